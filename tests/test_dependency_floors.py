"""The oldest release of each dependency that pyproject.toml's pins allow, installed and run.

pip keeps a release that meets the pin where one is installed already, so a pin's lower
bound is a promise: every release from it up works. The test environment holds the newest
ones; this builds a venv with each pinned dependency at its floor (read from pyproject.toml,
so a pin that changes is tested at its new floor) and runs clusterjob through it: a command
line Typer reads (its vendored click's errors among them, which typer 0.26.0-0.27.1 do not
have), the same command read without Typer, the command list, every shipped site file's
validation, and an NVML inventory over the stand-in library; then the unit tests of what the
dependencies serve (NVML, rendering, the site loader) with the floors imported.

The floors come from the package index (~3 s from pip's cache); where it cannot be reached
the test is skipped, saying so. Their own dependencies, and clusterjob, come from the
environment running the tests, after the venv's own packages (tests/venvs.py, as the wheel
test's venv), so the floors are the copies imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from venvs import venv_seeing_outside

from clusterjob import resources
from clusterjob.sandbox.standin import h100, standin_env, write_scenario

REPO = Path(__file__).resolve().parent.parent
TOKEN = re.compile(r"[0-9a-f]{16}")  # a submission's token, in its comment and file name
MLLAB = str(resources.site_configs_dir() / "mllab.yaml")
SUBMIT = ["submit", "train.py", "--site", MLLAB, "--gpus", "2", "--model", "a100", "--dry-run"]
# What the command imported, after its output: the fast path's run imports no Typer.
_RUN = """import contextlib, io, sys
from clusterjob.__main__ import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
print(out.getvalue(), end="")
print(int(code), "typer" in sys.modules, file=sys.stderr)
"""


def pins() -> list[Requirement]:
    """This platform's pinned dependencies, as pyproject.toml states them."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    lines = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    found = [Requirement(line) for line in lines]
    return [r for r in found if r.marker is None or r.marker.evaluate()]


