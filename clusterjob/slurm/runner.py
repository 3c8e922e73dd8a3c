"""The one place that runs Slurm commands.

Every ``sbatch``/``squeue``/``sacct``/``scontrol``/``scancel``/``sinfo`` call goes through
``Runner.run``: one attempt has its own timeout, retries (for transient failures only) use
exponential backoff with jitter and all fit inside one overall deadline. Failures come back
as the typed errors of ``clusterjob.errors``, carrying the command, exit code and stderr.

Tests inject a fake ``exec`` function (``Runner(exec=...)``) instead of patching subprocess.

Where the commands run is the runner's ``Transport``: this machine (``LocalTransport``, the
default) or a cluster's login node over ssh (``SshTransport``, one shared connection; see
``clusterjob.slurm.ssh``). The transport also reads and writes the few files a remote job
needs (its log, a function job's pickles), through the same connection.

``CLUSTERJOB_SLURM_DEADLINE`` (seconds) caps everything one ``Runner`` does, attempts, retries
and pauses together, measured from its first command. Each clusterjob operation (a submission
with its look-ups, a status query, a cancel) uses one runner, so with the controller down it
gives up within that many seconds instead of the default windows (up to two minutes).
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from clusterjob import envvars
from clusterjob.errors import SlurmError, SlurmTransientError, SlurmUnavailable, UsageError
from clusterjob.process import run_in_group
from clusterjob.slurm.ssh import SSH_LOST, SshTarget, ssh_argv, ssh_failure

# stderr fragments that mean "the controller did not answer this time", not "your request is
# wrong": a failed command that printed one is retried (a submission only after its token was
# looked up, see SlurmClient.sbatch). Slurm's clients print either their own error text
# (src/common/slurm_errno.c, the same words in 22.05, 24.11 and 26.05) or, for a socket
# error, the C library's strerror text; a controller stopped or restarted mid-request gives
# any of them, depending on where the request was (connect, send, reply). See
# tests/fixtures/slurm/*_err_* and tests/test_slurm_runner.py.
SLURM_COMMUNICATION_ERRORS = (
    "Unable to contact slurm controller",  # (connect|send|receive|shutdown failure)
    "Socket timed out on send/recv operation",
    "Zero Bytes were transmitted or received",
    "Header lengths are longer than data received",
    "Unexpected message received",
    "Communication connection failure",
    "Message send failure",
    "Message receive failure",
    "Communication shutdown failure",
    "Unexpected missing socket error",
    "Connection forced closed by quiesce timeout",
    "Connection timed out establishing",
    "Connection timed out writing",
    "Connection timed out reading",
    "Kernel reported delayed socket error",
    "Process is shutting down and closing all communications",
    "Rate limit exceeded, please retry",  # momentarily | later (rl_enable)
    "Slurm backup controller in standby mode",
    "Controller is in standby mode, try a different controller",
    "Unable to connect to database",  # slurmdbd restarting (sacct)
)
SOCKET_ERRORS = (  # strerror(3) of the socket errnos a dropped connection gives
    "Connection reset by peer",
    "Connection refused",
    "Broken pipe",
    "Connection timed out",
    "Software caused connection abort",
    "Transport endpoint is not connected",
    "Network is unreachable",
    "No route to host",
    "Resource temporarily unavailable",
    "Interrupted system call",
)
TRANSIENT_MARKERS = (
    *SLURM_COMMUNICATION_ERRORS,
    *SOCKET_ERRORS,
    SSH_LOST,  # the ssh connection to a remote login node could not be made or was lost
)

# stderr fragments that mean "no Slurm config here": retrying cannot help.
NO_CONFIG_MARKERS = (
    "Could not establish a configuration source",
    "Unable to process configuration file",
)

DEFAULT_TIMEOUT = 30.0  # one attempt; Slurm clients wait MessageTimeout (10 s) per RPC try
DEFAULT_RETRY_WINDOW = 60.0  # overall deadline when the caller retries without giving one
DEADLINE_ENV = envvars.SLURM_DEADLINE


def deadline_from_env() -> float | None:
    """The ``CLUSTERJOB_SLURM_DEADLINE`` budget in seconds; None when unset."""
    text = os.environ.get(DEADLINE_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise UsageError(f"{DEADLINE_ENV}={text!r}: give a number of seconds greater than 0")
    return value


@dataclass(frozen=True)
class SlurmResult:
    """What a finished Slurm command printed; ``returncode`` is 0 unless built by a fake."""

    cmd: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


# exec(cmd, timeout, input) -> SlurmResult. Raises FileNotFoundError when the command is
# not installed and subprocess.TimeoutExpired when it ran past ``timeout``.
Exec = Callable[[Sequence[str], float, "str | None"], SlurmResult]


def subprocess_exec(
    cmd: Sequence[str], timeout: float, input: str | None, *, local_conf: bool = True
) -> SlurmResult:
    """Run ``cmd`` for real. Slurm clients print in the C locale; keep them that way.
    ``local_conf``: the command is a Slurm client of this machine (not ssh to another)."""
    conf = os.environ.get("SLURM_CONF")
    if local_conf and conf and not os.path.isfile(conf):
        # the clients would retry reading it for 60 s before saying so; say it now
        message = f"{cmd[0]}: SLURM_CONF={conf} does not exist: {NO_CONFIG_MARKERS[1]}"
        return SlurmResult(tuple(cmd), 1, "", message)
    return SlurmResult(tuple(cmd), *run_in_group(cmd, timeout, input))


def is_transient(stderr: str) -> bool:
    """Whether a failed command's stderr says the controller was unreachable or busy."""
    return any(marker.casefold() in stderr.casefold() for marker in TRANSIENT_MARKERS)


