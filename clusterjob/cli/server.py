"""The command server: a clusterjob with its modules loaded, that runs hot commands for clients.

A fresh ``submit`` spends most of its time importing clusterjob (about 150 ms against the
7 ms of the ``sbatch`` it runs); a shell loop of a hundred submissions pays it a hundred
times. ``clusterjob.cli.client`` starts this server in the background the first time such a
command runs; the commands after it hand themselves over (Mercurial's ``chg`` works the same
way). The server loads what ``submit`` and ``status`` load (``PRELOAD``) and nothing more,
and then waits. For each command it forks a worker, which takes on everything of the client
process that its command could see (``_become_client``): the environment, the working
directory, the umask, resource limits and priority, which signals are ignored or blocked,
``sys.argv``, and the client's own stdin, stdout and stderr, passed as file descriptors. The
worker then runs ``clusterjob.__main__.main`` as the client would have, and sends back the
exit status; the server itself never runs a command, so every worker starts from freshly
imported modules.

What keeps a worker honest:

- **Same installation and start-up.** The socket's name is made from the client's
  interpreter, ``sys.path``, flags, locale and ``PYTHON*`` environment, user, groups and login
  session (``client.fingerprint``); a request whose fingerprint differs from the server's is
  refused, and the client runs the command itself.
- **Same code.** Before each command the server checks that no file it loaded outside the
  standard library (clusterjob's modules, its dependencies', any data file they read while
  loading) changed since; if one did, it refuses the command and ends, and the next command
  starts a new server.
- **Nothing read at import.** The server starts with only the environment that shapes its
  interpreter (``client.server_environment``): a module that read anything else while
  loading would be wrong for every command, not only for some, and the tests compare served
  and unserved commands side by side.
- **Only its user.** The socket lies in the private runtime directory (mode 0700, checked);
  the server answers only a peer of its own uid, and the client talks only to such a server
  (``SO_PEERCRED`` both ways).

While no command runs, the server keeps the next command's worker forked ahead (a *spare*,
``Server.start_spare``), its pages already copied from the server's (``page_populator``):
a command's fork and its first writes to each page, ~5 ms of a submit, are then behind it.
The server hands the spare the client's connection, request and descriptors over a socket
pair; a command that comes while another runs gets a worker forked for it, as before.

A worker runs its command only once its client, told it started, says to go ahead: a
client that waited ``client.START_TIMEOUT`` seconds in vain runs the command itself, and the
late worker then runs nothing. (Until a stuck server gets to a request, it holds the
descriptors that came with it: a pipe from the client's stdout stays open that long.)
A worker whose client goes away before it ends (the client was killed: SIGKILL is the one
signal a client cannot pass on) is killed too. A server ends after ``client.IDLE_SECONDS``
without a command, when its socket is removed or replaced, and when its code changed.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gc
import importlib
import io
import marshal
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import NoReturn, TextIO

from clusterjob import lifetime
from clusterjob.cli import client

# What a submit and a status load, run in a fresh process, with the site read from its YAML
# (tests/test_command_server.py keeps this in step): loaded once here, so that no worker
# imports anything.
PRELOAD = (
    "clusterjob.__main__",
    "clusterjob.api.cluster",
    "clusterjob.api.polling",
    "clusterjob.api.remote",
    "clusterjob.cli.common",
    "clusterjob.cli.fast_commands",
    "clusterjob.cli.fastpath",
    "clusterjob.cli.outcome",
    "clusterjob.cli.status_report",
    "clusterjob.cli.submitting",
    "clusterjob.gpu.models",
    "clusterjob.jobs.badnodes",
    "clusterjob.jobs.controlled",
    "clusterjob.jobs.explain",
    "clusterjob.jobs.followup",
    "clusterjob.jobs.hardware",
    "clusterjob.jobs.private_files",
    "clusterjob.jobs.registry",
    "clusterjob.jobs.snapshot",
    "clusterjob.jobs.status",
    "clusterjob.jobs.submit",
    "clusterjob.jobs.usage",
    "clusterjob.jobscript.backends",
    "clusterjob.jobscript.control",
    "clusterjob.jobscript.directives",
    "clusterjob.jobscript.interpreter",
    "clusterjob.jobscript.program",
    "clusterjob.jobscript.render",
    "clusterjob.jobscript.request",
    "clusterjob.jobscript.requeues",
    "clusterjob.jobscript.shell",
    "clusterjob.jobscript.shipped_templates",
    "clusterjob.jobscript.steps",
    "clusterjob.jobscript.submit_python",
    "clusterjob.node.allocation",
    "clusterjob.node.usage",
    "clusterjob.pci",
    "clusterjob.process",
    "clusterjob.resources",
    "clusterjob.site.discovery",
    "clusterjob.site.gpu_syntax",
    "clusterjob.site.initcache",
    "clusterjob.site.jobpolicy",
    "clusterjob.site.loader",  # a site not in the cache yet (or changed): read from its YAML
    "clusterjob.site.model",
    "clusterjob.site.nodemodel",
    "clusterjob.site.pinning",
    "clusterjob.site.schema",
    "clusterjob.site.sitecache",
    "clusterjob.slurm.commands",
    "clusterjob.slurm.parse",
    "clusterjob.slurm.runner",
    "clusterjob.slurm.ssh",
    "clusterjob.slurm.syntax",
    "clusterjob.site.yamlcheck",
    "difflib",
    "encodings.utf_8_sig",
    "glob",
    "resource",
)
REQUEST_MAX = 16 << 20  # an environment of megabytes is possible; more is not a request
REQUEST_TIMEOUT = 10.0  # seconds a client has to send its request once connected
LOG_MAX = 1 << 20  # a server's log (a line a command) starts again past this size
REFUSED_EXIT = 125  # a worker that could not take on its client's state; the client runs it
ORPHAN_GRACE = 1.0  # seconds a worker whose client went away has to end by itself
TICK = 0.5  # seconds between the server's looks at its workers, its socket and the clock
GO_ON, STALE = b"\1", b"\0"  # the server's check of its code, as a spare hears it
MADV_POPULATE_WRITE = 23  # <linux/mman.h>, Linux 5.14
Stamp = tuple[int, int, int]  # a watched file's inode, size and mtime in nanoseconds


def boot(path: str, print_: tuple[object, ...], main: Callable[[list[str]], int]) -> None:
    """A server's life, started by ``client.start_server``: take the socket's lock (or end,
    where another server holds it), load, listen, serve, end. ``main`` is the command line's
    entry point (``clusterjob.__main__.main``), which each worker runs."""
    _close_inherited()
    if client.fingerprint(int(str(print_[-1]))) != print_:
        return  # this interpreter did not start as the client's did: it could not stand in
    os.umask(0o077)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another server answers on this socket
    watched = preload()
    populate = page_populator()
    gc.freeze()  # the loaded modules' objects out of the collector's sight: a worker's
    # collections then do not write to (and so copy) every page they live on
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a server that died without removing it
    listener.bind(path)
    listener.listen(64)
    inode = os.stat(path).st_ino
    if _size(path + ".log") > LOG_MAX:
        os.unlink(path + ".log")
    log = open(path + ".log", "a", encoding="utf-8")  # noqa: SIM115 - open while it serves
    log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} server {os.getpid()}: listening\n")
    log.flush()
    try:
        why = Server(listener, lock, print_, watched, log, main, populate).serve(path, inode)
        log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} server {os.getpid()}: ends: {why}\n")
        log.flush()
    finally:
        if _socket_inode(path) == inode:
            os.unlink(path)
        listener.close()
        os._exit(0)  # no teardown of the loaded modules: it buys nothing here


def _close_inherited() -> None:
    """Close what the first client passed on without meaning to (its parent's descriptors
    left open across exec: a build tool's pipe, a shell's ``3>file``): held for the server's
    life, a pipe would never see its end. The interpreter's own are not inheritable."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):
                if os.get_inheritable(fd):
                    os.close(fd)


