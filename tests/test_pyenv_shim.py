"""pyenv's python3 shim read without running it (``submit_python.pyenv_interpreter``): the
interpreter pyenv would run, where pyenv's files alone say it; in every other case the shim
is run as before, so the answer is never a guess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterjob.jobscript.submit_python import pyenv_interpreter, start_find_submit_python

# The shim `pyenv rehash` writes (libexec/pyenv-rehash), for a root of the test's own.
SHIM = """\
#!/usr/bin/env bash
set -e
[ -n "$PYENV_DEBUG" ] && set -x

program="${{0##*/}}"

export PYENV_ROOT="{root}"
exec "{root}/libexec/pyenv" exec "$program" "$@"
"""
RAN = "/the/shim/ran"  # what this test's stand-in `pyenv exec` answers


def _pyenv(tmp_path: Path, *versions: str, global_version: str = "3.12.1") -> Path:
    """A pyenv root: shims/python3, versions/V/bin/python3 (this interpreter), the global
    version file, and a `pyenv` that says RAN when the shim is run."""
    root = tmp_path / "pyenv"
    for version in versions or ("3.12.1", "3.11.7"):
        bin_dir = root / "versions" / version / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "python3").symlink_to(sys.executable)
    (root / "shims").mkdir()
    (root / "shims" / "python3").write_text(SHIM.format(root=root))
    (root / "shims" / "python3").chmod(0o755)
    (root / "libexec").mkdir()
    (root / "libexec" / "pyenv").write_text(f"#!/bin/sh\necho {RAN}\n")
    (root / "libexec" / "pyenv").chmod(0o755)
    (root / "version").write_text(f"{global_version}\n")
    return root


def _read(root: Path, cwd: Path, **environ: str) -> str | None:
    return pyenv_interpreter(str(root / "shims" / "python3"), environ, str(cwd))


def _answer(root: Path, cwd: Path, **environ: str) -> str:
    """What `submit` names: the reader's answer, else the shim's."""
    here = os.getcwd()
    os.chdir(cwd)
    try:
        path = f"{root / 'shims'}:{os.environ['PATH']}"  # the shim's bash found after it
        found = start_find_submit_python({"PATH": path, **environ})()
    finally:
        os.chdir(here)
    assert found.python is not None
    return found.python


def test_the_global_version_is_read_without_running_the_shim(tmp_path: Path) -> None:
    root = _pyenv(tmp_path)
    expected = str(root / "versions" / "3.12.1" / "bin" / "python3")
    assert _read(root, tmp_path) == expected
    assert _answer(root, tmp_path) == expected


def test_the_nearest_local_version_file_then_pyenv_version_win(tmp_path: Path) -> None:
    root = _pyenv(tmp_path)
    project = tmp_path / "project" / "src"
    project.mkdir(parents=True)
    (tmp_path / "project" / ".python-version").write_text("# pinned\n\n3.11.7 extra words\n")
    assert _read(root, project) == str(root / "versions" / "3.11.7" / "bin" / "python3")
    assert _read(root, project, PYENV_VERSION="3.12.1") == str(
        root / "versions" / "3.12.1" / "bin" / "python3"
    )
    # $PYENV_DIR is where pyenv starts looking, in place of the working directory
    assert _read(root, project, PYENV_DIR=str(tmp_path)) == str(
        root / "versions" / "3.12.1" / "bin" / "python3"
    )


@pytest.mark.parametrize(
    "version",
    ["3.12.1:3.11.7", "system", "3.12", "", "../3.12.1", "3.9.0"],
    ids=["two versions", "system", "a prefix", "none", "a path", "not installed"],
)
def test_what_only_pyenv_can_tell_runs_the_shim(tmp_path: Path, version: str) -> None:
    root = _pyenv(tmp_path, global_version=version)
    assert _read(root, tmp_path) is None
    assert _answer(root, tmp_path) == RAN


def test_a_virtualenv_or_a_python3_that_cannot_run_runs_the_shim(tmp_path: Path) -> None:
    root = _pyenv(tmp_path)
    (root / "versions" / "3.12.1" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert _read(root, tmp_path) is None
    (root / "versions" / "3.12.1" / "pyvenv.cfg").unlink()
    python = root / "versions" / "3.12.1" / "bin" / "python3"
    python.unlink()
    python.write_text("")  # not executable: pyenv's `which` hooks would look further
    assert _read(root, tmp_path) is None
    assert _answer(root, tmp_path) == RAN


def test_hooks_that_may_change_the_answer_run_the_shim(tmp_path: Path) -> None:
    root = _pyenv(tmp_path)
    plugin = root / "plugins" / "pyenv-virtualenv" / "etc" / "pyenv.d"
    (plugin / "which").mkdir(parents=True)
    for known in ("conda.bash", "python-config.bash", "system-site-packages.bash"):
        (plugin / "which" / known).write_text("")
    (root / "pyenv.d" / "exec").mkdir(parents=True)
    (root / "pyenv.d" / "exec" / "pip-rehash.bash").write_text("")
    assert _read(root, tmp_path) is not None, "pyenv-virtualenv's and pip-rehash's hooks"
    hooks = tmp_path / "hooks"
    (hooks / "version-name").mkdir(parents=True)
    (hooks / "version-name" / "pick.bash").write_text("PYENV_VERSION=3.11.7\n")
    assert _read(root, tmp_path, PYENV_HOOK_PATH=str(hooks)) is None
    # a version-name hook is not consulted when $PYENV_VERSION is set (pyenv-which)
    assert _read(root, tmp_path, PYENV_HOOK_PATH=str(hooks), PYENV_VERSION="3.12.1")
    (plugin / "which" / "other.bash").write_text("")
    assert _read(root, tmp_path) is None
    (plugin / "which" / "other.bash").unlink()
    (root / "pyenv.d" / "exec" / "other.bash").write_text("")
    assert _read(root, tmp_path) is None


def test_other_scripts_on_path_are_run(tmp_path: Path) -> None:
    root = _pyenv(tmp_path)
    shim = root / "shims" / "python3"
    shim.write_text(shim.read_text().replace("libexec/pyenv", "libexec/other"))
    assert _read(root, tmp_path) is None


@pytest.mark.skipif(shutil.which("pyenv") is None, reason="no pyenv installed here")
def test_the_reader_agrees_with_an_installed_pyenv(tmp_path: Path) -> None:
    """Where pyenv is installed: for each installed version named in .python-version, what the
    reader says is what the real shim runs (or the reader leaves it to the shim)."""
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
    shim = Path(root) / "shims" / "python3"
    versions = sorted(os.listdir(Path(root) / "versions"))[:4]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYENV_VERSION")}
    for version in [*versions, "system", "no-such-version"]:
        (tmp_path / ".python-version").write_text(version + "\n")
        read = pyenv_interpreter(str(shim), environ, str(tmp_path))
        ran = subprocess.run(
            [str(shim), "-c", "import sys; print(sys.executable)"],
            capture_output=True, text=True, cwd=tmp_path, env=environ,
        )  # fmt: skip
        if read is not None:
            assert read == ran.stdout.strip(), version
