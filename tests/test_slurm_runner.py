"""The one Slurm runner: which failures are retried, how long, and what the errors carry."""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from clusterjob.errors import SlurmError, SlurmTransientError, SlurmUnavailable, exit_code
from clusterjob.slurm.runner import Runner, SlurmResult, is_transient

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


@pytest.mark.parametrize(
    ("name", "transient"),
    [
        ("squeue_err_socket_timeout.stderr.txt", True),
        ("sbatch_err_socket_timeout.stderr.txt", True),
        ("squeue_err_no_controller.stderr.txt", True),
        ("sbatch_err_no_controller.stderr.txt", True),
        ("scontrol_err_no_controller.stderr.txt", True),
        ("sbatch_err_partition.stderr.txt", False),
        ("sbatch_err_invalid_gres.stderr.txt", False),
        ("sbatch_err_bad_gres_type.stderr.txt", False),
        ("sbatch_err_missing_script.stderr.txt", False),
        ("scontrol_show_job_unknown.stderr.txt", False),
        ("sacct_err_accounting_disabled.stderr.txt", False),
    ],
)
def test_recorded_failures_are_classified(name: str, transient: bool) -> None:
    assert is_transient((FIXTURES / name).read_text()) is transient


@pytest.mark.parametrize(
    "stderr",
    [
        "sbatch: error: Batch job submission failed: Unexpected message received",
        "squeue: error: Resource temporarily unavailable",
        "slurm_load_jobs error: Zero Bytes were transmitted or received",
    ],
)
def test_other_transient_messages(stderr: str) -> None:
    assert is_transient(stderr)


# How each client prints a failed request: its own prefix, then Slurm's error text.
CLIENT_SHAPES = (
    "sbatch: error: Batch job submission failed: {}",
    "squeue: error: {}",
    "slurm_load_jobs error: {}",
    "scontrol: error: {}",
    "sacct: error: Problem talking to the database: {}",
    "scancel: error: Kill job error on job id 12: {}",
)
# What a controller stopped or restarted mid-request makes the clients print (slurm_errno.c,
# the same words in 22.05, 24.11 and 26.05, and strerror(3) for socket errnos): each one, in
# each client's shape, is transient. "Connection reset by peer" is the one 26.05's sbatch
# printed during a controller restart that used to end a sweep's submission.
CONTROLLER_GONE = (
    "Unable to contact slurm controller (connect failure)",
    "Unable to contact slurm controller (send failure)",
    "Unable to contact slurm controller (receive failure)",
    "Unable to contact slurm controller (shutdown failure)",
    "Socket timed out on send/recv operation",
    "Zero Bytes were transmitted or received",
    "Header lengths are longer than data received",
    "Communication connection failure",
    "Message send failure",
    "Message receive failure",
    "Communication shutdown failure",
    "Connection timed out establishing",
    "Connection timed out reading",
    "Process is shutting down and closing all communications",
    "Rate limit exceeded, please retry momentarily",
    "Rate limit exceeded, please retry later",
    "Controller is in standby mode, try a different controller",
    "Unable to connect to database",
    "Connection reset by peer",
    "Connection refused",
    "Broken pipe",
    "Connection timed out",
    "Transport endpoint is not connected",
    "Software caused connection abort",
)


@pytest.mark.parametrize("shape", CLIENT_SHAPES)
@pytest.mark.parametrize("text", CONTROLLER_GONE)
def test_every_controller_gone_message_is_transient(shape: str, text: str) -> None:
    assert is_transient(shape.format(text))


# The request itself is wrong: retrying cannot help, so none of these is transient.
REQUEST_WRONG = (
    "Invalid partition name specified",
    "Invalid generic resource (gres) specification",
    "Requested node configuration is not available",
    "Invalid account or account/partition combination specified",
    "Invalid qos specification",
    "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
    "Requested time limit is invalid (missing or exceeds some limit)",
    "Invalid job id specified",
    "Job dependency problem",
    "Protocol authentication error",
    "Invalid authentication credential",
    "Access/permission denied",
)


@pytest.mark.parametrize("shape", CLIENT_SHAPES)
@pytest.mark.parametrize("text", REQUEST_WRONG)
def test_a_wrong_request_is_not_transient(shape: str, text: str) -> None:
    assert not is_transient(shape.format(text))


