"""Slurm on another machine: the login node, reached with the system's OpenSSH client.

Every command for a remote cluster runs as ``ssh [options] HOST -- env LC_ALL=C CMD...``
(the words quoted with ``shlex``) over ONE multiplexed connection: ``ControlMaster=auto``
with its socket in the user's runtime dir (``$CLUSTERJOB_RUNTIME_DIR``, else
``$XDG_RUNTIME_DIR/clusterjob``, else ``/tmp/clusterjob-UID``), kept for a while after the
last command (``ControlPersist``), so a status poll costs a channel, not a handshake. The
user's own ``~/.ssh/config`` applies (``Host`` aliases, ``ProxyJump``, keys); nothing here
prompts unless a person is at a terminal (``BatchMode=yes`` otherwise).

How an ssh failure is read (ssh itself exits 255): a host key that is unknown or changed, a
refused key, an unknown host name and a refused connection (nothing listens on that port)
are ``SshError``: one line naming the host, exit 4 (``SLURM_UNAVAILABLE``, as for a Slurm
that cannot be reached), no retry. A connection that timed out or was lost is transient,
and carries ``SSH_LOST`` in its stderr so that the runner retries it and ``sbatch`` looks
its token up before submitting again.

``rsync`` (for ``sync``) and the interactive ``srun --pty`` use the same connection.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterjob import envvars
from clusterjob.errors import SshError, UsageError
from clusterjob.runtime_dir import RUNTIME_DIR_ENV, SOCKET_PATH_MAX, private_runtime_dir

SSH_LOST = "ssh connection to the cluster failed"  # a transient marker (runner.TRANSIENT_MARKERS)
CONTROL_PERSIST = "600"  # seconds the shared connection outlives its last command
CONNECT_TIMEOUT = "20"
SSH_CONFIG_ENV = envvars.SSH_CONFIG  # an ssh_config file (-F) instead of ~/.ssh/config

_SPEC = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
    r"(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\])"
    r"(?::(?P<port>[0-9]{1,5}))?$"
)


@dataclass(frozen=True)
class SshTarget:
    """Where and how to reach a login node. ``host`` may be an alias of ``~/.ssh/config``."""

    host: str
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    options: tuple[str, ...] = ()  # extra `-o KEY=VALUE` for ssh
    config_file: str | None = None  # ssh -F FILE
    name: str = ""  # the profile name, or the spec as given
    # said after a failure to reach it: e.g. that the name is no profile of hosts.yaml
    note: str = ""

    @property
    def label(self) -> str:
        """``user@host:port`` as typed: what the registry records and messages show."""
        if self.name:
            return self.name
        text = f"{self.user}@{self.host}" if self.user else self.host
        return f"{text}:{self.port}" if self.port else text

    def key(self) -> str:
        """A file-name-safe form of the label (caches per host)."""
        return file_key(self.label)


_NOT_IN_A_FILE_KEY = re.compile(r"[^A-Za-z0-9._@-]")


def file_key(label: str) -> str:
    """A cluster's transport label (``user@host:port``, "" for this machine) as a part of a
    file name: what is kept per cluster reached (status cache, avoid list, remote cache)."""
    return _NOT_IN_A_FILE_KEY.sub("_", label)


def parse_target(spec: str) -> SshTarget:
    """``[USER@]HOST[:PORT]`` (``[::1]:2222`` for an IPv6 address) -> a target."""
    text = spec.strip()
    m = _SPEC.match(text)
    if not m or (m.group("port") and not 0 < int(m.group("port")) < 65536):
        raise UsageError(
            f"--host {spec!r}: expected [USER@]HOST[:PORT] or the name of a host profile"
        )
    host = m.group("host").strip("[]")
    return SshTarget(
        host=host,
        user=m.group("user"),
        port=int(m.group("port")) if m.group("port") else None,
        name=text,
    )


def control_path(environ: Mapping[str, str] | None = None) -> str:
    """The ControlPath pattern: ``%C`` is ssh's hash of local host, remote host, port, user
    (a fixed 40 characters: a socket path must stay under ~100)."""
    directory, problem = private_runtime_dir(environ)
    if problem:
        raise UsageError(f"ssh's control socket: {problem}")
    path = os.path.join(directory, "cm-%C")
    if len(path) - 2 + 40 > SOCKET_PATH_MAX:  # %C is 40 hex digits
        raise UsageError(
            f"{directory} is too long a directory for ssh's control socket (a socket path "
            f"has at most {SOCKET_PATH_MAX} bytes); set {RUNTIME_DIR_ENV} to a shorter one"
        )
    return path


def ssh_base(
    target: SshTarget, *, tty: bool = False, environ: Mapping[str, str] | None = None
) -> list[str]:
    """``ssh`` with the options of the shared connection, without the host (rsync's ``-e``)."""
    env = os.environ if environ is None else environ
    argv = ["ssh"]
    config = target.config_file or env.get(SSH_CONFIG_ENV)
    if config:
        argv += ["-F", config]
    argv += [
        "-o", "ControlMaster=auto",
        "-o", f"ControlPath={control_path(env)}",
        "-o", f"ControlPersist={CONTROL_PERSIST}",
        "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=3",
    ]  # fmt: skip
    if not (tty or _on_terminal()):
        argv += ["-o", "BatchMode=yes"]  # no password or passphrase prompt, ever
    if target.port:
        argv += ["-p", str(target.port)]
    if target.user:
        argv += ["-l", target.user]
    if target.identity:
        argv += ["-i", os.path.expanduser(target.identity), "-o", "IdentitiesOnly=yes"]
    for option in target.options:
        argv += ["-o", option]
    return argv


def _on_terminal() -> bool:
    try:
        return sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def remote_words(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The one string the remote shell runs: ``env LC_ALL=C [K=V...] CMD...``, each word
    quoted, so the remote shell never re-reads an argument."""
    assignments = [f"{k}={v}" for k, v in (env or {}).items()]
    return shlex.join(["env", "LC_ALL=C", *assignments, *cmd])


def ssh_argv(
    target: SshTarget,
    cmd: Sequence[str],
    *,
    tty: bool = False,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The full ssh command line that runs ``cmd`` on the login node."""
    argv = ssh_base(target, tty=tty)
    if tty:
        argv.append("-t")
    return [*argv, "--", target.host, remote_words(cmd, env)]


# ssh's own words (OpenSSH 9): what is permanent, and what a retry may get past.
_HOST_KEY = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED")
_AUTH = ("Permission denied", "Too many authentication failures", "no mutual signature")
_NAME = ("Could not resolve hostname",)
_REFUSED = ("Connection refused",)


def ssh_failure(target: SshTarget, returncode: int, stderr: str) -> str | None:
    """None when a command's failure is the command's own; else the transient stderr to
    report (carrying ``SSH_LOST``). Raises ``SshError`` for a failure no retry can help."""
    if returncode != 255:
        return None
    text = stderr.strip()
    first = next((line for line in text.splitlines() if line.strip()), "")
    if any(m in text for m in _HOST_KEY):
        raise SshError(
            f"ssh {target.label}: host key verification failed (the host's key is unknown "
            "or has CHANGED); connect once with `ssh` to check and accept it, or fix "
            "~/.ssh/known_hosts"
        )
    if any(m in text for m in _AUTH):
        raise SshError(
            f"ssh {target.label}: authentication failed ({_clip(first)}); add your key to "
            "ssh-agent or name it as `identity` in the host profile"
        )
    note = f"; {target.note}" if target.note else ""
    if any(m in text for m in _NAME):
        raise SshError(f"ssh {target.label}: unknown host name ({_clip(first)}){note}")
    if any(m in text for m in _REFUSED) and "ssh: connect to host" in text:
        raise SshError(
            f"ssh {target.label}: connection refused ({_clip(first)}): no ssh server "
            f"listens there; check the host and port{note}"
        )
    if "ssh:" in text or "Connection" in text or "mux_client" in text or "Broken pipe" in text:
        return f"{SSH_LOST} ({target.label}): {_clip(first) or 'no error output'}"
    if not text:
        return f"{SSH_LOST} ({target.label}): ssh exited 255 without a word"
    return None  # the remote command's own exit 255, with its own words


def _clip(line: str, limit: int = 200) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


def close_master(target: SshTarget) -> None:
    """End the shared connection now (``ssh -O exit``); nothing if none is open."""
    argv = [*ssh_base(target), "-O", "exit", target.host]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, capture_output=True, timeout=10, check=False)


# --- rsync over the same connection --------------------------------------------------------

# Never worth sending to the cluster: VCS data, caches, environments built for this machine.
DEFAULT_EXCLUDES = (
    ".git/", ".hg/", ".svn/", "__pycache__/", "*.pyc", ".venv/", "venv/", ".tox/", ".nox/",
    ".mypy_cache/", ".pytest_cache/", ".ruff_cache/", "node_modules/", "*.egg-info/",
    ".ipynb_checkpoints/", ".DS_Store", ".clusterjob/",
)  # fmt: skip
SIZE_WARNING_BYTES = 200 * 1024 * 1024


def rsync_argv(
    target: SshTarget, source: Path, remote_dir: str, excludes: Sequence[str]
) -> list[str]:
    """``rsync`` of ``source``'s contents into ``remote_dir`` through the shared connection.
    ``.gitignore`` files are honoured; nothing on the remote side is deleted."""
    ssh = shlex.join(ssh_base(target))
    argv = ["rsync", "--recursive", "--links", "--times", "--perms", "--compress"]
    argv += ["--filter=:- .gitignore", "-e", ssh]
    for pattern in (*DEFAULT_EXCLUDES, *excludes):
        argv.append(f"--exclude={pattern}")
    user = f"{target.user}@" if target.user else ""
    host = f"[{target.host}]" if ":" in target.host else target.host
    return [*argv, "--", f"{source}/", f"{user}{host}:{_rsync_path(remote_dir)}/"]


def _rsync_path(path: str) -> str:
    # rsync 3.2.4+ (Debian 12) protects remote args itself; a path is passed as it is
    return path


def tree_size(source: Path, excludes: Sequence[str] = ()) -> int:
    """Bytes under ``source`` that a sync would consider (the default excludes skipped),
    for the size warning; a cheap walk, not rsync's exact rules."""
    import fnmatch

    patterns = [p.rstrip("/") for p in (*DEFAULT_EXCLUDES, *excludes)]
    total = 0
    for root, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, p) for p in patterns)]
        for name in files:
            if any(fnmatch.fnmatch(name, p) for p in patterns):
                continue
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def run_rsync(argv: Sequence[str], target: SshTarget, timeout: float = 3600) -> None:
    """Run rsync; a failure is one line (the ssh failures read as for any command)."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise UsageError(
            "rsync is not installed here: install it (and on the cluster), or give the "
            "remote directory your code is in (remote_dir, sync: false)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SshError(f"rsync to {target.label} did not finish within {timeout:.0f}s") from None
    if proc.returncode == 0:
        return
    lost = ssh_failure(target, 255 if proc.returncode in (12, 255) else -1, proc.stderr)
    first = next((ln for ln in proc.stderr.splitlines() if ln.strip()), "no error output")
    raise SshError(f"rsync to {target.label} failed (exit {proc.returncode}): {lost or first}")
