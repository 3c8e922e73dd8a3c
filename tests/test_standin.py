"""The stand-in libnvidia-ml.so.1 itself, driven through the unmodified pynvml; its build helper."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from standin_fixtures import run_python

from clusterjob.errors import ClusterjobError
from clusterjob.sandbox.standin import (
    GIB,
    LIBRARY_NAME,
    StandinGpu,
    StandinScenario,
    a100,
    add_sandbox_extra,
    build_standin_library,
    find_nvml_header,
    h100,
    scenario_text,
    standin_env,
    v100,
    write_scenario,
)

pytestmark = pytest.mark.nvml


def _json_from_child(code: str, lib: Path, scenario, tmp_path: Path, **kw):
    result = run_python(code, lib.parent, scenario, tmp_path, **kw)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


TWO_GPUS = StandinScenario(
    gpus=(
        a100("0000:07:00.0", 0, processes=((1234, 3 * GIB, "python train.py"),), utilization=40),
        v100("0000:3b:00.0", 1, minor=5, memory_used=2 * GIB),
    ),
    driver_version="550.54.15",
    cuda_driver_version=12040,
)


def test_entry_points_pynvml_uses(standin_lib, tmp_path):
    code = """
import json, pynvml as n
text = lambda v: v.decode() if isinstance(v, bytes) else v  # pynvml versions differ
n.nvmlInit()
out = {"driver": n.nvmlSystemGetDriverVersion(), "cuda": n.nvmlSystemGetCudaDriverVersion(),
       "cuda2": n.nvmlSystemGetCudaDriverVersion_v2(), "nvml": n.nvmlSystemGetNVMLVersion(),
       "count": n.nvmlDeviceGetCount(), "gpus": []}
for i in range(out["count"]):
    h = n.nvmlDeviceGetHandleByIndex(i)
    pci = n.nvmlDeviceGetPciInfo_v3(h)
    m1 = n.nvmlDeviceGetMemoryInfo(h)
    m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    ext = n.nvmlPciInfoExt_v1_t(); ext.version = n.nvmlPciInfoExt_v1
    n.nvmlDeviceGetPciInfoExt(h, n.byref(ext))
    procs = n.nvmlDeviceGetComputeRunningProcesses(h)
    util = n.nvmlDeviceGetUtilizationRates(h)
    out["gpus"].append({
        "index": n.nvmlDeviceGetIndex(h), "name": n.nvmlDeviceGetName(h),
        "uuid": n.nvmlDeviceGetUUID(h), "serial": n.nvmlDeviceGetSerial(h),
        "minor": n.nvmlDeviceGetMinorNumber(h),
        "bus_id": text(pci.busId), "legacy": text(pci.busIdLegacy),
        "bus": pci.bus, "domain": pci.domain, "ext_bus_id": text(ext.busId),
        "mem1": [m1.total, m1.used, m1.free], "mem2": [m2.total, m2.used, m2.free],
        "procs": [[p.pid, p.usedGpuMemory, n.nvmlSystemGetProcessName(p.pid)] for p in procs],
        "procs_v2": len(n.nvmlDeviceGetComputeRunningProcesses_v2(h)),
        "util": util.gpu, "persistence": n.nvmlDeviceGetPersistenceMode(h),
        "ecc_corrected": n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                                       n.NVML_AGGREGATE_ECC),
    })
n.nvmlShutdown()
print(json.dumps(out))
"""
    out = _json_from_child(code, standin_lib, TWO_GPUS, tmp_path)
    assert (out["driver"], out["cuda"], out["cuda2"]) == ("550.54.15", 12040, 12040)
    assert out["nvml"] == "12.550.54.15"
    assert out["count"] == 2
    g0, g1 = out["gpus"]
    assert g0["index"] == 0 and g1["index"] == 1
    assert g0["name"] == "NVIDIA A100-SXM4-80GB" and g1["name"] == "Tesla V100-SXM2-32GB"
    assert g0["uuid"] == TWO_GPUS.gpus[0].uuid and g0["serial"] == TWO_GPUS.gpus[0].serial
    assert g1["minor"] == 5
    # NVML's own formats: 8-digit domain in busId, 4-digit in the legacy field, upper case.
    assert g1["bus_id"] == "00000000:3B:00.0" and g1["legacy"] == "0000:3B:00.0"
    assert g1["ext_bus_id"] == "00000000:3B:00.0"
    assert (g1["bus"], g1["domain"]) == (0x3B, 0)
    assert g1["mem1"] == [32 * GIB, 2 * GIB, 30 * GIB] == g1["mem2"]
    assert g0["procs"] == [[1234, 3 * GIB, "python train.py"]] and g0["procs_v2"] == 1
    assert g1["procs"] == [] and g1["procs_v2"] == 0
    assert g0["util"] == 40 and g0["persistence"] == 1 and g0["ecc_corrected"] == 0


def test_handles_by_uuid_bus_id_and_serial(standin_lib, tmp_path):
    gpu1 = TWO_GPUS.gpus[1]
    code = f"""
