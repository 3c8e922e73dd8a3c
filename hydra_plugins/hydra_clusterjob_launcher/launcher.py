"""``ClusterjobLauncher``: a Hydra sweep as ONE Slurm array job, submitted through
``clusterjob.Cluster.map`` (the site's GPU syntax, the preflight, the registry).

Each sweep point's config is composed here, before anything is submitted (a bad override
fails at once, and the nodes need neither the config files nor the search path); the job's
task ``i`` runs ``HydraTask`` on point ``i``: Hydra's own ``run_job``, so its output
directory, ``.hydra/`` files, logging and callbacks are those of Hydra's other launchers.

``wait=false`` (the default) returns once Slurm has the job: one ``SubmittedJobReturn`` per
point, whose status is ``UNKNOWN`` (submitted: not ended yet) and whose ``return_value`` is
the task's ``clusterjob.Job`` (a future: ``.id``, ``.result()``). ``wait=true`` returns
Hydra's ``JobReturn`` of each task as the task made it; a failed task's exception (or the
``JobFailed`` of a task Slurm ended) is raised by Hydra's sweeper as with any launcher.
"""

# No `from __future__ import annotations`: see config.py (Hydra's plugin scan).
import logging
import os
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.singleton import Singleton
from hydra.core.utils import (
    JobReturn,
    JobStatus,
    configure_log,
    filter_overrides,
    run_job,
    setup_globals,
)
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.hydra_clusterjob_launcher.config import LAUNCHER_FIELDS

if TYPE_CHECKING:
    from clusterjob.api.cluster import Cluster, Job

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def job_options(params: Mapping[str, Any], *, job_name: str | None = None) -> dict[str, Any]:
    """The launcher's config as ``clusterjob submit`` keywords: every job field that is set
    (None and empty lists leave the default), ``array_parallelism`` as ``array="%N"``,
    ``job_name`` defaulting to Hydra's job name. Lists and dicts come as plain containers."""
    options: dict[str, Any] = {}
    for name, value in params.items():
        if name in LAUNCHER_FIELDS or name.startswith("_"):
            continue
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        if value is None or value == [] or value == {}:
            continue
        options[name] = value
    parallel = params.get("array_parallelism")
    if parallel is not None:
        options["array"] = f"%{int(parallel)}"
    if job_name and "job_name" not in options:
        options["job_name"] = job_name
    return options


@dataclass
class SubmittedJobReturn(JobReturn):
    """A sweep point submitted, its outcome not known yet: ``status`` is ``UNKNOWN`` and
    ``return_value`` the task's ``clusterjob.Job`` (Hydra's own ``JobReturn`` asserts on an
    UNKNOWN status, which would stop its sweeper)."""

    job: Any = None  # the clusterjob.Job

    @property
    def job_id(self) -> str:
        return self.job.id if self.job is not None else ""

    @property
    def return_value(self) -> Any:
        return self.job

    @return_value.setter
    def return_value(self, value: Any) -> None:
        self._return_value = value


