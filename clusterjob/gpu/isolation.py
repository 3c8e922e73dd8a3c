"""Where an NVML read runs so that a hung driver cannot hold the caller past its timeout.

Two places, picked by the caller of ``read_inventory``: a daemon thread (cheap; the stuck call
stays behind in the process) or a forked child (the Slurm hooks and ``preflight``: a driver
stuck in the kernel cannot hold our exit, the child is killed, and whatever NVML prints goes to
/dev/null instead of into slurmd's log). Both raise ``ReadTimedOut`` when time is up.

A child sends its answer back as plain data (``marshal``: built in, nothing to import), so the
Prolog forks before it has imported anything but this module; ``select``, ``signal`` and
``threading`` are imported where they are used, after the fork, and ``contextlib`` (with
``collections`` and ``functools``, 4 ms) not at all.
"""

from __future__ import annotations

import marshal
import os
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # not at run time: the Prolog imports this module before every job
    from collections.abc import Callable
    from typing import Any, TypeVar

    T = TypeVar("T")

__all__ = [
    "ChildRead",
    "ReadTimedOut",
    "in_thread",
    "kill_children",
    "start_in_child",
    "start_nvml_read",
]

_CHILDREN: set[int] = set()  # reader children still running


class ReadTimedOut(Exception):
    """The read did not answer within its timeout (the caller words the error)."""


def in_thread(read: Callable[[], T], timeout: float) -> T:
    """``read()`` in a daemon thread; its exception is raised here. ReadTimedOut when late."""
    result: list[T] = []
    failure: list[BaseException] = []

    import threading

    def work() -> None:
        try:
            result.append(read())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=work, name="clusterjob-nvml", daemon=True)
    worker.start()
    worker.join(timeout)
    if failure:
        raise failure[0]
    if not result:
        raise ReadTimedOut
    return result[0]


class ChildRead:
    """A ``read()`` running in a forked child (``start_in_child``); ``result`` waits for it."""

    __slots__ = ("pid", "rfd")

    def __init__(self, pid: int, rfd: int) -> None:
        self.pid = pid
        self.rfd = rfd

    def result(self, timeout: float | None) -> Any:
        """The child's value (plain data). An NvmlError in the child is raised here as it was; any
        other exception becomes NvmlError(UNKNOWN), since it is still an answer and not a hang.
        ReadTimedOut when the child has not answered within ``timeout`` seconds from now (it
        is killed then). Once only."""
        import select

        rfd = self.rfd
        end = None if timeout is None else time.monotonic() + timeout
        chunks: list[bytes] = []
        try:
            while True:
                left = None if end is None else end - time.monotonic()
                if left is not None and (left <= 0 or not select.select([rfd], [], [], left)[0]):
                    kill_children()
                    raise ReadTimedOut
                chunk = os.read(rfd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(rfd)
        _reap(self.pid, block=True)
        _CHILDREN.discard(self.pid)
        from clusterjob.errors import NvmlError, NvmlErrorKind

        try:
            payload = marshal.loads(b"".join(chunks))
        except Exception as exc:
            raise NvmlError(
                NvmlErrorKind.UNKNOWN, "the NVML reader ended without an answer"
            ) from exc
        if payload[0] == "ok":
            return payload[1]
        raise NvmlError(NvmlErrorKind(payload[1]), payload[2])


def start_in_child(read: Callable[[], Any]) -> ChildRead:
    """Fork a child with /dev/null as its stdio that runs ``read()`` now, while this process
    goes on; its value, plain data that ``marshal`` writes (None, numbers, strings, tuples,
    lists, dicts), comes back through ``ChildRead.result``. The Prolog starts its
    NVML read before it imports its checks, so that loading pynvml and the driver overlaps
    with loading clusterjob. ``kill_children`` ends a child whose result is never asked for."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        try:
            os.close(rfd)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            try:
                payload: tuple[Any, ...] = ("ok", read())
            except BaseException as exc:  # an error is still an answer, not a hang
                from clusterjob.errors import NvmlError, NvmlErrorKind

                if isinstance(exc, NvmlError):
                    payload = ("error", exc.kind.value, str(exc))
                else:
                    kind = NvmlErrorKind.UNKNOWN.value
                    payload = ("error", kind, f"{type(exc).__name__}: {exc}")
            try:
                data = marshal.dumps(payload)
            except ValueError as exc:  # a value marshal cannot write: a bug, said as such
                from clusterjob.errors import NvmlErrorKind

                kind = NvmlErrorKind.UNKNOWN.value
                data = marshal.dumps(("error", kind, f"the reader's answer: {exc}"))
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view) :]
        finally:
            os._exit(0)
    os.close(wfd)
    _CHILDREN.add(pid)
    return ChildRead(pid, rfd)


def start_nvml_read() -> ChildRead:
    """``clusterjob.gpu.nvml.read_nvml`` in a forked child (see ``start_in_child``); its
    ``result`` is ``GpuInventory.as_dict()`` (``GpuInventory.from_dict`` reads it). This
    module imports neither it nor clusterjob's errors, so the Prolog forks before it has
    loaded anything else."""
    return start_in_child(_read_nvml)


def _read_nvml() -> dict[str, Any]:  # in the child
    from clusterjob.gpu.nvml import read_nvml

    return read_nvml().as_dict()


def kill_children() -> None:
    """Leave no hung reader behind (it may never return from the driver)."""
    import signal

    for pid in list(_CHILDREN):
        try:  # noqa: SIM105 (no contextlib: see the module's docstring)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        _reap(pid, block=False)
        _CHILDREN.discard(pid)


def _reap(pid: int, block: bool) -> None:
    try:  # noqa: SIM105 (no contextlib: see the module's docstring)
        os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        pass
