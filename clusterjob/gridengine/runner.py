"""The one place that runs Grid Engine commands.

Every ``qsub``/``qstat``/``qacct``/``qdel``/``qhost``/``qconf`` call goes through
``Runner.run``: each attempt has its own timeout, a failure that says the qmaster did not
answer is retried with backoff inside one deadline, and every failure comes back as a typed
error of ``clusterjob.errors`` carrying the command, exit code and stderr.

Tests inject a fake ``exec`` function (``Runner(exec=...)``) instead of patching subprocess.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from clusterjob.errors import GridEngineError, GridEngineTransientError, GridEngineUnavailable
from clusterjob.process import run_in_group

COMMANDS = ("qsub", "qstat", "qacct", "qdel", "qhost", "qconf")

# stderr fragments of a qmaster that did not answer this time (commlib and GDI errors of
# Son of Grid Engine 8.1.9's clients), as opposed to a refused request: worth a retry.
TRANSIENT_MARKERS = (
    "unable to contact qmaster",
    "unable to send message to qmaster",
    "failed receiving gdi request",
    "can't connect to service",
    "commlib error",
    "got select error",
    "connection refused",
    "connection reset by peer",
    "qmaster is not alive",
)
# stderr fragments of a machine with no usable cell: retrying cannot help.
NO_CELL_MARKERS = (
    "please set the environment variable SGE_ROOT",
    "cell directory",
    "can't read act_qmaster",
    "unable to read qmaster name",
)

DEFAULT_TIMEOUT = 30.0  # one attempt
DEFAULT_RETRY_WINDOW = 60.0  # all attempts of a retried command


@dataclass(frozen=True)
class GridEngineResult:
    """What a finished Grid Engine command printed; ``returncode`` is 0 unless a fake's."""

    cmd: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


# exec(cmd, timeout, input) -> GridEngineResult. Raises FileNotFoundError when the command is
# not installed and subprocess.TimeoutExpired when it ran past ``timeout``.
Exec = Callable[[Sequence[str], float, "str | None"], GridEngineResult]


def subprocess_exec(cmd: Sequence[str], timeout: float, input: str | None) -> GridEngineResult:
    """Run ``cmd`` for real (``clusterjob.process.run_in_group``: the C locale, in which qacct's
    dates and qstat's words are parsed; its own process group, so a timeout ends all of it)."""
    return GridEngineResult(tuple(cmd), *run_in_group(cmd, timeout, input))


def is_transient(stderr: str) -> bool:
    """Whether a failed command's stderr says the qmaster was unreachable this time."""
    text = stderr.casefold()
    return any(marker.casefold() in text for marker in TRANSIENT_MARKERS)


class Runner:
    """Runs Grid Engine commands with timeouts, classification and bounded retries."""

    def __init__(
        self,
        exec: Exec | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        base_delay: float = 0.5,
        max_delay: float = 8.0,
        rng: random.Random | None = None,
    ) -> None:
        self._exec = exec or subprocess_exec
        self._sleep = sleep
        self._clock = clock
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._rng = rng or random.Random()
        self.calls = 0  # attempts made

    def clock(self) -> float:
        return self._clock()

    def run(
        self,
        cmd: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float | None = None,
        retry: bool = False,
        input: str | None = None,
    ) -> GridEngineResult:
        """Run ``cmd``; its result when it exits 0.

        A refused request raises ``GridEngineError`` at once; a qmaster that did not answer
        raises ``GridEngineTransientError``, or with ``retry`` is asked again until
        ``deadline`` (an absolute ``clock()`` time; default ``DEFAULT_RETRY_WINDOW`` from now),
        then raises ``GridEngineUnavailable``.
        """
        cmd = list(cmd)
        if not cmd or cmd[0] not in COMMANDS:
            raise ValueError(f"not a Grid Engine command: {cmd[:1]}")
        start = self._clock()
        if deadline is None:
            deadline = start + (DEFAULT_RETRY_WINDOW if retry else timeout)
        attempt = 0
        while True:
            remaining = max(deadline - self._clock(), 1.0 if attempt == 0 else 0.0)
            outcome = self._attempt(cmd, min(timeout, remaining), input)
            if isinstance(outcome, GridEngineResult):
                return outcome
            if not isinstance(outcome, GridEngineTransientError) or not retry:
                raise outcome
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise GridEngineUnavailable(
                    cmd,
                    outcome.returncode,
                    outcome.stderr,
                    hint=f"the qmaster did not answer after {attempt + 1} tries in "
                    f"{self._clock() - start:.0f}s; it may be down, try again later",
                ) from outcome
            ceiling = min(self._max_delay, self._base_delay * (2**attempt))
            self._sleep(max(0.0, min(remaining, self._rng.uniform(ceiling / 2, ceiling))))
            attempt += 1

    def _attempt(
        self, cmd: list[str], timeout: float, input: str | None
    ) -> GridEngineResult | GridEngineError:
        self.calls += 1
        try:
            result = self._exec(cmd, timeout, input)
        except FileNotFoundError:
            raise GridEngineUnavailable(
                cmd,
                None,
                f"{cmd[0]}: command not found",
                hint="Grid Engine's client commands are not installed or not on PATH; run "
                "clusterjob on a submit host of the cluster (with SGE_ROOT set)",
            ) from None
        except subprocess.TimeoutExpired:
            return GridEngineTransientError(
                cmd, None, f"{cmd[0]} did not finish within {timeout:.0f}s (killed)"
            )
        except OSError as exc:
            raise GridEngineUnavailable(cmd, None, f"{cmd[0]}: {exc.strerror or exc}") from None
        if result.returncode == 0:
            return result
        stderr = result.stderr or result.stdout  # qsub prints some refusals on stdout
        if any(marker.casefold() in stderr.casefold() for marker in NO_CELL_MARKERS):
            raise GridEngineUnavailable(
                cmd,
                result.returncode,
                stderr,
                hint="this machine has no usable Grid Engine cell: set SGE_ROOT (and SGE_CELL) "
                "as the cluster's settings.sh does",
            )
        if is_transient(stderr):
            return GridEngineTransientError(cmd, result.returncode, stderr)
        return GridEngineError(cmd, result.returncode, stderr)
