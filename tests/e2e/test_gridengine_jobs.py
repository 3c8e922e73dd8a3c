"""submit, status, wait, cancel and logs on a Grid Engine site, against the running local Grid
Engine cluster (`clusterjob sandbox up --scheduler gridengine`): hosts host1 and host2 with
4 a100 GPUs each, host3 with 2 v100, queue all.q.

The site is written here for that cluster (site_configs/gelab.yaml describes another: its
queues and hosts are not the sandbox's). The jobs run inside the sandbox's root, which sees
/tmp: the test's directory, its registry and its scripts are all under it, and clusterjob is
installed there for the root's python3 (a GPU job's first step runs `clusterjob bind-gpus`),
as test_gridengine_binding.py installs it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clusterjob.sandbox import gridengine
from tests.e2e.test_gridengine_binding import _install

pytestmark = pytest.mark.gridengine

SITE = """\
site: gesandbox
scheduler: gridengine
node_command: env PYTHONPATH={lib} /usr/bin/python3 -m clusterjob
models:
  A100:
    aliases: [a100]
    gres_type: a100
    nvml_names: ["NVIDIA A100-SXM4-80GB"]
    memory_gb: 80
  V100:
    aliases: [v100]
    gres_type: v100
    nvml_names: ["Tesla V100-SXM2-32GB"]
    memory_gb: 32
partitions:
  all.q:
    nodes: "host[1-3]"
    default: true
node_map:
  - nodes: "host[1-2]"
    gpus:
      - {model: A100, bus_id: "0000:10:00.0"}
      - {model: A100, bus_id: "0000:20:00.0"}
      - {model: A100, bus_id: "0000:30:00.0"}
      - {model: A100, bus_id: "0000:40:00.0"}
  - nodes: "host3"
    gpus:
      - {model: V100, bus_id: "0000:10:00.0"}
      - {model: V100, bus_id: "0000:20:00.0"}
"""

TRAIN = """\
import os
import sys

print("training with", sys.argv[1:], "task", os.environ.get("SGE_TASK_ID"))
"""

Cli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="module")
def node_lib() -> Iterator[Path]:
    """clusterjob for the sandbox root's python3, in a folder under /tmp (seen inside)."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the sandbox's python3 is 3.11: clusterjob's compiled dependencies must match")
    dest = Path(tempfile.mkdtemp(prefix="cj-gejobs-", dir="/tmp"))
    dest.chmod(0o755)
    try:
        yield _install(dest)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


@pytest.fixture
def ge(tmp_path: Path, node_lib: Path) -> Cli:
    """`clusterjob ARGS...` in its own process, with the sandbox's qsub/qstat/qacct/qdel first
    on PATH, a site for the sandbox, its own registry, cwd tmp_path (seen inside the sandbox).
    The status cache is off, so polls see news."""
    lay = gridengine.layout(None)
    if gridengine.holder_pid(lay) is None or not (lay.bin_dir / "qsub").exists():
        pytest.skip(
            "the Grid Engine sandbox is not up (`clusterjob sandbox up --scheduler gridengine`)"
        )
    if not str(tmp_path).startswith("/tmp/"):
        pytest.skip(f"the test directory {tmp_path} is not under /tmp, which the sandbox sees")
    (tmp_path / "site.yaml").write_text(SITE.replace("{lib}", str(node_lib)))
    (tmp_path / "train.py").write_text(TRAIN)
    env = dict(os.environ)
    env["PATH"] = f"{lay.bin_dir}:{env.get('PATH', '')}"
    env["CLUSTERJOB_SITE"] = str(tmp_path / "site.yaml")
    env["CLUSTERJOB_DATA_DIR"] = str(tmp_path / "data")
    env["CLUSTERJOB_STATUS_CACHE_SECONDS"] = "0"

    def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "clusterjob", *args],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    return run