def preload() -> dict[str, Stamp]:
    """Import ``PRELOAD``; the files it loaded from outside the standard library (modules,
    and data files opened while loading), each with its stamp."""
    opened: list[str] = []
    loading = [True]

    def note(event: str, args: tuple[object, ...]) -> None:
        if loading[0] and event == "open" and isinstance(args[0], str):
            opened.append(args[0])

    sys.addaudithook(note)  # stays for the process's life; a check of a flag once loaded
    for name in PRELOAD:
        importlib.import_module(name)
    loading[0] = False
    files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    files.update(opened)
    stdlib = os.path.dirname(os.__file__) + os.sep
    return {
        f: stamp
        for f in sorted(x for x in files if isinstance(x, str) and os.path.isabs(x))
        if not (f.startswith(stdlib) and "-packages" not in f) and (stamp := _stamp(f)) is not None
    }


def _stamp(path: str) -> Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _socket_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class Server:
    """The accept loop: one forked worker per command; their statuses reaped here."""

    def __init__(
        self,
        listener: socket.socket,
        lock: int,
        print_: tuple[object, ...],
        watched: dict[str, Stamp],
        log: TextIO,
        main: Callable[[list[str]], int],
        populate: Callable[[], None] | None = None,
    ) -> None:
        self.listener = listener
        self.lock = lock
        self.print_ = print_
        self.watched = watched
        self.workers: dict[int, tuple[socket.socket, str]] = {}  # pid: (client, command)
        self.wakeup = -1  # the wakeup pipe's end that SIGCHLD writes to, while serving
        self.orphans: dict[int, float] = {}  # worker: when its client went away (its
        # command answered and the worker ending, or the client killed: ``end_orphans``)
        self.log = log
        self.main = main
        self.populate = populate
        self.spare: tuple[int, socket.socket] | None = None  # (pid, the server's end)
        # a spare is made at the start and after each command (not after a spare that ended
        # without one: whatever ended it would end the next)
        self.wants_spare = True

    def serve(self, path: str, inode: int) -> str:
        """Serve until a reason to end; that reason. A worker's end wakes the loop at once
        (SIGCHLD, through a wakeup pipe), so its client hears how it ended without delay."""
        ended, self.wakeup = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        previous_fd = signal.set_wakeup_fd(self.wakeup)
        previous = signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        try:
            return self._loop(path, inode, ended)
        finally:
            self.end_spare()
            signal.signal(signal.SIGCHLD, previous)
            signal.set_wakeup_fd(previous_fd)
            os.close(ended)
            os.close(self.wakeup)

    def _loop(self, path: str, inode: int, ended: int) -> str:
        last = time.monotonic()
        listening = self.listener.fileno()
        while True:
            if self.wants_spare and not self.workers:
                self.wants_spare = False
                self.spare = self.start_spare()
            ready = self._wait(listening, ended)
            if ended in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(ended, 512)
            self.reap()
            if listening in ready:
                conn, _ = self.listener.accept()
                last = time.monotonic()
                if not self.take(conn):
                    return "its code changed"  # the next command starts a new server
            elif not self.workers and time.monotonic() - last > client.IDLE_SECONDS:
                return f"no command for {client.IDLE_SECONDS} s"
            self.end_orphans()
            if _socket_inode(path) != inode:
                return "its socket was removed or replaced"

    def _wait(self, listening: int, ended: int) -> set[int]:
        """Wait at most ``TICK`` for a connection, a worker's end or a client that went away
        (its end of the connection closed: ``POLLRDHUP``, which is not data, so nothing here
        reads what a client sends its worker); the descriptors with news."""
        poll = select.poll()
        poll.register(listening, select.POLLIN)
        poll.register(ended, select.POLLIN)
        clients = {}
        for pid, (conn, _) in self.workers.items():
            if pid not in self.orphans:
                clients[conn.fileno()] = pid
                poll.register(conn, select.POLLRDHUP)
        ready = set()
        for fd, events in poll.poll(TICK * 1000):
            if fd in clients:
                if events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR):
                    self.orphans[clients[fd]] = time.monotonic()
            else:
                ready.add(fd)
        return ready

    def stale(self) -> bool:
        return any(_stamp(f) != stamp for f, stamp in self.watched.items())

    def take(self, conn: socket.socket) -> bool:
        """Start ``conn``'s command in a worker, or refuse it; False once this server's code
        is stale."""
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", creds)[1] != os.getuid():
                conn.close()
                return True
            conn.settimeout(REQUEST_TIMEOUT)
            request, fds = receive(conn)
        except (OSError, ValueError, EOFError, TypeError):
            conn.close()
            return True
        if request.get("fingerprint") != self.print_ or len(fds) != 4:
            _refuse(conn, fds)
            return True
        handed = self.hand_to_spare(conn, request, fds)  # it takes on the client meanwhile
        stale = self.stale()
        if handed is not None:
            pid, end = handed
            with contextlib.suppress(OSError):  # it ended: reaped as a worker, or not at all
                end.sendall(STALE if stale else GO_ON)
            end.close()
            _close(fds)  # a stale spare refuses its client itself (``wait_as_spare``)
        elif stale:
            _refuse(conn, fds)
            return False
        else:  # no spare ready (another command runs), or it died: a worker of its own
            pid = os.fork()
            if pid == 0:
                self.leave()
                conn.settimeout(None)
                work(conn, request, fds, self.main)
            _close(fds)
        if stale:  # the spare refuses its client; the next command starts a new server
            conn.close()
            return False
        self.workers[pid] = (conn, str(list(request["args"])[0]))  # type: ignore[call-overload]
        return True

    def leave(self) -> None:
        """In a process just forked from the server (a worker, a spare): close what is the
        server's, so that its socket, lock and log end with it and its clients' connections
        with their own workers."""
        self.listener.close()
        os.close(self.lock)
        signal.set_wakeup_fd(-1)
        os.close(self.wakeup)
        for other, _ in self.workers.values():
            other.close()
        if self.spare is not None:
            self.spare[1].close()
        self.log.close()

    def start_spare(self) -> tuple[int, socket.socket] | None:
        """Fork the next command's worker ahead of it, while no command runs: the fork and
        the copying of the pages a command writes (``page_populator``), ~5 ms of a submit's
        35, are then done before it comes. None where no process could be forked."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return None
        if pid == 0:
            try:
                self.leave()
                ours.close()
                if self.populate is not None:
                    self.populate()
                wait_as_spare(theirs, self.main)
            finally:  # never back into the server's code
                os._exit(1)
        theirs.close()
        return pid, ours

    def end_spare(self) -> None:
        """The spare ends once its end of the pair reads as closed; waited for here."""
        if self.spare is not None:
            pid, end = self.spare
            self.spare = None
            end.close()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def hand_to_spare(
        self, conn: socket.socket, request: dict[str, object], fds: list[int]
    ) -> tuple[int, socket.socket] | None:
        """Give a command to the spare worker: its pid and the server's end of their pair,
        over which the server's check of its code follows (``STALE`` or ``GO_ON``), while the
        spare takes on the client's state; None where there is no spare or it could not
        take the command (it died)."""
        if self.spare is None:
            return None
        pid, end = self.spare
        self.spare = None
        try:  # the descriptors last: a spare that has them has the whole request
            end.sendall(_framed(marshal.dumps(request)))
            socket.send_fds(end, [b"\0"], [conn.fileno(), *fds])
        except OSError:
            end.close()
            return None  # it ended: reaped as any child, no client waits on it
        return pid, end

    def end_orphans(self) -> None:
        """SIGKILL for a worker whose client went away ``ORPHAN_GRACE`` seconds ago and that
        has not ended since, as the command would have ended with its own process."""
        now = time.monotonic()
        for pid, since in list(self.orphans.items()):
            if pid not in self.workers:
                del self.orphans[pid]
            elif now - since > ORPHAN_GRACE:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                del self.orphans[pid]

    def reap(self) -> None:
        """Tell each ended worker's client how it ended (a worker that ended normally told it
        first; the client reads only the first answer)."""
        while True:  # every ended child: workers, and a spare that ended without a command
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn, command = self.workers.pop(pid, (None, ""))
            if conn is None:  # a spare that ended before it had a command
                if self.spare is not None and self.spare[0] == pid:
                    self.spare[1].close()
                    self.spare = None
                continue
            self.wants_spare = self.spare is None
            if os.WIFSIGNALED(status):
                ended = f"signal {os.WTERMSIG(status)}"
                _answer(conn, client.KILLED, os.WTERMSIG(status))
            else:
                code = os.waitstatus_to_exitcode(status)
                ended = "refused" if code == REFUSED_EXIT else f"exit {code}"
                _answer(conn, client.EXITED, code)
            conn.close()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            self.log.write(f"{stamp} worker {pid}: {command}, {ended}\n")
            self.log.flush()


def receive(conn: socket.socket) -> tuple[dict[str, object], list[int]]:
    """A client's request and the descriptors that came with it (stdin, stdout, stderr and
    its working directory)."""
    data, fds, flags, _ = socket.recv_fds(conn, 1 << 16, 4)
    if flags & socket.MSG_CTRUNC:
        _close(fds)
        raise ValueError("descriptors cut off")
    try:
        return _request(conn, data), fds
    except BaseException:
        _close(fds)
        raise


def _request(conn: socket.socket, data: bytes = b"") -> dict[str, object]:
    """A request as ``_framed`` sends it (its length, then itself, marshalled), of which
    ``data`` came already."""
    head = bytearray(data)
    while len(head) < 4:
        chunk = conn.recv(4 - len(head))
        if not chunk:
            raise EOFError
        head += chunk
    size = int.from_bytes(head[:4], "little")
    if size > REQUEST_MAX:
        raise ValueError("request too large")
    body = head[4:]
    while len(body) < size:
        chunk = conn.recv(min(1 << 20, size - len(body)))
        if not chunk:
            raise EOFError
        body += chunk
    request = marshal.loads(bytes(body))
    if not isinstance(request, dict):
        raise ValueError("not a request")
    return request


def _framed(body: bytes) -> bytes:
    """A message as ``receive`` reads it: its length, then itself."""
    return len(body).to_bytes(4, "little") + body


def wait_as_spare(end: socket.socket, main: Callable[[list[str]], int]) -> NoReturn:
    """A spare worker's life: wait for the server to hand it a command (the client's
    connection, request and descriptors, over ``end``), then run it as any worker does,
    once the server found its code unchanged. The server's end closing before that (the
    server ended) ends the spare."""
    try:
        request = _request(end)
        _, fds, _, _ = socket.recv_fds(end, 1, 5)
    except (OSError, ValueError, EOFError, TypeError):
        os._exit(0)
    if len(fds) != 5:  # the server ended before it sent them all
        _close(fds)
        os._exit(0)
    conn = socket.socket(fileno=fds[0])
    conn.settimeout(None)

    def code_unchanged() -> bool:
        try:
            said = end.recv(1)
        except OSError:
            said = b""
        end.close()
        return said == GO_ON

    work(conn, request, fds[1:], main, code_unchanged)


def page_populator() -> Callable[[], None] | None:
    """What makes a forked process's writable pages its own at once, before a command runs
    in it (``Server.start_spare``): a worker otherwise copies each page of the server's the
    first time it writes to it (a reference count changed is a write), ~5 ms of faults in
    the middle of a command. ``madvise(MADV_POPULATE_WRITE)`` does it for a whole mapping in
    the kernel; before Linux 5.14 there is none (None): the spare then saves the fork alone.
    (Writing each page's first byte from Python is no substitute: the interpreter may write
    that byte itself between the read and the write, and the write would undo it.)"""
    import ctypes
    import mmap

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        madvise.restype = ctypes.c_int
    except (OSError, AttributeError):  # no C library to ask
        return None
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    first = ctypes.c_char.from_buffer(probe)
    kernel_can = madvise(ctypes.addressof(first), mmap.PAGESIZE, MADV_POPULATE_WRITE) == 0
    del first
    probe.close()
    if not kernel_can:
        return None

    def populate() -> None:
        for start, end in _writable_mappings():
            madvise(start, end - start, MADV_POPULATE_WRITE)  # one it cannot: left as is

    return populate


def _writable_mappings() -> list[tuple[int, int]]:
    """This process's private writable mappings (``rw-p`` in ``/proc/self/maps``): the ones
    a forked process shares with its parent until it writes to them. A device's memory is
    not among them, even where mapped so: a write is not the device's to have."""
    found = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split(None, 5)
                where, perms = fields[0], fields[1]
                name = fields[5].strip() if len(fields) > 5 else ""
                if perms == "rw-p" and not name.startswith("/dev/"):
                    start, _, end = where.partition("-")
                    found.append((int(start, 16), int(end, 16)))
    except OSError:  # no /proc: nothing made its own ahead, each page copied when written
        return []
    return found


