"""Slurm misbehaving under the real `clusterjob` command: lost replies, refused submissions,
the controller stopped in the middle of a sweep, the controller down.

The promise checked here is the one a researcher relies on: every `clusterjob submit` ends
with exactly one Slurm job and one registry record, or with a clear error and none. Jobs are
submitted held (`--sbatch-arg=--hold`), so a sweep costs the two cores nothing (and, never
eligible, they stay out of sacct: they are counted in squeue, the controller's own saved
state after its restart); each test cancels what it submitted and leaves the controller up
and every node answering.

Figures (faults injected, jobs lost, jobs duplicated) are printed: `pytest -s` shows them.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clusterjob.jobs.registry import REGISTRY_FILE, Registry
from clusterjob.sandbox import cluster
from clusterjob.slurm.runner import DEADLINE_ENV, Runner, SlurmResult

from .conftest import Cli, Sandbox

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
TINY = ("--gpus", "1", "--model", "V100", "--sbatch-arg=--hold")


def figures(test: str, **values: object) -> None:
    """The numbers a reader of the README wants, one line per test (`pytest -s` shows it)."""
    print(f"\nfault figures: {test}: " + ", ".join(f"{k}={v}" for k, v in values.items()))


# --- the budget, on a fake clock (no Slurm needed) ------------------------------------------


class _Stalled:
    """A controller that never answers: each attempt runs out its whole timeout."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timeouts: list[float] = []

    def exec(self, cmd, timeout, input) -> SlurmResult:  # noqa: A002 - the Exec signature
        self.timeouts.append(timeout)
        self.now += timeout
        raise subprocess.TimeoutExpired(list(cmd), timeout)

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_budget_bounds_every_attempt_and_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """CLUSTERJOB_SLURM_DEADLINE=5 holds a retrying query, and the next one, to 5 s in all."""
    monkeypatch.setenv(DEADLINE_ENV, "5")
    slurm = _Stalled()
    runner = Runner(slurm.exec, sleep=slurm.sleep, clock=lambda: slurm.now, rng=random.Random(0))
    with pytest.raises(Exception, match="did not answer") as first:
        runner.run(["squeue"], timeout=30, retry=True)
    assert type(first.value).__name__ == "SlurmUnavailable"
    assert slurm.now <= 5.0 and max(slurm.timeouts) <= 5.0, slurm.timeouts
    with pytest.raises(Exception, match=r"budget for Slurm is spent"):
        runner.run(["sacct"], timeout=30, retry=True)
    assert slurm.now <= 5.0


def test_without_budget_windows_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEADLINE_ENV, raising=False)
    slurm = _Stalled()
    runner = Runner(slurm.exec, sleep=slurm.sleep, clock=lambda: slurm.now, rng=random.Random(0))
    with pytest.raises(Exception, match="did not answer"):
        runner.run(["squeue"], timeout=30, retry=True)
    assert slurm.timeouts[0] == 30 and slurm.now >= 60


# --- the real cluster -----------------------------------------------------------------------


@pytest.fixture
def job_name(sandbox: Sandbox) -> Iterator[str]:
    """A job name unique to the test: Slurm is counted by it, and its jobs cancelled after."""
    name = f"fault-{uuid.uuid4().hex[:10]}"
    yield name
    sandbox.run("scancel", f"--name={name}", check=False)


def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "data" / REGISTRY_FILE)


def slurm_jobs(sandbox: Sandbox, name: str) -> dict[str, str]:
    """Every job Slurm holds with this name (any state): job id -> comment."""
    out = sandbox.run("squeue", "--states=all", f"--name={name}", "-h", "-o", "%i|%k")
    return dict(line.split("|", 1) for line in out.splitlines() if line)


def fake_sbatch(tmp_path: Path, body: str) -> tuple[dict[str, str], Path]:
    """An `sbatch` first on PATH that runs ``body`` (sh) with $REAL_SBATCH and $CALLS set."""
    real = subprocess.run(["which", "sbatch"], capture_output=True, text=True, check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch-calls"
    wrapper = bin_dir / "sbatch"
    wrapper.write_text(
        f'#!/bin/sh\nREAL_SBATCH={real.stdout.strip()}\nCALLS={calls}\necho x >>"$CALLS"\n{body}'
    )
    wrapper.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


def submitted_id(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"Submitted job (\d+)", proc.stdout)
    assert match, proc.stdout
    return match.group(1)


def wait_cluster_healthy(sandbox: Sandbox, timeout: float = 60) -> None:
    """`scontrol ping` says UP and no node is down or not responding (the next test's start)."""
    deadline = time.monotonic() + timeout
    while True:
        ping = sandbox.run("scontrol", "ping", check=False)
        states = sandbox.run("sinfo", "-h", "-N", "-o", "%T", check=False, timeout=15).split()
        bad = [s for s in states if s.endswith("*") or s.startswith(("down", "unk", "not_resp"))]
        if "is UP" in ping and states and not bad:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"cluster not healthy after {timeout}s: {ping!r} {states}")
        time.sleep(0.5)