import json, pynvml as n
n.nvmlInit()
idx = n.nvmlDeviceGetIndex
out = [idx(n.nvmlDeviceGetHandleByUUID({gpu1.uuid!r})),
       idx(n.nvmlDeviceGetHandleByPciBusId("0000:3b:00.0")),
       idx(n.nvmlDeviceGetHandleByPciBusId("00000000:3B:00.0")),
       idx(n.nvmlDeviceGetHandleBySerial({gpu1.serial!r}))]
for bad in (lambda: n.nvmlDeviceGetHandleByUUID("GPU-nope"),
            lambda: n.nvmlDeviceGetHandleByPciBusId("0000:99:00.0")):
    try:
        bad()
    except n.NVMLError_NotFound:
        out.append("not found")
try:
    n.nvmlDeviceGetHandleByIndex(2)
except n.NVMLError_InvalidArgument:
    out.append("invalid index")
print(json.dumps(out))
"""
    out = _json_from_child(code, standin_lib, TWO_GPUS, tmp_path)
    assert out == [1, 1, 1, 1, "not found", "not found", "invalid index"]


def test_refcounted_init_and_calls_after_shutdown(standin_lib, tmp_path):
    code = """
import json, pynvml as n
n.nvmlInit(); n.nvmlInit()
n.nvmlShutdown()
out = [n.nvmlDeviceGetCount()]
n.nvmlShutdown()
try:
    n.nvmlDeviceGetCount()
except n.NVMLError_Uninitialized:
    out.append("uninitialized")
print(json.dumps(out))
"""
    assert _json_from_child(code, standin_lib, TWO_GPUS, tmp_path) == [2, "uninitialized"]


def test_scenario_is_reread_at_each_first_init(standin_lib, tmp_path):
    """A long-lived process (a workstation daemon, an in-process test) sees scenario changes."""
    second = tmp_path / "second.txt"
    write_scenario(second, StandinScenario(gpus=(h100("0000:18:00.0", 0),)))
    code = f"""
import json, os, pynvml as n
n.nvmlInit(); first = n.nvmlDeviceGetCount(); n.nvmlShutdown()
os.environ["FAKE_NVML_SCENARIO"] = {str(second)!r}
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); name = n.nvmlDeviceGetName(h); n.nvmlShutdown()
print(json.dumps([first, name]))
"""
    out = _json_from_child(code, standin_lib, TWO_GPUS, tmp_path)
    assert out == [2, "NVIDIA H100 80GB HBM3"]


def test_usage_keys_change_while_nvml_stays_initialised(standin_lib, tmp_path):
    """A sampler keeps NVML open for the whole job: a scenario rewritten mid-job changes what
    it reads of utilisation, memory used and power, and nothing else of the GPU."""
    scenario = tmp_path / "node.txt"
    write_scenario(scenario, StandinScenario(gpus=(h100("0000:18:00.0", 0, utilization=3),)))
    busy = StandinScenario(
        gpus=(h100("0000:18:00.0", 0, utilization=97, memory_used=9 * GIB, power_usage=650_000),)
    )
    code = f"""
import json, os, time, pynvml as n
def read(h):
    return [n.nvmlDeviceGetUtilizationRates(h).gpu, n.nvmlDeviceGetMemoryInfo(h).used,
            n.nvmlDeviceGetPowerUsage(h)]
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); before = read(h)
time.sleep(0.05)
open({str(scenario)!r}, "w").write({scenario_text(busy)!r})
after = read(h)
print(json.dumps([before, after, n.nvmlDeviceGetCount()]))
"""
    out = _json_from_child(code, standin_lib, scenario, tmp_path)
    assert out == [[3, 0, 60_000], [97, 9 * GIB, 650_000], 1]


def test_lost_gpu_counts_calls_including_handle_lookups(standin_lib, tmp_path):
    scenario = StandinScenario(gpus=(a100("0000:07:00.0", 0, lost_after_calls=2),))
    code = """
import json, pynvml as n
n.nvmlInit()
out = []
h = n.nvmlDeviceGetHandleByIndex(0)
out.append(n.nvmlDeviceGetName(h))
for _ in range(2):
    try:
        n.nvmlDeviceGetUUID(h)
    except n.NVMLError_GpuIsLost as e:
        out.append(str(e))
print(json.dumps(out))
"""
    out = _json_from_child(code, standin_lib, scenario, tmp_path)
    assert out == ["NVIDIA A100-SXM4-80GB", "GPU is lost", "GPU is lost"]


def test_unset_scenario_behaves_like_no_driver_and_says_why(standin_lib, tmp_path):
    code = """
