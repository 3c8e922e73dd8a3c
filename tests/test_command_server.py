"""The command server (clusterjob/cli/server.py, client.py): a command it runs answers as the
same command run in its own process, for every shape of command line; the server loads
everything such a command loads, reads nothing of its environment while loading, answers
only its own user, and ends when its code changes, its socket goes or it is idle.

The end-to-end half, against the local Slurm cluster (a served job sees what its client had,
Ctrl-C, a terminal), is tests/e2e/test_command_server.py.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from server_helpers import (
    REPO,
    alive,
    logs,
    normalized,
    run,
    runtime_dir,
    served,
    served_env,
    server_pids,
    start,
    wait_for_server,
)

from clusterjob import envvars
from clusterjob.cli import client, fastpath, server
from clusterjob.runtime_dir import RUNTIME_DIR_ENV

SITE = REPO / "site_configs" / "mllab.yaml"

# Command lines of every shape the fast path and Typer take: a submission's options, a
# request the site refuses, the argument parser's errors, help, and status (no Slurm here:
# its error line, the same both ways).
COMMAND_LINES = [
    ["submit", "train.py", "--gpus", "2", "--model", "A100", "--dry-run"],
    ["submit", "train.py", "-N", "2", "--gpus", "4", "--model", "A100", "--dry-run"],
    ["submit", "train.py", "--gpus", "1", "--model", "A100", "--array", "0-3", "--env", "A=1",
     "--time", "1:00:00", "--dry-run", "--", "--lr", "0.1"],
    ["submit", "train.py", "--gpus", "1", "--model", "A100", "--sweep", "lr=0.1,0.2",
     "--dry-run"],
    ["submit", "train.py", "--gpus", "2", "--model", "H100", "--dry-run"],
    ["submit", "train.py", "--gpus", "two", "--model", "A100", "--dry-run"],
    ["submit", "missing.py", "--gpus", "1", "--model", "A100", "--dry-run"],
    ["submit", "train.py", "--gpus", "1", "--model", "A100", "--dry-run", "--debug"],
    ["submit"],
    ["submit", "--help"],
    ["status"],
    ["status", "--all", "--json"],
    ["status", "12345"],
    ["status", "--bogus"],
]  # fmt: skip


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('train')\n")
    return tmp_path


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, CLUSTERJOB_SITE=str(SITE), COLUMNS="100")
    env["CLUSTERJOB_DATA_DIR"] = str(tmp_path / "data")
    for name in ("SLURM_CONF", "CLUSTERJOB_HOST"):
        env.pop(name, None)
    env["PATH"] = "/usr/bin:/bin"  # no Slurm: status says so, the same way both times
    return env


def test_every_shape_of_command_line_answers_alike_served_and_not(
    workdir: Path, base_env: dict[str, str]
) -> None:
    with runtime_dir() as rt:
        env = served_env(base_env, rt)
        start(env, rt, workdir)
        differ = []
        for args in COMMAND_LINES:
            before = len(served(rt))
            alone = run(args, dict(base_env, CLUSTERJOB_SERVER="0"), workdir)
            through = run(args, env, workdir)
            assert len(served(rt, before + 1)) == before + 1, f"not served: {args}: {served(rt)}"
            a = (alone.returncode, normalized(alone.stdout), normalized(alone.stderr))
            b = (through.returncode, normalized(through.stdout), normalized(through.stderr))
            if a != b:
                differ.append(f"{args}:\n  alone:  {a}\n  served: {b}")
        assert not differ, "\n".join(differ)
        # the shapes are not all alike: errors, help and scripts among them
        assert {int(line.rsplit(" ", 1)[1]) for line in served(rt)[-len(COMMAND_LINES) :]} > {0}


def test_a_served_command_reads_stdin_and_writes_to_the_descriptors_it_was_given(
    workdir: Path, base_env: dict[str, str]
) -> None:
    """The server's own stdio is /dev/null: the output must reach the client's own pipes,
    not the server's, and the exit status the client's; here through a file for stdout."""
    with runtime_dir() as rt:
        env = served_env(base_env, rt)
        start(env, rt, workdir)
        out = workdir / "out.txt"
        with out.open("w") as fh:
            done = subprocess.run(
                [*_cli(), "submit", "train.py", "--gpus", "1", "--model", "A100", "--dry-run"],
                env=env, cwd=workdir, stdout=fh, stderr=subprocess.PIPE, text=True, timeout=60,
            )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "#SBATCH --gres=gpu:a100:1" in out.read_text() or "#SBATCH" in out.read_text()
        assert served(rt, 1) == ["submit, exit 0"]


def test_a_served_command_closes_its_registry_after_its_answer(
    workdir: Path, base_env: dict[str, str]
) -> None:
    """A served worker closes its registry connections after it has told its client the exit
    status (clusterjob/lifetime.py): closed all the same, so the last close still copies the
    write-ahead log into the database and removes it, as a command in its own process does."""
    data = Path(base_env["CLUSTERJOB_DATA_DIR"])
    with runtime_dir() as rt:
        env = served_env(base_env, rt)
        start(env, rt, workdir)
        alone = run(["status"], dict(base_env, CLUSTERJOB_SERVER="0"), workdir)
        assert (data / "jobs.sqlite").is_file(), alone.stderr  # status opened (made) it
        (data / "jobs.sqlite").unlink()
        through = run(["status"], env, workdir)
        assert served(rt, 1) == [f"status, exit {alone.returncode}"]  # reaped: it has ended
        assert (through.returncode, through.stderr) == (alone.returncode, alone.stderr)
    assert (data / "jobs.sqlite").is_file()
    assert not (data / "jobs.sqlite-wal").exists()  # its close ran, after the answer


def test_a_captured_commands_output_ends_with_its_answer_not_with_its_worker(
    tmp_path: Path,
) -> None:
    """A program that captures a served command's output reads to the end of its pipe; the
    worker lets go of the client's stdio before it tells the exit status, so the pipe ends
    with the client, not once the worker has run what the command left for after its answer
    (``lifetime``; here a release that takes two seconds). The worker itself, its request
    as the client builds it and real pipes; only the command is this test's."""
    import marshal
    import select

    from clusterjob import lifetime

    request = marshal.loads(client._request(["status"], ("fingerprint",)) or b"")
    released = tmp_path / "released"
    out_r, out_w = os.pipe()
    ours, theirs = socket.socketpair()

    def command(args: list[str]) -> int:
        print("the command's output")
        lifetime.after_answer(lambda: (time.sleep(2), released.write_text("done")))
        return 3

    pid = os.fork()
    if pid == 0:  # the worker, as the server forks it
        try:
            import atexit

            atexit._clear()  # pytest's own exit handlers are not the worker's to run
            sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
            ours.close()
            os.close(out_r)
            stdin = os.open(os.devnull, os.O_RDONLY)
            cwd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
            server.work(theirs, request, [stdin, out_w, out_w, cwd], command)
        finally:
            os._exit(99)
    theirs.close()
    os.close(out_w)
    try:
        assert ours.recv(client.ANSWER_SIZE)[:1] == client.STARTED
        ours.sendall(client.GO)
        assert ours.recv(client.ANSWER_SIZE) == client.EXITED + (3).to_bytes(4, "little")
        output = b""
        deadline = time.monotonic() + 1.0
        while (left := deadline - time.monotonic()) > 0 and select.select([out_r], [], [], left)[0]:
            chunk = os.read(out_r, 4096)
            if not chunk:
                break
            output += chunk
        else:
            pytest.fail("the pipe stayed open while the worker ran its releases")
        assert output == b"the command's output\n"
        assert not released.exists()  # the worker was still releasing when the pipe ended
    finally:
        os.close(out_r)
        ours.close()
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3
    assert released.read_text() == "done"  # and ran its release all the same


