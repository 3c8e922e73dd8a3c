"""Attacks on the root Prolog by an ordinary user, each reproduced against a real file tree.

Run as root (the Prolog's user); the attacker is a real unprivileged Unix user created for the
test. Each test names the finding of the security review it covers. The Epilog runs as root
after every job with the same site file, cache and log rules: each attack on those is run
against both hooks.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir
from unix_users import UnixUser, unix_user

from clusterjob.errors import UntrustedConfig
from clusterjob.node import allocation
from clusterjob.node.allocation import parse_index_list
from clusterjob.node.trust import check_trusted

REPO = Path(__file__).resolve().parents[1]
MAX_INDICES = getattr(allocation, "MAX_INDICES", 1024)  # the cap per node

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the Prolog runs as root")

GOOD = """\
site: good
gpu_request: {syntax: gres}
models:
  A100: {nvml_names: ["NVIDIA A100-SXM4-80GB"]}
node_map:
  - {nodes: "gpu2", gpus: [{model: A100}]}
prolog: {on_error: drain}
"""
EVIL = GOOD.replace("site: good", "site: evil").replace("on_error: drain", "on_error: pass")


@pytest.fixture
def tree() -> Iterator[Path]:
    yield from trusted_tmp_dir()


@pytest.fixture(scope="module")
def user() -> Iterator[UnixUser]:
    with unix_user() as u:
        yield u


@pytest.fixture(params=["prolog", "epilog"])
def hook(request: pytest.FixtureRequest) -> str:
    """The root hooks that read the site file, fill the cache and append to a log."""
    return str(request.param)


def run_hook(
    hook: str, *args: str, umask: int | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``clusterjob prolog`` or ``epilog`` as slurmd runs it; no NVML library here, so on a
    trusted config it cannot check the GPUs and applies the site's ``on_error`` (the Epilog
    asks NVML only after a job given GPUs: this one had GPU 0)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SLURMD_NODENAME": "gpu2"}
    if hook == "epilog":
        env["SLURM_JOB_GPUS"] = "0"
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", hook, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,  # noqa: PLW1509
    )


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


# -- 1. the config check: no path through a dir others can write, no check-then-reopen -----


def test_path_through_a_sticky_world_writable_dir_is_refused(tree: Path) -> None:
    """/tmp-like parents were accepted (sticky); anyone may create names there (StrictModes)."""
    pub = tree / "pub"
    pub.mkdir()
    pub.chmod(0o1777)
    site = write(pub / "etc" / "site.yaml", GOOD)
    site.parent.chmod(0o755)
    with pytest.raises(
        UntrustedConfig, match=r"directory .*/pub is group/world-writable \(mode 1777\)"
    ):
        check_trusted(site)


def test_symlink_in_a_trusted_dir_is_followed_and_its_target_checked(tree: Path) -> None:
    """What admins do (/etc/clusterjob -> /opt/...) keeps working; a link out to /tmp does not."""
    real = write(tree / "opt" / "site.yaml", GOOD)
    (tree / "etc").mkdir()
    (tree / "etc" / "site.yaml").symlink_to(real)
    check_trusted(tree / "etc" / "site.yaml")
    pub = tree / "pub"
    pub.mkdir()
    pub.chmod(0o1777)
    write(pub / "site.yaml", GOOD)
    (tree / "etc" / "other.yaml").symlink_to(pub / "site.yaml")
    with pytest.raises(UntrustedConfig, match="group/world-writable"):
        check_trusted(tree / "etc" / "other.yaml")


def test_user_swapping_a_symlink_never_gets_root_to_load_their_config(
    tree: Path, user: UnixUser, hook: str
) -> None:
    """The review's race: a user flips a symlink between root's file and their own while the
    Prolog checks one and (before) parsed the other. No run may ever use the user's policy."""
    good = write(tree / "etc" / "good.yaml", GOOD)
    pub = tree / "pub"
    pub.mkdir()
    pub.chmod(0o1777)
    evil = Path(user.home) / "evil.yaml"
    write(evil, EVIL)
    os.chown(evil, user.uid, user.gid)
    link = pub / "site.yaml"
    swapper = user.popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os
                a, b, link = {str(good)!r}, {str(evil)!r}, {str(link)!r}
                tmp = link + ".new"
                while True:
                    for target in (a, b):
                        try:
                            os.symlink(target, tmp)
                            os.rename(tmp, link)
                        except OSError:
                            pass
                """
            ),
        ]
    )
    try:
        outcomes = []
        for _ in range(40):
            done = run_hook(
                hook,
                "--site",
                str(link),
                "--cache-dir",
                str(tree / "cache"),
                "--log",
                str(tree / "p.jsonl"),
            )
            outcomes.append((done.returncode, done.stderr))
    finally:
        swapper.kill()
        swapper.wait()
    used_evil = [err for code, err in outcomes if code == 0 or "on_error=pass" in err]
    assert used_evil == []
    assert all(code == 1 for code, _ in outcomes)


def test_config_read_is_the_file_checked(tree: Path, hook: str) -> None:
    """The parse comes from the checked descriptor: a config root owns is parsed and cached
    under that file's identity; replacing the name afterwards is a cache miss, not a hit."""
    site = write(tree / "etc" / "site.yaml", GOOD)
    cache = tree / "cache"
    first = run_hook(
        hook, "--site", str(site), "--cache-dir", str(cache), "--log", str(tree / "p.jsonl")
    )
    assert "on_error=drain" in first.stderr and first.returncode == 1
    (entry,) = cache.iterdir()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o644
    write(tree / "etc" / "new.yaml", EVIL)
    os.replace(tree / "etc" / "new.yaml", site)  # root's own edit: must be seen at once
    second = run_hook(
        hook, "--site", str(site), "--cache-dir", str(cache), "--log", str(tree / "p.jsonl")
    )
    assert "on_error=pass" in second.stderr and second.returncode == 0