import pynvml as n
try:
    n.nvmlInit()
except n.NVMLError_DriverNotLoaded:
    print("driver not loaded")
"""
    result = run_python(code, standin_lib.parent, None, tmp_path)
    assert result.stdout.strip() == "driver not loaded"
    assert "standin-nvml: FAKE_NVML_SCENARIO is not set" in result.stderr


def test_percent_n_without_node_name_fails_loudly(standin_lib, tmp_path):
    code = """
import pynvml as n
try:
    n.nvmlInit()
except n.NVMLError_Unknown:
    print("unknown")
"""
    result = run_python(code, standin_lib.parent, tmp_path / "%n.txt", tmp_path)
    assert result.stdout.strip() == "unknown"
    assert "SLURMD_NODENAME is not set" in result.stderr


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("gpu.0.name = X\ngpu.0.uuid = GPU-1\ngpu.0.bus_id = 0000:07:00.0\ngpu.0.colour = red\n",
         ":4: gpu.0.colour: unknown key"),
        ("gpu.0.name = X\ngpu.0.uuid = GPU-1\ngpu.0.bus_id = zz\n", "not a PCI address"),
        ("gpu.1.name = X\ngpu.1.uuid = GPU-1\ngpu.1.bus_id = 0000:07:00.0\n",
         "gpu.0 needs at least name, uuid and bus_id"),
        ("init_error = sometimes\n", "unknown init_error"),
        ("gpu.0.name = X\ngpu.0.uuid = U\ngpu.0.bus_id = 07:00.0\ngpu.0.unsupported = fans\n",
         "unknown word in unsupported"),
        ("driver_version 550\n", ":1: expected key = value"),
    ],
)  # fmt: skip
def test_malformed_scenario_fails_init_with_the_line(standin_lib, tmp_path, text, complaint):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    code = """
import pynvml as n
try:
    n.nvmlInit()
except n.NVMLError_Unknown:
    print("unknown")
"""
    result = run_python(code, standin_lib.parent, path, tmp_path)
    assert result.stdout.strip() == "unknown"
    assert complaint in result.stderr


def test_preload_serves_pynvml_in_a_running_process(standin_lib, tmp_path):
    """No LD_LIBRARY_PATH at process start: loading by path first is enough for pynvml."""
    scenario = write_scenario(tmp_path / "s.txt", TWO_GPUS)
    code = f"""
import json, os
os.environ.pop("LD_LIBRARY_PATH", None)
from clusterjob.sandbox.standin import preload_standin
preload_standin({str(standin_lib)!r})
from clusterjob.gpu.inventory import read_inventory
print(json.dumps([g.name for g in read_inventory().gpus]))
"""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_python(code, empty, scenario, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"]


# --- the Python side: scenario files, build cache, environment --------------------------


def test_scenario_text_round_trips_every_key():
    gpu = StandinGpu(
        name="NVIDIA A100-SXM4-80GB",
        uuid="GPU-1",
        serial=None,
        bus_id="0000:07:00.0",
        minor=3,
        memory_total=80 * GIB,
        lost_after_calls=4,
        hang_seconds=0.5,
        unsupported=["ecc", "mig"],
        processes=[(7, 10, "a b:c")],
    )
    text = scenario_text(StandinScenario(gpus=[gpu], init_error="no_permission"))
    lines = set(text.splitlines())
    assert {
        "init_error = no_permission",
        "gpu.0.minor = 3",
        "gpu.0.lost_after_calls = 4",
        "gpu.0.hang_seconds = 0.5",
        "gpu.0.unsupported = ecc,mig",
        "gpu.0.process.0 = 7:10:a b:c",
        "gpu.0.persistence = 1",
    } <= lines
    assert not any(line.startswith("gpu.0.serial") for line in lines)


def test_scenario_rejects_unknown_words():
    with pytest.raises(ValueError, match="valid: name, uuid"):
        a100("0000:07:00.0", 0, unsupported=("fans",))
    with pytest.raises(ValueError, match="init_error"):
        StandinScenario(init_error="sometimes")
    with pytest.raises(ValueError, match="one line"):
        scenario_text(StandinScenario(gpus=(a100("0000:07:00.0", 0, name="A\nB"),)))


def test_model_helpers_are_stable_per_node_and_slot():
    assert a100("0000:07:00.0", 0, node="n1") == a100("0000:07:00.0", 0, node="n1")
    assert a100("0000:07:00.0", 0, node="n1").uuid != a100("0000:07:00.0", 0, node="n2").uuid
    assert v100("0000:07:00.0", 0).unsupported == ("mig", "remap")
    assert v100("0000:07:00.0", 0, unsupported=()).unsupported == ()
    assert h100("0000:18:00.0", 4).minor == 4


def test_build_is_cached_by_source_hash(tmp_path):
    lib = build_standin_library(tmp_path)
    assert lib == tmp_path / LIBRARY_NAME
    first = lib.stat().st_ino
    assert build_standin_library(tmp_path).stat().st_ino == first  # reused, not rebuilt
    (tmp_path / (LIBRARY_NAME + ".sha256")).write_text("stale\n")
    rebuilt = build_standin_library(tmp_path)
    assert rebuilt.stat().st_ino != first  # rebuilt and swapped in whole
    assert rebuilt.read_bytes()[:4] == b"\x7fELF"
    assert (tmp_path / (LIBRARY_NAME + ".sha256")).read_text().strip() != "stale"
    assert sorted(p.name for p in tmp_path.iterdir()) == [LIBRARY_NAME, LIBRARY_NAME + ".sha256"]


def test_build_without_compiler_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-gcc"))
    with pytest.raises(ClusterjobError, match="apt-get install gcc"):
        build_standin_library(tmp_path / "out")


def test_missing_header_names_the_extra_and_how_to_add_it_here(tmp_path):
    with pytest.raises(ClusterjobError, match="extra") as caught:
        find_nvml_header([tmp_path])
    assert str(caught.value).endswith(
        f"{sys.executable} -m pip install 'clusterjob-slurm[sandbox]'"
    )
    assert find_nvml_header().name == "nvml.h"


@pytest.mark.parametrize(
    ("prefix", "advice"),
    [
        ("/home/ann/.local/share/pipx/venvs/clusterjob-slurm",
         "pipx inject clusterjob-slurm nvidia-nvml-dev"),
        ("/root/.local/share/uv/tools/clusterjob-slurm",
         "uv tool install --reinstall 'clusterjob-slurm[sandbox]'"),
    ],
)  # fmt: skip
def test_pipx_and_uv_tool_installs_are_told_their_own_way(prefix, advice):
    """pipx users were told `pip install nvidia-nvml-dev`, which does not reach pipx's venv."""
    assert add_sandbox_extra(prefix) == advice


