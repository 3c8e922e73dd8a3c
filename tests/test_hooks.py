"""The Slurm hooks through ``python -m clusterjob``: exit codes and exact output lines.

These tests need no GPU library: they cover what happens before NVML is asked (config
trust, argument handling), the TaskProlog (pure environment logic) and the stdlib-only
import rule. The runs over the stand-in NVML library are in test_hooks_nvml.py.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir

from clusterjob.errors import UntrustedConfig
from clusterjob.node.trust import check_trusted

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534
# The root hooks that read the site file and give slurmd a verdict: the same trust rules.
HOOKS = ("prolog", "epilog")


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """The Prolog trusts no path through sticky /tmp: these trees live under a root-owned dir."""
    yield from trusted_tmp_dir()


def cj(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m clusterjob`` as slurmd would: a small, explicit environment."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", *args],
        env={**base, **(env or {})},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    d = tmp_path / "etc"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    return d


def write_site(conf_dir: Path) -> Path:
    site = conf_dir / "site.yaml"
    site.write_text("site: lab\n")
    site.chmod(0o644)
    return site


# -- config trust (StrictModes) ----------------------------------------------------------


def test_trusted_config_accepted(conf_dir: Path) -> None:
    check_trusted(write_site(conf_dir))  # root-owned 644 in a root-owned 755 dir


@pytest.mark.parametrize(
    ("setup", "why"),
    [
        (lambda s: os.chown(s, NOBODY, -1), "file {s} is owned by uid 65534, not root"),
        (lambda s: s.chmod(0o666), "file {s} is group/world-writable (mode 0666)"),
        (lambda s: s.chmod(0o664), "file {s} is group/world-writable (mode 0664)"),
        (lambda s: s.parent.chmod(0o777), "directory {d} is group/world-writable (mode 0777)"),
        (lambda s: s.parent.chmod(0o1777), "directory {d} is group/world-writable (mode 1777)"),
        (lambda s: os.chown(s.parent, NOBODY, -1), "directory {d} is owned by uid 65534, not root"),
    ],
)
def test_untrusted_config_refused(conf_dir: Path, setup, why: str) -> None:  # type: ignore[no-untyped-def]
    site = write_site(conf_dir)
    setup(site)
    with pytest.raises(UntrustedConfig) as info:
        check_trusted(site)
    assert str(info.value) == f"refusing {site}: " + why.format(s=site, d=conf_dir)


def test_symlink_to_user_file_refused(conf_dir: Path, tmp_path: Path) -> None:
    user_dir = tmp_path / "home"
    user_dir.mkdir()
    target = user_dir / "evil.yaml"
    target.write_text("site: evil\n")
    os.chown(target, NOBODY, -1)
    link = conf_dir / "site.yaml"
    link.symlink_to(target)
    with pytest.raises(UntrustedConfig, match="owned by uid 65534"):
        check_trusted(link)


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("how", ["chown nobody", "chmod 666"])
def test_hook_drains_on_untrusted_config(
    conf_dir: Path, tmp_path: Path, how: str, hook: str
) -> None:
    site = write_site(conf_dir)
    if how == "chown nobody":
        os.chown(site, NOBODY, -1)
        why = f"file {site} is owned by uid 65534, not root"
    else:
        site.chmod(0o666)
        why = f"file {site} is group/world-writable (mode 0666)"
    log = tmp_path / "log" / f"{hook}.jsonl"
    done = cj(
        hook,
        "--site",
        str(site),
        "--log",
        str(log),
        env={"SLURMD_NODENAME": "gpu2", "SLURM_JOB_ID": "42"},
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"clusterjob {hook}: gpu2: GPUs not checked: site config: refusing {site}: {why} "
        "-- draining (on_error=drain, site policy unknown)"
    ]
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["node"] == "gpu2"
    assert record["job_id"] == "42"
    assert (record["outcome"], record["action"], record["error"]) == ("error", "drain", "config")


@pytest.mark.skipif(Path("/etc/clusterjob/site.yaml").exists(), reason="a real site is installed")
@pytest.mark.parametrize("hook", HOOKS)
def test_hook_ignores_clusterjob_site_env(conf_dir: Path, tmp_path: Path, hook: str) -> None:
    """A user-controlled variable must not choose root's config: the default path is used."""
    user_site = write_site(conf_dir)  # even a trusted file is not taken from the environment
    done = cj(
        hook,
        "--log",
        str(tmp_path / "p.jsonl"),
        env={"SLURMD_NODENAME": "gpu2", "CLUSTERJOB_SITE": str(user_site)},
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"clusterjob {hook}: gpu2: GPUs not checked: site config: /etc/clusterjob/site.yaml: "
        "cannot read: No such file or directory -- draining (on_error=drain, site policy unknown)"
    ]


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_missing_config_drains(tmp_path: Path, hook: str) -> None:
    missing = tmp_path / "nope.yaml"
    done = cj(
        hook,
        "--site",
        str(missing),
        "--log",
        str(tmp_path / "p.jsonl"),
        env={"SLURMD_NODENAME": "gpu2"},
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"clusterjob {hook}: gpu2: GPUs not checked: site config: {missing}: cannot read: "
        "No such file or directory -- draining (on_error=drain, site policy unknown)"
    ]


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_unwritable_log_is_reported_on_the_same_line(conf_dir: Path, hook: str) -> None:
    site = write_site(conf_dir)
    os.chown(site, NOBODY, -1)
    blocker = conf_dir / "file"
    blocker.write_text("")
    done = cj(
        hook,
        "--site",
        str(site),
        "--log",
        str(blocker / "prolog.jsonl"),
        env={"SLURMD_NODENAME": "gpu2"},
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.endswith(f"; cannot write log {blocker / 'prolog.jsonl'}: File exists")


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_bad_argument_is_one_line(hook: str) -> None:
    done = cj(hook, "--bogus")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"clusterjob {hook}: unrecognized arguments: --bogus"]


