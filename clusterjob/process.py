"""Running a scheduler's client command: the one way both schedulers' runners start one.

In the C locale (the parsers read the clients' English words and dates) and in a process
group of its own, so that a timeout, or Ctrl-C, ends everything it started (a wrapper
script's children too), not only the direct child while the rest holds our pipes open.

And a child started early for an answer wanted later (``answer_later``: git's commit, the
interpreter a shim runs), so that it runs while the command does other work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import weakref
from collections.abc import Callable, Sequence

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import TypeVar

    T = TypeVar("T")


def run_in_group(cmd: Sequence[str], timeout: float, input: str | None) -> tuple[int, str, str]:
    """``(returncode, stdout, stderr)`` of ``cmd``. Raises FileNotFoundError when it is not
    installed and subprocess.TimeoutExpired when it ran past ``timeout`` (its whole group
    killed and reaped first)."""
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    with subprocess.Popen(
        list(cmd),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except BaseException:  # the timeout, or Ctrl-C: the group no longer reaches the tty
            kill_group(proc)
            raise
    return proc.returncode, stdout, stderr


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc``'s whole process group and reap it, without waiting on stray pipes."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=2)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    proc.wait()


def reap(proc: subprocess.Popen[str]) -> None:
    """End a child started for an answer that is no longer wanted, and wait for it: no
    stray process, no zombie, no open pipe (a command that failed before asking)."""
    if proc.returncode is None:
        proc.kill()
    if proc.stdout is not None and not proc.stdout.closed:
        proc.communicate()  # waits, and closes the pipe


def answer_later(
    proc: subprocess.Popen[str], timeout: float, read: Callable[[str, int | None], T]
) -> Callable[[], T]:
    """``proc``'s answer, to be asked for later: ``read`` of its stdout and exit status,
    waited for at the first call (at most ``timeout`` seconds; then it is killed and read as
    no output) and the same at every later call. A child whose answer is never asked for is
    reaped when the answer is dropped: no stray process."""
    said: list[T] = []

    def answer() -> T:
        if not said:
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.SubprocessError:
                reap(proc)
                out = ""
            said.append(read(out, proc.returncode))
        return said[0]

    weakref.finalize(answer, reap, proc)
    return answer
