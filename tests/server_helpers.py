"""Running clusterjob through its command server in tests: a private runtime directory, the
server's log (one line per command it ran), and the same command line run both ways."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clusterjob.cli import server

REPO = Path(__file__).resolve().parent.parent


def clusterjob_command() -> list[str]:
    """The installed entry point beside this interpreter, as a person runs it."""
    exe = Path(sys.executable).parent / "clusterjob"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "clusterjob"]


@contextmanager
def runtime_dir() -> Iterator[Path]:
    """A private runtime directory with a short path (a socket's path has at most 107 bytes;
    pytest's are longer). Removing it at the end ends its servers: a server ends when its
    socket is gone, and this waits until they have."""
    directory = Path(tempfile.mkdtemp(prefix="cjs-", dir="/tmp"))
    try:
        yield directory
    finally:
        servers = server_pids(directory)
        shutil.rmtree(directory, ignore_errors=True)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in servers) and time.monotonic() < deadline:
            time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def logs(directory: Path) -> str:
    return "".join(p.read_text() for p in sorted(directory.glob("server-*.log")))


def server_pids(directory: Path) -> list[int]:
    return [int(m) for m in re.findall(r" server (\d+): listening", logs(directory))]


def served(directory: Path, at_least: int = 0, timeout: float = 10) -> list[str]:
    """What the servers in ``directory`` ran: ``COMMAND, exit N`` (or ``refused``) each, once
    there are ``at_least`` (a server logs a command when it reaps its worker, which may be a
    moment after the client has its answer)."""
    deadline = time.monotonic() + timeout
    while True:
        found = re.findall(r" worker \d+: (.*)", logs(directory))
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def wait_for_server(directory: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not server_pids(directory) or not list(directory.glob("server-????????")):
        if time.monotonic() > deadline:
            raise AssertionError(f"no command server listened in {directory}: {logs(directory)}")
        time.sleep(0.05)


def served_env(base: dict[str, str], directory: Path) -> dict[str, str]:
    return dict(base, CLUSTERJOB_SERVER="1", CLUSTERJOB_RUNTIME_DIR=str(directory))


def run(
    args: list[str], env: dict[str, str], cwd: Path, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload,no-any-return]
        [*clusterjob_command(), *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False, **kwargs,
    )  # fmt: skip


def start(
    env: dict[str, str], directory: Path, cwd: Path, command: list[str] | None = None
) -> None:
    """Start the server ``env``'s commands go to (a command that starts it runs in its own
    process) and wait until it listens. ``command`` is how those commands run clusterjob:
    the entry point, or ``python -m clusterjob`` (its ``sys.path`` differs: another server)."""
    subprocess.run(  # Typer's help: no Slurm, no registry
        [*(command or clusterjob_command()), "status", "--help"],
        env=env, cwd=cwd, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    wait_for_server(directory)
    assert server.PRELOAD  # the module the tests are about is the one imported here


def normalized(text: str) -> str:
    """Submission tokens and generated names are random: the same either way once masked."""
    return re.sub(r"\b[0-9a-f]{16}\b", "TOKEN", text)
