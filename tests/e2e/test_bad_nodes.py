"""A node that fails the in-job preflight costs one attempt, not every retry: under a real
slurmd the job exits 78 there, `clusterjob wait` records the node in the user's avoid list
and submits the job once more without it (`--retry-bad-node 1`), and the retry completes
elsewhere. Slurm's accounting holds exactly two jobs of that name.

The node is bad for the preflight only: the job's site file (a copy of the sandbox's, given
with --site) says gpu1's A100s sit at its V100s' bus ids, as a map written before the GPUs
were moved; the root Prolog reads the sandbox's own site and passes. gpu2's A100s are held
by another job while the first attempt starts, so that it lands on gpu1; that job is
cancelled once the bad node is recorded. Nothing is drained.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from clusterjob.sandbox import cluster

from .conftest import Cli, Sandbox

pytestmark = pytest.mark.slurm

GOOD_GPU1 = """\
  - nodes: gpu1
    gpus:
      - {model: A100, bus_id: "0000:07:00.0"}
      - {model: A100, bus_id: "0000:0b:00.0"}
      - {model: V100, bus_id: "0000:48:00.0"}
      - {model: V100, bus_id: "0000:4c:00.0"}
"""
MOVED_GPU1 = """\
  - nodes: gpu1
    gpus:
      - {model: V100, bus_id: "0000:07:00.0"}
      - {model: V100, bus_id: "0000:0b:00.0"}
      - {model: A100, bus_id: "0000:48:00.0"}
      - {model: A100, bus_id: "0000:4c:00.0"}
"""


def _submitted(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"Submitted job (\d+)", proc.stdout)
    assert match, proc.stdout
    return match.group(1)


def _state(cj: Cli, job: str) -> str:
    (row,) = json.loads(cj("status", "--json", job).stdout)
    return str(row["state"])


def _accounted(sandbox: Sandbox, name: str, jobs: int, timeout: float = 60) -> list[list[str]]:
    """sacct's rows (id, state, exit code, nodes) of the jobs named ``name``, once it has
    ``jobs`` of them, all ended (slurmdbd is told a moment after the end)."""
    deadline = time.monotonic() + timeout
    while True:
        out = sandbox.run("sacct", "-n", "-X", "-P", "-S", "now-6hours", "--name", name,
                          "-o", "JobID,State,ExitCode,NodeList")  # fmt: skip
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        ended = all(r[1] not in ("PENDING", "RUNNING", "COMPLETING") for r in rows)
        if (len(rows) >= jobs and ended) or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def test_a_node_that_fails_the_preflight_is_left_out_of_the_retry(
    cj: Cli, sandbox: Sandbox, tmp_path: Path
) -> None:
    site_text = sandbox.site_path.read_text()
    assert GOOD_GPU1 in site_text, "the sandbox's node map has changed: update this test"
    site = tmp_path / "moved-gpu1.yaml"
    site.write_text(site_text.replace(GOOD_GPU1, MOVED_GPU1, 1))
    name = f"badnode-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, **cluster.client_env(sandbox.state_dir))
    env.update(CLUSTERJOB_DATA_DIR=str(tmp_path / "data"), CLUSTERJOB_STATUS_CACHE_SECONDS="0")
    hold = ("--gpus", "2", "--model", "A100", "--nodelist", "gpu2", "--time", "10")
    blocker = _submitted(cj("submit", *hold, "--job-name", f"{name}-hold", "--", "sleep", "600"))
    waiter = None
    try:
        deadline = time.monotonic() + 120
        while _state(cj, blocker) != "RUNNING":
            assert time.monotonic() < deadline, "gpu2's A100s were never held"
            time.sleep(1)
        job = _submitted(cj("submit", "--site", str(site), "--gpus", "1", "--model", "A100",
                            "--retry-bad-node", "1", "--time", "5", "--job-name", name,
                            "--", "bash", "-c", 'echo "ran on $SLURMD_NODENAME"'))  # fmt: skip
        waiter = subprocess.Popen(
            [sys.executable, "-m", "clusterjob", "wait", job, "--interval", "1",
             "--timeout", "240"],
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        avoid = tmp_path / "data" / "bad-nodes.json"
        deadline = time.monotonic() + 150
        while not (avoid.exists() and "gpu1" in avoid.read_text()):
            assert waiter.poll() is None, waiter.communicate()
            assert time.monotonic() < deadline, "the bad node was never recorded"
            time.sleep(1)
        cj("cancel", blocker)  # gpu2 free for the retry
        out, err = waiter.communicate(timeout=240)
        assert waiter.returncode == 0, (out, err)
        said = re.search(
            rf"^{job}: gpu1: preflight failed: (.+); your submissions avoid it for 24h; "
            rf"submitted again as job (\d+) without gpu1 \(--retry-bad-node: 0 more left\)$",
            out,
            re.M,
        )
        assert said, out
        retry = said[2]
        assert f"{retry} COMPLETED (exit 0)" in out.splitlines(), out
        rows = _accounted(sandbox, name, 2)
        assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
            (job, "FAILED", "78:0", "gpu1"),
            (retry, "COMPLETED", "0:0", "gpu2"),
        ], rows
        assert "ran on gpu2" in cj("logs", retry).stdout
        first_log = cj("logs", job).stdout
        assert "clusterjob: preflight failed (exit 1): the program was not started" in first_log
        assert "ran on" not in first_log, first_log
        listed = cj("nodes")
        assert listed.returncode == 0, listed.stderr
        (line,) = [x for x in listed.stdout.splitlines() if x.startswith("gpu1 ")]
        assert f" {job} " in line and "preflight failed: " in line, listed.stdout
        # the next submission stays off gpu1, and says so in one line
        dry = cj("submit", "--gpus", "1", "--model", "A100", "--dry-run", "--", "true")
        assert "#SBATCH --exclude=gpu1" in dry.stdout.splitlines(), dry.stdout
        (note,) = [x for x in dry.stderr.splitlines() if "avoiding gpu1" in x]
        assert note.startswith("note: avoiding gpu1 (preflight failed "), note
        assert cj("nodes", "--clear", "gpu1").stdout == "forgot: gpu1\n"
    finally:
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
        cj("cancel", blocker)
        for line in sandbox.run("squeue", "-h", "-o", "%i %j").splitlines():
            job_id, _, job_name = line.partition(" ")
            if job_name.startswith(name):
                sandbox.run("scancel", job_id, check=False)