def _refuse(conn: socket.socket, fds: list[int]) -> None:
    _close(fds)
    _answer(conn, client.REFUSED, 0)
    conn.close()


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _answer(conn: socket.socket, tag: bytes, number: int) -> None:
    with contextlib.suppress(OSError):  # the client went away: there is no one to tell
        conn.sendall(tag + number.to_bytes(4, "little", signed=True))


def work(
    conn: socket.socket,
    request: dict[str, object],
    fds: list[int],
    main: Callable[[list[str]], int],
    code_unchanged: Callable[[], bool] = lambda: True,
) -> NoReturn:
    """A worker's life: become the client's process, run its command, report how it ended.
    ``code_unchanged``: the server's check of its files, made while this process took on
    the client (a spare's); a stale server's worker refuses, and the client runs alone."""
    try:
        refusal = _become_client(request, fds)
    except Exception as exc:  # a request this server cannot read: the client runs it
        refusal = f"{type(exc).__name__}: {exc}"
    if refusal is None and not code_unchanged():
        refusal = "the server's code changed"
    if refusal is not None:
        _answer(conn, client.REFUSED, 0)
        os._exit(REFUSED_EXIT)
    _answer(conn, client.STARTED, os.getpid())
    if not _go_ahead(conn):
        os._exit(REFUSED_EXIT)  # the client gave up waiting and runs the command itself
    lifetime.answer_first()  # what the command releases, it may release after its answer
    code = run_command(main, list(request["args"]))  # type: ignore[call-overload]
    _let_go_of_stdio()  # flushed by run_command
    _answer(conn, client.EXITED, code)
    lifetime.answered()
    os._exit(code)