def _cli() -> list[str]:
    from server_helpers import clusterjob_command

    return clusterjob_command()


def test_the_server_loads_everything_a_submit_and_a_status_load() -> None:
    """A worker imports nothing: whatever a fresh submit or status loads (clusterjob's modules,
    its dependencies', the standard library's) the server loaded before it forked."""
    cold = textwrap.dedent(
        f"""
        import contextlib, io, os, sys
        os.environ["CLUSTERJOB_SITE"] = {str(SITE)!r}
        os.environ["PATH"] = "/usr/bin:/bin"
        from clusterjob.__main__ import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main(["submit", {str(REPO / "examples" / "train.py")!r}, "--gpus", "1",
                  "--model", "A100", "--dry-run"])
            main(["status"])
        print(sorted(sys.modules))
        """
    )
    warm = "from clusterjob.cli import server; server.preload(); import sys; print(sorted(sys.modules))"  # noqa: E501
    env = dict(os.environ, CLUSTERJOB_SERVER="0")
    loaded = _modules(cold, env)
    preloaded = _modules(warm, env)
    missing = sorted(set(loaded) - set(preloaded) - {"__main__"})
    assert not missing, f"add to server.PRELOAD: {missing}"


def _modules(code: str, env: dict[str, str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    return list(eval(done.stdout.strip().splitlines()[-1]))  # a list of names, printed here


def test_no_loaded_module_of_clusterjob_reads_the_environment_or_cwd_while_loading() -> None:
    """A server starts with the interpreter's environment alone and serves every command from
    modules loaded then: one that read anything else while loading (a default from
    ``$HOME``, the working directory) would answer each command with the server's."""
    code = textwrap.dedent(
        """
        import json, os, sys
        read = []
        class Watched(type(os.environ)):
            def __getitem__(self, key):
                frame = sys._getframe(1)  # past Mapping.get and os's own helpers
                while frame.f_globals.get("__name__") in ("collections.abc", "os"):
                    frame = frame.f_back
                read.append([frame.f_globals.get("__name__", ""), key])
                return super().__getitem__(key)
        os.environ.__class__ = Watched
        real_getcwd = os.getcwd
        def getcwd():
            read.append([sys._getframe(1).f_globals.get("__name__", ""), "(cwd)"])
            return real_getcwd()
        os.getcwd = getcwd
        from clusterjob.cli import server
        server.preload()
        print(json.dumps(read))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    read = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [f"{module} read {key}" for module, key in read if module.startswith("clusterjob")]
    assert not ours, ours
    # the watch works: a read that goes through it is seen
    probe = subprocess.run(
        [sys.executable, "-c", code.replace("server.preload()", "import clusterjob.runtime_dir as r; r.runtime_dir()")],  # noqa: E501
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "clusterjob.runtime_dir" in probe.stdout


def test_the_fast_commands_are_the_served_ones() -> None:
    assert set(client.SERVED) == set(fastpath.FAST_COMMANDS)
    assert client.SERVER_ENV == envvars.SERVER
    assert client.HOST_ENV == envvars.HOST
    assert RUNTIME_DIR_ENV == envvars.RUNTIME_DIR


def test_a_bad_server_setting_is_one_line_and_exit_2(
    workdir: Path, base_env: dict[str, str]
) -> None:
    done = run(["status"], dict(base_env, CLUSTERJOB_SERVER="yes"), workdir)
    assert done.returncode == 2
    assert done.stderr == "clusterjob: error: CLUSTERJOB_SERVER must be 0 or 1, not 'yes'\n"


def test_with_the_server_off_no_server_starts(workdir: Path, base_env: dict[str, str]) -> None:
    with runtime_dir() as rt:
        env = dict(served_env(base_env, rt), CLUSTERJOB_SERVER="0")
        run(["status", "--help"], env, workdir)
        time.sleep(1.0)
        assert not list(rt.iterdir())


def test_the_socket_name_follows_what_shapes_the_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = client.fingerprint(1)
    monkeypatch.setenv("LC_ALL", "C")
    second = client.fingerprint(1)
    monkeypatch.setenv("PYTHONWARNINGS", "error")
    third = client.fingerprint(1)
    paths = {client.socket_path("/d", p) for p in (first, second, third, client.fingerprint(2))}
    assert len(paths) == 4
    monkeypatch.setenv("SOMETHING_ELSE", "x")  # the command's own environment: not part of it
    assert client.fingerprint(1) == third


def test_a_server_starts_with_only_what_shapes_its_interpreter() -> None:
    env = {"HOME": "/h", "PATH": "/bin", "LANG": "C.UTF-8", "LC_CTYPE": "C", "PYTHONPATH": "/p",
           "CLUSTERJOB_SITE": "/s", "SLURM_CONF": "/c"}  # fmt: skip
    assert client.server_environment(env) == {
        "HOME": "/h", "LANG": "C.UTF-8", "LC_CTYPE": "C", "PYTHONPATH": "/p",
    }  # fmt: skip


@pytest.mark.parametrize("spare", ["ready", "killed"])
def test_a_changed_module_ends_the_server_and_its_command_runs_alone(
    tmp_path: Path, workdir: Path, base_env: dict[str, str], spare: str
) -> None:
    """A copy of clusterjob first on the path (as an upgrade in place would leave it): its
    server refuses the first command after a module changed, which runs in its own process,
    and ends; the next command starts a server of the new code. Whether the command was
    handed to the spare (which refuses it, told by the server) or there was none."""
    copy = tmp_path / "copy"
    shutil.copytree(
        REPO / "clusterjob", copy / "clusterjob", ignore=shutil.ignore_patterns("__pycache__")
    )
    base = dict(base_env, PYTHONPATH=str(copy))
    with runtime_dir() as rt:
        env = served_env(base, rt)
        start(env, rt, workdir)
        first = server_pids(rt)
        assert run(["status", "--all"], env, workdir).returncode != 2
        assert len(served(rt, 1)) == 1  # the help that started it ran alone; then status
        if spare == "killed":
            import signal

            ready = _spare_of(first[0])
            os.kill(ready, signal.SIGKILL)
            while ready in _children(first[0]):  # reaped
                time.sleep(0.05)
        module = copy / "clusterjob" / "cli" / "outcome.py"
        module.write_text(module.read_text() + "\n# changed\n")
        alone = run(["status", "--all"], env, workdir)
        assert len(served(rt, 2, timeout=1)) == 1, "a stale server ran a command"
        assert (
            alone.returncode
            == run(["status", "--all"], dict(base, CLUSTERJOB_SERVER="0"), workdir).returncode
        )  # noqa: E501
        deadline = time.monotonic() + 20
        while server_pids(rt) == first:
            run(["status", "--help"], env, workdir)
            assert time.monotonic() < deadline, "no new server after the code changed"
            time.sleep(0.3)
        assert "ends: its code changed" in (rt.glob("server-*.log").__next__()).read_text()


def test_a_request_the_worker_cannot_take_on_runs_alone(
    workdir: Path, base_env: dict[str, str]
) -> None:
    """A server started under a lower hard limit cannot raise a later client's: that client's
    command runs in its own process, with its own limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 64:
        pytest.skip("this process's open-file limit is too low to lower")
    low = min(hard - 1, 1024)
    with runtime_dir() as rt:
        env = served_env(base_env, rt)

        def lowered() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, low), low))

        subprocess.run([*_cli(), "status", "--help"], env=env, cwd=workdir, preexec_fn=lowered,
                       capture_output=True, timeout=60, check=False)  # fmt: skip
        wait_for_server(rt)
        done = run(["status", "--help"], env, workdir)
        assert done.returncode == 0 and "Usage" in done.stdout
        assert served(rt, 1) == ["status, refused"]
        ok = subprocess.run(
            [*_cli(), "status", "--help"], env=env, cwd=workdir, preexec_fn=lowered,
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        assert ok.returncode == 0
        assert served(rt, 2) == ["status, refused", "status, exit 0"]


def test_another_user_gets_no_answer(workdir: Path, base_env: dict[str, str]) -> None:
    """Even where the directory and socket were opened to others, the server answers no one
    but its own user (``SO_PEERCRED``)."""
    pytest.importorskip("pwd")
    from unix_users import unix_user

    with runtime_dir() as rt:
        env = served_env(base_env, rt)
        start(env, rt, workdir)
        sock = next(p for p in rt.iterdir() if p.suffix == "" and p.name.startswith("server-"))
        rt.chmod(0o711)
        sock.chmod(0o666)
        probe = textwrap.dedent(
            f"""
            import socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect({str(sock)!r})
            s.settimeout(10)
            try:
                s.sendall(b"\\x10\\x00\\x00\\x00" + b"x" * 16)
                print(repr(s.recv(5)))
            except (BrokenPipeError, ConnectionResetError):  # closed, before or after it
                print(repr(b""))
            """
        )
        with unix_user("cjsrv") as other:
            done = other.run([sys.executable, "-c", probe])
        assert done.stdout.strip() == "b''", done.stderr
        assert served(rt, 1, timeout=1) == []


def test_an_idle_server_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "IDLE_SECONDS", 0.3)
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    lock = os.open(tmp_path / "s.lock", os.O_RDWR | os.O_CREAT, 0o600)
    with open(tmp_path / "log", "w") as log:
        begun = time.monotonic()
        serving = server.Server(listener, lock, (), {}, log, lambda args: 0)
        why = serving.serve(path, os.stat(path).st_ino)
    assert why == "no command for 0.3 s"
    assert time.monotonic() - begun < 5
    assert serving.spare is None  # the spare made for a command that never came: ended
    listener.close()
    os.close(lock)


