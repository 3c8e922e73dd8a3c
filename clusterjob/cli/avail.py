"""Command: avail (registered on the app in clusterjob.cli)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from clusterjob.cli import app
from clusterjob.cli.common import JsonOption, SiteOption, load_site
from clusterjob.cli.completion import ModelOption, PartitionOption


@app.command("avail")
def avail(
    site: SiteOption = None,
    model: ModelOption = None,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", help="GPUs per node: also ask Slurm when such a job would start."),
    ] = None,
    partition: PartitionOption = None,
    as_json: JsonOption = False,
) -> None:
    """Free GPUs by model and partition now (drained/down nodes left out, and named)."""
    from clusterjob.jobs.avail import availability, format_availability

    result = availability(
        load_site(site, describe=True), model=model, gpus=gpus, partition=partition
    )
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print("\n".join(format_availability(result)))
