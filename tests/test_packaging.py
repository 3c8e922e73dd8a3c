"""The product as a user installs it: the distribution name, one version, what the sdist and
the wheel carry, and the README's three install lines in clean environments.

The wheel and sdist are built once for the module from a copy of the sources. The install
tests (pipx, uv tool, pip --user) get the dependencies from the package index, so they are
skipped, saying so, where the index cannot be reached.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest

import clusterjob
from clusterjob.__main__ import main

REPO = Path(__file__).resolve().parent.parent
DIST = "clusterjob-slurm"
SOURCES = (
    "pyproject.toml", "README.md", "CHANGELOG.md", "clusterjob", "hydra_plugins", "templates",
    "site_configs", "tests", "examples", "docs", "benchmarks", "scripts",
)  # fmt: skip


def _env() -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "UV_"))}
    # uv (pipx's installer where present) trusts the system's CA store, as pip does: a machine
    # whose registry proxy's CA is only there (no SSL_CERT_FILE) refused it otherwise
    return {**kept, "UV_NATIVE_TLS": "1"}


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdist and wheel, built (without network) from a copy of the sources."""
    tmp = tmp_path_factory.mktemp("dist")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        origin = REPO / name
        if origin.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(origin, src / name, ignore=ignore)
        elif origin.exists():
            shutil.copy2(origin, src / name)
    out = tmp / "out"
    build = [sys.executable, "-m", "build", "--sdist", "--wheel", "--no-isolation"]
    _run([*build, "--outdir", str(out)], src)
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("clusterjob_slurm-*.whl")
    return wheel


# --- the name and the version ------------------------------------------------------------


def test_the_distribution_has_its_own_name_and_one_version() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DIST  # `clusterjob` on the index is an unrelated project
    assert "version" not in project and project["dynamic"] == ["version"]
    assert project["scripts"] == {"clusterjob": "clusterjob.__main__:main"}
    # The installed metadata (this checkout's own install) is built from __version__.
    assert importlib.metadata.version(DIST) == clusterjob.__version__


def test_version_option_prints_the_metadata_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"clusterjob {importlib.metadata.version(DIST)}\n"


def test_debug_output_names_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--debug", "site", "validate", str(REPO / "site_configs" / "mllab.yaml")])
    err = capsys.readouterr().err
    assert f"debug: clusterjob {clusterjob.__version__}, Python " in err


# --- what the sdist and the wheel carry ---------------------------------------------------


def test_wheel_carries_the_package_data_and_metadata(dist: Path) -> None:
    wheel = _wheel(dist)
    assert wheel.name == f"clusterjob_slurm-{clusterjob.__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = {p.name for p in (REPO / "templates").glob("*.j2")}
    sites = {p.name for p in (REPO / "site_configs").glob("*.yaml")}
    assert templates and sites
    assert {f"clusterjob/_data/templates/{t}" for t in templates} <= names
    assert {f"clusterjob/_data/site_configs/{s}" for s in sites} <= names
    assert "clusterjob/sandbox/standin_nvml.c" in names  # what `sandbox up` compiles
    assert "clusterjob/node/wrappers.py" in names
    # the Hydra launcher, in Hydra's namespace package (no hydra_plugins/__init__.py)
    assert "hydra_plugins/hydra_clusterjob_launcher/launcher.py" in names
    assert "hydra_plugins/__init__.py" not in names
    assert not any("__pycache__" in n or n.startswith("tests/") for n in names)
    info = f"clusterjob_slurm-{clusterjob.__version__}.dist-info"
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert f"Name: {DIST}\n" in metadata
    assert f"Version: {clusterjob.__version__}\n" in metadata
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "clusterjob = clusterjob.__main__:main" in entry_points


def test_sdist_carries_what_builds_and_tests_it(dist: Path) -> None:
    (sdist,) = dist.glob("clusterjob_slurm-*.tar.gz")
    top = f"clusterjob_slurm-{clusterjob.__version__}"
    with tarfile.open(sdist) as tar:
        names = {n.removeprefix(f"{top}/") for n in tar.getnames()}
    for needed in (
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
        "templates/job.sh.j2",
        "site_configs/mllab.yaml",
        "clusterjob/sandbox/standin_nvml.c",
        "examples/train.py",
        "tests/conftest.py",
        "scripts/bootstrap.sh",
    ):
        assert needed in names, needed
    assert not any("__pycache__" in n for n in names)


# --- the README's install lines, each in a clean environment -----------------------------


def _index_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/typer/", timeout=10):
            return True
    except OSError:
        return False


needs_index = pytest.mark.skipif(
    not _index_reachable(), reason="the package index is unreachable (dependencies come from it)"
)


