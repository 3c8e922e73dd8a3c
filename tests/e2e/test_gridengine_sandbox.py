"""The local Grid Engine cluster for real: brought up in a state directory of its own (its own
namespaces, so it runs beside the one `sandbox up --scheduler gridengine` keeps), a 2-GPU job
that must land on an a100 host and see that host's stand-in GPUs, then `down --purge`
leaving no process, mount or state behind."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from clusterjob.errors import ClusterjobError
from clusterjob.sandbox import gridengine

pytestmark = pytest.mark.gridengine

JOB = """#!/bin/sh
echo "host=$(hostname)"
python3 - <<'PY'
import ctypes
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
count = ctypes.c_uint()
nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
handle = ctypes.c_void_p()
nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
name = ctypes.create_string_buffer(96)
nvml.nvmlDeviceGetName(handle, name, 96)
print(f"gpus={count.value} name={name.value.decode()}")
PY
exit 7
"""


def _skip_unless_the_root_can_be_built(state: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the Grid Engine sandbox needs root (namespaces, mounts, chroot)")
    missing = [tool for tool in ("unshare", "nsenter", "cc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the Grid Engine sandbox needs {', '.join(missing)} (not installed)")
    lay = gridengine.layout(state)
    if not (lay.root / ".clusterjob-root").exists() and shutil.which("mmdebstrap") is None:
        pytest.skip(
            f"no Grid Engine root in {lay.root} and no mmdebstrap to build one "
            "(apt-get install mmdebstrap, or `clusterjob sandbox up --scheduler gridengine` once)"
        )
    try:
        gridengine.ensure_root(lay)
    except ClusterjobError as exc:
        pytest.skip(f"this machine cannot build the Grid Engine root: {exc}")


def test_up_runs_a_two_gpu_job_on_an_a100_host_and_down_leaves_nothing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    state = tmp_path_factory.mktemp("gridengine") / "state"
    _skip_unless_the_root_can_be_built(state)
    # Up from the cached root takes about 15 s; how long is the benchmark's business, not
    # this test's: the limit here only stops a hang.
    ge = gridengine.up(state, timeout=240)
    namespace = None
    try:
        assert ge.status.up, gridengine.describe(ge.status, ge.layout)
        pid = gridengine.holder_pid(ge.layout)
        assert pid is not None
        namespace = gridengine.namespace_of(pid)
        jobs = ge.layout.jobs
        (jobs / "two.sh").write_text(JOB)
        qsub = [str(ge.layout.bin_dir / "qsub"), "-sync", "y", "-cwd", "-N", "two"]
        done = subprocess.run(
            [*qsub, "-l", "gpu=2,gpu_type=a100", "two.sh"],
            cwd=jobs, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 7, done.stdout + done.stderr  # qsub -sync y: the job's
        job_id = done.stdout.split("Your job ", 1)[1].split()[0]
        text = (jobs / f"two.o{job_id}").read_text()
        # the queue's prolog (installed at up) claimed two of the host's GPUs for the job
        bound, rest = text.split("\n", 1)
        assert re.fullmatch(
            rf"clusterjob: job {job_id} on (host1|host2): CUDA_VISIBLE_DEVICES=\d,\d", bound
        ), text
        # then the preflight's table of the two GPUs, then the job's own output
        host = bound.split()[4].rstrip(":")
        table, job_output = rest.split(f"host={host}\n", 1)
        assert f"preflight {host}: OK (4 GPU slot(s)" in table, text
        output = [f"host={host}", *job_output.split()]
        assert output[1:] == ["gpus=4", "name=NVIDIA", "A100-SXM4-80GB"]
        refused = subprocess.run(
            [*qsub, "-w", "e", "-l", "gpu=5", "two.sh"],
            cwd=jobs, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert refused.returncode == 1
        assert "no suitable queues" in refused.stderr
    finally:
        gridengine.down(state, purge=True)
    assert namespace is not None
    assert gridengine.processes_in_namespace(namespace) == []
    assert str(state) not in Path("/proc/self/mountinfo").read_text()
    assert not state.exists()
