"""The one exception hierarchy of clusterjob, and the one place that maps it to exit codes.

Every error a user can cause or meet is a ``ClusterjobError`` with a one-line message.
The CLI (and the Slurm hook entry points) catch it, print ``clusterjob: error: <message>``
and exit with ``exit_code(exc)``. A traceback is shown only with ``--debug``.
"""

from __future__ import annotations

from dataclasses import dataclass


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


class NvmlError(ClusterjobError):
    """NVML could not give an inventory: ``kind`` is one of the stable outcome names below."""

    KINDS = (
        "library_not_found",
        "driver_not_loaded",
        "version_mismatch",
        "gpu_lost",
        "no_permission",
        "timeout",
        "unknown",
    )

    def __init__(self, kind: str, message: str) -> None:
        assert kind in self.KINDS, kind
        self.kind = kind
        super().__init__(message)


class UntrustedConfig(ClusterjobError):
    """A file the root Prolog would read that someone other than root could have written."""


class PreflightFailed(ClusterjobError):
    """The GPUs on this node are not what the site map or the job's request says."""


class RegistryError(ClusterjobError):
    """The local job registry is unreadable or corrupt; the message says how to recover."""


# The one mapping from error class to exit code. Order matters: first match wins,
# so subclasses come before their bases.
_EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ConfigError, 2),
    (UsageError, 2),
    (SiteNotFound, 2),
    (PreflightFailed, 1),
    (SlurmUnavailable, 4),
    (SlurmError, 3),
    (NvmlError, 5),
    (RegistryError, 6),
    (ClusterjobError, 1),
)


def exit_code(exc: BaseException) -> int:
    """Exit code for an exception; anything that is not ours is an internal error (70)."""
    for cls, code in _EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return 70  # EX_SOFTWARE: a bug in clusterjob
