"""Whether a request for a model can only get that model's GPUs.

A partition that holds several models must let Slurm tell them apart: the request either
names a GRES type no other model of the partition has, or carries a node feature, and then
no node of the partition may hold the model beside another (a feature picks nodes, not the
GPUs on them). Otherwise ``--gpus=1`` on such a partition gets any GPU. The site loader
warns where a model is not pinned on a partition that holds it (with the fix), and
``resolve`` refuses such a request (a model, a model group, a site built without the loader).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from clusterjob.site.model import GpuModel, Partition, Site
from clusterjob.site.nodemodel import GresUnit, gres_units

# What one node holds, as Slurm sees it: each GRES index's (model, GRES type).
_Holding = frozenset[tuple[str, str | None]]


def partition_holdings(site: Site, partition: Partition) -> set[_Holding]:
    """The distinct GPU layouts of the partition's nodes (node-map entries share a tuple)."""
    seen: dict[int, _Holding] = {}
    for node in partition.node_names:
        gpus = site.node_map.gpus(node)
        if gpus and id(gpus) not in seen:
            seen[id(gpus)] = frozenset(
                (site.unit_model(u), _unit_type(site, u)) for u in gres_units(gpus)
            )
    return set(seen.values())


def _unit_type(site: Site, unit: GresUnit) -> str | None:
    """A GRES index's type; None for a GPU whose model the site does not define (a site
    built without the loader)."""
    try:
        return site.unit_gres_type(unit)
    except KeyError:
        return None


def _can_write_type(site: Site, model: GpuModel) -> bool:
    """Whether the site's syntax writes a GRES type in a request, given one."""
    typed = replace(model, gres_type="t")
    return site.gpu_syntax.options(typed, 1, 1, site.type_required).gres_type is not None


def unpinned(
    site: Site, partition: Partition, model: GpuModel, holdings: set[_Holding] | None = None
) -> str | None:
    """Why a request for ``model`` (a model group: any of its members) on ``partition`` could
    get another model's GPUs; None when Slurm is told which GPUs it wants. ``holdings``: the
    partition's, when the caller has them."""
    if site.gpu_syntax.gaps(model, site.type_required):
        return None  # the syntax cannot ask for it at all: said where that is checked
    wanted = set(model.members or (model.name,))
    if holdings is None:
        holdings = partition_holdings(site, partition)
    others = sorted({m for h in holdings for m, _ in h} - wanted)
    if not others:
        return None
    spelled = site.gpu_syntax.options(model, 1, 1, site.type_required)
    typed = spelled.gres_type
    sharing = sorted({m for h in holdings for m, t in h if m not in wanted and _same(t, typed)})
    mixed = any({m for m, _ in h} & wanted and {m for m, _ in h} - wanted for h in holdings)
    if (typed and not sharing) or (model.constraint and not mixed):
        return None
    feature = (f"--constraint={model.constraint}",) if model.constraint else ()
    shown = " ".join((*spelled.options, *feature)) or "no GPU option"
    return (
        f"partition {partition.name} also holds {_names(others)} GPUs, and a request for "
        f"{model.name} ({shown}) can get them: {_why(model, typed, sharing)}; "
        f"{_fix(site, model, mixed)}"
    )


def _why(model: GpuModel, typed: str | None, sharing: list[str]) -> str:
    if typed:
        return f"GRES type {typed!r} is also {_names(sharing)}'s"
    if model.constraint:
        return "its node feature cannot tell GPUs apart on a node that holds both"
    return "it names no GRES type and no node feature"


def _fix(site: Site, model: GpuModel, mixed: bool) -> str:
    if model.members:  # a group has no keys of its own: its models do
        return "give its models a gres_type they share and no other model has"
    if mixed or model.constraint:
        return f"give {model.name} a gres_type of its own"
    if _can_write_type(site, model):
        return f"give {model.name} a gres_type of its own, or a constraint (node feature)"
    return f"give {model.name} a constraint (node feature)"


def _same(gres_type: str | None, typed: str | None) -> bool:
    return gres_type is not None and typed is not None and gres_type.casefold() == typed.casefold()


def _names(models: Iterable[str]) -> str:
    return ", ".join(models)


def site_holdings(site: Site) -> dict[str, set[_Holding]]:
    """Each partition's holdings, by partition name (read once for many models)."""
    return {p.name: partition_holdings(site, p) for p in site.partitions}


def first_unpinned(
    site: Site, model: GpuModel, holdings: dict[str, set[_Holding]] | None = None
) -> str | None:
    """The first reason, over the partitions that hold ``model`` (a group: any of its
    models), it is not pinned. ``holdings``: ``site_holdings(site)``, when the caller has it."""
    wanted = set(model.members or (model.name,))
    every = holdings if holdings is not None else site_holdings(site)
    for partition in site.partitions:
        held = every[partition.name]
        if any(wanted & {m for m, _ in h} for h in held):
            problem = unpinned(site, partition, model, held)
            if problem:
                return problem
    return None
