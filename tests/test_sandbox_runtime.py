"""The local cluster's node side as other users run it, wherever root's checkout sits.

Root's clone lands in root's home (0700) by default: the TaskProlog and ``node_command`` run as
the job's user, who cannot reach that checkout or its venv. The sandbox then runs a copy
(``clusterjob.sandbox.runtime``) that every user can read; the stand-in NVML library is one
every user can load.
"""

from __future__ import annotations

import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir
from unix_users import UnixUser, unix_user

from clusterjob.sandbox import config, runtime
from clusterjob.sandbox.config import Layout
from clusterjob.sandbox.standin import build_standin_library


@pytest.fixture
def trusted() -> Iterator[Path]:
    yield from trusted_tmp_dir()


@pytest.fixture(scope="module")
def user() -> Iterator[UnixUser]:
    with unix_user("cjrt") as u:
        yield u


def world_python() -> Path:
    python = runtime.world_python()
    if python is None:
        pytest.skip("no Python of this version every user can run")
    return python


def test_the_copy_is_what_another_user_runs(trusted: Path, user: UnixUser) -> None:
    copied = runtime.copy_runtime(trusted / "runtime")
    code = (
        "import sys; sys.path[:0] = sys.argv[1:3]; "
        "import clusterjob, typer, jinja2, pynvml, ruamel.yaml; "
        "from clusterjob.resources import templates_dir, site_configs_dir; "
        "print(clusterjob.__file__, templates_dir().is_dir(), site_configs_dir().is_dir())"
    )
    done = user.run(
        [str(world_python()), "-I", "-c", code, *map(str, copied.pythonpath())], cwd="/"
    )
    assert done.returncode == 0, done.stderr
    where, templates, sites = done.stdout.split()
    assert Path(where).is_relative_to(copied.src)
    assert (templates, sites) == ("True", "True")
    for path in (copied.directory, *copied.directory.rglob("*")):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert path.stat().st_uid == 0, path
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))


def test_the_copy_is_made_again_only_when_what_it_copies_changed(trusted: Path) -> None:
    copied = runtime.copy_runtime(trusted / "runtime")
    marker = copied.src / "clusterjob" / "__init__.py"
    first = marker.stat().st_ino
    runtime.copy_runtime(trusted / "runtime")
    assert marker.stat().st_ino == first  # up to date: not copied again
    stale = copied.src / "clusterjob" / "left-over.txt"
    stale.write_text("")
    (copied.directory / ".clusterjob-runtime").write_text("another digest\n")
    runtime.copy_runtime(trusted / "runtime")
    assert marker.stat().st_ino != first and not stale.exists()


def test_distribution_closure_follows_requirements_without_extras() -> None:
    names = {d.metadata["Name"].lower() for d in runtime.distribution_closure(["clusterjob-slurm"])}
    assert {"clusterjob-slurm", "jinja2", "markupsafe", "typer", "nvidia-ml-py"} <= names
    assert "pytest" not in names and "cloudpickle" not in names  # the test and api extras


def test_a_checkout_others_cannot_reach_gives_the_node_side_the_copy(
    trusted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = Layout(trusted)
    own = layout.hook_python_dir / "bin" / "python"
    own.parent.mkdir(parents=True)
    own.symlink_to(world_python())
    monkeypatch.setattr(runtime, "reachable_here", lambda: False)
    script = config.node_command_script(layout)
    assert f"exec {own} -I -c" in script
    assert script.rstrip().endswith(f'{layout.runtime_dir / "src"} "$@"')
    assert config.hook_python(layout) == own
    monkeypatch.setattr(runtime, "reachable_here", lambda: True)
    assert config.hook_python(layout) == Path(sys.executable)
    assert str(layout.runtime_dir) not in config.node_command_script(layout)


def test_the_standin_library_is_one_every_user_can_load(trusted: Path, user: UnixUser) -> None:
    lib = build_standin_library(trusted / "lib")
    assert stat.S_IMODE(lib.stat().st_mode) == 0o755
    lib.chmod(0o711)  # as earlier builds left it
    assert stat.S_IMODE(build_standin_library(trusted / "lib").stat().st_mode) == 0o755
    load = f"import ctypes; ctypes.CDLL({str(lib)!r}); print('loaded')"
    done = user.run([str(world_python()), "-I", "-c", load], cwd="/")
    assert done.returncode == 0 and done.stdout.strip() == "loaded", done.stderr
