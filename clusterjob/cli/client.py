"""The command server's client: hand a hot command to a warm clusterjob, or say to run it here.

A ``submit`` or ``status`` run as a fresh process spends most of its time importing
clusterjob; a shell loop of submissions pays that on every line. So ``__main__`` first asks
here whether a command server (``clusterjob.cli.server``) of this same installation, user and
login session is listening in the private runtime directory. If one is, this process sends
it everything a process is to its command: the command line, the environment, the working
directory, the umask, the resource limits, the scheduling priority and its stdin, stdout and
stderr themselves (as file descriptors, so a terminal stays a terminal and a pipe a pipe).
The server forks a worker that takes them all on and runs the command as this process would
have; its exit status comes back here and becomes this process's. Ctrl-C and the other
termination signals are passed on to the worker, and Ctrl-Z stops it with this process.

A command for a remote cluster (``$CLUSTERJOB_HOST``; ``--host`` comes before the command
word, so such a command line is not one of these) always runs here: ssh may ask for a
passphrase or a host key on the controlling terminal, which a worker does not have. So does
a command run inside a batch job: a server it started would outlive the job on its node.
Where no server answers, or this one cannot stand in for this process (another interpreter,
``sys.path``, interpreter flags or locale, which the socket's name is made from; a resource
limit or priority the worker cannot take on), ``run_served`` returns None and the command
runs here as before. Where none listened, it starts one in the background for the next
command; it ends after ``IDLE_SECONDS`` without a command. ``CLUSTERJOB_SERVER=0`` turns all
of this off. This module imports only what the interpreter has loaded at its start,
``_socket`` (``socket`` itself imports ``enum``: 3 ms) and ``resource``; neither it nor
the modules a command is imported through has a ``from __future__`` import (a module of its
own: 0.2 ms).
"""

import marshal
import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Mapping

SERVER_ENV = "CLUSTERJOB_SERVER"  # envvars.SERVER; envvars imports dataclasses
HOST_ENV = "CLUSTERJOB_HOST"  # envvars.HOST: a remote cluster's commands run in their own
# process (ssh asks for a passphrase or a host key on /dev/tty, the controlling terminal)
# Set in a batch job by Slurm and by Grid Engine (for every job, arrays or not): a command
# run in a job runs there, and starts no server to linger on the node after the job.
IN_A_JOB = ("SLURM_JOB_ID", "SGE_TASK_ID")
SERVED = ("submit", "status")  # the commands the server runs (fastpath.FAST_COMMANDS)
PROTOCOL = 1  # bump when a request or an answer changes shape
IDLE_SECONDS = 120  # a server ends after this long without a command

# An answer is a tag byte and a signed 32-bit number, little-endian.
ANSWER_SIZE = 5
STARTED, EXITED, KILLED, REFUSED = b"P", b"X", b"K", b"R"
# The client's go-ahead after STARTED. A client that gave up waiting for STARTED (a server
# stuck for START_TIMEOUT seconds) runs the command itself and never sends it, so the worker
# that starts late runs nothing: a command runs once, here or there, never both.
GO = b"G"
START_TIMEOUT = 5.0
FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


# The environment that decides how the interpreter starts (its path, flags, hash seed, text
# encodings, warnings): part of the socket's name, and all of a server's own environment
# (with HOME, where a user's site-packages are found).
def _shapes_interpreter(name: str) -> bool:
    return name.startswith(("PYTHON", "LC_")) or name in ("LANG", "LANGUAGE")


def server_enabled(environ: "Mapping[str, str]") -> bool | None:
    """Whether to use a command server; None where the setting is not one this reads."""
    setting = environ.get(SERVER_ENV, "")
    if setting in ("", "1"):
        return True
    if setting == "0":
        return False
    return None