def test_a_watched_file_that_changes_makes_the_server_stale(tmp_path: Path) -> None:
    watched = tmp_path / "m.py"
    watched.write_text("x = 1\n")
    stamp = server._stamp(str(watched))
    assert stamp is not None
    with open(os.devnull, "w") as log, socket.socket(socket.AF_UNIX) as listener:
        serving = server.Server(listener, -1, (), {str(watched): stamp}, log, lambda args: 0)
        assert not serving.stale()
        watched.write_text("x = 2\n")
        assert serving.stale()


def test_what_the_server_watches_is_its_code_not_the_standard_library() -> None:
    code = (
        "from clusterjob.cli import server as s; import json; print(json.dumps(list(s.preload())))"  # noqa: E501
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )  # noqa: E501
    files = json.loads(done.stdout.strip().splitlines()[-1])
    assert str(REPO / "clusterjob" / "cli" / "submitting.py") in files
    assert any("jinja2" in f or "hostlist" in f for f in files)  # a dependency's modules
    assert not any(
        f.startswith(os.path.dirname(os.__file__) + "/") and "-packages" not in f for f in files
    )  # noqa: E501


def test_a_pipe_the_first_command_inherited_is_not_held_open_by_its_server(
    workdir: Path, base_env: dict[str, str]
) -> None:
    """A build tool that waits for its pipe's end would wait for the server's (two minutes
    idle, or forever for a busy one): the server closes what it inherited by accident."""
    import select

    with runtime_dir() as rt:
        env = served_env(base_env, rt)
        read_end, write_end = os.pipe()
        try:
            subprocess.run(
                [*_cli(), "status", "--help"], env=env, cwd=workdir, pass_fds=(write_end,),
                capture_output=True, timeout=60, check=True,
            )  # fmt: skip
            os.close(write_end)
            wait_for_server(rt)
            ready, _, _ = select.select([read_end], [], [], 5)
            assert ready and os.read(read_end, 1) == b"", "the server holds the pipe open"
        finally:
            os.close(read_end)


