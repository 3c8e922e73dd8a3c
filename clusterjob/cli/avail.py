"""Commands: avail, nodes (registered on the app in clusterjob.cli)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Annotated

import typer

from clusterjob.cli.app import app
from clusterjob.cli.common import load_site, the_cluster
from clusterjob.cli.options import JsonOption, ModelOption, PartitionOption, SiteOption
from clusterjob.errors import UsageError, printable


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
    """Free GPUs by model and partition now (drained/down nodes left out, and named; the
    nodes your submissions avoid, named)."""
    from clusterjob.jobs.avail import availability, format_availability

    loaded = load_site(site, describe=True)
    now = time.time()
    listed = the_cluster(site).avoid_list().entries(loaded.cluster_name, now)
    result = availability(
        loaded,
        model=model,
        gpus=gpus,
        partition=partition,
        avoided=[e.line(now) for e in listed],
    )
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print("\n".join(format_availability(result)))


@app.command("nodes")
def nodes(
    node: Annotated[
        str | None, typer.Argument(help="Only this node (with --clear: forget only it).")
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Forget the node (default: every node) now.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """The nodes your submissions avoid for a while (a failed preflight, a node failure or a
    GPU fault of one of your jobs there, seen by `wait`), and why; `--clear [NODE]` forgets."""
    avoid = the_cluster().avoid_list()
    now = time.time()
    if clear:
        gone = avoid.clear(node)
        if node is not None and not gone:
            raise UsageError(f"{node} is not on your avoid list")
        names = ", ".join(dict.fromkeys(e.node for e in gone)) or "none"
        print(f"forgot: {names}")
        return
    listed = [e for e in avoid.entries(now=now) if node is None or e.node == node]
    if as_json:
        print(json.dumps([asdict(e) for e in listed], indent=2))
        return
    if not listed:
        print("no nodes avoided" + (f" ({node} is not on the list)" if node else ""))
        return
    rows = [
        (e.node, e.cluster or "-", e.job_id, _when(e.since - now), _when(e.until - now), e.finding)
        for e in listed
    ]
    headers = ("NODE", "CLUSTER", "JOB", "SINCE", "UNTIL", "FINDING")
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    for cells in (headers, *rows):
        line = "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        print(printable(line))


def _when(delta: float) -> str:
    """``2h ago`` (past) or ``in 22h`` (to come)."""
    from clusterjob.jobs.badnodes import ago

    return ago(-delta) if delta <= 0 else "in " + ago(delta).removesuffix(" ago")
