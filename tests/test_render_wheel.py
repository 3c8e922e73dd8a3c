"""The built wheel renders jobs on its own: templates and example sites travel inside it.

Slow-ish (a wheel build and a venv, ~10 s) but kept in the suite: an editable install or a
source checkout would hide a template left out of the wheel. The venv gets clusterjob only
from the wheel, installed non-editable, and runs from a directory outside the repository.
Its dependencies (jinja2, typer... without network) come from the environment running the
tests, after its own site-packages (tests/venvs.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from venvs import venv_seeing_outside

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "clusterjob", "templates", "site_configs")


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_wheel_renders_a_dry_run_outside_the_repository(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    assert (REPO / "README.md").is_file(), "pyproject.toml's readme README.md is missing"
    # Build from a copy, so the build neither sees nor leaves anything in the working tree.
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif origin.exists():
            shutil.copy2(origin, src / name)
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
        src,
        env,
    )
    (wheel,) = dist.glob("clusterjob_slurm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "clusterjob/_data/templates/job.sh.j2" in names
    assert "clusterjob/_data/site_configs/mllab.yaml" in names

    venv = tmp_path / "venv"
    # The wheel's clusterjob wins over the checkout's editable install that the outer
    # environment may carry: the venv's own site-packages come first.
    py = venv_seeing_outside(venv, env=env)
    pip_install = ["install", "--no-deps", "--no-index", "--no-compile", str(wheel)]
    _run([sys.executable, "-m", "pip", "--python", str(py), *pip_install], tmp_path, env)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "train.py").write_text("print('training')\n")
    where = _run([str(py), "-c", "import clusterjob; print(clusterjob.__file__)"], elsewhere, env)
    installed = Path(where.strip())
    assert installed.is_relative_to(venv), installed  # the wheel, not the checkout
    assert not any(p.suffix == ".pth" for p in installed.parents[1].glob("*clusterjob*"))

    out = _run(
        [str(venv / "bin" / "clusterjob"), "submit", "--site", "hpccentre", "--gpus", "4",
         "--model", "a100", "--dry-run", "train.py", "--", "--lr", "3e-4"],
        elsewhere,
        env,
    )  # fmt: skip
    lines = out.splitlines()
    assert "#SBATCH --gpus-per-node=nvidia_a100-sxm4-80gb:4" in lines
    assert "#SBATCH --constraint=a100_80g" in lines
    site_file = installed.parent / "_data" / "site_configs" / "hpccentre.yaml"
    assert f"export CLUSTERJOB_SITE={site_file}" in lines
    assert 'exec "$python" train.py --lr 3e-4' in lines
    # The installed wheel renders the shipped template from its compiled form and reads the
    # command line from submit's option table: the same script, without Jinja2.
    probe = (
        "import sys\nfrom clusterjob.__main__ import main\n"
        "code = main(sys.argv[1:])\n"
        "print('jinja2 imported' if 'jinja2' in sys.modules else 'no jinja2', int(code))\n"
    )
    argv = ["submit", "--site", "hpccentre", "--gpus", "4", "--model", "a100", "--dry-run",
            "train.py", "--", "--lr", "3e-4"]  # fmt: skip
    again = _run([str(py), "-c", probe, *argv], elsewhere, env)
    assert again.endswith("\nno jinja2 0\n"), again[-200:]
    assert _tokenless(again.removesuffix("no jinja2 0\n")) == _tokenless(out)


def _tokenless(output: str) -> str:
    """``output`` with its job token (new on every run) replaced."""
    token = output.split("#SBATCH --comment=clusterjob:", 1)[1].split("\n", 1)[0]
    return output.replace(token, "TOKEN")
