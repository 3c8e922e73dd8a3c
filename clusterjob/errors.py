"""The one exception hierarchy of clusterjob, and the one place that maps it to exit codes.

Every error a user can cause or meet is a ``ClusterjobError`` with a one-line message.
The CLI (and the Slurm hook entry points) catch it, print ``clusterjob: error: <message>``
and exit with ``exit_code(exc)``. A traceback is shown only with ``--debug``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum, IntEnum

from clusterjob.record import Record


class ExitCode(IntEnum):
    """What the ``clusterjob`` process exits with; scripts and the Slurm hooks rely on them."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    SLURM = 3
    SLURM_UNAVAILABLE = 4
    NVML = 5
    REGISTRY = 6
    INTERNAL = 70  # EX_SOFTWARE: a bug in clusterjob
    INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, or an aborted prompt


class ClusterjobError(Exception):
    """Base of every error clusterjob reports to a person."""


class UsageError(ClusterjobError):
    """Bad command-line input: an unknown model, an impossible GPU request, a bad job id."""


class ConfigIssue(Record):
    """One problem in a site config, located as ``file:line: key.path: message``."""

    __slots__ = ("file", "line", "key_path", "message", "warning")

    file: str
    line: int | None
    key_path: str
    message: str
    warning: bool

    def __init__(
        self, file: str, line: int | None, key_path: str, message: str, warning: bool = False
    ) -> None:
        self._fill(file, line, key_path, message, warning)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        path = f" {self.key_path}:" if self.key_path else ""
        kind = " warning:" if self.warning else ""
        return f"{where}:{kind}{path} {self.message}"


class ConfigError(ClusterjobError):
    """A site config (or template) that cannot be used; carries every issue found at once."""

    def __init__(self, issues: list[ConfigIssue] | ConfigIssue) -> None:
        self.issues = [issues] if isinstance(issues, ConfigIssue) else list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class SiteNotFound(ClusterjobError):
    """No site config could be found through the documented search order."""


class SchedulerCommandError(ClusterjobError):
    """A scheduler's client command failed. Carries the command, its exit code and its
    stderr; the message names the command and the first line it printed."""

    def __init__(self, cmd: list[str], returncode: int | None, stderr: str, hint: str = "") -> None:
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stderr = stderr.strip()
        self.hint = hint
        first = self.stderr.splitlines()[0] if self.stderr else "no error output"
        msg = f"{cmd[0]} failed (exit {returncode}): {first}"
        if hint:
            msg += f" -- {hint}"
        super().__init__(msg)


class SlurmError(SchedulerCommandError):
    """A Slurm command failed."""


class SlurmTransientError(SlurmError):
    """A Slurm failure worth retrying: controller unreachable, socket timeout, our own timeout."""


class SlurmUnavailable(SlurmError):
    """Slurm could not be reached within the overall deadline, or its commands are not installed."""


class SubmissionUncertain(SlurmUnavailable):
    """sbatch may or may not have created the job, and Slurm could not be asked: the
    submission's record is kept (with its token) for ``status`` to settle."""


class SubmitInterrupted(KeyboardInterrupt):
    """Ctrl-C during a submission, with what became of the job (its id and how to cancel it,
    or that its token finds it): the CLI prints the message and exits 130."""


class GridEngineError(SchedulerCommandError):
    """A Grid Engine command (qsub, qstat, qacct, qdel, qhost, qconf) failed."""


class GridEngineTransientError(GridEngineError):
    """A Grid Engine failure worth retrying: qmaster unreachable, our own timeout."""


class GridEngineUnavailable(GridEngineError):
    """Grid Engine's qmaster could not be reached in time, or its commands are not installed."""


class SshError(ClusterjobError):
    """The login node of a remote cluster could not be used over ssh: its host key is unknown
    or changed, the key was refused, the name does not resolve, rsync failed."""


class JobFailed(ClusterjobError):
    """A job (``Job.result()``) ended other than COMPLETED, or its function left no result.
    ``state`` and ``exit_code`` are Slurm's."""

    def __init__(self, message: str, state: str = "", exit_code: int | None = None) -> None:
        self.state = state
        self.exit_code = exit_code
        super().__init__(message)


class JobTimeout(ClusterjobError, TimeoutError):
    """``Job.wait(timeout)`` ran out of time while the job was still going (also a
    ``TimeoutError``, as ``concurrent.futures`` raises)."""


class NvmlErrorKind(str, Enum):
    """Why NVML gave no inventory: stable names that the Prolog's log and JSON output carry."""

    LIBRARY_NOT_FOUND = "library_not_found"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    VERSION_MISMATCH = "version_mismatch"
    GPU_LOST = "gpu_lost"
    NO_PERMISSION = "no_permission"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"


