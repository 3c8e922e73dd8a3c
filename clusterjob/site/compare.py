"""The differences between two site files on what Slurm sees (``site init --diff``).

Models are matched by what selects them in Slurm, not by their names: the GRES type, else
the node feature (constraint), else the name. Each difference is one ``Difference`` naming
the field and both values, so a site written by hand can be checked against the one
``site init`` reads from the cluster (and two site files against each other). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterjob.site.model import GpuModel, Site
from clusterjob.slurm.syntax import time_seconds

ModelKey = tuple[str, str]


@dataclass(frozen=True)
class Difference:
    field: str  # "model", "model.name", "partition.time_limit", "qos.max_nodes", ...
    what: str  # the thing that differs: a model, partition or QoS, or "" for the site
    a: str | None  # its value in the first site (None: absent there)
    b: str | None

    def __str__(self) -> str:
        return self.said("the first", "the second")

    def said(self, first: str, second: str) -> str:
        """One line naming the two sides: ``partition gpu: only in site.yaml (gpu[1-2])``."""
        where = f"{self.field} {self.what}".strip() if self.what else self.field
        if self.a is None:
            return f"{where}: only in {second} ({self.b})"
        if self.b is None:
            return f"{where}: only in {first} ({self.a})"
        return f"{where}: {self.a} in {first}, {self.b} in {second}"

    def to_dict(self) -> dict[str, str | None]:
        return {"field": self.field, "what": self.what, "a": self.a, "b": self.b}


def model_key(model: GpuModel) -> ModelKey:
    if model.gres_type:
        return ("GRES type", model.gres_type.casefold())
    if model.constraint:
        return ("feature", model.constraint)
    return ("name", model.name.casefold())


def _label(key: ModelKey) -> str:
    return f"{key[0]} {key[1]}"


def _time(text: str | None) -> str:
    if text is None:
        return "UNLIMITED"
    try:
        seconds = time_seconds(text)
    except ValueError:
        return text
    if seconds is None:
        return "UNLIMITED"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{days}-" if days else "") + f"{hours:02d}:{minutes:02d}:{secs:02d}"


def _text(value: object) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"  # as the site file writes it
    return None if value is None else str(value)


def partition_models(site: Site, partition: str) -> tuple[str, ...]:
    """The models (as their keys' labels) some node of the partition holds."""
    found = site.partition(partition)
    if found is None:
        return ()
    names = {m for node in found.node_names for m in site.gres_models(node)}
    keys = {_label(model_key(m)) for m in site.models if m.name in names}
    return tuple(sorted(keys))


def compare_sites(a: Site, b: Site) -> list[Difference]:
    """Every difference between ``a`` and ``b`` on syntax, models, partitions and QoS."""
    out: list[Difference] = []

    def differ(field: str, what: str, x: object, y: object) -> None:
        if x != y:
            out.append(Difference(field, what, _text(x), _text(y)))

    differ("syntax", "", a.gpu_syntax.name, b.gpu_syntax.name)
    differ("type_required", "", a.type_required, b.type_required)
    differ("account", "", a.account, b.account)

    models_a = {model_key(m): m for m in a.models}
    models_b = {model_key(m): m for m in b.models}
    for key in [*models_a, *(k for k in models_b if k not in models_a)]:
        ma, mb = models_a.get(key), models_b.get(key)
        label = _label(key)
        if ma is None or mb is None:
            out.append(Difference("model", label, ma.name if ma else None, mb.name if mb else None))
            continue
        differ("model.name", label, ma.name, mb.name)
        if ma.memory_gb and mb.memory_gb:
            differ("model.memory_gb", label, ma.memory_gb, mb.memory_gb)
        if key[0] != "feature":
            differ("model.constraint", label, ma.constraint, mb.constraint)

    parts_a = {p.name: p for p in a.partitions}
    parts_b = {p.name: p for p in b.partitions}
    for name in [*parts_a, *(n for n in parts_b if n not in parts_a)]:
        pa, pb = parts_a.get(name), parts_b.get(name)
        if pa is None or pb is None:
            out.append(
                Difference("partition", name, pa.nodes if pa else None, pb.nodes if pb else None)
            )
            continue
        differ("partition.time_limit", name, _time(pa.time_limit), _time(pb.time_limit))
        differ("partition.default", name, pa.default, pb.default)
        differ("partition.submit_as", name, pa.submit_as, pb.submit_as)
        differ("partition.max_nodes", name, pa.max_nodes, pb.max_nodes)
        differ("partition.gpus_per_node", name, pa.gpus_per_node, pb.gpus_per_node)
        differ("partition.max_gpus_per_job", name, pa.max_gpus_per_job, pb.max_gpus_per_job)
        ma_, mb_ = partition_models(a, name), partition_models(b, name)
        differ("partition.models", name, ", ".join(ma_) or "none", ", ".join(mb_) or "none")

    qos_a = {q.name: q for q in a.qos}
    qos_b = {q.name: q for q in b.qos}
    for name in [*qos_a, *(n for n in qos_b if n not in qos_a)]:
        qa, qb = qos_a.get(name), qos_b.get(name)
        if qa is None or qb is None:
            out.append(Difference("qos", name, "listed" if qa else None, "listed" if qb else None))
            continue
        differ("qos.max_time", name, _time(qa.max_time), _time(qb.max_time))
        differ("qos.max_gpus_per_job", name, qa.max_gpus_per_job, qb.max_gpus_per_job)
        differ("qos.max_nodes", name, qa.max_nodes, qb.max_nodes)
    return out
