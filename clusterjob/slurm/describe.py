"""Pure readings of a live cluster's shape for ``clusterjob site init``. No I/O here.

``scontrol show node``, ``scontrol show partition``, ``scontrol show config`` and
``sacctmgr show qos`` (where accounting runs) are all a site file needs: the GPU layouts of
the nodes (GRES and node features), the partitions with their limits, whether jobs must name
an account, and the QoS with their limits. The node and partition records come from the
parsers of ``clusterjob.slurm.parse``; what is read from them for a description is here,
beside the one new format (sacctmgr's), so the commands and their readings cannot drift.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import hostlist

from clusterjob.slurm.parse import (
    NodeRecord,
    PartitionRecord,
    _null,
    _split_top,
    parse_gres,
)

# sacctmgr show qos format= fields, in order (with --noheader --parsable2: "|" between them).
# MaxTRES is the per-job limit (MaxTRESPerJob), MaxTRESPU the per-user one.
QOS_FIELDS = (
    ("name", "Name"),
    ("max_wall", "MaxWall"),
    ("max_tres", "MaxTRES"),
    ("max_tres_per_node", "MaxTRESPerNode"),
    ("max_tres_per_user", "MaxTRESPU"),
    ("max_jobs_per_user", "MaxJobsPU"),
)


def sacctmgr_qos_command() -> list[str]:
    """The one ``sacctmgr`` call whose output ``parse_sacctmgr_qos`` reads."""
    fields = ",".join(slurm for _, slurm in QOS_FIELDS)
    return ["sacctmgr", "--noheader", "--parsable2", "show", "qos", f"format={fields}"]


@dataclass(frozen=True)
class QosRecord:
    """One QoS and the limits a job meets (empty strings in sacctmgr's output: None)."""

    name: str
    max_wall: str | None  # a Slurm time, e.g. "2-00:00:00"
    max_tres: Mapping[str, str]  # per job: {"gres/gpu": "4", "node": "2"}
    max_tres_per_node: Mapping[str, str]
    max_tres_per_user: Mapping[str, str]
    max_jobs_per_user: int | None

    @property
    def max_gpus_per_job(self) -> int | None:
        return _int(self.max_tres.get("gres/gpu"))

    @property
    def max_nodes(self) -> int | None:
        return _int(self.max_tres.get("node"))

    @property
    def limited(self) -> bool:
        """Whether a job can meet any limit of this QoS."""
        return bool(
            self.max_wall
            or self.max_tres
            or self.max_tres_per_node
            or self.max_tres_per_user
            or self.max_jobs_per_user is not None
        )


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def parse_tres_map(text: str | None) -> dict[str, str]:
    """``cpu=4,gres/gpu=2,node=1`` -> {"cpu": "4", "gres/gpu": "2", "node": "1"}."""
    out: dict[str, str] = {}
    for item in _split_top(text or ""):
        key, sep, value = item.partition("=")
        if sep and key:
            out[key.strip()] = value.strip()
    return out


def parse_sacctmgr_qos(stdout: str) -> list[QosRecord]:
    """``sacctmgr --noheader --parsable2 show qos format=...`` (``sacctmgr_qos_command``):
    one QoS per line, fields in ``QOS_FIELDS`` order. Lines of another width (a header, a
    warning) are skipped; a QoS name is never empty."""
    width = len(QOS_FIELDS)
    out = []
    for line in stdout.splitlines():
        parts = line.rstrip("\n").split("|")
        if len(parts) == width + 1 and parts[-1] == "":  # --parsable (not 2): a trailing "|"
            parts = parts[:-1]
        if len(parts) != width or not parts[0].strip():
            continue
        v = dict(zip((name for name, _ in QOS_FIELDS), (p.strip() for p in parts), strict=True))
        jobs = v["max_jobs_per_user"]
        out.append(
            QosRecord(
                name=v["name"],
                max_wall=_null(v["max_wall"]),
                max_tres=parse_tres_map(v["max_tres"]),
                max_tres_per_node=parse_tres_map(v["max_tres_per_node"]),
                max_tres_per_user=parse_tres_map(v["max_tres_per_user"]),
                max_jobs_per_user=int(jobs) if jobs.isdigit() else None,
            )
        )
    return out


# --- scontrol show config ------------------------------------------------------------------------


def accounting_runs(config: Mapping[str, str]) -> bool:
    """Whether jobs are accounted in slurmdbd (``sacctmgr`` can then be asked)."""
    return "slurmdbd" in config.get("AccountingStorageType", "").casefold()


def enforced(config: Mapping[str, str]) -> tuple[str, ...]:
    """The words of ``AccountingStorageEnforce`` (``associations,limits,qos``), lowercase;
    ``limits``, ``safe`` and ``qos`` imply associations, as slurm.conf(5) says."""
    text = config.get("AccountingStorageEnforce", "").casefold()
    words = [w.strip() for w in text.split(",") if w.strip() and w.strip() not in ("none", "0")]
    if any(w in ("limits", "safe", "qos") for w in words) and "associations" not in words:
        words.append("associations")
    return tuple(words)


def slurm_version(config: Mapping[str, str]) -> str | None:
    return _null(config.get("SLURM_VERSION", "")) if config else None


# --- nodes -------------------------------------------------------------------------------


def node_features(node: NodeRecord) -> tuple[str, ...]:
    """A node's features: ``AvailableFeatures`` (from 17.11), else ``Features`` (older)."""
    text = node.raw.get("AvailableFeatures", node.raw.get("Features", ""))
    value = _null(text)
    if value is None:
        return ()
    return tuple(f.strip() for f in value.split(",") if f.strip())


@dataclass(frozen=True)
class GpuLayout:
    """Nodes that hold the same GPUs (and node features): one ``node_map`` entry.

    ``gpus`` are (GRES type or None, count) in the order Slurm prints them in ``Gres=``,
    which is the order of the node's GRES indices.
    """

    gpus: tuple[tuple[str | None, int], ...]
    features: tuple[str, ...]
    nodes: tuple[str, ...]

    @property
    def hostlist(self) -> str:
        return str(hostlist.collect_hostlist(list(self.nodes)))

    @property
    def count(self) -> int:
        return sum(n for _, n in self.gpus)


def node_gpus(node: NodeRecord) -> tuple[tuple[str | None, int], ...]:
    """The node's GPUs as (type, count) in Slurm's order; types summed where repeated."""
    found: dict[str | None, int] = {}
    for entry in parse_gres(node.gres):
        if entry.name == "gpu" and entry.count > 0:
            found[entry.type] = found.get(entry.type, 0) + entry.count
    return tuple(found.items())


def gpu_layouts(nodes: Iterable[NodeRecord]) -> list[GpuLayout]:
    """Nodes with GPUs grouped by identical GPUs and features, in the order first seen."""
    groups: dict[tuple[object, ...], list[str]] = {}
    shapes: dict[tuple[object, ...], tuple[tuple[str | None, int], ...]] = {}
    features: dict[tuple[object, ...], tuple[str, ...]] = {}
    for node in nodes:
        gpus = node_gpus(node)
        if not gpus:
            continue
        feats = tuple(sorted(node_features(node)))
        key = (gpus, feats)
        groups.setdefault(key, []).append(node.name)
        shapes[key] = gpus
        features[key] = feats
    return [GpuLayout(shapes[k], features[k], tuple(names)) for k, names in groups.items()]


# --- partitions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionLimits:
    """What a job meets in a partition, read from its ``scontrol show partition`` record."""

    name: str
    nodes: tuple[str, ...]  # expanded; every node of the cluster for Nodes=ALL
    default: bool
    max_time: str | None  # None: UNLIMITED
    default_time: str | None
    max_nodes: int | None
    exclusive: bool  # OverSubscribe=EXCLUSIVE: whole nodes
    qos: str | None  # the partition's own QoS
    allow_qos: tuple[str, ...]  # empty: ALL
    allow_accounts: tuple[str, ...]  # empty: ALL
    state: str


_NONE = ("", "NONE", "N/A", "(null)", "UNLIMITED", "INFINITE")


def _limit(text: str | None) -> str | None:
    return None if text is None or text.strip().upper() in _NONE else text.strip()


def _names(text: str | None) -> tuple[str, ...]:
    value = _limit(text)
    if value is None or value.upper() == "ALL":
        return ()
    return tuple(n for n in value.split(",") if n)


def partition_nodes(
    partition: PartitionRecord, all_nodes: Sequence[NodeRecord] = ()
) -> tuple[str, ...]:
    """The partition's node names: its ``Nodes=`` hostlist expanded; ``ALL`` or a hostlist
    python-hostlist cannot read: the nodes whose ``Partitions=`` name it."""
    text = partition.nodes
    if text and text.upper() != "ALL":
        try:
            return tuple(hostlist.expand_hostlist(text))
        except hostlist.BadHostlist:
            pass
    return tuple(n.name for n in all_nodes if partition.name in n.partitions or text == "ALL")


def partition_limits(
    partition: PartitionRecord, all_nodes: Sequence[NodeRecord] = ()
) -> PartitionLimits:
    r = partition.raw
    over = r.get("OverSubscribe", r.get("Shared", "")).upper()
    max_nodes = _limit(r.get("MaxNodes"))
    return PartitionLimits(
        name=partition.name,
        nodes=partition_nodes(partition, all_nodes),
        default=partition.default,
        max_time=_limit(partition.max_time),
        default_time=_limit(r.get("DefaultTime")),
        max_nodes=int(max_nodes) if max_nodes and max_nodes.isdigit() else None,
        exclusive=over.startswith("EXCLUSIVE"),
        qos=_limit(r.get("QoS")),
        allow_qos=_names(r.get("AllowQos")),
        allow_accounts=_names(r.get("AllowAccounts")),
        state=partition.state,
    )
