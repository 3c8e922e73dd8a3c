"""A local cluster shaped like a site file: `clusterjob sandbox up --like SITE`.

A site admin tries a new site file before deploying it, and the tests run each shipped
site's jobs on a cluster of its shape. From the site file: one node per distinct GPU
configuration of its node map (and one more for a partition that would have none), with
the site's node names, GPU models at the node map's bus ids (the stand-in NVML reports them
as the map says), GRES names and types, the node features the models' constraints name,
partitions with their time limits, the accounts and QoS its defaults and `qos:` name, and
the CPUs and memory its defaults ask of a node. The shape is kept in the state dir
(``shape.json``) with the site file as given, so `up`, `down` and `status` read the same
cluster whatever becomes of the file since.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from clusterjob.errors import UsageError, did_you_mean
from clusterjob.sandbox.config import (
    ACCOUNT,
    CLUSTER_NAME,
    DEFAULT_SHAPE,
    MAX_NODES,
    ClusterShape,
    Layout,
    PartitionShape,
    SandboxGpu,
    SandboxNode,
)
from clusterjob.site.model import JobDefaults, QosLimits, Site
from clusterjob.site.nodemodel import NodeGpu

SHAPE_FILE = "shape.json"
LIKE_SITE = "like-site.yaml"  # the site file as given; site.yaml is it pointed at this cluster
GIB = 1024**3
_FEATURE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")


def shape_of(layout: Layout) -> ClusterShape:
    """The shape of the sandbox in ``layout``: its own, or the one `up --like` recorded."""
    path = layout.state_dir / SHAPE_FILE
    if not path.is_file():
        return DEFAULT_SHAPE
    return _from_json(json.loads(path.read_text()))


def record(layout: Layout, shape: ClusterShape, site_text: str) -> None:
    """Keep ``shape`` and the site file it came from in the state dir."""
    (layout.state_dir / LIKE_SITE).write_text(site_text)
    (layout.state_dir / SHAPE_FILE).write_text(json.dumps(asdict(shape), indent=1) + "\n")


def like(site: Site, more: Sequence[str] = ()) -> ClusterShape:
    """The local cluster shaped like ``site`` (see the module's docstring); ``more``: more of
    the site's own nodes to run beside one per configuration (a job of several nodes needs
    that many of one configuration)."""
    names = _pick_nodes(site, more)
    nodes = tuple(_node(site, name) for name in names)
    partitions = []
    for part in site.partitions:
        members = [n for n in names if n in part.node_names]
        if part.submit_as == "qos" or not members:
            continue
        limit = part.time_limit or "2-00:00:00"
        # a plain list: Slurm reads no multi-dimensional ranges (r[6,13]i0n0)
        whole = part.gpus_per_node is not None  # whole nodes: all their GPUs with them
        partitions.append(
            PartitionShape(part.name, ",".join(members), part.default, limit, exclusive=whole)
        )
    if not partitions:  # a site that names QoS, not partitions: jobs go to the default one
        partitions.append(PartitionShape("all", ",".join(names), True))
    if not any(p.default for p in partitions):
        partitions[0] = replace(partitions[0], default=True)
    models = {m.name: m for m in site.models}
    features = {
        node.name: tuple(
            dict.fromkeys(
                [
                    *(
                        f
                        for gpu in node.mapped
                        for f in _FEATURE.findall(models[gpu.model].constraint or "")
                    ),
                    *site.node_map.features.get(node.name, ()),
                ]
            )
        )
        for node in nodes
    }
    return ClusterShape(
        nodes=nodes,
        partitions=tuple(partitions),
        gres_types=tuple(dict.fromkeys(m.gres_type for m in site.models if m.gres_type)),
        nvml={
            m.name: (m.nvml_names[0], (m.memory_gb or 80) * GIB)
            for m in site.models
            if m.nvml_names and m.vendor == "nvidia"
        },
        features={n: f for n, f in features.items() if f},
        type_required=site.type_required,
        routed=tuple(p.name for p in partitions if _submit_as(site, p.name) == "none"),
        accounts=_accounts(site),
        qos=_qos(site),
        like=str(site.source),
        cluster_name=(site.cluster_name or site.name).lower(),
    )


def node_names(hosts: str) -> list[str]:
    """The names of `up --nodes HOSTLIST` (``gpu[01-04],big1``)."""
    import hostlist

    try:
        return list(hostlist.expand_hostlist(hosts))
    except hostlist.BadHostlist as e:
        raise UsageError(f"--nodes {hosts}: not a host list ({e})") from None


def _submit_as(site: Site, name: str) -> str | None:
    part = site.partition(name)
    return part.submit_as if part else None


def _pick_nodes(site: Site, wanted: Sequence[str] = ()) -> list[str]:
    """One node per distinct GPU configuration of the node map, then one for each partition
    none of those is in, then the ``wanted`` ones (the site's own names); refused beyond
    ``MAX_NODES``."""
    seen: set[tuple[object, ...]] = set()
    names: list[str] = []
    for name, gpus in site.node_map.nodes.items():
        config = tuple((g.model, g.bus_id, g.mig) for g in gpus)
        if config not in seen:
            seen.add(config)
            names.append(name)
    for part in site.partitions:
        if part.submit_as == "qos" or not part.node_names:
            continue
        if not any(n in part.node_names for n in names):
            mapped = [n for n in part.node_names if n in site.node_map]
            names.append((mapped or list(part.node_names))[0])
    known = dict.fromkeys(
        [*site.node_map.nodes, *(n for p in site.partitions for n in p.node_names)]
    )
    for name in wanted:
        if name not in known:
            raise UsageError(
                f"--nodes: {name} is not a node of {site.name}{did_you_mean(name, list(known))}"
            )
        if name not in names:
            names.append(name)
    if len(names) > MAX_NODES:
        raise UsageError(
            f"--like {site.name}: {len(names)} nodes (node configurations, partitions and "
            f"--nodes); the local cluster runs at most {MAX_NODES}"
        )
    return names


def _node(site: Site, name: str) -> SandboxNode:
    gpus = site.node_map.gpus(name) or ()
    mapped = tuple(_gpu(g, mapped=True) for g in gpus)
    physical = tuple(_gpu(g, mapped=False) for g in gpus)
    parts = [p for p in site.partitions if name in p.node_names]
    defaults = [site.defaults, *(p.defaults for p in parts)]
    defaults += [m.defaults for m in site.models if any(g.model == m.name for g in gpus)]
    per_gpu = max(
        [1, *(d.cpus_per_gpu or 0 for d in defaults), *(d.cpus_per_task or 0 for d in defaults)]
    )
    cpus = max(16, per_gpu * max(1, len(gpus)))
    memory = max(64000, cpus * 1024 + 1024, _mem_mb(defaults) * max(1, len(gpus)) + 1024)
    return SandboxNode(name, parts[0].name if parts else "", mapped, physical, cpus, memory)


def _gpu(gpu: NodeGpu, *, mapped: bool) -> SandboxGpu:
    """A node-map slot as the node map says it (its MIG slices ``profile@instance``) or as the
    stand-in NVML shows it (the profiles in order, instances 1, 2, ...); a slot without a bus
    id gets one."""
    bus = gpu.bus_id or f"0000:{0x10 + gpu.slot:02x}:00.0"
    profiles = gpu.mig or ()
    if mapped and profiles:  # GPU instances 1, 2, ... where the map gives none
        instances = gpu.mig_gi or tuple(range(1, len(profiles) + 1))
        slices = zip(profiles, instances, strict=True)
        return SandboxGpu(gpu.model, bus, tuple(f"{p}@{i}" for p, i in slices))
    return SandboxGpu(gpu.model, bus, tuple(profiles))


def _mem_mb(defaults: list[JobDefaults]) -> int:
    sizes = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    most = 0
    for d in defaults:
        m = re.fullmatch(r"(\d+)([KMGT]?)B?", (d.mem_per_gpu or "").upper())
        if m:
            most = max(most, int(int(m.group(1)) * sizes.get(m.group(2) or "M", 1)))
    return most


def _all_defaults(site: Site) -> list[JobDefaults]:
    return [
        site.defaults,
        *(p.defaults for p in site.partitions),
        *(m.defaults for m in site.models),
    ]


def _accounts(site: Site) -> tuple[str, ...]:
    """The sandbox's account and every account the site's defaults name (not a pattern)."""
    named = [d.account for d in _all_defaults(site) if d.account and "{" not in d.account]
    return tuple(dict.fromkeys([ACCOUNT, *named]))


def _qos(site: Site) -> tuple[QosLimits, ...]:
    """The site's QoS with their limits, and every other QoS it names (defaults, QoS by
    time, partitions submitted as a QoS), without limits."""
    out = {q.name: q for q in site.qos}
    names = [d.qos for d in _all_defaults(site) if d.qos]
    names += [r.qos for d in _all_defaults(site) for r in d.qos_by_time if r.qos]
    names += [p.name for p in site.partitions if p.submit_as == "qos"]
    for name in names:
        out.setdefault(name, QosLimits(name))
    return tuple(out.values())


def site_text(layout: Layout, node_command: str, prolog_log: str) -> str:
    """The recorded site file, pointed at this cluster: its jobs run the sandbox's
    node_command, its Prolog logs in the state dir."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    data = yaml.load((layout.state_dir / LIKE_SITE).read_text())
    data["node_command"] = node_command
    if data.get("templates_dir") and not Path(str(data["templates_dir"])).is_absolute():
        raise UsageError(
            "--like: the site's templates_dir is relative to its file; give it absolute"
        )
    prolog = data.get("prolog")
    if prolog is None:
        data["prolog"] = {"log": prolog_log}
    else:
        prolog["log"] = prolog_log
    out = io.StringIO()
    out.write(f"# {_HEAD}\n")
    yaml.dump(data, out)
    return out.getvalue()


