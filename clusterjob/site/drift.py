"""Drift between a site's node map and the live cluster (``clusterjob site diff``).

The node map is what the Prolog checks real GPUs against and what ``gres-conf`` generates
Slurm's config from; when an admin changes one side only, jobs land on the wrong GPUs or
nodes get drained. ``compare`` is pure (site + parsed Slurm records); ``diff_site`` asks
Slurm through ``SlurmClient``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import hostlist

from clusterjob import __version__
from clusterjob.errors import UsageError, printable
from clusterjob.site.admin import node_gres_strings
from clusterjob.site.model import Site
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.parse import NodeRecord, PartitionRecord, gpu_counts, gpu_gres

# Reasons the clusterjob Prolog leaves: Slurm's own "Prolog error" when the Prolog exits
# non-zero, or the reason clusterjob sets itself ("clusterjob: GPU 1 is V100, ...").
PROLOG_REASONS = ("Prolog error", "clusterjob")


@dataclass(frozen=True)
class GresDrift:
    node: str
    expected: str  # from the node map, as gres-conf writes it ("gpu:a100:2,gpu:v100:2")
    actual: str | None  # the GPU items of Slurm's Gres= (None when it lists no GPU)


@dataclass(frozen=True)
class PartitionDrift:
    partition: str
    only_in_map: tuple[str, ...]  # nodes the site lists that Slurm's partition lacks
    only_in_slurm: tuple[str, ...]
    missing_in_slurm: bool = False  # the site names a partition Slurm does not have
    missing_in_site: bool = False  # a Slurm partition with mapped GPU nodes the site lacks


@dataclass(frozen=True)
class DrainedNode:
    node: str
    state: str  # e.g. IDLE+DRAIN
    reason: str | None


@dataclass(frozen=True)
class VersionSkew:
    """A node whose last Prolog run logged another clusterjob than this one."""

    node: str
    version: str | None  # None: that Prolog logged no version (older than the field)
    time: str | None  # of that log record


@dataclass(frozen=True)
class DriftReport:
    site: str
    not_in_map: tuple[str, ...]  # Slurm nodes with GPU GRES the node map lacks
    not_in_slurm: tuple[str, ...]  # mapped nodes Slurm does not know
    gres: tuple[GresDrift, ...]
    partitions: tuple[PartitionDrift, ...]
    prolog_drained: tuple[DrainedNode, ...]  # drained by the clusterjob Prolog
    other_drained: tuple[DrainedNode, ...] = ()  # drained for other reasons: shown, not drift
    ignored: tuple[str, ...] = field(default=())  # Slurm nodes without GPUs, not in the map
    version_skew: tuple[VersionSkew, ...] = ()  # from a Prolog log, when one was given
    version: str = __version__  # this clusterjob's, which the nodes' are compared with

    @property
    def in_sync(self) -> bool:
        return not (
            self.not_in_map
            or self.not_in_slurm
            or self.gres
            or self.partitions
            or self.prolog_drained
            or self.version_skew
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["in_sync"] = self.in_sync
        return data


def is_prolog_reason(reason: str | None) -> bool:
    """Whether a node's drain reason was left by the clusterjob Prolog."""
    return bool(reason) and any(str(reason).startswith(r) for r in PROLOG_REASONS)


def _same_gres(expected: dict[str | None, int], actual: dict[str | None, int]) -> bool:
    def norm(counts: dict[str | None, int]) -> dict[str | None, int]:
        return {(t.casefold() if t else t): n for t, n in counts.items() if n}

    return norm(expected) == norm(actual)


def _expand(hosts: str | None) -> set[str]:
    return set(hostlist.expand_hostlist(hosts)) if hosts else set()


def compare(
    site: Site, nodes: Sequence[NodeRecord], partitions: Sequence[PartitionRecord]
) -> DriftReport:
    """The node map against what Slurm reports: node sets, GPU GRES, partitions, drains."""
    mapped = site.node_map.nodes
    expected_gres = node_gres_strings(site)
    live = {n.name: n for n in nodes}
    has_gpus = {n.name for n in nodes if any(c for c in gpu_counts(n.gres).values())}

    not_in_map = sorted(name for name in has_gpus if name not in mapped)
    ignored = sorted(name for name in live if name not in mapped and name not in has_gpus)
    not_in_slurm = sorted(name for name in mapped if name not in live)

    gres: list[GresDrift] = []
    for name in mapped:
        node = live.get(name)
        if node is None:
            continue
        expected = expected_gres.get(name, "")
        if not _same_gres(gpu_counts(expected), gpu_counts(node.gres)):
            gres.append(GresDrift(name, expected or "(no GPUs)", gpu_gres(node.gres)))

    slurm_parts = {p.name: p for p in partitions}
    drift: list[PartitionDrift] = []
    for part in site.partitions:
        record = slurm_parts.get(part.name)
        want = set(part.node_names)
        if record is None:
            drift.append(PartitionDrift(part.name, tuple(sorted(want)), (), missing_in_slurm=True))
            continue
        have = _expand(record.nodes)
        if want != have:
            drift.append(
                PartitionDrift(part.name, tuple(sorted(want - have)), tuple(sorted(have - want)))
            )
    described = {p.name for p in site.partitions}
    for record in partitions:
        if record.name in described:
            continue
        gpu_nodes = sorted(n for n in _expand(record.nodes) if n in mapped and mapped[n])
        if gpu_nodes:  # a partition of GPU nodes users cannot ask for by name through the site
            drift.append(PartitionDrift(record.name, (), tuple(gpu_nodes), missing_in_site=True))

    prolog: list[DrainedNode] = []
    other: list[DrainedNode] = []
    for node in nodes:
        if not node.drained:
            continue
        state = "+".join((node.state, *node.flags))
        entry = DrainedNode(node.name, state, node.reason)
        (prolog if is_prolog_reason(node.reason) else other).append(entry)

    return DriftReport(
        site=site.name,
        not_in_map=tuple(not_in_map),
        not_in_slurm=tuple(not_in_slurm),
        gres=tuple(gres),
        partitions=tuple(drift),
        prolog_drained=tuple(prolog),
        other_drained=tuple(other),
        ignored=tuple(ignored),
    )


