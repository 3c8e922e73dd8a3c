"""`clusterjob site install-hooks`: the Prolog/TaskProlog wrappers slurm.conf names.

Real files in a root-owned scratch tree under /var/lib (the Prolog's trust rules refuse
anything below a world-writable directory such as /tmp, so pytest's tmp_path cannot hold
them). The wrappers written here are run as programs; the e2e test runs them under slurmd.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterjob import __version__
from clusterjob.__main__ import main
from clusterjob.errors import UntrustedConfig, UsageError
from clusterjob.node.wrappers import HookWrappers, check_wrappers, install_wrappers

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root-owned files need root")


@pytest.fixture
def root_tree() -> Iterator[Path]:
    """A root-owned 0755 scratch directory whose every parent only root can write."""
    path = Path(tempfile.mkdtemp(prefix="clusterjob-test-", dir="/var/lib"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def site(root_tree: Path) -> Path:
    etc = root_tree / "etc"
    etc.mkdir(mode=0o755)
    site = etc / "site.yaml"
    shutil.copy(REPO / "site_configs" / "mllab.yaml", site)
    site.chmod(0o644)
    return site


def _args(site: Path, prefix: Path, *more: str) -> list[str]:
    cache = site.parent.parent / "cache"
    return ["site", "install-hooks", "--site", str(site), "--prefix", str(prefix),
            "--cache-dir", str(cache), *more]  # fmt: skip


def test_install_writes_root_owned_isolated_wrappers_and_prints_slurm_conf(
    site: Path, root_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = root_tree / "slurm"  # made, root-owned 0755
    assert main(_args(site, prefix)) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"Prolog={prefix}/clusterjob-prolog" in out
    assert f"TaskProlog={prefix}/clusterjob-task-prolog" in out
    assert f"Epilog={prefix}/clusterjob-epilog" in out
    assert "PrologFlags=Alloc" in out
    assert stat.S_IMODE(prefix.stat().st_mode) == 0o755
    hooks = ("prolog", "task-prolog", "epilog")
    for name, hook in ((f"clusterjob-{h}", h) for h in hooks):
        path = prefix / name
        st = path.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o755)
        lines = path.read_text().splitlines()
        assert lines[0] == "#!/bin/sh"
        assert "cd / || exit 1" in lines
        command = f"{sys.executable} -I -m clusterjob {hook} --site {site}"
        if hook in ("prolog", "epilog"):  # its exit status is the verdict
            assert lines[-1].startswith(f"exec {command}")
        else:  # never the task's end: see the test below
            assert lines[-2].startswith(command) and lines[-1] == "exit 0"
        assert Path(sys.executable).is_absolute()
    prolog = (prefix / "clusterjob-prolog").read_text()
    assert f"--cache-dir {root_tree / 'cache'}" in prolog
    # A second run replaces them in place (same text), leaving no temporary file behind.
    assert main(_args(site, prefix)) == 0
    assert sorted(p.name for p in prefix.iterdir()) == [
        "clusterjob-epilog",
        "clusterjob-prolog",
        "clusterjob-task-prolog",
    ]


def test_dry_run_writes_nothing_and_shows_the_wrappers(
    site: Path, root_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = root_tree / "slurm"
    assert main(_args(site, prefix, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert not prefix.exists()
    assert f"exec {sys.executable} -I -m clusterjob prolog --site {site}" in out
    assert f"Prolog={prefix}/clusterjob-prolog" in out


def test_refuses_a_prefix_the_prolog_would_not_trust(
    site: Path, root_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = root_tree / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # group-writable: anyone in the group could swap the root script
    assert main(_args(site, shared)) == 1
    assert "group/world-writable" in capsys.readouterr().err
    assert list(shared.iterdir()) == []
    with tempfile.TemporaryDirectory() as tmp:  # below /tmp: world-writable, even if sticky
        with pytest.raises(UntrustedConfig, match="--prefix"):
            install_wrappers(HookWrappers(Path(tmp), Path(sys.executable), site))
        assert os.listdir(tmp) == []


def test_refuses_a_site_file_the_prolog_would_refuse(site: Path, root_tree: Path) -> None:
    site.chmod(0o664)
    with pytest.raises(UntrustedConfig, match="--site"):
        install_wrappers(HookWrappers(root_tree / "slurm", Path(sys.executable), site))
    assert not (root_tree / "slurm").exists()


def test_check_passes_a_fresh_installation(
    site: Path, root_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = root_tree / "slurm"
    assert main(_args(site, prefix)) == 0
    capsys.readouterr()
    assert main(_args(site, prefix, "--check")) == 0
    out = capsys.readouterr().out
    assert f"runs clusterjob {__version__}" in out
    assert "NVML:" in out  # found, or why not (no driver on a build machine)
    assert "slurm.conf: " in out  # names these wrappers, or not, or could not be asked
    assert out.splitlines()[-1] == f"{prefix}: hooks ok"


def test_check_catches_a_group_writable_wrapper(
    site: Path, root_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = root_tree / "slurm"
    assert main(_args(site, prefix)) == 0
    (prefix / "clusterjob-prolog").chmod(0o775)
    capsys.readouterr()
    assert main(_args(site, prefix, "--check")) == 1
    out = capsys.readouterr().out
    assert f"{prefix}/clusterjob-prolog is group/world-writable (mode 0775)" in out
    assert "mode 0775, want 0755" in out
    assert out.splitlines()[-1] == f"{prefix}: hooks NOT ok"


def test_check_catches_a_wrong_interpreter_path(
    site: Path, root_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = root_tree / "slurm"
    assert main(_args(site, prefix)) == 0
    prolog = prefix / "clusterjob-prolog"
    prolog.write_text(prolog.read_text().replace(sys.executable, "/opt/gone/bin/python"))
    capsys.readouterr()
    assert main(_args(site, prefix, "--check")) == 1
    out = capsys.readouterr().out
    assert f"runs interpreter /opt/gone/bin/python, want {sys.executable}" in out
    assert "interpreter /opt/gone/bin/python: no such file" in out
    # Asked to check for an interpreter that is not the one written: said as well.
    assert main(_args(site, prefix, "--check", "--python", "/usr/bin/false")) == 1
    assert "want /usr/bin/false" in capsys.readouterr().out


def test_the_task_prolog_wrapper_runs_and_passes_env_on(site: Path, root_tree: Path) -> None:
    prefix = root_tree / "slurm"
    wrappers = HookWrappers(
        prefix, Path(sys.executable), site, environment=(("NVML_DIR", "/opt/x/$SLURMD_NODENAME"),)
    )
    install_wrappers(wrappers)
    env = {"SLURMD_NODENAME": "ml-gpu01", "SLURM_JOB_GPUS": "0,1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": "/nonexistent", "PYTHONSTARTUP": "/nonexistent"}  # fmt: skip
    done = subprocess.run([str(wrappers.task_prolog)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=root_tree)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "export NVML_DIR=/opt/x/ml-gpu01" in lines
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in lines


def test_env_values_are_text_and_variable_expansions_only(site: Path, root_tree: Path) -> None:
    for bad in ("$(reboot)", "`reboot`", "a\nb"):
        with pytest.raises(UsageError):
            HookWrappers(root_tree, Path(sys.executable), site, environment=(("X", bad),))
    with pytest.raises(UsageError, match="not a variable name"):
        HookWrappers(root_tree, Path(sys.executable), site, environment=(("1X", "v"),))
    quoted = HookWrappers(root_tree, Path(sys.executable), site, environment=(("X", 'a"b\\c'),))
    assert 'export X="a\\"b\\\\c"' in quoted.prolog_text()
    assert main(_args(site, root_tree / "slurm", "--env", "NOEQUALS", "--dry-run")) == 2


def test_relative_or_unsafe_paths_are_refused(site: Path) -> None:
    with pytest.raises(UsageError, match="absolute"):
        HookWrappers(Path("/etc/slurm"), Path("python3"), site)
    with pytest.raises(UsageError, match="unquoted"):
        HookWrappers(Path("/etc/slurm hooks"), Path(sys.executable), site)


def test_check_reports_the_interpreter_that_does_not_run_clusterjob(
    site: Path, root_tree: Path
) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3")
    wrappers = HookWrappers(root_tree / "slurm", Path(python), site)
    install_wrappers(wrappers)
    result = check_wrappers(wrappers)
    if result.ok:  # the system Python has this very clusterjob: nothing to report
        assert any(__version__ in n for n in result.notes)
    else:
        assert any("does not run clusterjob" in p or "the wrappers run" in p
                   for p in result.problems), result.problems  # fmt: skip


def test_a_task_prolog_that_cannot_run_says_so_and_never_fails_the_task(
    site: Path, root_tree: Path
) -> None:
    """slurmd kills a task whose TaskProlog fails: a clusterjob the job's user cannot import
    (root's checkout in a 0700 home) used to fail every such job."""
    base = Path(getattr(sys, "_base_executable", sys.executable))
    empty = root_tree / "no-clusterjob-here"
    empty.mkdir()
    wrappers = HookWrappers(root_tree / "slurm", base, site, package_root=empty)
    wrappers.task_prolog.parent.mkdir()
    wrappers.task_prolog.write_text(wrappers.task_prolog_text())
    wrappers.task_prolog.chmod(0o755)
    done = subprocess.run([str(wrappers.task_prolog)], env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60, cwd="/")  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [ln for ln in done.stdout.splitlines() if ln.startswith("print ")]
    assert len(said) == 1 and "clusterjob task-prolog could not run (exit 1)" in said[0]
    assert "GPUs were not checked" in said[0]


def test_a_source_tree_wrapper_runs_that_tree(site: Path, root_tree: Path) -> None:
    """The sandbox run from a checkout that is not installed: the wrapper names the tree,
    and an interpreter without clusterjob (the TaskProlog is stdlib-only) runs it."""
    base = Path(getattr(sys, "_base_executable", sys.executable))
    wrappers = HookWrappers(root_tree / "slurm", base, site, package_root=REPO)
    install_wrappers(wrappers)
    assert "-I -c 'import sys; sys.path.insert(0, sys.argv.pop(1))" in wrappers.task_prolog_text()
    env = {"SLURM_JOB_GPUS": "0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(wrappers.task_prolog)], env=env, capture_output=True, text=True,
                          timeout=60, cwd="/")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in done.stdout.splitlines()


def test_the_hooks_cache_by_default_is_the_one_a_job_reads() -> None:
    """A job's preflight and TaskProlog read the node's entry from the hooks' default cache
    (``job_node_view``): `install-hooks` writes the Prolog's line with that same directory
    unless told another."""
    import inspect

    from clusterjob.cli.site import install_hooks
    from clusterjob.node.context import DEFAULT_CACHE_DIR

    default = inspect.signature(install_hooks).parameters["cache_dir"].default
    assert str(default) == DEFAULT_CACHE_DIR
