"""The Hydra launcher (``hydra/launcher=clusterjob``) on the real local Slurm cluster.

A ``--multirun`` of four points is ONE array job of four tasks, and the command returns as
soon as Slurm has it; the tasks then run Hydra's own ``run_job`` on the nodes (outputs in
the sweep directory, ``.hydra/`` saved) and their return values can be read later. With
``hydra.launcher.wait=true`` Hydra gets each task's return value, or its exception.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterjob.api.cluster import Cluster
from clusterjob.sandbox import cluster as sandbox_cluster

from .conftest import Sandbox

pytest.importorskip("hydra", reason="hydra-core is not installed (pip install '.[hydra]')")

pytestmark = pytest.mark.slurm


def _hydra_runs_here() -> str | None:
    """Why Hydra itself cannot run on this Python, or None. hydra-core 1.3.8 cannot build its
    command line on Python 3.14: argparse now checks help strings, and Hydra's is an object
    ("ValueError: badly formed help string"), so any @hydra.main app fails before our
    launcher is reached."""
    from hydra._internal.utils import get_args_parser

    try:
        get_args_parser()
    except ValueError as exc:
        from importlib.metadata import version

        return f"hydra-core {version('hydra-core')} does not run on Python {sys.version[:4]}: {exc}"
    return None


_CANNOT = _hydra_runs_here()
if _CANNOT is not None:
    pytest.skip(_CANNOT, allow_module_level=True)

APP = '''
"""A Hydra app: its 'training' returns twice its learning rate."""
import hydra


def task(cfg):
    if cfg.lr > cfg.get("max_lr", 1.0):
        raise ValueError(f"lr {cfg.lr} is too high")
    return cfg.lr * 2


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    return task(cfg)


if __name__ == "__main__":
    main()
'''

POINTS = [0.1, 0.2, 0.3, 0.4]


@pytest.fixture
def here(sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project on the login node: the sandbox's Slurm and site, a registry of its
    own, the app in a fresh working directory."""
    for key, value in sandbox_cluster.client_env(sandbox.state_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0")
    monkeypatch.delenv("CLUSTERJOB_HOST", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    (work / "app.py").write_text(APP)
    monkeypatch.chdir(work)
    return work


def multirun_command(here: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``python app.py --multirun hydra/launcher=clusterjob OVERRIDES``, as a user types it."""
    return subprocess.run(
        [sys.executable, "app.py", "--multirun", "hydra/launcher=clusterjob", *overrides],
        cwd=here, env=dict(os.environ), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_multirun_is_one_array_job_and_returns_at_once(sandbox: Sandbox, here: Path) -> None:
    started = time.monotonic()
    done = multirun_command(
        here, "hydra.launcher.gpus=2", "hydra.launcher.model=A100",
        "hydra.launcher.time=0:05:00", "+lr=" + ",".join(map(str, POINTS)),
    )  # fmt: skip
    took = time.monotonic() - started
    print(f"\nmultirun of {len(POINTS)} points returned in {took:.2f}s (wait=false)")
    assert done.returncode == 0, done.stdout + done.stderr
    assert took < 20
    cluster = Cluster(poll_interval=0.5)
    (record,) = cluster.registry().all()  # one submission for the whole sweep
    base = record.job_id
    assert f"Submitted 4 jobs to Slurm as array job {base}" in done.stdout
    assert "#SBATCH --array=0-3\n" in record.script
    assert "#SBATCH --gres=gpu:a100:2" in record.script  # the site's own syntax
    jobs = [cluster.job(f"{base}_{i}") for i in range(len(POINTS))]
    values = [job.result(timeout=180)[0].return_value for job in jobs]
    assert values == pytest.approx([lr * 2 for lr in POINTS])
    # Slurm's accounting: the one array job's four tasks (slurmdbd may lag the results)
    wanted = [f"{base}_{i}|COMPLETED" for i in range(len(POINTS))]
    deadline = time.monotonic() + 60
    while True:
        tasks = sandbox.run("sacct", "-n", "-X", "-P", "-j", base, "--format=JobID,State")
        if sorted(tasks.split()) == wanted or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(tasks.split()) == wanted
    (sweep,) = (here / "multirun").glob("*/*")  # Hydra's sweep dir, as any launcher's
    assert (sweep / "multirun.yaml").is_file()
    for i, lr in enumerate(POINTS):
        saved = (sweep / str(i) / ".hydra" / "config.yaml").read_text()
        assert f"lr: {lr}" in saved
        assert f"id: '{base}_{i}'" in (sweep / str(i) / ".hydra" / "hydra.yaml").read_text()
        assert (sweep / ".clusterjob" / f"{base}_{i}.out").is_file()  # the task's log


def test_a_blocking_multirun_returns_each_tasks_value(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hydra's own harness in this process, to see what the launcher hands Hydra back."""
    from hydra.core.utils import JobStatus
    from hydra.test_utils.test_utils import SweepTaskFunction
    from hydra.version import VersionBase
    from packaging.version import Version

    monkeypatch.setattr(VersionBase.instance(), "version_base", Version("1.3"))
    monkeypatch.syspath_prepend(str(here))
    import app  # type: ignore[import-not-found]

    sweep = SweepTaskFunction()
    sweep.calling_file, sweep.calling_module = str(here / "app.py"), None
    sweep.task_function = app.task  # imported by the tasks from the working directory
    sweep.config_path = sweep.config_name = None
    sweep.overrides = [
        "hydra/launcher=clusterjob", "hydra.launcher.wait=true",
        "hydra.launcher.poll_interval=0.5", "hydra.launcher.timeout=240",
        "hydra.launcher.gpus=1", "hydra.launcher.model=A100",
        "+lr=" + ",".join(map(str, POINTS)),
    ]  # fmt: skip
    sweep.temp_dir = str(here / "multirun")
    started = time.monotonic()
    sweep.__enter__()  # its __exit__ would delete the sweep directory
    print(f"\nblocking multirun of {len(POINTS)} points: {time.monotonic() - started:.2f}s")
    assert sweep.returns is not None
    (returns,) = sweep.returns
    assert [r.status for r in returns] == [JobStatus.COMPLETED] * len(POINTS)
    assert [r.return_value for r in returns] == pytest.approx([lr * 2 for lr in POINTS])
    assert len(Cluster().registry().all()) == 1
    for i, ret in enumerate(returns):
        assert ret.hydra_cfg is not None
        assert ret.hydra_cfg.hydra.runtime.output_dir == str(here / "multirun" / str(i))


def test_a_blocking_multirun_raises_a_failed_tasks_exception(here: Path) -> None:
    done = multirun_command(
        here, "hydra.launcher.wait=true", "hydra.launcher.poll_interval=0.5",
        "+lr=0.1,0.4", "+max_lr=0.3",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Error executing job with overrides: ['+lr=0.4', '+max_lr=0.3']" in done.stderr
    assert "ValueError: lr 0.4 is too high" in done.stderr
    assert "in task" in done.stderr  # the task's own traceback, from the node
