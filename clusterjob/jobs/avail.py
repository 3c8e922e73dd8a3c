"""``clusterjob avail``: free GPUs by model and partition right now, and when a job would start.

Free = a node's configured GPU GRES (``Gres=``) minus those in use (``GresUsed=``, from
``scontrol show node -o -d``: one Slurm call for the whole cluster). Drained and down nodes
are left out and named, since their GPUs cannot be had. The start estimate is Slurm's own
(``sbatch --test-only`` of the job ``clusterjob submit`` would render), not a guess.

A scheduler followed through its backend's ``JobControl`` (Grid Engine) counts its hosts'
free GPUs itself (``JobControl.gpu_hosts``); the same rows are built from that count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from clusterjob.errors import UsageError, printable
from clusterjob.jobscript.backends import backend_for
from clusterjob.jobscript.control import HostGpus, JobControl
from clusterjob.site.model import Site
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.parse import (
    NodeRecord,
    StartEstimate,
    alloc_tres_gpu_counts,
    gpu_counts,
    node_unavailable,
)


@dataclass(frozen=True)
class NodeFree:
    """One node's GPUs of one model."""

    node: str
    partitions: tuple[str, ...]
    model: str  # the site's model name, or the GRES type Slurm reports when no model has it
    total: int
    free: int


@dataclass(frozen=True)
class ModelFree:
    """Free GPUs of one model in one partition, over its usable nodes."""

    partition: str
    model: str
    free: int
    total: int  # on usable nodes
    most_on_one_node: int  # the largest single-node request that could start now
    nodes_free: tuple[str, ...]  # nodes with at least one free GPU of this model


@dataclass(frozen=True)
class SkippedNode:
    node: str
    state: str
    reason: str | None


@dataclass(frozen=True)
class Availability:
    site: str
    rows: tuple[ModelFree, ...]
    skipped: tuple[SkippedNode, ...]  # drained/down nodes whose GPUs were not counted
    unknown_use: tuple[str, ...] = ()  # nodes whose GPUs in use Slurm did not report
    estimate: StartEstimate | None = None
    request: str | None = None  # the request estimated, e.g. "2 x A100"
    # your avoid list's nodes (jobs/badnodes.py): "gpu3 (preflight failed 2h ago: ..., job 7)"
    avoided: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.estimate is not None:
            e = self.estimate
            data["estimate"] = {
                "start": e.start.isoformat() if e.start else None,
                "start_text": e.start_text,
                "nodes": e.nodes,
                "partition": e.partition,
                "processors": e.processors,
            }
        return data


def _model_name(site: Site, gres_type: str | None, node: str) -> str:
    """The site's model for a GRES type (or, untyped, the node map's only model there)."""
    if gres_type is not None:
        for m in site.models:
            if m.gres_type and m.gres_type.casefold() == gres_type.casefold():
                return m.name
        return gres_type
    models = set(site.gres_models(node))
    return models.pop() if len(models) == 1 else "gpu"


def node_free(
    site: Site, nodes: Sequence[NodeRecord]
) -> tuple[list[NodeFree], list[SkippedNode], list[str]]:
    """Per usable node and model: GPUs and free GPUs; and the nodes left out, and why."""
    usable: list[NodeFree] = []
    skipped: list[SkippedNode] = []
    unknown: list[str] = []
    for node in nodes:
        total = gpu_counts(node.gres)
        if not any(total.values()):
            continue
        if node_unavailable(node):
            state = "+".join((node.state, *node.flags))
            skipped.append(SkippedNode(node.name, state, node.reason))
            continue
        if node.gres_used is not None:
            used = gpu_counts(node.gres_used)
        elif "AllocTRES" in node.raw:
            used = alloc_tres_gpu_counts(node.raw["AllocTRES"])
        else:
            unknown.append(node.name)
            continue
        for gres_type, count in total.items():
            busy = used.get(gres_type, 0)
            usable.append(
                NodeFree(
                    node=node.name,
                    partitions=node.partitions,
                    model=_model_name(site, gres_type, node.name),
                    total=count,
                    free=max(0, count - busy),
                )
            )
    return usable, skipped, unknown