class NvmlError(ClusterjobError):
    """NVML could not give an inventory; ``kind`` says why (see NvmlErrorKind)."""

    def __init__(self, kind: NvmlErrorKind, message: str) -> None:
        self.kind = NvmlErrorKind(kind)  # a name outside the enum is a ValueError here
        super().__init__(message)


class UntrustedConfig(ClusterjobError):
    """A file the root Prolog would read that someone other than root could have written."""


class PreflightFailed(ClusterjobError):
    """The GPUs on this node are not what the site map or the job's request says."""


class RegistryError(ClusterjobError):
    """The local job registry is unreadable or corrupt; the message says how to recover."""


class RegistryCorrupt(RegistryError):
    """The registry file itself is damaged (not merely locked or not permitted): only such a
    file is moved aside by ``clusterjob status --repair``."""


# The one mapping from error class to exit code. Order matters: first match wins,
# so subclasses come before their bases.
_EXIT_CODES: tuple[tuple[type[BaseException], ExitCode], ...] = (
    (ConfigError, ExitCode.USAGE),
    (UsageError, ExitCode.USAGE),
    (SiteNotFound, ExitCode.USAGE),
    (PreflightFailed, ExitCode.FAILURE),
    (SlurmUnavailable, ExitCode.SLURM_UNAVAILABLE),
    (SshError, ExitCode.SLURM_UNAVAILABLE),
    (SlurmError, ExitCode.SLURM),
    # The scheduler's exit codes: Grid Engine's failures read as Slurm's do (3 and 4).
    (GridEngineUnavailable, ExitCode.SLURM_UNAVAILABLE),
    (GridEngineError, ExitCode.SLURM),
    (NvmlError, ExitCode.NVML),
    (RegistryError, ExitCode.REGISTRY),
    (ClusterjobError, ExitCode.FAILURE),
)


def exit_code(exc: BaseException) -> ExitCode:
    """Exit code for an exception; anything that is not ours is an internal error."""
    for cls, code in _EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return ExitCode.INTERNAL


# Text from other users, programs, nodes or Slurm (a GPU process's name, a claim's holder
# text, a job's name, Slurm's stderr) must not drive the terminal, forge a line in a log or
# hide in a drain reason: control characters (C0, DEL, C1) become \xNN (tab, newline and
# carriage return \t \n \r), the Unicode bidirectional controls and line separators \uNNNN.
_UNICODE_CONTROLS = (0x061C, 0x200E, 0x200F, *range(0x2028, 0x202F), *range(0x2066, 0x206A))
_FIELD = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))},
    **{c: f"\\u{c:04x}" for c in _UNICODE_CONTROLS},
    0x09: "\\t",
    0x0A: "\\n",
    0x0D: "\\r",
}
_LINES = {c: e for c, e in _FIELD.items() if c not in (0x09, 0x0A)}


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` safe to print on a terminal, in a log or a drain reason: nothing dropped, every
    control escaped. One field (the default) stays on one line; ``lines=True`` keeps tabs and
    newlines, for a message of several lines."""
    return text.translate(_LINES if lines else _FIELD)


def did_you_mean(word: str, choices: Mapping[str, str] | Iterable[str]) -> str:
    """`` (did you mean NAME?)`` for the choice a mistyped ``word`` is one slip away from; ""
    when there is none. ``choices``: the names, or each spelling (an alias) -> its name."""
    shown = dict(choices) if isinstance(choices, Mapping) else {c: c for c in choices}
    typed = _spelling(word)
    for near in (str.__eq__, _one_slip):
        for spelling, name in shown.items():
            if near(typed, _spelling(spelling)):
                return f" (did you mean {name}?)"
    return ""


# Case, separators and the letters read as digits (A10O, V1OO) are no difference in a name.
_SAME = str.maketrans({"o": "0", "l": "1", "-": None, "_": None, " ": None})


def _spelling(text: str) -> str:
    return text.casefold().translate(_SAME)


def _one_slip(typed: str, name: str) -> bool:
    """Two neighbours swapped (hcp: hpc), or one letter more or less (gpus: gpu). Never one
    character for another, nor a digit more or less: A800, P100 and A10 are other GPUs, gpu9
    another node."""
    if len(typed) == len(name):
        diff = [i for i, (a, b) in enumerate(zip(typed, name, strict=True)) if a != b]
        if len(diff) != 2 or diff[1] != diff[0] + 1:
            return False
        return typed[diff[0] : diff[1] + 1] == name[diff[0] : diff[1] + 1][::-1]
    short, long = sorted((typed, name), key=len)
    if len(long) != len(short) + 1:
        return False
    return any(
        long[:i] + long[i + 1 :] == short and not long[i].isdigit() for i in range(len(long))
    )