@pytest.fixture
def controller(sandbox: Sandbox) -> Iterator[Callable[[], None]]:
    """stop() takes slurmctld down; it is started again (and waited for) whatever happens."""

    def stop() -> None:
        assert cluster.stop_daemon(sandbox.state_dir, "slurmctld"), "slurmctld was not running"

    try:
        yield stop
    finally:
        cluster.start_slurmctld(sandbox.state_dir)
        wait_cluster_healthy(sandbox)


# What sbatch printed when the controller went away mid-request (22.05's timeout; 26.05 said
# "Connection reset by peer" during a restart and that submission used to be lost).
LOST_REPLIES = (
    "sbatch: error: Socket timed out on send/recv operation",
    "sbatch: error: Batch job submission failed: Connection reset by peer",
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
    "(receive failure)",
    "sbatch: error: Batch job submission failed: Zero Bytes were transmitted or received",
)


@pytest.mark.slurm
@pytest.mark.parametrize("said", LOST_REPLIES)
def test_lost_sbatch_reply_still_one_job(
    cj: Cli, sandbox: Sandbox, tmp_path: Path, job_name: str, said: str
) -> None:
    """(a) sbatch creates the job, then reports the connection lost: no second job."""
    path_env, calls = fake_sbatch(
        tmp_path, f'"$REAL_SBATCH" "$@" >/dev/null || exit $?\necho "{said}" >&2\nexit 1\n'
    )
    proc = cj("submit", TRAIN, "--site", str(sandbox.site_path), *TINY, "--job-name", job_name,
              extra_env=path_env)  # fmt: skip
    job = submitted_id(proc)
    in_slurm = slurm_jobs(sandbox, job_name)
    records = registry(tmp_path).all()
    assert list(in_slurm) == [job], in_slurm
    assert [r.job_id for r in records] == [job]
    assert in_slurm[job] == f"clusterjob:{records[0].token}"
    assert len(calls.read_text().split()) == 1  # found by its token, never sent again
    figures("lost sbatch reply", faults=1, jobs=len(in_slurm), duplicated=len(in_slurm) - 1)


@pytest.mark.slurm
@pytest.mark.parametrize("said", LOST_REPLIES[:2])
def test_refused_sbatch_is_sent_again_once(
    cj: Cli, sandbox: Sandbox, tmp_path: Path, job_name: str, said: str
) -> None:
    """(b) the first sbatch fails before creating a job (controller busy): one job in the end."""
    marker = tmp_path / "refused-once"
    path_env, calls = fake_sbatch(
        tmp_path,
        f'if [ ! -e {marker} ]; then\n  touch {marker}\n  echo "{said}" >&2\n  exit 1\nfi\n'
        'exec "$REAL_SBATCH" "$@"\n',
    )
    proc = cj("submit", TRAIN, "--site", str(sandbox.site_path), *TINY, "--job-name", job_name,
              extra_env=path_env)  # fmt: skip
    job = submitted_id(proc)
    assert list(slurm_jobs(sandbox, job_name)) == [job]
    assert [r.job_id for r in registry(tmp_path).all()] == [job]
    assert len(calls.read_text().split()) == 2
    figures("refused sbatch", faults=1, jobs=1, lost=0, duplicated=0)


