"""The sandbox's root Prolog and Epilog and its node_command never run a ``clusterjob/``
package found in the working directory they were started from (the review planted one in a
world-writable directory and had it run as root)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clusterjob.sandbox import config
from clusterjob.sandbox.config import Layout

PLANT = """\
import os
with open(os.environ.get("MARKER", "/nonexistent"), "w") as fh:
    fh.write(str(os.getuid()))
"""


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A world-writable directory (as /tmp) holding someone's ``clusterjob`` package."""
    pub = tmp_path / "pub"
    pkg = pub / "clusterjob"
    pkg.mkdir(parents=True)
    pub.chmod(0o1777)
    for name in ("__init__.py", "__main__.py"):
        (pkg / name).write_text(PLANT)
    return pub


def run_wrapper(text: str, cwd: Path, marker: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = cwd.parent / "wrapper.sh"
    script.write_text(text)
    return subprocess.run(
        ["/bin/sh", str(script), *args],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "MARKER": str(marker), "SLURMD_NODENAME": "gpu2"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_root_hook_wrapper_ignores_a_package_in_its_cwd(
    planted: Path, tmp_path: Path, hook: str
) -> None:
    marker = tmp_path / "ran-as"
    wrappers = config.hook_wrappers(Layout(tmp_path / "state"))
    text = {"prolog": wrappers.prolog_text, "epilog": wrappers.epilog_text}[hook]()
    done = run_wrapper(text, planted, marker)
    assert not marker.exists(), f"planted package ran as uid {marker.read_text()}"
    assert done.stderr.startswith(f"clusterjob {hook}: "), done.stderr  # the real one ran


def test_node_command_ignores_a_package_in_the_jobs_cwd(planted: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran-as"
    layout = Layout(tmp_path / "state")
    done = run_wrapper(config.node_command_script(layout), planted, marker, "--help")
    assert not marker.exists(), f"planted package ran as uid {marker.read_text()}"
    assert done.returncode == 0 and "Usage" in done.stdout, done.stderr


def test_node_command_ignores_pythonpath(planted: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran-as"
    script = tmp_path / "wrapper.sh"
    script.write_text(config.node_command_script(Layout(tmp_path / "state")))
    done = subprocess.run(
        ["/bin/sh", str(script), "--help"],
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "MARKER": str(marker), "PYTHONPATH": str(planted)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert not marker.exists()
    assert done.returncode == 0, done.stderr
