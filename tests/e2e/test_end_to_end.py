"""End to end on the real local Slurm cluster: what a researcher types, what Slurm does.

Every test drives the real `clusterjob` command in its own process against the sandbox
(`clusterjob sandbox up`): real sbatch/squeue/sacct/scontrol, the real Prolog and TaskProlog
wired in slurm.conf, the real pynvml over the stand-in NVML library on each node.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import Cli, Sandbox

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")


def submit(cj: Cli, sandbox: Sandbox, *args: str) -> str:
    proc = cj("submit", "--site", str(sandbox.site_path), *args)
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"Submitted job (\d+)", proc.stdout)
    assert match, proc.stdout
    return match.group(1)


def status(cj: Cli, *jobs: str) -> list[dict]:
    proc = cj("status", "--json", *jobs)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_status(cj: Cli, job: str, done: Callable[[dict], bool], timeout: float = 90) -> dict:
    """Poll `clusterjob status JOB --json` (what a user sees) until ``done`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        (row,) = status(cj, job)
        if done(row):
            return row
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} never reached the expected state: {row}")
        time.sleep(1)


def finished(row: dict) -> bool:
    return row["state"] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED")


def logs(cj: Cli, job: str) -> str:
    proc = cj("logs", job)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_two_a100s_preflighted_and_completed(cj: Cli, sandbox: Sandbox) -> None:
    """1. The headline command: the job lands on two A100s and proves it before training."""
    job = submit(cj, sandbox, TRAIN, "--gpus", "2", "--model", "A100")
    row = wait_status(cj, job, finished)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), row
    # The accounting record says which GPUs Slurm gave: two of this site's a100 GRES type.
    assert "gres/gpu:a100=2" in row["gpus"].split(","), row
    # Asked again, the finished job comes from the registry, with what Slurm said kept.
    (again,) = status(cj, job)
    assert again["source"] == "registry", again
    assert (again["state"], again["gpus"]) == ("COMPLETED", row["gpus"]), again
    assert re.fullmatch(r"\d\d:\d\d:\d\d", again["elapsed"] or ""), again

    out = logs(cj, job)
    table = [ln for ln in out.splitlines() if re.match(r"^\d+\*? ", ln)]
    allocated = [ln for ln in table if re.match(r"^\d+\* ", ln)]
    assert len(allocated) == 2, out
    for line in allocated:
        assert re.search(r"\bA100\s+NVIDIA A100-SXM4-80GB \(A100\)\s+ok$", line), line
    assert re.search(r"^preflight gpu[12]: OK", out, re.M), out
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in out.splitlines()
    assert re.search(r"^CUDA_VISIBLE_DEVICES=0,1$", out, re.M), out


def test_job_on_the_mismatched_node_drains_it_and_status_says_why(
    cj: Cli, sandbox: Sandbox
) -> None:
    """2. gpu3's boards sit in another order than its node map says: the Prolog refuses it."""
    job = submit(cj, sandbox, TRAIN, "--gpus", "2", "--model", "A100", "--partition", "suspect")
    try:
        # What Slurm really does: requeue the job and hold it; drain the node. The hold's
        # reason shows while the job is still COMPLETING (its Epilog runs), so wait for
        # both: the job back in the queue, and held.
        row = wait_status(
            cj, job, lambda r: r["state"] == "PENDING" and "held" in (r["reason"] or "").lower()
        )
        assert "prolog" in row["explanation"].lower(), row
        assert f"scontrol release {job}" in row["explanation"], row
        # Slurm drains it as "Prolog error"; clusterjob then puts its own reason there.
        deadline = time.monotonic() + 30
        while not (node := sandbox.node("gpu3"))["Reason"].startswith("clusterjob:"):
            assert "DRAIN" in node["State"], node
            assert time.monotonic() < deadline, node
            time.sleep(1)
        assert node["Reason"].startswith(
            "clusterjob: model-mismatch: gpu3: slot 0 (0000:07:00.0): expected A100, found"
        ), node
        # The precise reason, for the admin, is in the node-local JSON log of the Prolog.
        records = [
            json.loads(line)
            for line in sandbox.layout.prolog_log.read_text().splitlines()
            if f'"{job}"' in line
        ]
        assert records, "no Prolog log record for the job"
        last = records[-1]
        assert (last["outcome"], last["action"]) == ("failed", "drain")
        assert any(f["check_id"] == "model-mismatch" for f in last["findings"]), last
        # The human view says the same in one table row.
        human = cj("status", job)
        assert "held" in human.stdout.lower() and "scontrol release" in human.stdout
    finally:
        cj("cancel", job)
        sandbox.resume("gpu3")


def test_impossible_request_fails_before_any_sbatch(
    cj: Cli, sandbox: Sandbox, tmp_path: Path
) -> None:
    """3. Three V100s per node where nodes have two: a clear error, and Slurm is not asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "sbatch-was-called"
    for tool in ("sbatch", "squeue", "sacct", "scontrol"):
        (bin_dir / tool).write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    proc = cj(
        "submit", TRAIN, "--gpus", "3", "--model", "V100", "--site", str(sandbox.site_path),
        extra_env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "no node has 3 V100 GPUs" in proc.stderr
    assert "V100: at most 2 per node" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


@pytest.mark.torch
def test_two_nodes_torchrun_rendezvous(cj: Cli, sandbox: Sandbox) -> None:
    """4. --nodes 2 --gpus 2: srun + torchrun, one worker per GPU, rendezvous on node one."""
    # torchrun comes from torch (CPU build), which scripts/test.sh installs: no skip here.
    assert importlib.util.find_spec("torch") is not None, "install torch: bash scripts/test.sh"
    # The job runs the user's interpreter; here the env with torch is the one running the tests.
    job = submit(
        cj, sandbox, TRAIN, "--gpus", "2", "--model", "A100", "--nodes", "2",
        "--python", sys.executable,
    )  # fmt: skip
    row = wait_status(cj, job, finished, timeout=180)
    out = logs(cj, job)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (row, out)
    # Several ranks share the output file: read each rank's one-line summary wherever it is.
    ranks = [
        m.groupdict()
        for m in re.finditer(
            r"rank-summary: rank=(?P<rank>\d+) local_rank=(?P<local_rank>\d+) "
            r"world_size=(?P<world_size>\d+) master_addr=(?P<master_addr>[\w.-]+) "
            r"slurmd_nodename=(?P<slurmd_nodename>[\w-]+) "
            r"cuda_visible_devices=(?P<cuda_visible_devices>[\d,]+)$",
            out,
            re.M,
        )
    ]
    assert sorted(int(r["rank"]) for r in ranks) == [0, 1, 2, 3], out
    assert {r["world_size"] for r in ranks} == {"4"}
    assert len({r["master_addr"] for r in ranks}) == 1 and ranks[0]["master_addr"] != "-"
    assert {r["slurmd_nodename"] for r in ranks} == {"gpu1", "gpu2"}
    for r in ranks:  # each node's workers share that node's two A100s
        assert r["cuda_visible_devices"] == "0,1", r
    # both nodes were preflighted
    assert len(re.findall(r"^preflight gpu[12]: OK", out, re.M)) == 2, out
    # one rank's lines, one node's lines (srun --label, torchrun --tee [rankN]:)
    node_of = {r["rank"]: r["slurmd_nodename"] for r in ranks}
    three = cj("logs", job, "--rank", "3")
    assert three.returncode == 0 and "rank=3 " in three.stdout, three
    assert all("[rank3]: " in line for line in three.stdout.splitlines()), three.stdout
    second = cj("logs", job, "--node", node_of["3"])
    assert second.returncode == 0, second.stderr
    shown = set(re.findall(r"\[rank(\d)\]: rank-summary", second.stdout))
    assert shown == {r for r, n in node_of.items() if n == node_of["3"]}, second.stdout


def test_array_and_dependency(cj: Cli, sandbox: Sandbox) -> None:
    """5. An array job, and a job that waits for it with --dependency=afterok."""
    array = submit(cj, sandbox, TRAIN, "--gpus", "1", "--model", "V100", "--array", "0-2")
    after = submit(
        cj, sandbox, TRAIN, "--gpus", "1", "--model", "A100", "--dependency", f"afterok:{array}"
    )
    row = wait_status(cj, after, finished, timeout=150)
    assert row["state"] == "COMPLETED", row
    # slurmdbd records the tasks' ends a moment after slurmctld: a CI run, asking right after
    # the dependent job ended, got only the task that ran last (8_2 of 8_0-8_2).
    want = {f"{array}_{i}" for i in range(3)}
    deadline = time.monotonic() + 30
    while True:
        tasks = sandbox.run("sacct", "-j", array, "-X", "-n", "-P", "--format=JobID,State")
        states = dict(line.split("|") for line in tasks.split())
        if want <= set(states) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert want <= set(states), states
    assert set(states.values()) == {"COMPLETED"}, states
    started = sandbox.run("sacct", "-j", f"{array},{after}", "-X", "-n", "-P",
                          "--format=JobID,Start,End")  # fmt: skip
    times = {j: (s, e) for j, s, e in (ln.split("|") for ln in started.split("\n") if ln)}
    assert times[after][0] >= max(e for j, (s, e) in times.items() if j != after)


def test_status_logs_cancel_through_a_job_life(cj: Cli, sandbox: Sandbox) -> None:
    """6. status for pending, running and finished jobs; logs; cancel."""
    # h1 has 8 H100s: a job holding all 8 makes a second one wait for Resources.
    first = submit(cj, sandbox, TRAIN, "--gpus", "8", "--model", "H100", "--", "--sleep", "60")
    second = submit(cj, sandbox, TRAIN, "--gpus", "8", "--model", "H100")
    try:
        running = wait_status(cj, first, lambda r: r["state"] == "RUNNING")
        assert running["nodes"] == "h1"
        pending = wait_status(cj, second, lambda r: r["state"] == "PENDING" and bool(r["reason"]))
        assert pending["reason"] in ("Resources", "Priority"), pending
        assert "GPU" in pending["explanation"], pending
        # logs of a running job: the preflight passed on all 8 H100s
        deadline = time.monotonic() + 30
        while "preflight h1: OK" not in (out := cj("logs", first).stdout):
            assert time.monotonic() < deadline, out
            time.sleep(1)
        assert cj("cancel", first).returncode == 0
        done = wait_status(cj, first, finished)
        assert done["state"] == "CANCELLED", done
        # the waiting job now gets the node and finishes
        second_done = wait_status(cj, second, finished)
        assert second_done["state"] == "COMPLETED", second_done
        table = cj("status", first, second).stdout
        assert re.search(rf"^{first}\s+CANCELLED", table, re.M), table
        assert re.search(rf"^{second}\s+COMPLETED", table, re.M), table
    finally:
        cj("cancel", first, second)


def test_shell_metacharacters_arrive_literally(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    """7. Hostile job arguments reach the program as they were typed; nothing executes."""
    pwned = tmp_path / "pwned"
    hostile = [
        f"$(touch {pwned})", f"`touch {pwned}`", f"'; touch {pwned}; '", "a\nb", "$HOME",
        "--lr=3e-4", "* ?", '"quoted"', "\\back\\slash",
    ]  # fmt: skip
    job = submit(cj, sandbox, TRAIN, "--gpus", "1", "--model", "V100", "--", *hostile)
    row = wait_status(cj, job, finished)
    assert row["state"] == "COMPLETED", row
    out = logs(cj, job)
    got = [
        ast.literal_eval(line.split("=", 1)[1])  # repr() written by examples/train.py
        for line in out.splitlines()
        if line.startswith("argv[")
    ]
    assert got == hostile
    assert not pwned.exists()