def test_standin_env_keeps_existing_library_path(monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/x/lib")
    env = standin_env("/tmp/lib", "/tmp/s-%n.txt")
    assert env == {"LD_LIBRARY_PATH": "/tmp/lib:/opt/x/lib", "FAKE_NVML_SCENARIO": "/tmp/s-%n.txt"}
    monkeypatch.delenv("LD_LIBRARY_PATH")
    assert standin_env("/tmp/lib", "s")["LD_LIBRARY_PATH"] == "/tmp/lib"


def test_xid_events_reach_each_registered_event_set_once(standin_lib, tmp_path):
    """nvmlEventSetCreate / nvmlDeviceRegisterEvents / nvmlEventSetWait_v2 through pynvml:
    a scenario's Xids come once per set, only for registered GPUs; then TIMEOUT."""
    scenario = StandinScenario(
        gpus=(a100("0000:07:00.0", 0, xids=(79, 48)), a100("0000:0b:00.0", 1, xids=(13,)))
    )
    code = """
import json, pynvml
pynvml.nvmlInit()
h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {"supported": bool(pynvml.nvmlDeviceGetSupportedEventTypes(h0)
                         & pynvml.nvmlEventTypeXidCriticalError)}
for name in ("first", "second"):
    s = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h0, pynvml.nvmlEventTypeXidCriticalError, s)
    got = []
    while True:
        try:
            d = pynvml.nvmlEventSetWait_v2(s, 0)
        except pynvml.NVMLError_Timeout:
            break
        got.append((d.eventType, d.eventData, d.gpuInstanceId))
    out[name] = got
    pynvml.nvmlEventSetFree(s)
print(json.dumps(out))
"""
    done = run_python(code, standin_lib.parent, scenario, tmp_path)
    assert done.returncode == 0, done.stderr
    xid = 0x8
    row = [[xid, 79, 0xFFFFFFFF], [xid, 48, 0xFFFFFFFF]]
    assert json.loads(done.stdout) == {"supported": True, "first": row, "second": row}


def test_xid_events_read_by_clusterjob_by_bus_id(standin_lib, tmp_path):
    scenario = StandinScenario(
        gpus=(
            a100("0000:07:00.0", 0, xids=(79,)),
            a100("0000:0b:00.0", 1, unsupported=("events",), xids=(48,)),
        )
    )
    code = (
        "import json; from clusterjob.gpu.nvml import read_xid_events as r; print(json.dumps(r()))"
    )
    done = run_python(code, standin_lib.parent, scenario, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"0000:07:00.0": [79]}  # 0b:00 cannot register