# -- 2. the log: trusted path, no FIFO, no symlinked parent, inside the deadline -------------


def test_fifo_at_the_log_path_does_not_hold_the_hook(tree: Path, hook: str) -> None:
    site = write(tree / "etc" / "site.yaml", GOOD)
    (tree / "log").mkdir()
    fifo = tree / "log" / "prolog.jsonl"
    os.mkfifo(fifo, 0o644)
    start = time.monotonic()
    done = run_hook(
        hook,
        "--site",
        str(site),
        "--cache-dir",
        str(tree / "c"),
        "--log",
        str(fifo),
        "--deadline",
        "3",
        timeout=30,
    )
    assert time.monotonic() - start < 10
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert f"cannot write log {fifo}" in line


def test_log_is_not_written_through_a_users_symlinked_dir(
    tree: Path, user: UnixUser, hook: str
) -> None:
    site = write(tree / "etc" / "site.yaml", GOOD)
    victim = tree / "victim"
    victim.mkdir()
    users = tree / "users"
    users.mkdir()
    os.chown(users, user.uid, user.gid)  # a directory the user owns on the log's path
    (users / "logs").symlink_to(victim)
    log = users / "logs" / "prolog.jsonl"
    done = run_hook(hook, "--site", str(site), "--cache-dir", str(tree / "c"), "--log", str(log))
    assert done.returncode == 1
    assert list(victim.iterdir()) == []
    assert f"cannot write log {log}" in done.stderr


def test_log_hard_link_to_another_file_is_not_appended_to(tree: Path, hook: str) -> None:
    site = write(tree / "etc" / "site.yaml", GOOD)
    precious = write(tree / "precious", "keep\n", 0o644)
    (tree / "log").mkdir()
    os.link(precious, tree / "log" / "prolog.jsonl")
    run_hook(
        hook,
        "--site",
        str(site),
        "--cache-dir",
        str(tree / "c"),
        "--log",
        str(tree / "log" / "prolog.jsonl"),
    )
    assert precious.read_text() == "keep\n"


# -- 3. the cache dir: made 0755 whatever the umask; a user's cache dir is not a drain -------


def test_cache_parents_are_made_0755_under_umask_0(tree: Path, hook: str) -> None:
    site = write(tree / "etc" / "site.yaml", GOOD)
    cache = tree / "var" / "cache" / "clusterjob"
    run_hook(
        hook,
        "--site",
        str(site),
        "--cache-dir",
        str(cache),
        "--log",
        str(tree / "p.jsonl"),
        umask=0,
    )
    for d in (tree / "var", tree / "var" / "cache", cache):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755, d
    assert len(list(cache.iterdir())) == 1


def test_cache_dir_made_first_by_a_user_neither_drains_nor_is_believed(
    tree: Path, user: UnixUser, hook: str
) -> None:
    site = write(tree / "etc" / "site.yaml", EVIL.replace("site: evil", "site: lab"))  # pass
    cache = tree / "cache"
    cache.mkdir()
    os.chown(cache, user.uid, user.gid)
    done = run_hook(
        hook, "--site", str(site), "--cache-dir", str(cache), "--log", str(tree / "p.jsonl")
    )
    assert done.returncode == 0, done.stderr  # the site's on_error=pass, not a cache refusal
    assert (
        f"cache not used: refusing {cache}: directory {cache} is owned by uid {user.uid}"
        in done.stderr
    )
    assert list(cache.iterdir()) == []


# -- 10. the deadline cannot be held up --------------------------------------------------------


def test_huge_gpu_index_lists_are_refused_not_expanded() -> None:
    start = time.monotonic()
    for text in (f"0-{MAX_INDICES}", "0-999999999", ",".join(["0-1000"] * 2)):
        with pytest.raises(ValueError, match=f"more than {MAX_INDICES} GPU indices"):
            parse_index_list(text)
    assert time.monotonic() - start < 1
    assert parse_index_list(f"0-{MAX_INDICES - 1}") == tuple(range(MAX_INDICES))


def test_cpu_bound_stall_past_the_deadline_is_ended_by_the_backstop(hook: str) -> None:
    """A C-level loop never lets Python's SIGALRM handler run; the CPU-time backstop ends it."""
    run_class = {"prolog": "PrologRun", "epilog": "EpilogRun"}[hook]
    code = textwrap.dedent(
        f"""
        from clusterjob.node.{hook} import {run_class}
        run = {run_class}(node="gpu2", job_id=None, log_override="/dev/null", deadline_override=1)
        run.arm_alarm()
        sum(range(10**12))  # one C call: no bytecode boundary for the Python handler
        """
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == -signal.SIGPROF
    assert time.monotonic() - start < 10
