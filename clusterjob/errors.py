"""The one exception hierarchy of clusterjob, and the one place that maps it to exit codes.

Every error a user can cause or meet is a ``ClusterjobError`` with a one-line message.
The CLI (and the Slurm hook entry points) catch it, print ``clusterjob: error: <message>``
and exit with ``exit_code(exc)``. A traceback is shown only with ``--debug``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum


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


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a site config, located as ``file:line: key.path: message``."""

    file: str
    line: int | None
    key_path: str
    message: str
    warning: bool = False

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


class SlurmError(ClusterjobError):
    """A Slurm command failed. Carries the command, its exit code and its stderr."""

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


class SlurmTransientError(SlurmError):
    """A Slurm failure worth retrying: controller unreachable, socket timeout, our own timeout."""


class SlurmUnavailable(SlurmError):
    """Slurm could not be reached within the overall deadline, or its commands are not installed."""


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


# Control characters (C0 but tab and newline, DEL, C1) as \xNN: text from other users or
# programs (a GPU claim's holder text, Slurm's stderr) must not drive the terminal.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c not in (9, 10)}


def printable(text: str) -> str:
    """``text`` safe to print on a terminal: control characters escaped, nothing dropped."""
    return text.translate(_CONTROL)
