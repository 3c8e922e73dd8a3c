"""The Hydra launcher (``hydra/launcher=clusterjob``) with the real hydra-core, without Slurm.

Each Hydra run here is a real ``--multirun`` in this process (Hydra's own test harness,
``SweepTaskFunction``), its launcher's cluster given the stateful stand-in for Slurm of
``tests/slurm_fake.py``. Every field of the launcher's config must change the job it
submits (a field read and dropped is the bug class the API's options tests guard against);
``wait=true`` is run against stand-in nodes that execute each array task's real worker in a
process of its own. The real Slurm: ``tests/e2e/test_hydra_launcher.py``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("hydra", reason="hydra-core is not installed (pip install '.[hydra]')")

import test_api_options as api_options  # noqa: E402
from hydra.core.plugins import Plugins  # noqa: E402
from hydra.core.utils import JobReturn, JobStatus  # noqa: E402
from hydra.test_utils.test_utils import SweepTaskFunction  # noqa: E402
from hydra.version import VersionBase  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from packaging.version import Version  # noqa: E402
from slurm_fake import FakeSlurm  # noqa: E402

from clusterjob.api.cluster import JOB_OPTIONS, Cluster, Job, RemoteTraceback  # noqa: E402

# Hydra's plugin scan runs the plugin's modules again (new classes under the same names):
# scan first, so that the classes imported here are the ones Hydra instantiates.
Plugins.instance()

from clusterjob.errors import JobFailed, UsageError  # noqa: E402
from hydra_plugins.hydra_clusterjob_launcher.config import (  # noqa: E402
    LAUNCHER_FIELDS,
    NOT_LAUNCHER_OPTIONS,
    ClusterjobLauncherConf,
)
from hydra_plugins.hydra_clusterjob_launcher.launcher import (  # noqa: E402
    ClusterjobLauncher,
    SubmittedJobReturn,
    _outcome,
    job_options,
)

# The API options tests' working directory: the sandbox's site plus a --project partition,
# a venv, a conda stand-in, a params file; cwd a fresh directory, a data dir of its own.
here = api_options.here

JOB_FIELDS = sorted(
    f.name
    for f in dataclasses.fields(ClusterjobLauncherConf)
    if f.name not in LAUNCHER_FIELDS and not f.name.startswith("_")
)

# Per field: the value to give and a line it puts in the job script: the API's own cases
# (tests/test_api_options.py), and the one field the API has not.
CASES: dict[str, tuple[dict[str, object], str]] = {
    name: api_options.CASES[name] for name in JOB_FIELDS if name in api_options.CASES
}
CASES["array_parallelism"] = ({"array_parallelism": 1}, "#SBATCH --array=0-1%1")

# The task the sweeps run: a module in the working directory, as a user's project has one
# (the job's Python imports it from there, as the submitting one did).
APP = """
def task(cfg):
    if cfg.lr > cfg.get("max_lr", 1.0):
        raise ValueError(f"lr {cfg.lr} is too high")
    return cfg.lr * 2