def summarise(
    site: Site,
    nodes: Sequence[NodeRecord],
    *,
    model: str | None = None,
    partition: str | None = None,
) -> Availability:
    """Free GPUs by partition and model (pure: parsed ``scontrol show node -o -d``)."""
    wanted = _wanted_model(site, model)
    usable, skipped, unknown = node_free(site, nodes)
    rows = _rows(usable, wanted, partition)
    if partition is not None:
        skipped = [s for s in skipped if _in_partition(nodes, s.node, partition)]
    return Availability(site.name, rows, tuple(skipped), tuple(unknown))


def _wanted_model(site: Site, model: str | None) -> str | None:
    """The site's canonical name of ``--model``; UsageError naming the models if unknown."""
    if model is None:
        return None
    found = site.model(model)
    if found is None:
        known = ", ".join(m.name for m in site.models)
        raise UsageError(f"unknown GPU model {model!r} at site {site.name}; models: {known}")
    return found.name


def _rows(
    usable: Sequence[NodeFree], wanted: str | None, partition: str | None
) -> tuple[ModelFree, ...]:
    """The nodes' GPUs summed by partition and model."""
    groups: dict[tuple[str, str], list[NodeFree]] = {}
    for entry in usable:
        if wanted is not None and entry.model != wanted:
            continue
        for part in entry.partitions:
            if partition is None or part == partition:
                groups.setdefault((part, entry.model), []).append(entry)
    return tuple(
        ModelFree(
            partition=part,
            model=name,
            free=sum(e.free for e in entries),
            total=sum(e.total for e in entries),
            most_on_one_node=max(e.free for e in entries),
            nodes_free=tuple(e.node for e in entries if e.free),
        )
        for (part, name), entries in sorted(groups.items())
    )


def host_free(site: Site, host: HostGpus) -> NodeFree:
    """A host the scheduler counts GPUs on (not Slurm), in ``NodeFree``'s words: its total
    is the site's node map's (the scheduler reports only what is left); its partitions are
    the site's partitions that list it."""
    mapped = site.node_map.gpus(host.host)
    total = max(len(mapped), host.free) if mapped is not None else host.free
    return NodeFree(
        node=host.host,
        partitions=tuple(p.name for p in site.partitions if host.host in p.node_names),
        model=_model_name(site, host.gpu_type, host.host),
        total=total,
        free=host.free,
    )


def summarise_hosts(
    site: Site,
    hosts: Sequence[HostGpus],
    *,
    model: str | None = None,
    partition: str | None = None,
) -> Availability:
    """Free GPUs by partition and model from a scheduler's per-host count (pure)."""
    wanted = _wanted_model(site, model)
    usable = [host_free(site, h) for h in hosts]
    return Availability(site.name, _rows(usable, wanted, partition), ())


def _in_partition(nodes: Sequence[NodeRecord], name: str, partition: str) -> bool:
    return any(n.name == name and partition in n.partitions for n in nodes)


def estimate_start(
    site: Site,
    *,
    gpus: int,
    model: str | None,
    partition: str | None,
    client: SlurmClient,
) -> StartEstimate:
    """When Slurm would start ``gpus`` GPUs of ``model``: the job ``clusterjob submit`` would
    render, through the same ``--test-only`` path (nothing is submitted or recorded)."""
    from clusterjob.jobs.submit import TestOnlyResult, submit
    from clusterjob.jobscript.render import render
    from clusterjob.jobscript.request import JobRequest, resolve

    request = JobRequest(
        script="clusterjob-avail-estimate",
        gpus=gpus,
        model=model,
        partition=partition,
        job_name="clusterjob-avail",
    )
    resolved = resolve(site, request, choose_interpreter=False)  # sbatch --test-only: never runs
    result = submit(site, resolved, render(site, resolved), test_only=True, client=client)
    assert isinstance(result, TestOnlyResult)
    return result.estimate