def _readme_install_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    return [ln.strip() for ln in text.splitlines() if "install" in ln and DIST in ln]


def test_readme_names_the_new_distribution_in_three_install_lines() -> None:
    lines = _readme_install_lines()
    assert any(ln.startswith("pipx install clusterjob-slurm") for ln in lines), lines
    assert any(ln.startswith("uv tool install clusterjob-slurm") for ln in lines), lines
    assert any("pip install --user clusterjob-slurm" in ln for ln in lines), lines
    readme = (REPO / "README.md").read_text()
    assert "pip install clusterjob\n" not in readme and "pip install clusterjob " not in readme


def _check_installed(command: Path, env: dict[str, str], cwd: Path) -> None:
    assert _run([str(command), "--version"], cwd, env) == f"clusterjob {clusterjob.__version__}\n"
    script = cwd / "train.py"
    script.write_text("print('training')\n")
    out = _run(
        [str(command), "submit", "--site", "mllab", "--gpus", "1", "--model", "a100",
         "--dry-run", "train.py"],
        cwd,
        env,
    )  # fmt: skip
    assert "#SBATCH --gres=gpu:a100:1" in out.splitlines()


@needs_index
def test_pipx_install(dist: Path, tmp_path: Path) -> None:
    pytest.importorskip("pipx")
    env = _env() | {
        "PIPX_HOME": str(tmp_path / "pipx"),
        "PIPX_BIN_DIR": str(tmp_path / "bin"),
        "PIPX_MAN_DIR": str(tmp_path / "man"),
    }
    _run([sys.executable, "-m", "pipx", "install", "--python", sys.executable,
          str(_wheel(dist))], tmp_path, env)  # fmt: skip
    _check_installed(tmp_path / "bin" / "clusterjob", env, tmp_path)


@needs_index
def test_uv_tool_install(dist: Path, tmp_path: Path) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        pytest.skip("uv is not installed next to this interpreter (the `test` extra has it)")
    env = _env() | {
        "UV_TOOL_DIR": str(tmp_path / "tools"),
        "UV_TOOL_BIN_DIR": str(tmp_path / "bin"),
    }
    _run([uv, "tool", "install", "--python", sys.executable, str(_wheel(dist))], tmp_path, env)
    _check_installed(tmp_path / "bin" / "clusterjob", env, tmp_path)


@needs_index
def test_pip_install_user(dist: Path, tmp_path: Path) -> None:
    base = Path(getattr(sys, "_base_executable", sys.executable))
    env = _env() | {"PYTHONUSERBASE": str(tmp_path / "user")}
    if (
        not (Path(sys.base_prefix) / "lib").is_dir()
        or (
            Path(sys.base_prefix)
            / "lib"
            / f"python{sys.version_info[0]}.{sys.version_info[1]}"
            / "EXTERNALLY-MANAGED"
        ).exists()
    ):
        pytest.skip("the base interpreter is managed by the system (no pip --user there)")
    _run([str(base), "-m", "pip", "install", "-q", "--user", str(_wheel(dist))], tmp_path, env)
    _check_installed(tmp_path / "user" / "bin" / "clusterjob", env, tmp_path)


def test_a_wheel_of_an_installed_clusterjob_is_the_wheel_it_came_from(
    dist: Path, tmp_path: Path
) -> None:
    """`sandbox up --slurm R` from a wheel, pipx or `uv tool` install gives the release root
    the same clusterjob as a wheel of its installed files (it used to hand pip the
    interpreter's site-packages as a project: "does not appear to be a Python project")."""
    original = _wheel(dist)
    installed, again = tmp_path / "installed", tmp_path / "again"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    _run([*pip, "--target", str(installed), str(original)], tmp_path)
    make = (
        "import sys; from pathlib import Path; from clusterjob.sandbox import runtime; "
        "assert not runtime.is_checkout(); print(runtime.wheel_of_running(Path(sys.argv[1])))"
    )
    env = _env() | {"PYTHONPATH": str(installed)}
    made = Path(_run([sys.executable, "-c", make, str(tmp_path / "out")], tmp_path, env).strip())
    assert made.name == original.name
    names = {n for n in zipfile.ZipFile(original).namelist() if "/licenses/" not in n}
    assert set(zipfile.ZipFile(made).namelist()) == names
    _run([*pip, "--target", str(again), str(made)], tmp_path)
    env = _env() | {"PYTHONPATH": str(again)}
    version = _run([sys.executable, "-m", "clusterjob", "--version"], tmp_path, env)
    assert version == f"clusterjob {clusterjob.__version__}\n"
    show = [sys.executable, "-m", "clusterjob", "site", "show", "--site", "mllab"]
    assert "A100" in _run(show, tmp_path, env)  # the shipped sites and templates came along