def version_skew(
    log_lines: Iterable[str], nodes: Iterable[str], version: str = __version__
) -> tuple[VersionSkew, ...]:
    """The ``nodes`` whose last record in a Prolog JSON-lines log names another version.

    Nodes absent from the log are not reported (no job ran there since it was started).
    Lines that are not JSON objects are skipped: a log cut short by a full disk still counts.
    """
    last: dict[str, dict[str, Any]] = {}
    for line in log_lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("node"), str):
            last[record["node"]] = record
    skew = []
    for node in sorted(set(nodes)):
        record = last.get(node)
        if record is None or record.get("version") == version:
            continue
        logged = record.get("version")
        skew.append(
            VersionSkew(node, logged if isinstance(logged, str) else None, record.get("time"))
        )
    return tuple(skew)


def diff_site(
    site: Site, client: SlurmClient | None = None, *, prolog_log: Path | None = None
) -> DriftReport:
    """``compare`` against the live cluster: two Slurm calls (nodes, partitions); with
    ``prolog_log`` (a node's log, or the nodes' logs gathered), the versions they ran."""
    client = client or SlurmClient()
    report = compare(site, client.nodes(), client.partitions())
    if prolog_log is None:
        return report
    try:
        with open(prolog_log, encoding="utf-8", errors="replace") as log:
            skew = version_skew(log, site.node_map.nodes)
    except OSError as exc:
        raise UsageError(f"--prolog-log {prolog_log}: {exc.strerror or exc}") from exc
    return replace(report, version_skew=skew)


def _hosts(names: Sequence[str]) -> str:
    return str(hostlist.collect_hostlist(list(names)))


def format_report(report: DriftReport) -> list[str]:
    """``site diff``: one line per difference, and what to do about it."""
    lines = []
    if report.not_in_map:
        lines.append(
            f"in Slurm, not in the node map: {_hosts(report.not_in_map)} "
            "(add them with `clusterjob site probe --merge` on each node)"
        )
    if report.not_in_slurm:
        lines.append(f"in the node map, not in Slurm: {_hosts(report.not_in_slurm)}")
    for g in report.gres:
        lines.append(
            f"GRES differs on {g.node}: node map says {g.expected}, Slurm has "
            f"{g.actual or '(none)'} (regenerate with `clusterjob site gres-conf`)"
        )
    for p in report.partitions:
        if p.missing_in_slurm:
            lines.append(f"partition {p.partition}: in the site, not in Slurm")
        elif p.missing_in_site:
            lines.append(
                f"partition {p.partition}: in Slurm with mapped GPU nodes "
                f"{_hosts(p.only_in_slurm)}, not in the site"
            )
        else:
            parts = []
            if p.only_in_map:
                parts.append(f"site only: {_hosts(p.only_in_map)}")
            if p.only_in_slurm:
                parts.append(f"Slurm only: {_hosts(p.only_in_slurm)}")
            lines.append(f"partition {p.partition}: nodes differ ({'; '.join(parts)})")
    for d in report.prolog_drained:
        lines.append(
            f"drained by the clusterjob Prolog: {d.node} ({d.state}): {d.reason} "
            f"(fix the node or the map, then `scontrol update nodename={d.node} state=resume`)"
        )
    for d in report.other_drained:
        lines.append(f"note: {d.node} drained for another reason ({d.state}): {d.reason}")
    if report.ignored:
        lines.append(f"note: nodes without GPUs, not in the map: {_hosts(report.ignored)}")
    for s in report.version_skew:
        ran = f"clusterjob {s.version}" if s.version else "a clusterjob that logs no version"
        lines.append(
            f"version differs on {s.node}: its Prolog ran {ran} (at {s.time}), this is "
            f"{report.version} (install the same version at the site's node_command path)"
        )
    lines.append(f"site {report.site}: {_verdict(report)}")
    return [printable(line) for line in lines]  # drain reasons and node names are Slurm's text


def _verdict(report: DriftReport) -> str:
    """The last line: what is out of sync, named as what it is (a node the Prolog drained
    is not a node-map difference)."""
    if report.in_sync:
        return "node map in sync with Slurm"
    map_differs = report.not_in_map or report.not_in_slurm or report.gres or report.partitions
    parts = ["node map differs from Slurm" if map_differs else "node map matches Slurm"]
    if report.prolog_drained:
        drained = _hosts([d.node for d in report.prolog_drained])
        parts.append(f"drained by the clusterjob Prolog: {drained}")
    if report.version_skew:
        parts.append(
            f"clusterjob version differs on {_hosts([s.node for s in report.version_skew])}"
        )
    return "; ".join(parts)
