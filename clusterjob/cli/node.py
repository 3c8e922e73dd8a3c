"""Commands: node (registered on the app in clusterjob.cli): ``preflight`` and ``gpus``."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer

from clusterjob import envvars
from clusterjob.cli.app import app
from clusterjob.errors import PreflightFailed


@app.command()
def preflight(
    site: Annotated[
        str | None,
        typer.Option(help="Site config file or name (default: $CLUSTERJOB_SITE, then search)."),
    ] = None,
    expect_model: Annotated[
        str | None,
        typer.Option(help="GPU model the job asked for.", envvar=envvars.EXPECT_MODEL),
    ] = None,
    expect_count: Annotated[
        int | None,
        typer.Option(help="GPUs the job asked for on this node.", envvar=envvars.EXPECT_COUNT),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Check this node's GPUs against the site map and the job's request (run in the job)."""
    from clusterjob.node import report
    from clusterjob.node.context import node_name
    from clusterjob.node.preflight import run_preflight

    environ = dict(os.environ)
    result = run_preflight(site, node_name(environ), environ, expect_model, expect_count)
    if as_json:
        print(report.render_json(result))
    else:
        print(report.render_table(result, summary=result.ok), file=sys.stderr)
    if not result.ok:
        raise PreflightFailed(report.summary_line(result))


@app.command()
def gpus(
    as_json: Annotated[bool, typer.Option("--json", help="Print the inventory as JSON.")] = False,
) -> None:
    """List this node's GPUs as NVML sees them, in PCI bus order, and who holds each."""
    from clusterjob.node import report
    from clusterjob.node.preflight import read_gpus
    from clusterjob.workstation.claims import current_claims

    inventory = read_gpus()
    holders = {c.key: c.holder_text() for c in current_claims()}
    if as_json:
        print(json.dumps(report.inventory_to_dict(inventory, holders), indent=2, sort_keys=True))
    else:
        print(report.render_inventory(inventory, holders))
