"""``--snapshot`` on the real local cluster: a job held in the queue while its code is
edited runs the code as it was when it was submitted, a script job (the command line) and a
function job whose module is edited (the Python API); the same job without a snapshot runs
the edited code, which is what a snapshot is for."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterjob.api.cluster import Cluster
from clusterjob.sandbox import cluster as sandbox_cluster

from .conftest import Cli, Sandbox

pytestmark = pytest.mark.slurm


@pytest.fixture
def here(sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project on the login node, cwd (where the `cj` fixture's commands run): a script
    importing a module of the project."""
    for key, value in sandbox_cluster.client_env(sandbox.state_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0")
    monkeypatch.delenv("CLUSTERJOB_HOST", raising=False)
    work = tmp_path
    (work / "train.py").write_text("import helper\nprint('script: original', helper.VALUE)\n")
    (work / "helper.py").write_text("VALUE = 'module: original'\n")
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    yield work
    sys.modules.pop("snapmod", None)


def test_a_held_script_job_runs_the_code_as_it_was_at_submit(
    here: Path, sandbox: Sandbox, cj: Cli
) -> None:
    held = ["--sbatch-arg=--hold", "--parsable"]
    frozen = cj("submit", "train.py", "--snapshot", *held).stdout.strip()
    live = cj("submit", "train.py", "--no-snapshot", *held).stdout.strip()
    assert sandbox.job(frozen)["JobState"] == "PENDING"
    (here / "train.py").write_text("import helper\nprint('script: edited', helper.VALUE)\n")
    (here / "helper.py").write_text("VALUE = 'module: edited'\n")
    sandbox.run("scontrol", "release", f"{frozen},{live}")
    for job in (frozen, live):
        assert sandbox.wait_job(job, timeout=120)["JobState"] == "COMPLETED"
    assert (here / f"slurm-{frozen}.out").read_text().splitlines()[-1] == (
        "script: original module: original"
    )
    assert (here / f"slurm-{live}.out").read_text().splitlines()[-1] == (
        "script: edited module: edited"
    )


def test_a_held_function_job_imports_its_module_as_it_was_at_submit(
    here: Path, sandbox: Sandbox
) -> None:
    (here / "snapmod.py").write_text("def which():\n    return 'original'\n")
    snapmod = importlib.import_module("snapmod")
    cluster = Cluster(poll_interval=0.5).options(sbatch_args=["--hold"])
    frozen = cluster.options(snapshot=True).submit_function(snapmod.which)
    live = cluster.submit_function(snapmod.which)  # pickled by reference: imported in the job
    (here / "snapmod.py").write_text("def which():\n    return 'edited'\n")
    sandbox.run("scontrol", "release", f"{frozen.id},{live.id}")
    assert frozen.result(timeout=120) == "original"
    assert live.result(timeout=120) == "edited"