def fingerprint(sid: int) -> tuple[object, ...]:
    """What a server must share with this process to run its command as it would have:
    the same installation, interpreter and start-up, user, groups and login session (the
    session's keyring and cgroup are what ``sbatch`` would have run in)."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if _shapes_interpreter(k)))
    flags = tuple(sys.flags)
    return (
        PROTOCOL, sys.version, sys.executable, tuple(sys.path), flags, env,
        os.getuid(), os.geteuid(), os.getgid(), os.getegid(), tuple(sorted(os.getgroups())), sid,
    )  # fmt: skip


def socket_path(directory: str, print_: tuple[object, ...]) -> str:
    return os.path.join(directory, f"server-{_name_hash(repr(print_).encode()):08x}")


# The largest prime below 2**32: a socket's name is the fingerprint's bytes, read as one
# number, modulo this prime. Only a name: two fingerprints that share one are told apart by
# the server, which compares the whole fingerprint and refuses the other's requests.
_NAME_PRIME = 4_294_967_291


def _name_hash(data: bytes) -> int:
    """A 32-bit hash from the interpreter's own built-ins: ``zlib`` and ``hashlib`` are
    shared libraries in some builds of Python (pyenv's, ...), a third of a millisecond to
    load in every command."""
    return int.from_bytes(data, "little") % _NAME_PRIME


def run_served(args: list[str]) -> int | None:
    """Run ``args`` in a command server and return its exit status; None where it is to run
    in this process (not a command a server runs, no server, one that cannot stand in for
    this process, or this is off)."""
    if not args or args[0] not in SERVED:
        return None
    enabled = server_enabled(os.environ)
    if enabled is None:
        from clusterjob.cli.outcome import err
        from clusterjob.errors import ExitCode

        err(f"error: {SERVER_ENV} must be 0 or 1, not {os.environ[SERVER_ENV]!r}")
        return int(ExitCode.USAGE)
    if not enabled or os.environ.get(HOST_ENV):
        return None  # off; or ssh may ask on the terminal, which a worker does not control
    if any(name in os.environ for name in IN_A_JOB):
        return None  # a server started in a job would outlive the job's own processes
    from clusterjob.runtime_dir import SOCKET_PATH_MAX, private_runtime_dir

    directory, problem = private_runtime_dir()
    if problem:
        return None
    try:
        sid = os.getsid(0)
        print_ = fingerprint(sid)
    except OSError:
        return None
    path = socket_path(directory, print_)
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        return None
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        start_server(path, print_)
        return None
    try:
        return _run(sock, args, print_)
    finally:
        sock.close()


def _request(args: list[str], print_: tuple[object, ...]) -> bytes | None:
    """The command and this process's state, as the server reads them."""
    import _signal
    import resource

    try:
        umask = os.umask(0o22)
        os.umask(umask)
        limits = {r: resource.getrlimit(r) for r in _limit_names(resource)}
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        ignored = [s for s in _signal.valid_signals() if _signal.getsignal(s) == _signal.SIG_IGN]
        blocked = list(_signal.pthread_sigmask(_signal.SIG_BLOCK, []))
    except (OSError, ValueError):
        return None
    request = {
        "fingerprint": print_,
        "args": args,
        "argv": sys.argv,
        "environ": dict(os.environb),
        "umask": umask,
        "limits": limits,
        "nice": nice,
        "ignored": ignored,
        "blocked": blocked,
    }
    return marshal.dumps(request)


def _limit_names(resource: object) -> list[int]:
    return [getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_")]


def _run(sock: object, args: list[str], print_: tuple[object, ...]) -> int | None:
    import _socket

    assert isinstance(sock, _socket.socket)
    try:
        peer = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
        if int.from_bytes(peer[4:8], sys.byteorder) != os.getuid():
            return None  # not ours, though in a directory only we may write: never trust it
        body = _request(args, print_)
        if body is None:
            return None
        cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            fds = (0, 1, 2, cwd)
            rights = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
            head = len(body).to_bytes(4, "little")
            sock.sendmsg([head + body], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        finally:
            os.close(cwd)
        sock.settimeout(START_TIMEOUT)
        tag, number = _answer(sock)
        if tag != STARTED:
            return None  # REFUSED, or a server that ended before its worker started
        sock.sendall(GO)  # the worker runs the command only once it has this
        sock.settimeout(None)
    except OSError:  # a closed stdin, a server that ended or is stuck: nothing has run
        return None
    return _follow(sock, worker=number)


def _answer(sock: object) -> tuple[bytes, int]:
    """The server's next answer; (b"", 0) where it closed the connection."""
    data = b""
    while len(data) < ANSWER_SIZE:
        chunk = sock.recv(ANSWER_SIZE - len(data))  # type: ignore[attr-defined]
        if not chunk:
            return b"", 0
        data += chunk
    return data[:1], int.from_bytes(data[1:], "little", signed=True)


def _follow(sock: object, worker: int) -> int:
    """Wait for the worker's end, passing signals on to it; its exit status, or this process
    ends by the signal that ended it."""
    import _signal  # signal itself imports enum

    def forward(signum: int, frame: object) -> None:
        try:  # noqa: SIM105 - contextlib imports collections (2 ms of every command here)
            os.kill(worker, signum)
        except OSError:
            pass  # it has ended: its status is on its way

    def stop(signum: int, frame: object) -> None:
        """Ctrl-Z: the worker stops with this process, and goes on when it does."""
        forward(_signal.SIGSTOP, frame)
        _signal.signal(_signal.SIGTSTP, _signal.SIG_DFL)
        os.kill(os.getpid(), _signal.SIGTSTP)  # stopped here until continued
        _signal.signal(_signal.SIGTSTP, stop)
        forward(_signal.SIGCONT, frame)

    for name in (*FORWARDED_SIGNALS, "SIGTSTP"):
        number = getattr(_signal, name)
        if _signal.getsignal(number) != _signal.SIG_IGN:  # ignored here: ignored there too
            _signal.signal(number, stop if name == "SIGTSTP" else forward)
    while True:
        try:
            tag, number = _answer(sock)
        except InterruptedError:
            continue
        except OSError:
            tag, number = b"", 0
        break
    if tag == EXITED:
        return number
    if tag == KILLED:
        _signal.signal(number, _signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return 128 + number
    sys.stderr.write(
        f"clusterjob: the command server's worker (pid {worker}) ended without an exit "
        "status; check with `clusterjob status` what the command did\n"
    )
    return 1


def server_environment(environ: "Mapping[str, str]") -> dict[str, str]:
    """A new server's environment: only what shapes its interpreter. A module that read
    anything else when imported would answer every later command with the first one's
    environment; started without it, such a module is wrong every time, and a test sees it."""
    env = {k: v for k, v in environ.items() if _shapes_interpreter(k)}
    if "HOME" in environ:
        env["HOME"] = environ["HOME"]
    return env


# A server's first words: out of the working directory it was started in, and onto the
# client's ``sys.path`` (the fingerprint's fourth item) before anything of clusterjob is
# imported, so that it loads the client's own clusterjob and no other.
BOOT = (
    "import marshal, os, sys; os.chdir('/'); f = marshal.loads(bytes.fromhex(sys.argv[2])); "
    "sys.path[:] = f[3]; from clusterjob.__main__ import main; "
    "from clusterjob.cli.server import boot; boot(sys.argv[1], f, main)"
)


def start_server(path: str, print_: tuple[object, ...]) -> None:
    """Start a server in the background for the commands after this one; it loads while this
    one runs. It ends at once where another already holds the socket's lock."""
    plain = marshal.dumps(print_)  # type: ignore[arg-type]  # numbers, strings and tuples
    args = [sys.executable, "-c", BOOT, path, plain.hex()]
    try:  # noqa: SIM105 - as above
        os.posix_spawn(
            sys.executable,
            args,
            server_environment(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setsid=True,
        )
    except OSError:
        pass  # no server this time: the command runs here all the same