def _submit(ge: Cli, *args: str) -> str:
    done = ge("submit", "--json", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return str(json.loads(done.stdout)["job_id"])


def _status(ge: Cli, job_id: str, *flags: str) -> dict[str, object]:
    done = ge("status", "--json", *flags, job_id)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads(done.stdout)
    assert isinstance(row, dict)
    return row


def _until(
    what: str, check: Callable[[], dict[str, object] | None], timeout: float = 90
) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(1)


PY = ("--python", "/usr/bin/python3")  # the sandbox root's Python: the job runs in it


def test_a_two_gpu_a100_job_completes_and_wait_returns_0(ge: Cli, tmp_path: Path) -> None:
    job = _submit(ge, *PY, "train.py", "--gpus", "2", "--model", "A100", "--", "--lr", "3")
    done = ge("wait", job, "--interval", "1", "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr
    row = _status(ge, job)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), row
    assert row["nodes"] in ("host1", "host2"), row  # the a100 hosts
    logs = ge("logs", job)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "training with ['--lr', '3']" in logs.stdout, logs.stdout
    # the GPUs clusterjob bound for the job, proved against the node map before it ran: the
    # preflight table, as on Slurm (two slots of the host's four taken, each an A100)
    out = logs.stdout
    assert re.search(r"^preflight host[12]: OK \(4 GPU slot\(s\)", out, re.M), out
    taken = [ln for ln in out.splitlines() if re.match(r"^\d+\* ", ln)]
    assert len(taken) == 2 and all(re.search(r"\bA100\b.*\bok$", ln) for ln in taken), out


def test_a_job_exiting_3_is_failed_with_exit_3(ge: Cli) -> None:
    job = _submit(ge, "--", "sh", "-c", "exit 3")
    done = ge("wait", job, "--interval", "1", "--timeout", "120")
    assert done.returncode == 3, done.stdout + done.stderr
    row = _status(ge, job)
    assert (row["state"], row["exit_code"]) == ("FAILED", 3), row


def test_a_sweep_of_four_is_one_array_job(ge: Cli, tmp_path: Path) -> None:
    done = ge("submit", "--json", *PY, "train.py", "--sweep", "lr=1,2,3,4")
    assert done.returncode == 0, done.stdout + done.stderr
    submitted = json.loads(done.stdout)
    assert submitted["tasks"] == 4
    script = Path(submitted["script_path"]).read_text()
    assert "#$ -t 1-4:1" in script
    job = str(submitted["job_id"])
    waited = ge("wait", job, "--interval", "1", "--timeout", "150")
    assert waited.returncode == 0, waited.stdout + waited.stderr

    def four_tasks() -> dict[str, object] | None:
        row = _status(ge, job, "--tasks")
        return row if len(row["tasks"]) == 4 else None  # type: ignore[arg-type]

    row = _until("the array's four tasks in accounting", four_tasks)
    assert row["state"] == "COMPLETED" and row["tasks_summary"] == "4 tasks: 4 COMPLETED", row
    ids = [t["job_id"] for t in row["tasks"]]  # type: ignore[attr-defined]
    assert ids == [f"{job}_{i}" for i in range(4)]
    assert _status(ge, f"{job}_2")["job_id"] == f"{job}_2"  # one task, asked as ID_N
    one = ge("logs", f"{job}_2")
    assert one.returncode == 0 and "['--lr=3'] task 3" in one.stdout, one.stdout + one.stderr


def test_more_gpus_than_free_pends_with_the_gpus_named_then_cancel(ge: Cli) -> None:
    sleep = ("--", "sleep", "300")
    blockers = [_submit(ge, "--gpus", "4", "--model", "A100", *sleep) for _ in range(2)]
    waiting = _submit(ge, "--gpus", "4", "--model", "A100", *sleep)
    try:

        def explained() -> dict[str, object] | None:
            row = _status(ge, waiting)
            return row if row["state"] == "PENDING" and "GPU" in str(row["explanation"]) else None

        row = _until("the waiting job's reason naming GPUs", explained)
        assert "gpu" in str(row["explanation"]).lower() and "host" in str(row["explanation"])
    finally:
        done = ge("cancel", waiting, *blockers)
    assert done.returncode == 0, done.stdout + done.stderr
    for job in (waiting, *blockers):

        def cancelled(job: str = job) -> dict[str, object] | None:
            row = _status(ge, job)
            return row if row["state"] == "CANCELLED" else None

        _until(f"job {job} CANCELLED", cancelled)


def test_a_dependency_on_last_holds_the_job(ge: Cli) -> None:
    first = _submit(ge, "--", "sleep", "3")
    done = ge("submit", "--json", "--dependency", "afterany:last", "--", "true")
    assert done.returncode == 0, done.stdout + done.stderr
    submitted = json.loads(done.stdout)
    second = str(submitted["job_id"])
    assert f"#$ -hold_jid {first}\n" in Path(submitted["script_path"]).read_text()
    done = ge("wait", first, second, "--interval", "1", "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr
