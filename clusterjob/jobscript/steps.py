"""The srun steps of a job script, each with its whole task layout and resources said.

Inside an allocation srun takes the batch's request from the environment as its own options
(``SLURM_NTASKS``, ``SLURM_NTASKS_PER_NODE``, ``SLURM_GPUS_PER_TASK``; from Slurm 23.11 also
``SLURM_CPUS_PER_TASK`` and ``SLURM_TRES_PER_TASK``). A step laid out otherwise than the batch
(one torchrun agent or one preflight per node under ``--ntasks-per-node=<GPUs>``) that says
only part of its layout gets the rest from the batch: srun ignores ``--ntasks-per-node=1``
next to the inherited task count ("can't honor"), and binds each task to the batch's GPUs
and CPUs per task. So each step here names its nodes, tasks, tasks per node, GPUs (as the
site's syntax binds them to a step) and CPUs per task.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterjob.jobscript import directives
from clusterjob.jobscript.request import ResolvedJob
from clusterjob.site.model import Site


@dataclass(frozen=True)
class Step:
    """One srun step: its options, and the batch variables srun must not read for it."""

    options: tuple[str, ...]  # e.g. ("--nodes=2", "--ntasks=2", "--ntasks-per-node=1", ...)
    unset: tuple[str, ...] = ()  # run as `env -u NAME ... srun`


@dataclass(frozen=True)
class JobSteps:
    """The steps a job script may start: one task per node (the preflight on several nodes,
    torchrun's agents, a container's program), and the srun launcher's tasks."""

    per_node: Step
    tasks: Step
    tasks_per_node: int  # the srun launcher's tasks per node: the batch's


def batch_tasks_per_node(job: ResolvedJob) -> int:
    """The ``#SBATCH --ntasks-per-node`` of the job script."""
    if job.sbatch_tasks_per_node is not None:
        return job.sbatch_tasks_per_node
    return job.tasks_per_node


def job_steps(site: Site, job: ResolvedJob) -> JobSteps:
    tasks = batch_tasks_per_node(job)
    return JobSteps(step(site, job, 1), step(site, job, tasks), tasks)


def step(site: Site, job: ResolvedJob, tasks: int) -> Step:
    """A step of ``tasks`` tasks on each node of ``job``, sharing the job's GPUs and CPUs."""
    options = [f"--nodes={job.nodes}", f"--ntasks={job.nodes * tasks}"]
    options.append(f"--ntasks-per-node={tasks}")
    gpus: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()
    if job.model is not None:
        syntax = site.gpu_syntax
        gpus = syntax.step_options(job.gres.gres_type, job.gpus_per_node, job.nodes, tasks)
        unset = syntax.batch_env
    options += directives.with_gres(gpus, other_gres(job))
    cpus = step_cpus_per_task(job, tasks)
    if cpus is not None:
        options.append(f"--cpus-per-task={cpus}")
    return Step(tuple(options), unset)


def other_gres(job: ResolvedJob) -> tuple[str, ...]:
    """The job's GRES besides its GPUs (``nvme:10``, ``mps:50``), from the batch's one
    ``--gres``: a step that names its own GRES gets only those, and some set the tasks'
    environment (MPS)."""
    for option in job.gres.options:
        if option.startswith("--gres="):
            items = option.removeprefix("--gres=").split(",")
            return tuple(i for i in items if directives.gres_name(i) != "gpu")
    return ()


def step_cpus_per_task(job: ResolvedJob, tasks: int) -> int | None:
    """The CPUs each of a step's ``tasks`` tasks per node gets: the node's CPUs for the job,
    as the batch asked for them per task, split among them. srun of Slurm 22.05 to 23.02 reads
    no ``--cpus-per-task`` from the batch (one CPU a task), and from 23.11 it reads the batch's
    per-task count, which is one GPU's share for a one-task-per-node step. None where the batch
    asked per GPU (srun reads ``SLURM_CPUS_PER_GPU``; the step has the same GPUs), or where the
    step's tasks are the batch's and those have Slurm's default."""
    batch_tasks = batch_tasks_per_node(job)
    if job.cpus_per_task is not None:
        return max(1, job.cpus_per_task * batch_tasks // tasks)
    if job.cpus_per_gpu is not None and job.sbatch_tasks_per_node is None:
        return None  # the script wrote --cpus-per-gpu
    if tasks < batch_tasks:
        return batch_tasks // tasks  # the batch's tasks had Slurm's default, one CPU each
    return None