class Scripted:
    """exec that plays a list of outcomes: a SlurmResult-ish tuple, or an exception."""

    def __init__(self, outcomes: list[object]) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[list[str], float]] = []
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        self.calls.append((list(cmd), timeout))
        outcome = self.outcomes.pop(0)
        if outcome == "timeout":
            self.now += timeout
            raise subprocess.TimeoutExpired(list(cmd), timeout)
        if isinstance(outcome, BaseException):
            raise outcome
        code, out, err = outcome  # type: ignore[misc]
        self.now += 0.1
        return SlurmResult(tuple(cmd), code, out, err)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def runner(self) -> Runner:
        return Runner(self, sleep=self.sleep, clock=lambda: self.now, rng=random.Random(1))


TIMED_OUT = (1, "", "slurm_load_jobs error: Socket timed out on send/recv operation")
NO_CONTROLLER = (1, "", "slurm_load_jobs error: Unable to contact slurm controller")


def test_transient_failures_are_retried_with_growing_backoff() -> None:
    fake = Scripted([TIMED_OUT, NO_CONTROLLER, "timeout", (0, "12\n", "")])
    result = fake.runner().run(["squeue"], timeout=5, retry=True)
    assert result.stdout == "12\n"
    assert len(fake.calls) == 4
    assert len(fake.sleeps) == 3
    # full jitter in [ceiling/2, ceiling], ceilings 0.5, 1, 2
    for sleep, ceiling in zip(fake.sleeps, (0.5, 1.0, 2.0), strict=True):
        assert ceiling / 2 <= sleep <= ceiling


def test_permanent_failure_is_not_retried_and_carries_command_and_stderr() -> None:
    stderr = (FIXTURES / "sbatch_err_partition.stderr.txt").read_text()
    fake = Scripted([(1, "", stderr)])
    with pytest.raises(SlurmError) as info:
        fake.runner().run(["sbatch", "--parsable", "job.sh"], timeout=5, retry=True)
    exc = info.value
    assert not isinstance(exc, SlurmTransientError)
    assert exc.cmd == ["sbatch", "--parsable", "job.sh"]
    assert exc.returncode == 1
    assert "Invalid partition name specified" in exc.stderr
    assert len(fake.calls) == 1
    assert exit_code(exc) == 3


def test_transient_without_retry_raises_transient_after_one_try() -> None:
    fake = Scripted([TIMED_OUT])
    with pytest.raises(SlurmTransientError):
        fake.runner().run(["sbatch", "x"], timeout=5, retry=False)
    assert len(fake.calls) == 1


def test_retries_stop_at_the_overall_deadline() -> None:
    fake = Scripted(["timeout"] * 50)
    runner = fake.runner()
    with pytest.raises(SlurmUnavailable) as info:
        runner.run(["squeue"], timeout=10, deadline=30.0, retry=True)
    assert "did not answer" in str(info.value)
    assert fake.now <= 30.0 + 10
    # each attempt's timeout shrinks to what is left of the deadline
    assert all(t <= 10 for _, t in fake.calls)
    assert 2 <= len(fake.calls) < 10
    assert exit_code(info.value) == 4


def test_missing_command_is_unavailable_with_a_clear_message() -> None:
    with pytest.raises(SlurmUnavailable) as info:
        Runner().run(["sbatch-not-installed-here"], timeout=5, retry=True)
    message = str(info.value)
    assert "command not found" in message
    assert "login node" in message


def test_no_slurm_config_is_unavailable_at_once() -> None:
    stderr = (FIXTURES / "squeue_err_no_config.stderr.txt").read_text()
    fake = Scripted([(1, "", stderr)])
    with pytest.raises(SlurmUnavailable) as info:
        fake.runner().run(["squeue"], timeout=5, retry=True)
    assert "SLURM_CONF" in str(info.value)
    assert len(fake.calls) == 1


def test_real_subprocess_timeout_is_transient() -> None:
    with pytest.raises(SlurmTransientError) as info:
        Runner().run(["sleep", "5"], timeout=0.3, retry=False)
    assert info.value.returncode is None
    assert "did not finish within" in info.value.stderr


def test_real_subprocess_success_and_failure() -> None:
    runner = Runner()
    assert runner.run(["sh", "-c", "echo 7"], timeout=5).stdout == "7\n"
    with pytest.raises(SlurmError) as info:
        runner.run(["sh", "-c", "echo 'sbatch: error: bad' >&2; exit 2"], timeout=5)
    assert (info.value.returncode, info.value.stderr) == (2, "sbatch: error: bad")
    assert runner.calls == 2


def test_missing_slurm_conf_file_is_reported_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nope.conf"))
    started = time.monotonic()
    with pytest.raises(SlurmUnavailable) as info:
        Runner().run(["squeue"], timeout=30, retry=True)
    assert time.monotonic() - started < 5  # squeue itself would retry for 60 s
    assert "nope.conf does not exist" in str(info.value)