def _pip(python: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *words,
         "--disable-pip-version-check"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _install_floor(python: Path, pin: Requirement) -> str:
    """Install the oldest release ``pin`` allows that installs here (a wheel for this
    Python; a floor older than this Python has none, and the next release is the floor
    here) and return its version; skip the test where the index cannot be read."""
    listed = _pip(python, "index", "versions", pin.name)
    line = next((ln for ln in listed.stdout.splitlines() if ln.startswith("Available")), "")
    versions = sorted(
        (Version(v) for v in line.partition(":")[2].replace(",", " ").split()),
    )
    allowed = [v for v in versions if pin.specifier.contains(v, prereleases=False)]
    if not allowed:
        pytest.skip(f"the package index lists no release of {pin} ({listed.stderr.strip()!r})")
    for version in allowed[:5]:
        done = _pip(python, "install", "-q", "--no-deps", "--prefer-binary",
                    f"{pin.name}=={version}")  # fmt: skip
        if done.returncode == 0:
            return str(version)
    pytest.fail(f"none of the five oldest releases {pin} allows installs: {done.stderr}")


@pytest.fixture(scope="module")
def floor_install(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A venv's python with each pinned dependency at its floor, and those floors."""
    python = venv_seeing_outside(tmp_path_factory.mktemp("floors") / "venv", (str(REPO),))
    floors = {pin.name: _install_floor(python, pin) for pin in pins()}
    print("the floors:", floors)
    return python, floors


@pytest.fixture
def floor_python(floor_install: tuple[Path, dict[str, str]]) -> Path:
    return floor_install[0]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return env


def test_the_floors_are_what_the_venv_imports(
    floor_install: tuple[Path, dict[str, str]],
) -> None:
    python, floors = floor_install
    assert set(floors) == {pin.name for pin in pins()}
    code = "import importlib.metadata as m, sys\nfor n in sys.argv[1:]: print(n, m.version(n))"
    shown = subprocess.run(
        [str(python), "-c", code, *floors], capture_output=True, text=True, check=True
    ).stdout.split()
    assert dict(zip(shown[::2], shown[1::2], strict=True)) == floors


def test_a_command_typer_reads_then_without_it(floor_python: Path, tmp_path: Path) -> None:
    """Under the oldest Typer the pin allows: its first run is Typer's, and prints what the
    newest allowed prints; the next reads the command's table (noted as this Typer's: it
    builds the same one) without importing Typer."""
    (tmp_path / "train.py").write_text("print('train')\n")
    env = _env(tmp_path)
    runs = [
        subprocess.run([str(floor_python), "-c", _RUN, *SUBMIT], capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=120)
        for _ in range(2)
    ]  # fmt: skip
    here = subprocess.run(
        [sys.executable, "-c", _RUN, *SUBMIT], capture_output=True, text=True, cwd=tmp_path,
        env=env, timeout=120,
    )  # fmt: skip
    assert [r.stderr for r in runs] == ["0 True\n", "0 False\n"], runs
    scripts = [TOKEN.sub("TOKEN", r.stdout) for r in (*runs, here)]
    assert "#SBATCH --gres=gpu:a100:2" in scripts[0] and scripts == [scripts[0]] * 3


@pytest.mark.parametrize(
    "words",
    [["submit", "train.py", "--gpus", "two"], ["submit", "train.py", "--bogus"], ["logs"]],
)
def test_an_argument_error_is_one_line(
    floor_python: Path, tmp_path: Path, words: list[str]
) -> None:
    """Typer's vendored click says what is wrong: the one line the newest allowed says."""
    said = [
        subprocess.run(
            [str(python), "-m", "clusterjob", *words],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=_env(tmp_path),
            timeout=120,
        )  # fmt: skip
        for python in (floor_python, sys.executable)
    ]
    assert [(s.returncode, s.stderr) for s in said] == [(2, said[1].stderr)] * 2, said[0].stderr
    assert said[0].stderr.startswith("clusterjob: error: ") and said[0].stderr.count("\n") == 1


def test_the_command_list(floor_python: Path, tmp_path: Path) -> None:
    env = {**_env(tmp_path), "COLUMNS": "100"}
    shown = [
        subprocess.run([str(floor_python), "-m", "clusterjob", "--help"], capture_output=True,
                       text=True, env=env, timeout=120)
        for _ in range(2)
    ]  # fmt: skip
    assert [s.returncode for s in shown] == [0, 0] and "Commands:" in shown[0].stdout
    assert shown[1].stdout == shown[0].stdout


def test_every_shipped_site_validates(floor_python: Path, tmp_path: Path) -> None:
    sites = sorted(str(p) for p in resources.site_configs_dir().glob("*.yaml"))
    done = subprocess.run(
        [str(floor_python), "-m", "clusterjob", "site", "validate", *sites],
        capture_output=True, text=True, env=_env(tmp_path), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_nvml_inventory_over_the_standin(
    floor_python: Path, tmp_path: Path, standin_lib: Path
) -> None:
    """Through the floor's pynvml: the facts whose structures older releases laid out other
    than nvml.h (a process list, the NVSwitch fabric's state) read as the driver wrote them."""
    from clusterjob.sandbox.standin import StandinScenario

    gib = 1024**3
    gpus = (
        h100("0000:18:00.0", 0, processes=((4242, 20 * gib, "train"), (4300, gib, "nvtop"))),
        h100("0000:2a:00.0", 1, fabric_state="in_progress", fabric_status=999),
    )
    scenario = write_scenario(tmp_path / "scenario.txt", StandinScenario(gpus=gpus))
    env = {**_env(tmp_path), **standin_env(standin_lib.parent, scenario)}
    code = (
        "import pynvml\nfrom clusterjob.gpu.inventory import read_inventory\n"
        "print(pynvml.__file__)\n"
        "for g in read_inventory().gpus:\n"
        "    print(g.bus_id, g.fabric_state, g.fabric_status, "
        "*((p.pid, p.used_memory) for p in g.processes))"
    )
    done = subprocess.run(
        [str(floor_python), "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    module, *lines = done.stdout.splitlines()
    assert module.startswith(str(floor_python.parent.parent)), "the floor's pynvml"
    assert lines == [
        f"0000:18:00.0 completed 0 (4242, {20 * gib}) (4300, {gib})",
        "0000:2a:00.0 in_progress 999",
    ]


# The unit tests of what the dependencies serve (NVML: the inventory, the hooks, the Epilog's
# Xid reader, the sampler; Jinja2: rendering, the golden scripts; ruamel and hostlist: the
# site loader), run again with every dependency at its floor: the whole class of a binding
# or parser that answers otherwise in an older release, not the few cases above. ~1 minute.
AT_THE_FLOORS = (
    "tests/test_inventory.py", "tests/test_hooks_nvml.py", "tests/test_epilog.py",
    "tests/test_usage.py", "tests/test_standin.py", "tests/test_render.py",
    "tests/test_render_golden.py", "tests/test_render_compiled.py", "tests/test_site_config.py",
    "tests/test_site_schema.py", "tests/test_site_loader_exact.py", "tests/test_yaml_resolve.py",
    "tests/test_site_gpu_syntax.py",
)  # fmt: skip


def test_the_unit_tests_of_what_the_dependencies_serve_pass_at_their_floors(
    floor_python: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [str(floor_python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--basetemp={tmp_path / 'run'}", *AT_THE_FLOORS],  # its own: pytest prunes old ones
        cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1] and " failed" not in done.stdout