class LocalTransport:
    """Slurm's commands and files on this machine (a login node)."""

    remote = False
    label = ""  # the registry's host for jobs submitted here

    def exec(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        return subprocess_exec(cmd, timeout, input)

    def interactive(self, cmd: Sequence[str], env: Mapping[str, str] | None = None) -> int:
        """``cmd`` on this terminal, with ``env`` added to this process's environment."""
        return run_interactive(list(cmd), {**os.environ, **(env or {})})

    def read_bytes(self, path: str, offset: int = 0) -> bytes | None:
        """The file's bytes from ``offset``; None when it does not exist (yet)."""
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a private file (its directory made, owner only)."""
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror}") from None


# Remote file access in plain POSIX sh: no clusterjob needed on the login node.
_READ = 'test -f "$1" || exit 3; exec tail -c +"$2" -- "$1"'
_WRITE = 'umask 077; mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
FILE_TIMEOUT = 120.0


class SshTransport(LocalTransport):
    """Slurm's commands and files on a login node, over one shared OpenSSH connection."""

    remote = True

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        self.label = target.label

    def exec(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        argv = ssh_argv(self.target, cmd)
        result = subprocess_exec(argv, timeout, input, local_conf=False)
        lost = ssh_failure(self.target, result.returncode, result.stderr)
        if lost is not None:
            return SlurmResult(tuple(cmd), result.returncode, result.stdout, lost)
        return SlurmResult(tuple(cmd), result.returncode, result.stdout, result.stderr)

    def interactive(self, cmd: Sequence[str], env: Mapping[str, str] | None = None) -> int:
        """``cmd`` on the login node with a terminal (``ssh -t``); ``env``: only the variables
        the session adds (the remote login environment is the base)."""
        argv = ssh_argv(self.target, cmd, tty=True, env=env)
        return run_interactive(argv)

    def _bytes(self, script: str, path: str, arg: str, data: bytes | None) -> bytes | None:
        words = ("sh", "-c", script, "sh", path, arg)
        argv = ssh_argv(self.target, words)
        timeout = FILE_TIMEOUT
        try:
            proc = subprocess.run(
                argv,
                input=data,
                stdin=None if data is not None else subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmTransientError(
                list(words), None, f"{SSH_LOST} ({self.label}): no answer in {timeout:.0f}s"
            ) from None
        except FileNotFoundError:
            raise SlurmUnavailable(["ssh"], None, "ssh: command not found") from None
        stderr = proc.stderr.decode("utf-8", "replace")
        lost = ssh_failure(self.target, proc.returncode, stderr)
        if lost is not None:
            raise SlurmTransientError(list(words), proc.returncode, lost)
        if proc.returncode == 3 and script == _READ:
            return None
        if proc.returncode != 0:
            first = stderr.strip().splitlines()[0] if stderr.strip() else "no error output"
            raise UsageError(f"{self.label}:{path}: {first}")
        return proc.stdout

    def read_bytes(self, path: str, offset: int = 0) -> bytes | None:
        return self._bytes(_READ, path, str(offset + 1), None)

    def write_bytes(self, path: str, data: bytes) -> None:
        self._bytes(_WRITE, path, "", data)


Transport = LocalTransport  # the interface: LocalTransport's methods


class Runner:
    """Runs Slurm commands with timeouts, classification and bounded retries."""

    def __init__(
        self,
        exec: Exec | None = None,
        *,
        transport: LocalTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        base_delay: float = 0.5,
        max_delay: float = 8.0,
        rng: random.Random | None = None,
        budget: float | None = None,
    ) -> None:
        self.transport = transport or LocalTransport()
        self._exec = exec or self.transport.exec
        self._sleep = sleep
        self._clock = clock
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._rng = rng or random.Random()
        self.calls: int = 0  # attempts made; status tests count Slurm load with it
        # seconds for everything this runner does (default: $CLUSTERJOB_SLURM_DEADLINE)
        self.budget = budget if budget is not None else deadline_from_env()
        self._budget_end: float | None = None  # set at the first command

    def clock(self) -> float:
        return self._clock()

    def backoff(self, attempt: int, remaining: float) -> float:
        """Exponential backoff with full jitter (attempt 0 -> up to base_delay), capped."""
        ceiling = min(self._max_delay, self._base_delay * (2**attempt))
        return max(0.0, min(remaining, self._rng.uniform(ceiling / 2, ceiling)))

    def sleep(self, seconds: float) -> None:
        self._sleep(seconds)

    def run(
        self,
        cmd: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float | None = None,
        retry: bool = False,
        input: str | None = None,
    ) -> SlurmResult:
        """Run ``cmd``; return its result when it exits 0.

        ``deadline`` is an absolute ``clock()`` time by which everything, retries included,
        must be over (default: one attempt, or ``DEFAULT_RETRY_WINDOW`` when ``retry``).
        Permanent failures raise ``SlurmError`` at once; transient ones are retried when
        ``retry`` and raise ``SlurmTransientError`` otherwise; a transient failure that
        outlives the deadline raises ``SlurmUnavailable``.
        """
        cmd = list(cmd)
        start = self._clock()
        if deadline is None:
            deadline = start + (DEFAULT_RETRY_WINDOW if retry else timeout)
        end = self._budget_left(cmd, start)
        if end is not None:
            deadline = min(deadline, end)
        attempt = 0
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0 and attempt == 0:
                # the caller's deadline already passed: try once anyway, within the budget
                remaining = timeout if end is None else end - self._clock()
            error = self._attempt(cmd, min(timeout, remaining), input)
            if not isinstance(error, SlurmError):
                return error
            if not isinstance(error, SlurmTransientError):
                raise error
            remaining = deadline - self._clock()
            if not retry:
                raise error
            if remaining <= 0:
                waited = self._clock() - start
                raise SlurmUnavailable(
                    cmd,
                    error.returncode,
                    error.stderr,
                    hint=f"Slurm did not answer after {attempt + 1} tries in {waited:.0f}s; "
                    "the controller may be down or overloaded, try again later",
                ) from error
            self._sleep(self.backoff(attempt, remaining))
            attempt += 1

    def _budget_left(self, cmd: list[str], now: float) -> float | None:
        """The absolute end of this runner's budget (None: no budget); raise when spent."""
        if self.budget is None:
            return None
        if self._budget_end is None:
            self._budget_end = now + self.budget
        if self._budget_end - now <= 0:
            raise SlurmUnavailable(
                cmd,
                None,
                f"{cmd[0]} not run: the {DEADLINE_ENV}={self.budget:g}s budget for Slurm is spent",
                hint="the controller may be down or overloaded, try again later",
            )
        return self._budget_end

    def _attempt(
        self, cmd: list[str], timeout: float, input: str | None
    ) -> SlurmResult | SlurmError:
        self.calls += 1
        try:
            result = self._exec(cmd, timeout, input)
        except FileNotFoundError:
            raise SlurmUnavailable(
                cmd,
                None,
                f"{cmd[0]}: command not found",
                hint="Slurm client commands are not installed or not on PATH; run clusterjob "
                "on a login node of the cluster (or load the slurm module)",
            ) from None
        except subprocess.TimeoutExpired:
            return SlurmTransientError(
                cmd, None, f"{cmd[0]} did not finish within {timeout:.0f}s (killed)"
            )
        except OSError as exc:
            raise SlurmUnavailable(cmd, None, f"{cmd[0]}: {exc.strerror or exc}") from None
        if result.returncode == 0:
            return result
        if any(marker in result.stderr for marker in NO_CONFIG_MARKERS):
            raise SlurmUnavailable(
                cmd,
                result.returncode,
                result.stderr,
                hint="this machine has no usable Slurm config: run on a login node of the "
                "cluster, or point SLURM_CONF at the cluster's slurm.conf",
            )
        if is_transient(result.stderr):
            return SlurmTransientError(cmd, result.returncode, result.stderr)
        return SlurmError(cmd, result.returncode, result.stderr or result.stdout)


def run(
    cmd: list[str],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    deadline: float | None = None,
    retry: bool = False,
    input: str | None = None,
) -> SlurmResult:
    """Run one Slurm command with the default (real) runner. See ``Runner.run``."""
    return Runner().run(cmd, timeout=timeout, deadline=deadline, retry=retry, input=input)


def run_interactive(cmd: list[str], env: Mapping[str, str] | None = None) -> int:
    """Run a Slurm command attached to this terminal (``srun --pty``): no capture, no timeout,
    no retry (a person is on the other end); its exit status."""
    try:
        return subprocess.call(cmd, env=None if env is None else dict(env))
    except FileNotFoundError:
        raise SlurmUnavailable(cmd, None, f"{cmd[0]}: command not found") from None