# -- task prolog -------------------------------------------------------------------------

ORDER = "export CUDA_DEVICE_ORDER=PCI_BUS_ID"


@pytest.mark.parametrize(
    ("env", "lines"),
    [
        ({}, [ORDER]),
        ({"SLURM_JOB_GPUS": "0,2", "CUDA_VISIBLE_DEVICES": "0,2"}, [ORDER]),
        (
            {"SLURM_JOB_GPUS": "2,0", "CUDA_VISIBLE_DEVICES": "2,0"},
            [ORDER, "export CUDA_VISIBLE_DEVICES=0,2"],
        ),
        ({"SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1"}, [ORDER]),
        (
            {"SLURM_JOB_GPUS": "3,1", "CUDA_VISIBLE_DEVICES": "1,0"},
            [ORDER, "export CUDA_VISIBLE_DEVICES=0,1"],
        ),
        (
            {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "4,5"},
            [
                ORDER,
                "print clusterjob: warning: CUDA_VISIBLE_DEVICES=4,5 does not match "
                "SLURM_JOB_GPUS=2,3",
            ],
        ),
        ({"CUDA_VISIBLE_DEVICES": "MIG-1,MIG-0"}, [ORDER]),
    ],
)
def test_task_prolog_lines(env: dict[str, str], lines: list[str]) -> None:
    done = cj("task-prolog", env=env)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == lines


def test_task_prolog_never_fails_the_task() -> None:
    done = cj("task-prolog", "--bogus")
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["print clusterjob: warning: task-prolog: bad arguments"]


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVML is installed here"
)
def test_task_prolog_uuid_without_nvml_warns_and_passes(tmp_path: Path) -> None:
    done = cj(
        "task-prolog",
        env={"CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a", "LD_LIBRARY_PATH": str(tmp_path)},
    )
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0] == ORDER
    assert len(lines) == 2
    assert lines[1].startswith(
        "print clusterjob: warning: CUDA_VISIBLE_DEVICES not put in PCI order: NVML: "
    )


# -- stdlib only on the hook path --------------------------------------------------------

FORBIDDEN = ("typer", "click", "rich", "jinja2", "ruamel", "hostlist")
# Loaded by the hooks and neither the standard library nor clusterjob: a new dependency.
NOT_STDLIB = (
    "sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in "
    "sys.stdlib_module_names | {'clusterjob'})"
)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that finds this checkout's clusterjob, and no more."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hooks_import_no_heavy_modules(conf_dir: Path, tmp_path: Path) -> None:
    site = write_site(conf_dir)
    os.chown(site, NOBODY, -1)  # the prolog stops at the trust check: no config parsing here
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from clusterjob.__main__ import main\n"
        "main(['task-prolog'])\n"
        f"main(['prolog', '--site', {str(site)!r}, '--log', {str(tmp_path / 'l')!r}])\n"
        f"main(['epilog', '--site', {str(site)!r}, '--log', {str(tmp_path / 'e')!r}])\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        f"print('LOADED', bad, {NOT_STDLIB})\n"
    )
    done = _python(code)
    assert done.stdout.splitlines()[-1] == "LOADED [] []", done.stderr


def test_a_hook_run_as_the_command_ends_without_teardown() -> None:
    """A hook run as slurmd runs it (its arguments from the command line) ends its process
    as soon as it has flushed its output: the interpreter's teardown (unloading what the
    checks imported) would add ~15 ms to every job's start. Its exit handlers still run.
    Called with arguments, as a library, ``main`` returns the exit code."""
    code = (
        "import atexit, sys\n"
        "class Unloaded:\n"
        "    def __del__(self): print('UNLOADED')\n"
        "kept = Unloaded()  # freed by the teardown, when the modules are unloaded\n"
        "atexit.register(print, 'EXIT HANDLER')\n"
        "from clusterjob.__main__ import main\n"
        "print('RETURNED', main(['task-prolog']))\n"
        "sys.argv = ['clusterjob', 'task-prolog']\n"
        "main()\n"
        "print('NOT REACHED')\n"
    )
    done = _python(code)
    assert (done.returncode, done.stdout.splitlines()) == (
        0,
        [
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
            "RETURNED 0",
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
            "EXIT HANDLER",
        ],
    ), done.stderr


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_fifo_config_is_refused_at_once(conf_dir: Path, tmp_path: Path, hook: str) -> None:
    """A site file that would block on open (a FIFO) is refused, not waited on.

    (It used to be opened and block until the deadline alarm; opening without blocking and
    checking the type on the descriptor now refuses it at once.)
    """
    fifo = conf_dir / "site.yaml"
    os.mkfifo(fifo, 0o644)
    start = time.monotonic()
    done = cj(
        hook,
        "--site",
        str(fifo),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--deadline",
        "1",
        "--log",
        str(tmp_path / "p.jsonl"),
        env={"SLURMD_NODENAME": "gpu2"},
    )
    assert time.monotonic() - start < 6
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"clusterjob {hook}: gpu2: GPUs not checked: site config: refusing {fifo}: {fifo} is "
        "not a regular file -- draining (on_error=drain, site policy unknown)"
    ]


@pytest.mark.parametrize("command", ["prolog", "task-prolog", "epilog"])
def test_hook_help_exits_0_without_warning(command: str) -> None:
    done = cj(command, "--help")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"Usage: clusterjob {command} [OPTIONS]")
    assert "warning" not in done.stdout