def _let_go_of_stdio() -> None:
    """Point stdin, stdout and stderr at /dev/null before the command's exit status is told.
    A client's stdout or stderr that is a pipe (``$(clusterjob submit ...)``, a program that
    captures the output) then ends with the client, not once this worker has released what
    the command left for after its answer (``lifetime``): its reader waited for that too,
    ~3 ms of every captured submit."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _go_ahead(conn: socket.socket) -> bool:
    """Whether the client, told the worker started, said to go ahead (``client.GO``)."""
    conn.settimeout(client.START_TIMEOUT)
    try:
        said = conn.recv(1)
    except OSError:
        return False
    finally:
        conn.settimeout(None)
    return said == client.GO


def _become_client(request: dict[str, object], fds: list[int]) -> str | None:
    """Take on the client process's state; why not, where a part of it cannot be taken on
    (a resource limit above this process's hard limit, a priority it may not raise to)."""
    import resource

    for res, wanted in request["limits"].items():  # type: ignore[attr-defined]
        if resource.getrlimit(res) != wanted:
            try:
                resource.setrlimit(res, wanted)
            except (OSError, ValueError):
                return f"resource limit {res}: {wanted}"
    nice = request["nice"]
    if os.getpriority(os.PRIO_PROCESS, 0) != nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)  # type: ignore[arg-type]
        except OSError:
            return f"priority {nice}"
    _take_signals(request)
    os.fchdir(fds[3])
    for number, fd in enumerate(fds[:3]):
        os.dup2(fd, number)
    _close(fds)
    os.environ.clear()
    for key, value in request["environ"].items():  # type: ignore[attr-defined]
        os.environb[key] = value
    os.umask(request["umask"])  # type: ignore[arg-type]
    sys.argv = list(request["argv"])  # type: ignore[call-overload]
    _take_stdio()
    return None


