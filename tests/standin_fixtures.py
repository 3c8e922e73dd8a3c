"""Test helpers for the stand-in NVML: build the library once, run code over it in a child.

A child process is needed because the dynamic loader reads LD_LIBRARY_PATH only at process
start, and pynvml keeps the first library it loaded for the life of the process. (Inside a
running process, ``clusterjob.sandbox.standin.preload_standin`` works too, but only before
pynvml has loaded anything, so the pytest process itself is left alone.)

tests/conftest.py registers this module as a plugin, so every test can ask for the
``standin_lib`` fixture (built once per session, cached by source hash).
"""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import clusterjob
from clusterjob.errors import NvmlError, NvmlErrorKind
from clusterjob.gpu.inventory import GpuInventory
from clusterjob.sandbox.standin import (
    StandinScenario,
    build_standin_library,
    standin_env,
    write_scenario,
)

_PACKAGE_ROOT = str(Path(clusterjob.__file__).resolve().parent.parent)


def standin_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled libnvidia-ml.so.1, built once per test session (per xdist worker)."""
    return build_standin_library(tmp_path_factory.getbasetemp() / "standin-nvml")


@pytest.fixture(scope="session")
def standin_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same, as a fixture, for a conftest that registers this module as a plugin."""
    return standin_library(tmp_path_factory)


@dataclass
class ChildResult:
    returncode: int
    stdout: str
    stderr: str


def run_python(
    code: str,
    lib_dir: Path | str,
    scenario: StandinScenario | Path | str | None,
    tmp_path: Path,
    extra_env: dict[str, str] | None = None,
    timeout: float = 60,
) -> ChildResult:
    """Run ``python -c code`` with the stand-in on LD_LIBRARY_PATH and the given scenario.

    ``scenario`` may be a StandinScenario (written under tmp_path), a path (used as is, may
    contain %n) or None (FAKE_NVML_SCENARIO unset).
    """
    if isinstance(scenario, StandinScenario):
        scenario = write_scenario(tmp_path / "scenario.txt", scenario)
    env = dict(os.environ)
    env.pop("SLURMD_NODENAME", None)
    env.pop("FAKE_NVML_SCENARIO", None)
    env.update(standin_env(lib_dir, scenario if scenario is not None else ""))
    if scenario is None:
        del env["FAKE_NVML_SCENARIO"]
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + old if old else "")
    env.update(extra_env or {})
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return ChildResult(done.returncode, done.stdout, done.stderr)


_INVENTORY_CODE = """
import json, marshal, sys
from clusterjob.errors import NvmlError
from clusterjob.gpu.inventory import read_inventory
try:
    inv = read_inventory(timeout={timeout!r})
except NvmlError as exc:
    print(json.dumps({{"error": {{"kind": exc.kind.value, "message": str(exc)}}}}))
else:  # as the forked NVML reader sends it back: plain data through marshal
    print(json.dumps({{"inventory": marshal.dumps(inv.as_dict()).hex()}}))
"""


def inventory_in_child(
    lib_dir: Path | str,
    scenario: StandinScenario | Path | str | None,
    tmp_path: Path,
    *,
    timeout: float | None = None,
    extra_env: dict[str, str] | None = None,
) -> GpuInventory | NvmlError:
    """``read_inventory()`` run in a child over the stand-in: the inventory, or the NvmlError."""
    result = run_python(
        _INVENTORY_CODE.format(timeout=timeout), lib_dir, scenario, tmp_path, extra_env
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.strip().splitlines()[-1])
    if "error" in data:
        return NvmlError(NvmlErrorKind(data["error"]["kind"]), data["error"]["message"])
    return GpuInventory.from_dict(marshal.loads(bytes.fromhex(data["inventory"])))
