"""The options many commands declare the same way, declared once: ``--site``, ``--json``,
and ``--model`` and ``--partition`` with their shell completion (``completion``)."""

from __future__ import annotations

from typing import Annotated

import typer

from clusterjob.cli.completion import complete_model, complete_partition

SiteOption = Annotated[
    str | None, typer.Option("--site", "-s", help="Site name or site YAML file.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
ModelOption = Annotated[
    str | None,
    typer.Option("--model", "-m", help="GPU model (or an alias).", autocompletion=complete_model),
]
PartitionOption = Annotated[
    str | None,
    typer.Option(
        "--partition",
        "-p",
        help="Slurm partition, one the site config names.",
        autocompletion=complete_partition,
    ),
]