@pytest.mark.parametrize("variable", ["SLURM_JOB_ID", "SGE_TASK_ID"])
def test_a_command_in_a_batch_job_runs_in_its_own_process_and_starts_no_server(
    workdir: Path, base_env: dict[str, str], variable: str
) -> None:
    with runtime_dir() as rt:
        run(["status", "--help"], dict(served_env(base_env, rt), **{variable: "7"}), workdir)
        time.sleep(1.0)
        assert not list(rt.iterdir())


def test_a_command_for_a_remote_cluster_runs_in_its_own_process(
    workdir: Path, base_env: dict[str, str]
) -> None:
    """ssh asks for a passphrase or a new host key on the controlling terminal, which a
    worker does not have: such a command is never handed over."""
    with runtime_dir() as rt:
        env = served_env(base_env, rt)
        start(env, rt, workdir)
        run(["status"], dict(env, CLUSTERJOB_HOST="login.example.org"), workdir)
        run(["status", "--help"], env, workdir)
        assert served(rt, 1) == ["status, exit 0"]  # the second alone


def test_a_killed_client_takes_its_worker_with_it(
    tmp_path: Path, workdir: Path, base_env: dict[str, str]
) -> None:
    """SIGKILL is the one signal a client cannot pass on: its worker must not go on alone
    (a command killed in its own process does not)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\nexec sleep 21\n")  # an sbatch that hangs
    (bin_dir / "sbatch").chmod(0o755)
    env = dict(base_env, PATH=f"{bin_dir}:/usr/bin:/bin")
    with runtime_dir() as rt:
        env = served_env(env, rt)
        start(env, rt, workdir)
        with subprocess.Popen(
            [*_cli(), "submit", "train.py", "--gpus", "1", "--model", "A100"],
            env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ) as submitting:  # fmt: skip
            try:
                deadline = time.monotonic() + 30
                while not _sleeping_sbatch():
                    assert time.monotonic() < deadline, "sbatch never ran"
                    time.sleep(0.1)
                submitting.kill()
            finally:
                submitting.kill()
        assert served(rt, 1) == ["submit, signal 9"]


def _sleeping_sbatch() -> bool:
    """Whether the stand-in sbatch (exec'd into ``sleep 21``) is running."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if fh.read() == b"sleep\x0021\x00":
                        return True
            except OSError:
                continue
    return False


def test_a_stuck_server_gets_the_command_once_and_never_runs_it(
    workdir: Path, base_env: dict[str, str]
) -> None:
    """A client gives a server ``START_TIMEOUT`` seconds to start its worker, then runs the
    command itself; the worker that starts late never runs it (it waits for the client's
    go-ahead): the command runs once, never twice."""
    import signal

    with runtime_dir() as rt:
        env = served_env(base_env, rt)
        start(env, rt, workdir)
        (pid,) = server_pids(rt)
        os.kill(pid, signal.SIGSTOP)
        out = workdir / "out.txt"
        try:  # output to a file: a pipe's end stays open in the request the server holds
            begun = time.monotonic()
            with out.open("w") as fh:
                done = subprocess.run(
                    [*_cli(), "status", "--help"], env=env, cwd=workdir, stdout=fh,
                    stderr=subprocess.DEVNULL, timeout=60, check=False,
                )  # fmt: skip
            waited = time.monotonic() - begun
        finally:
            os.kill(pid, signal.SIGCONT)
        assert done.returncode == 0 and out.read_text().count("Usage:") == 1
        assert waited >= client.START_TIMEOUT
        assert served(rt, 1) == ["status, refused"]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def _spare_of(server_pid: int, not_this: int = 0, timeout: float = 10) -> int:
    """The server's spare worker: its one child while no command runs."""
    deadline = time.monotonic() + timeout
    while True:
        children = [c for c in _children(server_pid) if c != not_this]
        if len(children) == 1:
            return children[0]
        assert time.monotonic() < deadline, f"no spare: children {children}"
        time.sleep(0.05)


def test_a_command_runs_in_the_spare_made_before_it_which_ends_with_its_server(
    workdir: Path, base_env: dict[str, str]
) -> None:
    """The next command's worker is forked (and its pages copied) while no command runs; the
    command runs in it, a new spare follows, and the last spare ends with its server."""
    with runtime_dir() as rt:
        env = served_env(base_env, rt)
        start(env, rt, workdir)
        (pid,) = server_pids(rt)
        spare = _spare_of(pid)
        assert run(["status", "--help"], env, workdir).returncode == 0
        assert served(rt, 1) == ["status, exit 0"]  # logged once reaped: waited for
        assert f" worker {spare}: status, exit 0" in logs(rt)
        following = _spare_of(pid, not_this=spare)
        assert following != spare
    assert not alive(following)


def test_a_spare_that_died_is_not_given_a_command(workdir: Path, base_env: dict[str, str]) -> None:
    """A spare killed before its command (the OOM killer, a user's kill): the command runs
    in a worker forked for it, and the next command in a new spare."""
    import signal

    with runtime_dir() as rt:
        env = served_env(base_env, rt)
        start(env, rt, workdir)
        (pid,) = server_pids(rt)
        spare = _spare_of(pid)
        os.kill(spare, signal.SIGKILL)
        while spare in _children(pid):  # reaped
            time.sleep(0.05)
        first = run(["status", "--help"], env, workdir)
        assert first.returncode == 0 and "Usage:" in first.stdout
        assert served(rt, 1) == ["status, exit 0"]
        assert f" worker {spare}:" not in logs(rt)
        following = _spare_of(pid)
        assert run(["status", "--help"], env, workdir).returncode == 0
        assert served(rt, 2) == ["status, exit 0"] * 2  # logged once reaped: waited for
        assert f" worker {following}: status, exit 0" in logs(rt)


def test_a_spare_has_its_own_copy_of_each_page_before_its_command() -> None:
    """In a forked process, after ``populate`` (madvise, Linux 5.14), the writable pages it
    shared with its parent are its own: its private dirty memory grew by most of them."""
    populate = server.page_populator()
    if populate is None:
        pytest.skip("the kernel has no MADV_POPULATE_WRITE (before Linux 5.14)")
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            total = sum(end - start_ for start_, end in server._writable_mappings()) // 1024
            before = _private_dirty_kb()
            populate()
            os.write(writing, f"{_private_dirty_kb() - before} {total}".encode())
        finally:
            os._exit(0)
    os.close(writing)
    with os.fdopen(reading) as fh:
        grew, total = (int(x) for x in fh.read().split())
    os.waitpid(pid, 0)
    assert grew > total // 2, f"{grew} KiB made private of {total} KiB writable"


def _private_dirty_kb() -> int:
    with open("/proc/self/smaps_rollup", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    raise AssertionError("no Private_Dirty in smaps_rollup")