def _take_signals(request: dict[str, object]) -> None:
    """The client's signal dispositions as its interpreter set them up: the ones it ignored
    ignored (a command run under ``nohup``, or in a shell's background), the others as
    Python sets them; and the same blocked signals."""
    ignored = set(request["ignored"])  # type: ignore[call-overload]
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if sig in ignored:
            handler: object = signal.SIG_IGN
        elif sig == signal.SIGINT:
            handler = signal.default_int_handler
        else:
            handler = signal.SIG_DFL
        if signal.getsignal(sig) is handler:  # as the server had it: most of them
            continue
        with contextlib.suppress(OSError, ValueError):  # one the C library keeps for itself
            signal.signal(sig, handler)  # type: ignore[arg-type]
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])  # type: ignore[arg-type]


def _take_stdio() -> None:
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` over the client's descriptors, as the
    interpreter opens them at its start: the same encoding and error handlers (the locale is
    the client's, by the fingerprint), stdout line-buffered on a terminal, stderr always."""
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(number, "r" if number == 0 else "w", closefd=False)
        buffered = io.BufferedReader(raw) if number == 0 else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            buffered,
            encoding=old.encoding,
            errors=old.errors,
            newline="\n",
            line_buffering=number == 2 or (number == 1 and raw.isatty()),
            write_through=old.write_through,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def run_command(main: Callable[[list[str]], int], args: list[str]) -> int:
    """Run the command as the client's interpreter would have run it, to the end of its
    process: its exit status, where it ends by one."""
    try:
        code = main(args)
    except SystemExit as exc:
        code = _exit_status(exc)
    except KeyboardInterrupt:  # as the interpreter does: the traceback, then end by SIGINT
        traceback.print_exc()
        _flushed()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    threading = sys.modules.get("threading")
    if threading is not None:  # the interpreter waits for threads that are not daemons
        for thread in threading.enumerate():
            if not thread.daemon and thread is not threading.main_thread():
                thread.join()
    atexit._run_exitfuncs()
    if not _flushed() and code == 0:
        code = 120  # what the interpreter exits with when stdout cannot be flushed at its end
    return code


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _flushed() -> bool:
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            ok = False
    return ok
