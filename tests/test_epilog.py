"""The Epilog end to end: ``python -m clusterjob epilog`` in a child, the unmodified pynvml
over the stand-in libnvidia-ml.so.1 (Xid events, ECC counts, a GPU lost), real site files and
kernel-log files. Exit codes, the one stderr line slurmd logs and the JSON record are checked
exactly: they are what drains a node and what an admin reads. What the Epilog shares with the
Prolog is tested for both hooks where the Prolog's is: its deadline in test_hooks_nvml.py, the
trust of its site file, log and cache in test_hooks.py and test_security_prolog.py."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_hooks_nvml import BUSES, NODE, Node, mixed
from trusted_tree import trusted_tmp_dir

from clusterjob.jobs.hardware import with_hardware
from clusterjob.jobs.status import JobStatus, StatusCache
from clusterjob.node import drain, epilog, xid
from clusterjob.node.wrappers import HookWrappers
from clusterjob.sandbox.standin import StandinScenario
from clusterjob.slurm import parse

pytestmark = pytest.mark.nvml

JOB_GPUS = {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"}  # buses 48:00, 4c:00


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """The Epilog trusts no path through sticky /tmp, as the Prolog."""
    yield from trusted_tmp_dir()


class EpilogNode(Node):
    def __init__(self, tmp: Path, lib_dir: Path) -> None:
        super().__init__(tmp, lib_dir)
        self.kernel = tmp / "kern.log"
        self.kernel.write_text("")
        self.elog = self.log.with_name("epilog.jsonl")

    def epilog(self, *extra: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        return self.run(
            "epilog",
            "--site",
            str(self.site),
            "--cache-dir",
            str(self.cache),
            "--kernel-log",
            str(self.kernel),
            *extra,
            env={**JOB_GPUS, **(env or {})},
        )

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.elog.read_text().splitlines()]


@pytest.fixture
def node(tmp_path: Path, standin_lib: Path) -> EpilogNode:
    return EpilogNode(tmp_path, standin_lib.parent)


def test_quiet_job_passes_and_records_its_gpus(node: EpilogNode) -> None:
    node.setup(mixed())
    done = node.epilog()
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    (rec,) = node.records()  # beside the Prolog's log, which the site names
    assert (rec["hook"], rec["node"], rec["job_id"], rec["outcome"], rec["action"]) == (
        "epilog",
        NODE,
        "1234",
        "ok",
        "pass",
    )
    assert [(g["slot"], g["bus_id"], g["found"]) for g in rec["gpus"]] == [
        (2, BUSES[2], True),
        (3, BUSES[3], True),
    ]
    assert rec["faults"] == [] and rec["reason"] is None


def test_xid_79_from_nvml_drains_naming_the_xid_gpu_and_job(node: EpilogNode) -> None:
    node.setup(mixed(**{"2": {"xids": (79,)}}))
    done = node.epilog()
    line = "Xid 79 (GPU fell off the bus) on gpu2 0000:48:00.0 during job 1234"
    assert (done.returncode, done.stderr) == (1, f"clusterjob epilog: {line}\n")
    (rec,) = node.records()
    assert (rec["outcome"], rec["action"], rec["reason"]) == ("fault", "drain", line)
    (fault,) = rec["faults"]
    assert fault == {
        "kind": "xid",
        "slot": 2,
        "bus_id": BUSES[2],
        "summary": "Xid 79 (GPU fell off the bus)",
        "cause": "hardware",
        "drain": True,
        "xid": 79,
        "source": "nvml",
    }


def test_an_xid_on_a_gpu_the_job_was_not_given_is_not_its_fault(node: EpilogNode) -> None:
    node.setup(mixed(**{"0": {"xids": (79,)}}))
    done = node.epilog()
    assert (done.returncode, done.stderr) == (0, "")
    assert node.records()[0]["faults"] == []


def test_application_xid_is_a_warning_not_a_drain(node: EpilogNode) -> None:
    node.setup(mixed(**{"3": {"xids": (31,)}}))
    done = node.epilog()
    assert done.returncode == 0
    assert done.stderr.startswith("clusterjob epilog: warning: Xid 31 (GPU memory page fault")
    (rec,) = node.records()
    assert (rec["outcome"], rec["faults"][0]["cause"]) == ("warning", "application")


def test_kernel_log_xid_for_the_jobs_bus_drains(node: EpilogNode) -> None:
    node.setup(mixed())
    node.kernel.write_text(
        "[  100.000001] NVRM: Xid (PCI:0000:07:00): 79, pid=1, GPU has fallen off the bus.\n"
        "[  200.500000] NVRM: Xid (PCI:0000:4c:00): 48, pid=77, name=python, DBE.\n"
    )
    done = node.epilog()
    line = "Xid 48 (double-bit ECC error) on gpu3 0000:4c:00.0 during job 1234"
    assert (done.returncode, done.stderr) == (1, f"clusterjob epilog: {line}\n")
    (fault,) = node.records()[0]["faults"]  # 07:00 is not the job's
    assert (fault["source"], fault["xid"]) == ("kernel", 48)


def test_kernel_lines_before_the_job_started_are_not_its_fault(node: EpilogNode) -> None:
    node.setup(mixed())
    # The line at a quarter of the machine's uptime, the job's start at half of it: before
    # the job on any machine, however recently it booted (a kernel line an hour before now,
    # as this test had it, is before the boot on a machine up for less than an hour).
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    node.kernel.write_text(
        f"[{uptime / 4:.6f}] NVRM: Xid (PCI:0000:4c:00): 79, GPU has fallen off the bus.\n"
    )
    begun = time.time() - uptime / 2
    started = {"SLURM_JOB_START_TIME": str(int(begun))}
    assert node.epilog(env=started).returncode == 0
    assert node.epilog().returncode == 1  # without a start time every line counts
    # without SLURM_JOB_START_TIME (22.05's Epilog): the Prolog's record of the job says when
    node.log.parent.mkdir(mode=0o755, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(begun))
    other = {"job_id": "99", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(0))}
    node.log.write_text(
        json.dumps(other) + "\n" + json.dumps({"job_id": "1234", "time": stamp}) + "\n"
    )
    node.log.chmod(0o640)
    assert node.epilog().returncode == 0


@pytest.mark.parametrize(
    ("slot", "gpu", "summary"),
    [
        ("2", {"lost_after_calls": 3}, "GPU lost (NVML: GPU is lost) on gpu2 0000:48:00.0"),
        (
            "2",
            {"ecc_uncorrectable": 2},
            "2 uncorrectable ECC error(s) since the last GPU reset on gpu2 0000:48:00.0",
        ),
        ("1", {"remapped_failure": True}, "row remapping failed on gpu1 0000:0b:00.0"),
    ],
)
def test_nvml_error_state_drains(node: EpilogNode, slot: str, gpu: dict, summary: str) -> None:
    node.setup(mixed(**{slot: gpu}))  # slot 1 an A100: a V100 has no row remapping
    done = node.epilog(env={"SLURM_JOB_GPUS": slot, "CUDA_VISIBLE_DEVICES": slot})
    assert (done.returncode, done.stderr) == (
        1,
        f"clusterjob epilog: {summary} during job 1234\n",
    )


def test_a_gpu_lost_before_nvml_could_place_it_drains(node: EpilogNode) -> None:
    node.setup(mixed(**{"1": {"lost_after_calls": 0}}))
    done = node.epilog()
    assert done.returncode == 1
    assert done.stderr.startswith("clusterjob epilog: GPU lost (GPU at NVML index 1 is lost")


def test_a_job_without_gpus_never_loads_nvml(node: EpilogNode) -> None:
    node.setup(mixed())
    node.scenario_path.unlink()  # NVML would fail: it must not be asked
    done = node.run("epilog", "--site", str(node.site), "--cache-dir", str(node.cache), env={})
    assert (done.returncode, done.stderr) == (0, "")
    assert node.records()[0]["note"] == "no GPUs in the job"


@pytest.mark.parametrize(("on_error", "rc"), [("drain", 1), ("pass", 0)])
def test_nvml_unusable_follows_the_sites_on_error(node: EpilogNode, on_error: str, rc: int) -> None:
    node.setup(
        StandinScenario(gpus=mixed().gpus, init_error="driver_not_loaded"), on_error=on_error
    )
    done = node.epilog()
    assert done.returncode == rc
    assert "GPUs not checked: NVML: NVIDIA driver is not loaded" in done.stderr
    assert node.records()[0]["outcome"] == "error"


def test_log_is_rotated_past_its_bound(node: EpilogNode, monkeypatch: pytest.MonkeyPatch) -> None:
    node.setup(mixed())
    node.elog.parent.mkdir(mode=0o755, exist_ok=True)
    with open(node.elog, "wb") as f:  # sparse: its size is what counts
        f.truncate(epilog.MAX_LOG_BYTES - 10)
    node.elog.chmod(0o640)
    assert node.epilog().returncode == 0
    old = node.elog.with_name("epilog.jsonl.1")
    assert old.stat().st_size == epilog.MAX_LOG_BYTES - 10
    assert len(node.records()) == 1


# -- every Xid of the table, through the Epilog and back out of `status` -------------------

# Written out from NVIDIA's "Xid Errors" document, not read from clusterjob's table: a row of
# the table that changes whether a node drains fails here, and a new row fails
# test_every_xid_in_the_table_has_a_case until it is placed in one of these.
XIDS_THAT_DRAIN = {38, 48, 61, 62, 64, 74, 79, 95, 119, 120, 140, 154}  # reset or field check
XIDS_THAT_WARN = {8, 13, 31, 32, 43, 45, 63, 68, 69, 92, 94, 121}  # the next job may run
UNKNOWN_XID = 999  # not in the table: recorded, not drained


def test_every_xid_in_the_table_has_a_case() -> None:
    assert not XIDS_THAT_DRAIN & XIDS_THAT_WARN
    assert set(xid.XIDS) == XIDS_THAT_DRAIN | XIDS_THAT_WARN
    assert UNKNOWN_XID not in xid.XIDS
    assert {code for code, x in xid.XIDS.items() if x.drain} == XIDS_THAT_DRAIN


def _node_line(reason: str | None) -> str:
    """The node as ``scontrol show node -o`` prints it after the Epilog (drained or not)."""
    state = "IDLE+DRAIN" if reason else "IDLE"
    tail = f" Reason={reason} [root@2026-12-04T01:00:00]" if reason else ""
    return (
        f"NodeName={NODE} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=8 "
        f"Gres=gpu:a100:2,gpu:v100:2 NodeAddr=127.0.0.1 State={state} Partitions=gpu{tail}"
    )


class _DrainReasons:
    """``SlurmClient.nodes`` over what ``scontrol show node -o`` prints for the node."""

    def __init__(self, reason: str | None) -> None:
        self.output = _node_line(reason) + "\n"

    def nodes(self, names: str | None = None) -> list[parse.NodeRecord]:
        return parse.parse_scontrol_nodes(self.output)


@pytest.mark.parametrize("source", ["nvml", "kernel"])
@pytest.mark.parametrize("code", [*sorted(xid.XIDS), UNKNOWN_XID])
def test_each_xid_drains_or_warns_and_status_blames_the_gpu_or_the_program(
    node: EpilogNode, code: int, source: str
) -> None:
    """The Xid on the job's gpu2, as NVML's event set delivers it (the real pynvml over the
    stand-in) or as the driver logs it in the kernel log; the Epilog run as slurmd runs it
    (it drains the node itself through scontrol); then the job's failure as ``status``
    reports it: a drained node's reason names the Xid, the GPU and the job, and ``status``
    says the hardware failed the job, not the program; after an Xid that does not drain,
    the job's own exit stands."""
    known = xid.describe(code)
    summary = f"Xid {code} ({known.meaning})"
    where = f"gpu2 {BUSES[2]}"
    if source == "nvml":
        node.setup(mixed(**{"2": {"xids": (code,)}}))
    else:
        node.setup(mixed())
        node.kernel.write_text(f"[  321.000001] NVRM: Xid (PCI:0000:48:00): {code}, pid=77\n")
    bin_dir = node.tmp / "bin"
    bin_dir.mkdir(mode=0o755)
    calls = node.tmp / "scontrol-calls"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    path = f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    done = node.epilog(env={"SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "PATH": path})

    drains = code in XIDS_THAT_DRAIN
    reason = f"{summary} on {where} during job 1234" if drains else None
    assert done.returncode == 0  # drained with its own reason, or nothing to drain for
    assert done.stderr == (
        f"clusterjob epilog: {reason}\n"
        if drains
        else f"clusterjob epilog: warning: {summary} on {where}\n"
    )
    assert _lines(calls) == (
        [f"update NodeName={NODE} State=DRAIN Reason=clusterjob: {reason}"] if drains else []
    )
    (rec,) = node.records()
    assert (rec["outcome"], rec["action"], rec["reason"]) == (
        ("fault", "drain", reason) if drains else ("warning", "pass", None)
    )
    assert rec["faults"] == [
        {
            "kind": "xid",
            "slot": 2,
            "bus_id": BUSES[2],
            "summary": summary,
            "cause": known.cause,
            "drain": drains,
            "xid": code,
            "source": source,
        }
    ]
    assert rec["gpus"][0]["nvml_xids"] == ([code] if source == "nvml" else [])

    failed = JobStatus("1234", "lab", "train", "FAILED", None, "", NODE, "00:05:00", 1, None,
                       "lab", "sacct")  # fmt: skip
    client = _DrainReasons(f"clusterjob: {reason}" if drains else None)
    cache = StatusCache(node.tmp / "status-cache.json", ttl=10)
    (row,) = with_hardware([failed], client, cache, time.time())  # type: ignore[arg-type]
    if drains:
        assert row.hardware == f"{summary} on {where} on node {NODE}"
        assert row.explanation == (
            f"hardware: {summary} on {where} on node {NODE} during the job, not your program "
            "(its exit 1 followed from it); the node is drained"
        )
    else:
        assert (row.hardware, row.explanation) == (None, "")


# -- the pieces -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "bus_id", "code", "stamp"),
    [
        (
            "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
            "0000:3b:00.0",
            79,
            1234.56789,
        ),
        ("4,512,2000000,-;NVRM: Xid (PCI:0000:B1:00): 48, pid=9, DBE", "0000:b1:00.0", 48, 2.0),
        ("NVRM: Xid (PCI:00000000:3b:00.0): 13, Graphics Exception", "0000:3b:00.0", 13, None),
    ],
)
def test_kernel_log_forms(line: str, bus_id: str, code: int, stamp: float | None) -> None:
    (found,) = xid.parse_kernel_log(line)
    assert (found.bus_id, found.code, found.uptime_s) == (bus_id, code, stamp)


def test_kernel_log_ignores_other_lines_and_older_ones() -> None:
    text = (
        "[ 10.0] nvidia: loading out-of-tree module\n"
        "[ 11.0] myapp: saw 'NVRM: Xid (PCI:0000:3b:00): 79, x' in a log\n"  # quoted
        "14,600,12000000,-;NVRM: Xid (PCI:0000:3b:00): 79, written by a process\n"  # user fac.
        "[ 20.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
        "[ 30.0] NVRM: Xid (PCI:0000:3b:00): 48, DBE\n"
    )
    assert [k.code for k in xid.parse_kernel_log(text, since_uptime=25)] == [48]


def test_install_hooks_writes_an_epilog_wrapper_and_its_slurm_conf_line() -> None:
    w = HookWrappers(Path("/etc/slurm"), Path("/usr/bin/python3"), Path("/etc/cj/site.yaml"))
    assert w.epilog == Path("/etc/slurm/clusterjob-epilog")
    text = w.files()[w.epilog]
    assert text.splitlines()[-1] == (
        "exec /usr/bin/python3 -I -m clusterjob epilog --site /etc/cj/site.yaml "
        "--cache-dir /var/cache/clusterjob"
    )
    assert "Epilog=/etc/slurm/clusterjob-epilog" in w.slurm_conf_lines()


def test_the_epilogs_drain_reason_replaces_slurms_epilog_error(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        '[ "$1" = show ] && echo "NodeName=gpu2 State=IDLE+DRAIN Reason=Epilog error [root@x]"\n'
    )
    script.chmod(0o755)
    drain.set_drain_reason_later(
        "gpu2", "clusterjob: Xid 79", scontrol=str(script), replacing=drain.SLURM_EPILOG_REASON
    )
    end = time.monotonic() + 10
    while time.monotonic() < end and len(_lines(calls)) < 2:
        time.sleep(0.1)
    assert _lines(calls) == ["show node -o gpu2", "update NodeName=gpu2 Reason=clusterjob: Xid 79"]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_env_cannot_redirect_the_epilogs_log(node: EpilogNode) -> None:
    node.setup(mixed())
    other = node.tmp / "elsewhere.jsonl"
    done = node.epilog(env={"CLUSTERJOB_EPILOG_LOG": str(other)})
    assert done.returncode == 0 and not other.exists() and node.elog.exists()
    assert os.stat(node.elog).st_mode & 0o777 == 0o640


@pytest.mark.parametrize(("works", "rc"), [(True, 0), (False, 1)])
def test_under_slurmd_it_drains_the_node_itself_with_its_reason(
    node: EpilogNode, works: bool, rc: int
) -> None:
    """slurmctld does not wait for an Epilog: it drains at once, so the reason is in place
    before the job leaves COMPLETING; where Slurm cannot be told, exit 1 drains it."""
    node.setup(mixed(**{"2": {"xids": (79,)}}))
    bin_dir = node.tmp / "bin"
    bin_dir.mkdir(mode=0o755)
    calls = node.tmp / "calls"
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\nexit {0 if works else 1}\n'
    )
    (bin_dir / "scontrol").chmod(0o755)
    path = f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    done = node.epilog(env={"SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "PATH": path})
    assert done.returncode == rc
    reason = "clusterjob: Xid 79 (GPU fell off the bus) on gpu2 0000:48:00.0 during job 1234"
    assert _lines(calls)[0] == f"update NodeName={NODE} State=DRAIN Reason={reason}"


def test_the_epilog_imports_the_standard_library_only(node: EpilogNode) -> None:
    """It runs after every job on every node: no Typer, Rich, Jinja2, ruamel, hostlist, and
    pynvml only in its NVML child (a warm cache: the Prolog's run parsed the YAML)."""
    node.setup(mixed())
    assert node.epilog().returncode == 0  # fills the parsed-site cache
    args = ["epilog", "--site", str(node.site), "--cache-dir", str(node.cache),
            "--kernel-log", str(node.kernel)]  # fmt: skip
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from clusterjob.__main__ import main\n"
        f"code = main({args!r})\n"
        "extra = sorted(m for m in set(sys.modules) - before\n"
        "               if m.split('.')[0] not in sys.stdlib_module_names | {'clusterjob'})\n"
        "print('RESULT', code, extra)\n"
    )
    done = node.run("-c", code, env=JOB_GPUS)
    assert done.stdout.splitlines()[-1] == "RESULT 0 []", done.stdout + done.stderr