@pytest.mark.slurm
def test_controller_restart_during_a_sweep_of_50(
    cj: Cli,
    sandbox: Sandbox,
    tmp_path: Path,
    job_name: str,
    controller: Callable[[], None],
) -> None:
    """(c) 50 submissions in a row; slurmctld is stopped three times, each at a random moment
    of a random submission (before, during or after its sbatch: the client then sees a refused
    connect, a reset connection or a lost reply) and kept down 2-6 s: every submission ends
    with exactly one job and one record. The seed is printed; CLUSTERJOB_FAULT_SEED replays it."""
    intended = 50
    seed = int(os.environ.get("CLUSTERJOB_FAULT_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    # which submission each outage starts in, how far into it, and how long it lasts
    plan = [(rng.randrange(5, 14), rng.uniform(0, 1.5), rng.uniform(2, 6))]
    plan.append((plan[-1][0] + rng.randrange(6, 12), rng.uniform(0, 1.5), rng.uniform(2, 6)))
    plan.append((plan[-1][0] + rng.randrange(6, 12), rng.uniform(0, 1.5), rng.uniform(2, 6)))
    started = [threading.Event() for _ in range(intended)]
    outages: list[tuple[float, float]] = []

    def take_controller_down() -> None:
        for index, into, down in plan:
            if not started[index].wait(timeout=300):
                return
            time.sleep(into)
            begin = time.monotonic()
            controller()
            time.sleep(down)
            cluster.start_slurmctld(sandbox.state_dir)
            outages.append((begin, time.monotonic()))

    fault = threading.Thread(target=take_controller_down, daemon=True)
    fault.start()
    results = []
    for i in range(intended):
        began = time.monotonic()
        started[i].set()
        proc = cj("submit", TRAIN, "--site", str(sandbox.site_path), *TINY,
                  "--job-name", job_name, "--", "--exit-code", "0", "--index", str(i))  # fmt: skip
        results.append((proc, began, time.monotonic()))
    fault.join(timeout=300)
    assert len(outages) == len(plan), f"the controller was not restarted (seed {seed})"

    failed = [(p.returncode, p.stderr) for p, _, _ in results if p.returncode != 0]
    assert not failed, (seed, failed)
    reported = [submitted_id(p) for p, _, _ in results]
    in_slurm = slurm_jobs(sandbox, job_name)
    records = registry(tmp_path).all()
    tokens = [r.token for r in records]
    hit = sum(1 for _, b, e in results for s, u in outages if e > s and b < u)
    figures(
        "controller restarts in a sweep",
        seed=seed,
        intended=intended,
        in_squeue=len(in_slurm),
        registry=len(records),
        submissions_during_outages=hit,
        outages_s=[round(u - s, 1) for s, u in outages],
        slowest_submit_s=round(max(e - b for _, b, e in results), 1),
        lost=intended - len(set(in_slurm)),
        duplicated=len(in_slurm) - len(set(in_slurm.values())),
    )
    assert hit >= len(plan), seed  # each fault really met a submission
    assert sorted(in_slurm) == sorted(reported) == sorted(r.job_id for r in records), seed
    assert len(set(reported)) == intended
    assert len(set(tokens)) == intended
    assert sorted(in_slurm.values()) == sorted(f"clusterjob:{t}" for t in tokens)


@pytest.mark.slurm
def test_controller_down_every_command_ends_within_its_deadline(
    cj: Cli,
    sandbox: Sandbox,
    tmp_path: Path,
    job_name: str,
    controller: Callable[[], None],
) -> None:
    """(d) status, submit, cancel, logs with slurmctld down: each gives up within
    CLUSTERJOB_SLURM_DEADLINE with one line and a non-zero exit, and submits nothing."""
    job = submitted_id(
        cj("submit", TRAIN, "--site", str(sandbox.site_path), *TINY, "--job-name", job_name)
    )
    controller()
    budget = 4.0
    env = {DEADLINE_ENV: str(budget)}
    commands = {
        "status": ("status",),
        "status JOB": ("status", job),
        "submit": ("submit", TRAIN, "--site", str(sandbox.site_path), *TINY,
                   "--job-name", job_name),
        "cancel": ("cancel", job),
        "logs": ("logs", job),
    }  # fmt: skip
    took = {}
    for what, args in commands.items():
        began = time.monotonic()
        proc = cj(*args, extra_env=env, timeout=60)
        took[what] = time.monotonic() - began
        assert proc.returncode == 4, (what, proc.returncode, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1, (what, proc.stderr)
        assert proc.stderr.startswith("clusterjob: error: "), (what, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert "Unable to contact slurm controller" in proc.stderr or "did not finish" in (
            proc.stderr
        ), (what, proc.stderr)
        # the budget, plus starting Python on two busy cores
        assert took[what] < budget + 6, (what, took[what], proc.stderr)
    # the refused submission left nothing behind once the controller is back
    cluster.start_slurmctld(sandbox.state_dir)
    wait_cluster_healthy(sandbox)
    assert list(slurm_jobs(sandbox, job_name)) == [job]
    assert [r.job_id for r in registry(tmp_path).all()] == [job]
    figures(
        "controller down",
        budget_s=budget,
        **{what.replace(" ", "_") + "_s": round(t, 1) for what, t in took.items()},
    )


@pytest.mark.slurm
def test_a_daemon_restarted_from_a_removed_directory_leaves_jobs_output_clean(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slurmd restarted by a caller whose working directory is then removed (a test's
    temporary directory, pruned by a later run) used to keep that directory as its own: every
    job step it started then printed "slurmstepd: error: Unable to get current working
    directory" into the job's output, which a later test read as the job's first line."""
    node = "gpu1"
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    try:
        assert cluster.stop_daemon(sandbox.state_dir, f"slurmd-{node}")
        cluster.start_slurmctld(sandbox.state_dir)  # starts the missing slurmd again
    finally:
        monkeypatch.chdir(sandbox.workdir)
        caller.rmdir()
    wait_cluster_healthy(sandbox)
    out = tmp_path / "out.txt"
    job = sandbox.sbatch("-w", node, "-o", str(out), "--wrap", "echo hello")
    assert sandbox.wait_job(job)["JobState"] == "COMPLETED"
    assert out.read_text() == "hello\n"