class HydraTask:
    """What one array task runs on the node: Hydra's state as it was at submission (its
    singletons: ConfigStore, the app's OmegaConf resolvers), then ``run_job`` on the task's
    composed config. Returns ``(JobReturn, traceback text or None)``: an exception crosses
    the pickle without its traceback, so the text travels beside it."""

    def __init__(
        self,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        singleton_state: Any,
    ) -> None:
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.singleton_state = singleton_state

    def __call__(self, sweep_config: DictConfig) -> tuple[JobReturn, str | None]:
        Singleton.set_state(self.singleton_state)
        setup_globals()
        array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
        task = os.environ.get("SLURM_ARRAY_TASK_ID")
        job_id = f"{array_job}_{task}" if array_job and task else os.environ.get("SLURM_JOB_ID")
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = job_id or sweep_config.hydra.job.num
        ret = run_job(
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        text = None
        if ret.status == JobStatus.FAILED and isinstance(ret._return_value, BaseException):
            exc = ret._return_value
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            if not _picklable(exc):  # its text still travels
                ret.return_value = RuntimeError(f"the task raised {exc!r} (not picklable)")
        return ret, text


def _picklable(value: object) -> bool:
    import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception:
        return False
    return True


class ClusterjobLauncher(Launcher):
    """``hydra/launcher=clusterjob``: its keyword arguments are ``ClusterjobLauncherConf``'s
    fields, as Hydra instantiates it."""

    def __init__(self, **params: Any) -> None:
        self.params = params
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(
        self,
        *,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def make_cluster(self) -> "Cluster":
        """The cluster the sweep goes to (tests give theirs a stand-in for Slurm)."""
        from clusterjob.api.cluster import Cluster

        p = self.params
        return Cluster(
            p.get("site"),
            host=p.get("host"),
            remote_dir=p.get("remote_dir"),
            sync=p.get("sync"),
            poll_interval=float(p.get("poll_interval") or 10.0),
        )

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        assert self.config is not None
        assert self.hydra_context is not None
        assert self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        if not job_overrides:
            return []
        wait = bool(self.params.get("wait"))
        sweeper = str(OmegaConf.select(self.config, "hydra.sweeper._target_", default=""))
        if not wait and sweeper not in ("", BASIC_SWEEPER):
            log.warning(
                f"hydra.launcher.wait=false with the sweeper {sweeper}: a sweeper that reads "
                "the jobs' results (Optuna, Ax, Nevergrad) needs hydra.launcher.wait=true"
            )
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep and self.config.hydra.sweep.mode is not None:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))

        configs: list[DictConfig] = []
        for i, overrides in enumerate(job_overrides):
            sweep_config = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(overrides)
            )
            with open_dict(sweep_config):
                sweep_config.hydra.job.num = initial_job_idx + i
            configs.append(sweep_config)

        cluster = self.make_cluster()
        options = job_options(self.params, job_name=str(self.config.hydra.job.name))
        if not cluster.remote:
            from clusterjob.jobs.submit import check_output_dirs

            # Hydra's other launchers keep their logs in the sweep directory; on a cluster
            # reached over ssh that directory is here, so the jobs' logs stay clusterjob's
            options.setdefault("output", str((sweep_dir / ".clusterjob").resolve() / "%A_%a.out"))
            check_output_dirs(options.get("output"), options.get("error"), cluster.workdir,
                              mkdir=True)  # fmt: skip
        task = HydraTask(self.hydra_context, self.task_function, Singleton.get_state())
        started = time.monotonic()
        jobs = cluster.options(**options).map(task, configs)
        array_id = jobs[0].id.rsplit("_", 1)[0]
        log.info(
            f"Submitted {len(jobs)} jobs to Slurm as array job {array_id} "
            f"({time.monotonic() - started:.1f}s)"
            + ("" if wait else f"; not waiting: clusterjob status {array_id}")
        )
        for i, (job, overrides) in enumerate(zip(jobs, job_overrides, strict=True)):
            shown = " ".join(filter_overrides(overrides))
            log.info(f"\t#{initial_job_idx + i} : {shown} : job {job.id}")
        if not wait:
            return [_submitted(job, cfg) for job, cfg in zip(jobs, configs, strict=True)]
        timeout = self.params.get("timeout")
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        returns: list[JobReturn] = []
        for job, cfg in zip(jobs, configs, strict=True):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            returns.append(_outcome(job, cfg, left))
        return returns


def _task_parts(cfg: DictConfig) -> tuple[DictConfig, DictConfig, list[str]]:
    """(the task's config without ``hydra``, the config with only ``hydra``, overrides)."""
    task_cfg = OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"])
    hydra_cfg = OmegaConf.masked_copy(cfg, ["hydra"])
    overrides = OmegaConf.to_container(cfg.hydra.overrides.task)
    assert isinstance(overrides, list)
    return task_cfg, hydra_cfg, [str(o) for o in overrides]


def _submitted(job: "Job", cfg: DictConfig) -> SubmittedJobReturn:
    task_cfg, hydra_cfg, overrides = _task_parts(cfg)
    with open_dict(hydra_cfg):
        hydra_cfg.hydra.job.id = job.id
    return SubmittedJobReturn(
        overrides=overrides,
        cfg=task_cfg,
        hydra_cfg=hydra_cfg,
        task_name=str(cfg.hydra.job.name),
        status=JobStatus.UNKNOWN,
        job=job,
    )


def _outcome(job: "Job", cfg: DictConfig, timeout: float | None) -> JobReturn:
    """The task's own ``JobReturn``; one that says FAILED when the job ended without one
    (cancelled, out of time or memory, its Python could not start)."""
    from clusterjob.api.cluster import RemoteTraceback
    from clusterjob.errors import JobTimeout

    try:
        ret, text = job.result(timeout)
    except JobTimeout:
        raise
    except Exception as exc:
        task_cfg, hydra_cfg, overrides = _task_parts(cfg)
        return JobReturn(
            overrides=overrides,
            cfg=task_cfg,
            hydra_cfg=hydra_cfg,
            task_name=str(cfg.hydra.job.name),
            status=JobStatus.FAILED,
            _return_value=exc,
        )
    assert isinstance(ret, JobReturn)
    if text and isinstance(ret._return_value, BaseException):
        ret._return_value.__cause__ = RemoteTraceback(text)
    return ret