"""


def override(name: str, value: object) -> str:
    """``hydra.launcher.NAME=VALUE`` in Hydra's override syntax (strings quoted)."""

    def form(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return str(v)
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(form(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{form(x)}" for k, x in v.items()) + "}"
        text = str(v).replace("\\", "\\\\").replace("'", "\\'")
        return f"'{text}'"

    return f"hydra.launcher.{name}={form(value)}"


@pytest.fixture
def slurm(here: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """The stand-in Slurm every launcher of the test submits to (through the real API)."""
    fake = FakeSlurm("sandbox")

    def make_cluster(self: ClusterjobLauncher) -> Cluster:
        interval = float(self.params.get("poll_interval") or 10.0)
        return Cluster(str(here / "site.yaml"), host="", exec=fake, poll_interval=interval)

    monkeypatch.setattr(ClusterjobLauncher, "make_cluster", make_cluster)
    # as @hydra.main(version_base="1.3") sets it (the jobs then keep the submit directory)
    monkeypatch.setattr(VersionBase.instance(), "version_base", Version("1.3"))
    (here / "lr_app.py").write_text(APP)
    monkeypatch.syspath_prepend(str(here))
    return fake


def multirun(here: Path, *overrides: str) -> list[JobReturn]:
    """``app --multirun hydra/launcher=clusterjob OVERRIDES``, in this process, running
    ``lr_app.task``; its sweep directory is ``here/multirun`` (kept)."""
    import lr_app  # type: ignore[import-not-found]

    sweep = SweepTaskFunction()
    sweep.calling_file = str(here / "lr_app.py")
    sweep.calling_module = None
    sweep.task_function = lr_app.task
    sweep.config_path = None
    sweep.config_name = None
    sweep.overrides = ["hydra/launcher=clusterjob", *overrides]
    sweep.temp_dir = str(here / "multirun")
    sweep.__enter__()  # its __exit__ would delete the sweep directory
    assert sweep.returns is not None
    return [ret for batch in sweep.returns for ret in batch]


def scripts(slurm: FakeSlurm) -> list[str]:
    return [Path(cmd[-1]).read_text() for cmd in slurm.commands("sbatch")]


# --- the config ---------------------------------------------------------------------------


def test_every_job_option_of_the_api_is_a_launcher_field() -> None:
    """``clusterjob submit`` gains an option: the launcher has it too, or says why not."""
    assert sorted(set(JOB_OPTIONS) - set(NOT_LAUNCHER_OPTIONS)) == JOB_FIELDS
    assert sorted(CASES) == sorted({*JOB_FIELDS, "array_parallelism"})


def test_the_launcher_is_found_by_hydra_as_clusterjob() -> None:
    from hydra.core.config_store import ConfigStore
    from hydra.plugins.launcher import Launcher

    node = ConfigStore.instance().load("hydra/launcher/clusterjob.yaml").node
    assert node._target_.endswith("launcher.ClusterjobLauncher")
    assert ClusterjobLauncher in Plugins.instance().discover(Launcher)


def test_job_options_keep_what_is_set_and_leave_the_rest_to_the_site() -> None:
    params = OmegaConf.to_container(OmegaConf.structured(ClusterjobLauncherConf))
    assert isinstance(params, dict)
    assert job_options(params, job_name="app") == {"job_name": "app"}
    params.update(gpus=2, model="A100", sbatch_args=OmegaConf.create(["--exclusive"]),
                  env=["A=1"], array_parallelism=3, wait=True, site="s.yaml",
                  job_name="mine")  # fmt: skip
    assert job_options(params, job_name="app") == {
        "gpus": 2, "model": "A100", "sbatch_args": ["--exclusive"], "env": ["A=1"],
        "array": "%3", "job_name": "mine",
    }  # fmt: skip


def test_the_cluster_is_the_one_the_config_names(here: Path) -> None:
    launcher = ClusterjobLauncher(site=str(here / "site.yaml"), host="", poll_interval=0.5,
                                  remote_dir="~/runs", sync=False)  # fmt: skip
    cluster = launcher.make_cluster()
    assert (cluster.host, cluster.poll_interval) == ("", 0.5)
    assert str(cluster.site.source) == str(here / "site.yaml")
    assert (cluster._remote_dir, cluster._sync) == ("~/runs", False)  # used with a host


# --- every field reaches the job ----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_launcher_field_reaches_the_job_script(here: Path, slurm: FakeSlurm, name: str) -> None:
    words = {"dir": here, "job": slurm.add_job(state="RUNNING", reason="None")}
    given, line = CASES[name]
    given = {k: v.format(**words) if isinstance(v, str) else v for k, v in given.items()}
    line = line.format(**words)
    multirun(here, "+lr=0.1,0.2")
    multirun(here, "+lr=0.1,0.2", *(override(k, v) for k, v in given.items()))
    plain, with_field = scripts(slurm)
    assert line not in plain  # the line is the field's doing
    assert line in with_field, with_field


def test_a_bad_field_is_clusterjobs_own_error_before_slurm(here: Path, slurm: FakeSlurm) -> None:
    with pytest.raises(UsageError, match="A10O"):
        multirun(here, "+lr=0.1,0.2", "hydra.launcher.gpus=1", "hydra.launcher.model=A10O")
    assert slurm.commands("sbatch") == []


# --- wait=false: one array job, returned at once ------------------------------------------


def test_a_sweep_is_one_array_job_and_returns_submitted(here: Path, slurm: FakeSlurm) -> None:
    returns = multirun(here, "+lr=0.1,0.2,0.3,0.4", "hydra.launcher.gpus=2",
                       "hydra.launcher.model=A100")  # fmt: skip
    (script,) = scripts(slurm)  # one sbatch for the four points
    assert "#SBATCH --array=0-3\n" in script
    assert "#SBATCH --gres=gpu:a100:2" in script  # the site's syntax for the model
    assert "#SBATCH --job-name=lr_app" in script  # Hydra's job name
    assert "CLUSTERJOB_EXPECT_MODEL" in script  # the preflight checks the GPUs first
    assert [type(r) for r in returns] == [SubmittedJobReturn] * 4
    base = returns[0].job_id.split("_")[0]
    for i, ret in enumerate(returns):
        assert ret.status is JobStatus.UNKNOWN  # submitted: not ended
        assert isinstance(ret.return_value, Job) and ret.return_value.id == f"{base}_{i}"
        assert ret.overrides == [f"+lr={(i + 1) / 10}"]
        assert ret.cfg is not None and ret.cfg.lr == (i + 1) / 10 and "hydra" not in ret.cfg
        assert ret.hydra_cfg is not None and ret.hydra_cfg.hydra.job.num == i
        assert ret.hydra_cfg.hydra.job.id == f"{base}_{i}"
    sweep = here / "multirun"
    assert (sweep / "multirun.yaml").is_file()  # Hydra's sweeper, as with any launcher
    assert f"--output={sweep}/.clusterjob/%A_%a.out" in script  # logs beside the outputs
    assert (sweep / ".clusterjob").is_dir()


def test_sweeper_batches_are_one_array_job_each(here: Path, slurm: FakeSlurm) -> None:
    returns = multirun(here, "+lr=0.1,0.2,0.3", "hydra.sweeper.max_batch_size=2")
    assert len(slurm.commands("sbatch")) == 2
    assert [r.hydra_cfg.hydra.job.num for r in returns if r.hydra_cfg] == [0, 1, 2]


# --- wait=true: the tasks' own returns ----------------------------------------------------


class StandInNodes:
    """Runs each task of every array job the stand-in Slurm was given, as a node would: the
    job's real worker in a process of its own (cwd the submit directory, Slurm's array
    variables set), then marks the task ended in the stand-in with the worker's exit code."""

    def __init__(self, slurm: FakeSlurm, here: Path) -> None:
        self.slurm, self.here = slurm, here
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> StandInNodes:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)

    def _run(self) -> None:
        done: set[str] = set()
        while not self.stop.wait(0.05):
            for row in [j for j in list(self.slurm.jobs) if "_[" in j and j not in done]:
                done.add(row)
                base, spec = row[:-1].split("_[")
                first, last = (int(x) for x in spec.split("-"))
                for task in range(first, last + 1):
                    self._task(base, task)
                del self.slurm.jobs[row]

    def _task(self, base: str, task: int) -> None:
        (jobdir,) = {p.parent for p in (self.here / "data" / "functions").glob("*/input.pkl")}
        env = {**os.environ, "SLURM_ARRAY_JOB_ID": base, "SLURM_ARRAY_TASK_ID": str(task),
               "SLURM_JOB_ID": str(int(base) + 1 + task)}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-u", str(jobdir / "clusterjob_worker.py"), str(jobdir)],
            cwd=self.here, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode not in (0, 1):
            self.errors.append(done.stdout + done.stderr)
        state = "COMPLETED" if done.returncode == 0 else "FAILED"
        self.slurm.jobs[f"{base}_{task}"] = self.slurm._fields(
            f"{base}_{task}", state, "None", exit_code=f"{done.returncode}:0"
        )


@pytest.fixture
def nodes(slurm: FakeSlurm, here: Path) -> Iterator[StandInNodes]:
    with StandInNodes(slurm, here) as running:
        yield running
    assert running.errors == []


WAIT = ("hydra.launcher.wait=true", "hydra.launcher.poll_interval=0.1",
        "hydra.launcher.timeout=120")  # fmt: skip


def test_wait_returns_each_tasks_value_and_hydras_outputs(
    here: Path, slurm: FakeSlurm, nodes: StandInNodes
) -> None:
    returns = multirun(here, "+lr=0.1,0.2,0.3,0.4", *WAIT)
    assert len(slurm.commands("sbatch")) == 1
    assert [r.status for r in returns] == [JobStatus.COMPLETED] * 4
    assert [r.return_value for r in returns] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    for i, ret in enumerate(returns):
        out = here / "multirun" / str(i)  # hydra.sweep.subdir: the job's number
        assert ret.working_dir == str(here)  # hydra.job.chdir is off from version_base 1.2
        assert ret.hydra_cfg is not None
        assert ret.hydra_cfg.hydra.runtime.output_dir == str(out)
        saved = OmegaConf.load(out / ".hydra" / "config.yaml")
        assert saved.lr == (i + 1) / 10
        assert OmegaConf.load(out / ".hydra" / "overrides.yaml") == [f"+lr={(i + 1) / 10}"]
        hydra_yaml = OmegaConf.load(out / ".hydra" / "hydra.yaml")
        assert hydra_yaml.hydra.job.num == i
        assert hydra_yaml.hydra.job.id.endswith(f"_{i}")  # the array task's Slurm id
        assert (out / "lr_app.log").exists()


def test_wait_raises_a_failed_tasks_exception_with_its_traceback(
    here: Path, slurm: FakeSlurm, nodes: StandInNodes
) -> None:
    with pytest.raises(ValueError, match=r"lr 0.2 is too high") as info:
        multirun(here, "+lr=0.1,0.2", "+max_lr=0.15", *WAIT)
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "in task" in info.value.__cause__.text  # the task's own frame, from the node


def test_a_task_that_ended_without_a_return_fails_as_hydra_expects() -> None:
    cfg = OmegaConf.create({"lr": 0.1, "hydra": {"overrides": {"task": ["lr=0.1"]},
                                                 "job": {"name": "app"}}})  # fmt: skip
    ended: Future[Any] = Future()
    ended.set_exception(JobFailed("job 7_0 ended TIMEOUT", "TIMEOUT"))
    ret = _outcome(ended, cfg, None)  # type: ignore[arg-type]
    assert ret.status is JobStatus.FAILED and ret.overrides == ["lr=0.1"]
    assert ret.cfg == {"lr": 0.1}
    with pytest.raises(JobFailed, match="TIMEOUT"):
        _ = ret.return_value
    own: Future[Any] = Future()
    own.set_result((JobReturn(status=JobStatus.COMPLETED, _return_value=0.2), None))
    assert _outcome(own, cfg, None).return_value == 0.2  # type: ignore[arg-type]