def availability(
    site: Site,
    *,
    model: str | None = None,
    gpus: int | None = None,
    partition: str | None = None,
    client: SlurmClient | None = None,
    avoided: Sequence[str] = (),
) -> Availability:
    """Free GPUs now; with ``gpus``, also Slurm's earliest start for such a job.
    ``avoided``: the avoid list's nodes, as said (their GPUs are counted: others may use
    them; your submissions exclude them)."""
    if partition is not None and site.partition(partition) is None:
        known = ", ".join(p.name for p in site.partitions)
        raise UsageError(
            f"unknown partition {partition!r} at site {site.name}; partitions: {known}"
        )
    control = backend_for(site).control()
    if control is not None:
        return controlled_availability(
            site, control, model=model, gpus=gpus, partition=partition, avoided=avoided
        )
    client = client or SlurmClient()
    result = summarise(site, client.nodes(), model=model, partition=partition)
    result = replace(result, avoided=tuple(avoided))
    if gpus is None:
        return result
    if gpus < 1:
        raise UsageError("--gpus must be at least 1")
    estimate = estimate_start(site, gpus=gpus, model=model, partition=partition, client=client)
    found = site.model(model) if model else None
    what = f"{gpus} x {found.name if found else 'GPU'}"
    return replace(result, estimate=estimate, request=what)


def controlled_availability(
    site: Site,
    control: JobControl,
    *,
    model: str | None,
    gpus: int | None,
    partition: str | None,
    avoided: Sequence[str] = (),
) -> Availability:
    """Free GPUs now on a scheduler followed through its backend (Grid Engine): one call for
    every host's count. No start estimate: such a scheduler gives none (refused, not guessed)."""
    if gpus is not None:
        label = backend_for(site).label
        raise UsageError(
            f"site {site.name} runs {label}, which gives no start estimate: leave --gpus out"
        )
    _wanted_model(site, model)  # an unknown model is refused before the scheduler is asked
    result = summarise_hosts(site, control.gpu_hosts(), model=model, partition=partition)
    return replace(result, avoided=tuple(avoided))


def format_availability(avail: Availability) -> list[str]:
    lines = []
    if not avail.rows:
        lines.append("no usable GPUs match")
    width = max([len("PARTITION"), *(len(r.partition) for r in avail.rows)])
    mwidth = max([len("MODEL"), *(len(r.model) for r in avail.rows)])
    if avail.rows:
        lines.append(f"{'PARTITION':<{width}}  {'MODEL':<{mwidth}}  FREE/TOTAL  MOST ON ONE NODE")
    for r in avail.rows:
        lines.append(
            f"{r.partition:<{width}}  {r.model:<{mwidth}}  {f'{r.free}/{r.total}':>10}  "
            f"{r.most_on_one_node}"
        )
    for s in avail.skipped:
        why = f": {s.reason}" if s.reason else ""
        lines.append(f"not counted: {s.node} is {s.state}{why}")
    if avail.unknown_use:
        lines.append(
            f"not counted: Slurm did not report GPUs in use on {', '.join(avail.unknown_use)}"
        )
    for line in avail.avoided:
        lines.append(f"avoided by your submissions: {line} (`clusterjob nodes`)")
    if avail.estimate is not None:
        e = avail.estimate
        when = e.start.strftime("%Y-%m-%d %H:%M:%S") if e.start else f"never ({e.start_text})"
        lines.append(
            f"a job of {avail.request} would start at {when} on {e.nodes} "
            f"(partition {e.partition}; Slurm's estimate, nothing submitted)"
        )
    return [printable(line) for line in lines]  # drain reasons are Slurm's (anyone's) text
