"""The batch scheduler behind a site, as one small object: which job template it renders,
the directive lines it adds, and the command that submits the written script.

The site's ``scheduler:`` names it (``clusterjob.site.model.SCHEDULERS``); ``backend_for``
is the one place that turns that name into behaviour, so the rest of clusterjob asks the
backend and never compares scheduler names. Adding a scheduler is adding a class here and a
package beside ``clusterjob.slurm`` for its commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from clusterjob.errors import UsageError

if TYPE_CHECKING:  # the submit path imports this module; it needs neither at run time
    from clusterjob.jobscript.control import JobControl
    from clusterjob.jobscript.request import ResolvedJob
    from clusterjob.site.model import Site


class SchedulerBackend(Protocol):
    """What rendering and submitting a job need to know of the scheduler."""

    @property
    def name(self) -> str: ...

    @property
    def template(self) -> str:
        """The job template's name (a site's template directory may override it)."""
        ...

    @property
    def submit_program(self) -> str:
        """The command that submits a script, as shown to a person (sbatch, qsub)."""
        ...

    @property
    def label(self) -> str:
        """The scheduler's name as people write it (Slurm, Grid Engine)."""
        ...

    @property
    def submits(self) -> bool:
        """Whether clusterjob submits, follows and cancels this scheduler's jobs itself
        (False: it renders the script, ``submit --dry-run``, and the user runs it)."""
        ...

    def directives(self, resolved: ResolvedJob) -> tuple[str, ...]:
        """Directive options the template writes as they are; UsageError for a request the
        scheduler cannot express."""
        ...

    def submit_argv(self, script_path: str) -> list[str]: ...

    def submit_command(self, script_path: str, workdir: str) -> list[str]:
        """The command that submits the written script from ``workdir``, as ``show`` and
        ``submit`` print it for a person to rerun."""
        ...

    def control(self) -> JobControl | None:
        """The scheduler's job commands (``clusterjob.jobscript.control``) the jobs layer
        submits, follows and cancels its jobs with; None: Slurm, whose jobs go through the
        jobs layer's own ``SlurmClient`` path."""
        ...


class SlurmBackend:
    """Slurm: the shipped ``job.sh.j2`` writes its ``#SBATCH`` lines itself."""

    name = "slurm"
    label = "Slurm"
    template = "job.sh.j2"
    submit_program = "sbatch"
    submits = True

    def directives(self, resolved: ResolvedJob) -> tuple[str, ...]:
        return ()

    def submit_argv(self, script_path: str) -> list[str]:
        return ["sbatch", "--parsable", script_path]

    def submit_command(self, script_path: str, workdir: str) -> list[str]:
        return ["sbatch", "--parsable", f"--chdir={workdir}", script_path]

    def control(self) -> JobControl | None:
        return None


class GridEngineBackend:
    """Son of Grid Engine: ``job-gridengine.sh.j2`` writes ``#$`` lines from ``directives``
    (``clusterjob.gridengine.syntax``'s table). What it has no word for is refused here, in
    one line naming each, before anything reaches qsub."""

    name = "gridengine"
    label = "Grid Engine"
    template = "job-gridengine.sh.j2"
    submit_program = "qsub"
    submits = True

    def directives(self, resolved: ResolvedJob) -> tuple[str, ...]:
        from clusterjob.gridengine import syntax as ge  # Slurm sites' renders never need it
        from clusterjob.slurm.syntax import time_seconds

        self._refuse_unsupported(resolved)
        request = resolved.request
        try:
            job = ge.QsubRequest(
                name=resolved.job_name,
                queue=resolved.partition.name if resolved.partition_option else None,
                gpus=resolved.gpus_per_node if resolved.model is not None else 0,
                gpu_type=resolved.model.gres_type if resolved.model is not None else None,
                runtime_s=time_seconds(resolved.time) if resolved.time is not None else None,
                tasks=ge.array_tasks(request.array) if request.array is not None else None,
                hold=ge.hold_jids(request.dependency) if request.dependency else (),
                output=ge.log_path(request.output, "--output") if request.output else None,
                error=ge.log_path(request.error, "--error") if request.error else None,
                account=resolved.account,
                mail_events=ge.mail_events(request.mail_type) if request.mail_type else None,
                mail_user=request.mail_user,
                rerunnable=request.requeue,
                token=resolved.token,
            )
            return ge.directives(job)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def submit_argv(self, script_path: str) -> list[str]:
        return ["qsub", script_path]

    def submit_command(self, script_path: str, workdir: str) -> list[str]:
        return ["qsub", "-wd", workdir, script_path]  # GridEngineControl.submit's options

    def control(self) -> JobControl | None:
        from clusterjob.jobscript.control import GridEngineControl

        return GridEngineControl()

    @staticmethod
    def _refuse_unsupported(resolved: ResolvedJob) -> None:
        request = resolved.request
        asked = {
            "more than one node (a Grid Engine parallel environment)": resolved.nodes > 1,
            "--launcher srun": resolved.launcher == "srun",
            "--qos": resolved.qos is not None,
            "--constraint": resolved.constraint is not None,
            "--exclude": request.exclude is not None,
            # its retry resubmits with the bad node excluded: Slurm's --exclude and sbatch
            "--retry-bad-node": request.retry_bad_node > 0,
            "--nodelist": request.nodelist is not None,
            "--signal": request.signal is not None,
            "--sbatch-arg (and a site's defaults.sbatch)": bool(resolved.sbatch_args),
            "--gres": bool(request.gres),
            "--container-image": request.container_image is not None,
            "CPUs per GPU or per task": resolved.cpus_per_gpu is not None
            or resolved.cpus_per_task is not None,
            "memory per GPU or per node": resolved.mem_per_gpu is not None
            or resolved.mem is not None,
        }
        missing = [name for name, wanted in asked.items() if wanted]
        if missing:
            raise UsageError(
                "this site runs Grid Engine, where clusterjob cannot ask for "
                + ", ".join(missing)
                + " yet: leave it out (or set it in the site's queue configuration)"
            )


# The one table from a site's ``scheduler:`` to its backend.
BACKENDS: Mapping[str, SchedulerBackend] = {
    "slurm": SlurmBackend(),
    "gridengine": GridEngineBackend(),
}


def backend_for(site: Site) -> SchedulerBackend:
    """The backend of the scheduler ``site`` runs (the loader admits only BACKENDS' names)."""
    return BACKENDS[site.scheduler]


def backend_named(scheduler: str | None) -> SchedulerBackend:
    """The backend a registry record names (an older record, which names none, is Slurm's)."""
    return BACKENDS.get(scheduler or "", BACKENDS["slurm"])


def check_submits(site: Site) -> None:
    """Refuse, before anything is written or run, to submit to a site whose scheduler
    clusterjob can render for but not yet submit to, saying what to do instead."""
    backend = backend_for(site)
    if not backend.submits:
        raise UsageError(
            f"site {site.name} runs {backend.label}: clusterjob writes its job scripts "
            f"(submit --dry-run) but does not submit or follow its jobs yet; save the script "
            f"and run {backend.submit_program} on it"
        )