_HEAD = "Written by `clusterjob sandbox up --like`: the site file, pointed at the local cluster."


def _from_json(data: dict[str, object]) -> ClusterShape:
    def gpus(items: object) -> tuple[SandboxGpu, ...]:
        return tuple(SandboxGpu(g["model"], g["bus_id"], tuple(g["mig"])) for g in items)  # type: ignore[attr-defined]

    nodes = tuple(
        SandboxNode(
            n["name"],
            n["partition"],
            gpus(n["mapped"]),
            gpus(n["physical"]),
            n["cpus"],
            n["memory_mb"],
        )  # fmt: skip
        for n in data["nodes"]  # type: ignore[attr-defined]
    )
    return ClusterShape(
        nodes=nodes,
        partitions=tuple(PartitionShape(**p) for p in data["partitions"]),  # type: ignore[attr-defined]
        gres_types=tuple(data["gres_types"]),  # type: ignore[arg-type]
        nvml={k: (v[0], v[1]) for k, v in data["nvml"].items()},  # type: ignore[attr-defined]
        features={k: tuple(v) for k, v in data["features"].items()},  # type: ignore[attr-defined]
        type_required=bool(data["type_required"]),
        routed=tuple(data.get("routed", ())),  # type: ignore[arg-type]
        accounts=tuple(data["accounts"]),  # type: ignore[arg-type]
        qos=tuple(
            QosLimits(
                q["name"],
                q["max_time"],
                q["max_gpus_per_job"],
                q["max_nodes"],
                tuple(q["partitions"]),
            )
            for q in data["qos"]  # type: ignore[attr-defined]
        ),  # fmt: skip
        like=data["like"],  # type: ignore[arg-type]
        cluster_name=str(data.get("cluster_name", CLUSTER_NAME)),
    )
