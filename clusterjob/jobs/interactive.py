"""An interactive session on a GPU node: ``srun --pty`` with the site's GPU request and the
preflight first (``clusterjob shell``). Nothing is recorded in the registry."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterjob import envvars
from clusterjob.jobscript.render import default_node_command
from clusterjob.jobscript.request import ResolvedJob
from clusterjob.jobscript.shell import shell_join
from clusterjob.jobscript.steps import step
from clusterjob.site.model import Site
from clusterjob.slurm.commands import SlurmClient

# On the node: the preflight (its words are the first N arguments), then the user's command
# or their login shell, interactive.
_ON_NODE = (
    'n=$1; shift; if [ "$n" -gt 0 ]; then "${@:1:$n}" preflight || exit $?; shift "$n"; fi; '
    'if [ $# -gt 0 ]; then exec "$@"; fi; exec "${SHELL:-/bin/bash}" -i'
)


@dataclass(frozen=True)
class ShellSession:
    """The srun options, the command it runs on the node, and the variables it adds."""

    options: tuple[str, ...]
    command: tuple[str, ...]
    env: dict[str, str]

    def command_line(self) -> str:
        """What a person would type (the variables as ``NAME=VALUE`` before srun)."""
        assignments = [f"{k}={v}" for k, v in self.env.items()]
        return shell_join([*assignments, "srun", "--pty", *self.options, *self.command])


def shell_session(
    site: Site,
    job: ResolvedJob,
    command: Sequence[str] = (),
    node_command: Sequence[str] | None = None,
) -> ShellSession:
    """One task on one node with its GPUs and CPUs as the site's syntax binds them to one task
    (the job script's one-task-per-node step: on a gpus-per-task site the batch's
    ``--gpus-per-task=1`` with one task gave one GPU whatever ``--gpus`` said); the preflight
    when it has GPUs."""
    options = [f"--job-name={job.job_name}"]
    if job.partition_option:
        options.append(f"--partition={job.partition.name}")
    one_task = step(site, job, 1)
    options += list(one_task.options)
    # what the site's syntax adds beside the GPUs (a model's --constraint), as the batch has it
    options += [o for o in job.gres.options if o.startswith("--constraint=")]
    per_task = any(o.startswith("--cpus-per-task=") for o in one_task.options)
    for name, value in (
        ("cpus-per-gpu", None if per_task else job.cpus_per_gpu),
        ("mem-per-gpu", job.mem_per_gpu),
        ("time", job.time),
        ("account", job.account),
        ("qos", job.qos),
        ("constraint", job.constraint),
        ("exclude", job.request.exclude),
        ("nodelist", job.request.nodelist),
    ):
        if value is not None:
            options.append(f"--{name}={value}")
    options += list(job.sbatch_args)  # the site's lines (--hint=...) and --sbatch-arg
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", envvars.SITE: str(Path(site.source).resolve())}
    preflight: list[str] = []
    if job.model is not None:
        env[envvars.EXPECT_MODEL] = job.model.name
        env[envvars.EXPECT_COUNT] = str(job.gpus_per_node)
        preflight = [str(w) for w in (node_command or default_node_command(site))]
    inner = ("bash", "-c", _ON_NODE, "clusterjob-shell", str(len(preflight)), *preflight)
    return ShellSession(tuple(options), (*inner, *command), env)


def open_shell(session: ShellSession, client: SlurmClient | None = None) -> int:
    """Run the session on this terminal; its exit status."""
    client = client or SlurmClient()
    return client.srun_pty(session.options, session.command, session.env)
