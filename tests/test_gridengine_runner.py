"""The one Grid Engine runner and its client: what is retried, what the errors carry, and
how a job the qmaster no longer knows reads."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from clusterjob.errors import (
    ExitCode,
    GridEngineError,
    GridEngineTransientError,
    GridEngineUnavailable,
    exit_code,
)
from clusterjob.gridengine.commands import GridEngineClient
from clusterjob.gridengine.parse import TaskRange, parse_qstat_xml
from clusterjob.gridengine.runner import GridEngineResult, Runner, is_transient
from clusterjob.gridengine.states import Outcome

FIXTURES = Path(__file__).parent / "fixtures" / "gridengine"


def recorded(name: str) -> str:
    """A recording's output, without the ``exit=N`` line record.sh appends."""
    return (FIXTURES / name).read_text().rstrip("\n").rpartition("\n")[0] + "\n"


class Commands:
    """A stateful fake: answers each command name from a queue of (rc, stdout, stderr)."""

    def __init__(self, answers: dict[str, list[tuple[int, str, str] | BaseException]]) -> None:
        self.answers = answers
        self.seen: list[list[str]] = []

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> GridEngineResult:
        self.seen.append(list(cmd))
        answer = self.answers[cmd[0]].pop(0)
        if isinstance(answer, BaseException):
            raise answer
        rc, out, err = answer
        return GridEngineResult(tuple(cmd), rc, out, err)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def runner(fake: Commands, clock: Clock | None = None) -> Runner:
    clock = clock or Clock()
    return Runner(fake, sleep=clock.sleep, clock=clock)


@pytest.mark.parametrize(
    ("stderr", "transient"),
    [
        ("error: commlib error: got select error (Connection refused)", True),
        ('unable to contact qmaster using port 6444 on host "master"', True),
        ("error: failed receiving gdi request response for mid=1 (got no message).", True),
        (recorded("qsub-refused-gpu5.txt"), False),
        (recorded("qsub-refused-unknown-complex.txt"), False),
        (recorded("qstat-j-missing.txt"), False),
        (recorded("qdel-missing.txt"), False),
    ],
)
def test_classification(stderr: str, transient: bool) -> None:
    assert is_transient(stderr) is transient


def test_a_refusal_is_not_retried_and_carries_the_command() -> None:
    fake = Commands({"qsub": [(1, "", recorded("qsub-refused-gpu5.txt"))]})
    with pytest.raises(GridEngineError) as info:
        runner(fake).run(["qsub", "job.sh"], retry=True)
    assert not isinstance(info.value, GridEngineTransientError)
    assert info.value.cmd == ["qsub", "job.sh"]
    assert info.value.returncode == 1
    assert "no suitable queues" in str(info.value)
    assert exit_code(info.value) == ExitCode.SLURM
    assert len(fake.seen) == 1


def test_an_unreachable_qmaster_is_retried_within_the_deadline() -> None:
    down = (1, "", "error: commlib error: got select error (Connection refused)")
    clock = Clock()
    fake = Commands({"qstat": [down] * 50})
    with pytest.raises(GridEngineUnavailable, match="did not answer") as info:
        runner(fake, clock).run(["qstat", "-xml"], retry=True, deadline=20.0)
    assert 1 < len(fake.seen) < 50
    assert clock.now <= 20.0
    assert exit_code(info.value) == ExitCode.SLURM_UNAVAILABLE


def test_a_retry_that_succeeds() -> None:
    down = (1, "", "unable to contact qmaster")
    fake = Commands({"qstat": [down, (0, "ok", "")]})
    assert runner(fake).run(["qstat"], retry=True).stdout == "ok"


def test_a_timeout_is_transient() -> None:
    fake = Commands({"qstat": [subprocess.TimeoutExpired(["qstat"], 1.0)]})
    with pytest.raises(GridEngineTransientError, match="did not finish"):
        runner(fake).run(["qstat"], timeout=1.0)


def test_missing_commands_say_so() -> None:
    fake = Commands({"qhost": [FileNotFoundError()]})
    with pytest.raises(GridEngineUnavailable, match="command not found"):
        runner(fake).run(["qhost"])


def test_no_cell() -> None:
    fake = Commands({"qstat": [(1, "", "error: please set the environment variable SGE_ROOT")]})
    with pytest.raises(GridEngineUnavailable, match="SGE_ROOT"):
        runner(fake).run(["qstat"], retry=True)
    assert len(fake.seen) == 1


def test_only_grid_engine_commands() -> None:
    with pytest.raises(ValueError):
        runner(Commands({})).run(["sbatch", "x"])


def test_client_submits_and_reads() -> None:
    fake = Commands(
        {
            "qsub": [(0, recorded("qsub-array.txt"), "")],
            "qstat": [(0, recorded("qstat-xml-array.xml"), "")],
            "qhost": [(0, recorded("qhost-F-gpu.txt"), "")],
        }
    )
    client = GridEngineClient(runner(fake))
    job = client.qsub("/tmp/job.sh")
    assert job.job_id.isdigit() and job.tasks == TaskRange(1, 4, 1)
    assert len(client.qstat()) == 3
    assert [h.name for h in client.hosts()] == ["host1", "host2", "host3"]
    assert fake.seen == [
        ["qsub", "/tmp/job.sh"],
        ["qstat", "-xml", "-r", "-u", "*"],
        ["qhost", "-F", "gpu,gpu_type"],
    ]


def test_client_unknown_jobs() -> None:
    missing = (1, "", recorded("qstat-j-missing.txt"))
    fake = Commands(
        {
            "qstat": [missing],
            "qacct": [(1, "", recorded("qacct-j-missing.txt"))],
            "qdel": [(1, "", recorded("qdel-missing.txt"))],
        }
    )
    client = GridEngineClient(runner(fake))
    assert client.job_detail("99") is None
    assert client.accounting("99") == []
    assert client.qdel(["99"]) is False


def test_qacct_before_any_job_ended_has_no_record_yet() -> None:
    """A new cluster has no accounting file until its first job ends: that is 'not yet',
    which status reads as the job still finishing (a first `wait` failed on it)."""
    fake = Commands({"qacct": [(1, "", recorded("qacct-j-no-accounting-file.txt"))]})
    assert GridEngineClient(runner(fake)).accounting("1") == []


def test_client_job_state_asks_qacct_only_once_qstat_forgot_the_job() -> None:
    listed = recorded("qstat-xml-held.xml")
    held = next(j for j in parse_qstat_xml(listed) if j.name == "held")
    fake = Commands(
        {
            "qstat": [(0, listed, ""), (0, recorded("qstat-xml-empty.xml"), "")] * 2,
            "qacct": [
                (0, recorded("qacct-j-exit3.txt"), ""),
                (1, "", recorded("qacct-j-missing.txt")),
            ],
        }
    )
    client = GridEngineClient(runner(fake))
    assert client.job_state(held.job_id) == "PENDING"
    assert client.job_state("12") == Outcome("FAILED", 3, "")
    assert [c[0] for c in fake.seen] == ["qstat", "qstat", "qacct"]
    fake.answers["qstat"] = [(0, recorded("qstat-xml-empty.xml"), "")]
    assert client.job_state("999999") is None
