"""Command: shell (registered on the app in clusterjob.cli).

``clusterjob shell --gpus 1 --model A100 [-- CMD ARGS]``: an interactive session on a GPU
node through ``srun --pty``, with the site's own GPU request and the preflight first.
"""

from __future__ import annotations

from typing import Annotated

import typer

from clusterjob.cli.app import app
from clusterjob.cli.common import the_cluster
from clusterjob.cli.options import ModelOption, PartitionOption, SiteOption


@app.command(context_settings={"allow_interspersed_args": True})
def shell(
    command: Annotated[
        list[str] | None,
        typer.Argument(help="Run this instead of your shell (after --).", show_default=False),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", help="GPUs (0 or none: CPU only).", show_default=False),
    ] = None,
    model: ModelOption = None,
    partition: PartitionOption = None,
    time: Annotated[str | None, typer.Option("--time", "-t", help="Time limit.")] = None,
    account: Annotated[
        str | None, typer.Option("--account", "-A", help="Slurm account to charge.")
    ] = None,
    qos: Annotated[str | None, typer.Option("--qos", help="Slurm quality of service.")] = None,
    cpus_per_gpu: Annotated[
        int | None, typer.Option("--cpus-per-gpu", help="CPUs per GPU.")
    ] = None,
    mem_per_gpu: Annotated[
        str | None, typer.Option("--mem-per-gpu", help="Memory per GPU, e.g. 64G.")
    ] = None,
    constraint: Annotated[
        str | None, typer.Option("--constraint", "-C", help="Node features, e.g. ib&nvme.")
    ] = None,
    exclude: Annotated[
        str | None, typer.Option("--exclude", "-x", help="Nodes not to use, e.g. gpu[01-03].")
    ] = None,
    nodelist: Annotated[
        str | None, typer.Option("--nodelist", "-w", help="Nodes the job must use.")
    ] = None,
    job_name: Annotated[str, typer.Option("--job-name", "-J", help="Slurm job name.")] = "shell",
    site: SiteOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the srun command; start nothing.")
    ] = False,
) -> None:
    """An interactive session on a node with GPUs of one model: srun --pty, preflight first."""
    result = the_cluster(site).shell(
        tuple(command or ()),
        dry_run=dry_run,
        gpus=gpus,
        model=model,
        partition=partition,
        time=time,
        account=account,
        qos=qos,
        cpus_per_gpu=cpus_per_gpu,
        mem_per_gpu=mem_per_gpu,
        constraint=constraint,
        exclude=exclude,
        nodelist=nodelist,
        job_name=job_name,
    )
    if isinstance(result, str):
        typer.echo(result)
        return
    raise typer.Exit(result)
