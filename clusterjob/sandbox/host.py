"""The sandbox's admin plumbing on the host: commands, daemons, pid files, ports, /etc/hosts.

Every subprocess the sandbox starts goes through ``run`` (a command that finishes) or
``spawn`` (a daemon kept in the foreground, detached, with its pid recorded by us). This is
separate from ``clusterjob.slurm``, which is how the product talks to a site's Slurm.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from clusterjob.errors import ClusterjobError

# Debian packages the sandbox needs, and a file each one provides, to see whether it is there.
PACKAGES: dict[str, str] = {
    "slurm-wlm": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
    "slurm-client": "/usr/bin/sbatch",
    "slurmdbd": "/usr/sbin/slurmdbd",
    "munge": "/usr/sbin/munged",
    "mariadb-server": "/usr/sbin/mariadbd",
    "mariadb-client": "/usr/bin/mariadb",
    "gcc": "/usr/bin/gcc",
}


def run(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    check: bool = True,
    input: str | None = None,
    new_session: bool = False,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; on failure raise one line naming it and its stderr."""
    try:
        proc = subprocess.run(
            cmd,
            env=env,
            cwd=cwd,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
            start_new_session=new_session,
        )
    except FileNotFoundError as exc:
        raise ClusterjobError(f"{cmd[0]}: not installed ({exc.strerror})") from exc
    except subprocess.TimeoutExpired as exc:
        raise ClusterjobError(f"{' '.join(cmd)}: no answer within {timeout:.0f}s") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise ClusterjobError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}): {detail}")
    return proc


def missing_packages() -> list[str]:
    return [pkg for pkg, path in PACKAGES.items() if not Path(path).exists()]


def install_packages(packages: list[str]) -> None:
    """apt-get update once, then install; services are kept from starting (we start our own)."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    policy = Path("/usr/sbin/policy-rc.d")
    ours = not policy.exists()
    if ours:  # Debian's documented way to stop maintainer scripts from starting daemons
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        run(["apt-get", "update", "-q"], env=env, timeout=600)
        run(["apt-get", "install", "-y", "-q", *packages], env=env, timeout=1200)
    finally:
        if ours:
            policy.unlink(missing_ok=True)


# --- daemons and their pid files -------------------------------------------------------------


@dataclass(frozen=True)
class PidRecord:
    """A process we started: its pid and its start time, so a reused pid is never mistaken."""

    name: str
    pid: int
    start_ticks: int
    log: Path

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie is not running
        return None
    return int(fields[19])  # field 22 of stat(5), counted after "pid (comm)"


def read_pid(pid_dir: Path, name: str) -> PidRecord | None:
    try:
        pid, ticks, log = (pid_dir / f"{name}.pid").read_text().split("\n", 2)
    except (OSError, ValueError):
        return None
    return PidRecord(name, int(pid), int(ticks), Path(log.strip()))


def list_pids(pid_dir: Path) -> list[PidRecord]:
    records = (read_pid(pid_dir, p.stem) for p in sorted(pid_dir.glob("*.pid")))
    return [r for r in records if r is not None]


def spawn(
    name: str,
    cmd: list[str],
    *,
    pid_dir: Path,
    log: Path,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> PidRecord:
    """Start a daemon in its foreground mode, detached: a shell in a new session starts it in
    the background and says its pid, so the daemon is not our child and outlives us. It
    starts in /: a daemon kept the caller's working directory, and when that was a test's
    temporary directory, removed later, every job step slurmd then started printed
    "slurmstepd: error: Unable to get current working directory" into the job's output."""
    if user is not None:  # setpriv execs in place: the pid stays the daemon's
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--", *cmd]
    launcher = ["sh", "-c", '"$@" >>"$0" 2>&1 </dev/null & echo $!', str(log), *cmd]
    started = run(launcher, env=env, timeout=30, new_session=True, cwd="/")
    pid = int(started.stdout.strip())
    ticks = _start_ticks(pid)
    record = PidRecord(name, pid, ticks if ticks is not None else -1, log)
    (pid_dir / f"{name}.pid").write_text(f"{record.pid}\n{record.start_ticks}\n{log}\n")
    return record


def stop(record: PidRecord, pid_dir: Path, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; only if the pid is still the process we started."""
    if record.alive():
        os.kill(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while record.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if record.alive():
            os.kill(record.pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while record.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
    (pid_dir / f"{record.name}.pid").unlink(missing_ok=True)


def _says_error(line: str) -> bool:
    low = line.lower()
    return "fatal" in low or "error" in low


def last_error_line(log: Path) -> str:
    """What a daemon's log says about why it stopped: its last error, with the first of the
    errors just before it, which usually names the cause (``error: ... No filesystem mounted
    on /sys/fs/cgroup ... fatal: slurmd initialization failed``)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log written"
    errors = [i for i, ln in enumerate(lines) if _says_error(ln)]
    if not errors:
        return lines[-1] if lines else "empty log"
    last = first = errors[-1]
    while first > 0 and _says_error(lines[first - 1]):
        first -= 1
    return lines[last] if first == last else f"{lines[first]} ... {lines[last]}"


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold ``flock(LOCK_EX)`` on ``path`` (made root-only, with its directory) for the block."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --- ports and /etc/hosts --------------------------------------------------------------------


def port_free(port: int) -> bool:
    """True when nothing listens on ``port`` (tried on every address, as the daemons bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


HOSTS = Path("/etc/hosts")


def add_hosts_entry(names: list[str], marker: str, hosts: Path = HOSTS) -> None:
    """Map node names to 127.0.0.1 on one line tagged with ``marker``."""
    _rewrite_hosts(hosts, marker, f"127.0.0.1 {' '.join(names)} {marker}")


def remove_hosts_entry(marker: str, hosts: Path = HOSTS) -> None:
    _rewrite_hosts(hosts, marker, None)


def has_hosts_entry(marker: str, hosts: Path = HOSTS) -> bool:
    try:
        return any(line.endswith(f" {marker}") for line in hosts.read_text().splitlines())
    except OSError:
        return False


def _rewrite_hosts(hosts: Path, marker: str, line: str | None) -> None:
    """Rewrite in place (/etc/hosts is often a bind mount that cannot be replaced)."""
    try:
        text = hosts.read_text()
        kept = [ln for ln in text.splitlines() if not ln.endswith(marker)]
        new = "\n".join(kept + ([line] if line else [])) + "\n"
        if new != text:
            with open(hosts, "r+") as f:
                f.write(new)
                f.truncate()
    except OSError as exc:
        raise ClusterjobError(f"cannot update {hosts}: {exc.strerror or exc}") from exc


def which(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if not found:
        raise ClusterjobError(f"{name}: not installed")
    return found
