"""``clusterjob site init``: a site file written from the live cluster, for a researcher whose
cluster has none.

Slurm is asked at most four times (``scontrol show node``, ``scontrol show partition``,
``scontrol show config``, and ``sacctmgr show qos`` where accounting runs: ``read_cluster``);
the rest is pure (``plan_site`` turns the records into a ``SitePlan``, ``render`` writes it as
commented YAML) and is tested on recorded output. What Slurm does not say is guessed, and the
file says so beside each guess:

- models from the GPU GRES types (and, for untyped GPUs, from node features that name a GPU),
  named from a table of known models (``clusterjob.site.modelnames``), else after the type;
- the node map holds models and counts per node layout, no PCI bus IDs (the preflight then
  checks model and count, and is set to ``warn``: a guessed name must not end jobs);
- the request syntax is ``gres`` (``--gres=gpu:TYPE:N``), ``gres+constraint`` where GPUs are
  untyped and told apart by features; ``probe_syntax`` checks candidates with
  ``sbatch --test-only`` (no job is created) when asked.
"""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import hostlist

from clusterjob.errors import ConfigError, ConfigIssue, SlurmError, UsageError
from clusterjob.site.compare import Difference
from clusterjob.site.loader import validate_site_file
from clusterjob.site.model import Site, mig_profile_size
from clusterjob.site.modelnames import (
    KNOWN,
    KnownModel,
    autodetected_nvml_name,
    guess_mig,
    known_model,
    mig_profile,
)
from clusterjob.site.nodeprobe import (
    ProbedGpu,
    ProbeJobs,
    ProbeOutcome,
    node_configurations,
    run_probe_jobs,
)
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.describe import (
    GpuLayout,
    QosRecord,
    accounting_runs,
    enforced,
    gpu_layouts,
    partition_limits,
    slurm_version,
)
from clusterjob.slurm.parse import NodeRecord, PartitionRecord, sbatch_error_message

MIG_COMPUTE = 7
UNKNOWN_NVML = "unknown"  # placeholder NVML name of a GPU no table entry names


@dataclass(frozen=True)
class ClusterFacts:
    """What Slurm said: the records ``plan_site`` reads, and how many calls it took."""

    nodes: tuple[NodeRecord, ...]
    partitions: tuple[PartitionRecord, ...]
    config: dict[str, str]
    qos: tuple[QosRecord, ...] | None  # None: no accounting, sacctmgr not asked
    calls: int = 0


def read_cluster(client: SlurmClient | None = None) -> ClusterFacts:
    """The live cluster in at most four Slurm calls (three without accounting)."""
    client = client or SlurmClient()
    config = client.config()
    nodes = client.nodes()
    partitions = client.partitions()
    qos: list[QosRecord] | None = None
    if accounting_runs(config):
        qos = client.qos()
    return ClusterFacts(
        tuple(nodes), tuple(partitions), config, None if qos is None else tuple(qos),
        calls=3 if qos is None else 4,
    )  # fmt: skip


# --- the plan ----------------------------------------------------------------------------------


@dataclass
class ModelPlan:
    name: str
    gres_type: str | None
    nvml_names: list[str]
    memory_gb: int | None
    vendor: str = "nvidia"
    constraint: str | None = None
    aliases: list[str] = field(default_factory=list)
    note: str = ""
    overlap: bool = False
    family: str | None = None
    specific: bool = True  # its name says the memory size (owns its NVML names first)
    parent: str | None = None  # a MIG slice's: the model of the GPU it is cut from
    profile: str | None = None  # a MIG slice's profile, e.g. "3g.40gb"


@dataclass(frozen=True)
class SlotPlan:
    model: str
    mig: tuple[str, ...] | None = None
    bus_id: str | None = None  # read by a probe job (``site init --probe``)


@dataclass(frozen=True)
class NodeEntryPlan:
    nodes: str
    slots: tuple[SlotPlan, ...]
    note: str


@dataclass(frozen=True)
class PartitionPlan:
    name: str
    nodes: str
    time_limit: str | None
    default: bool
    max_nodes: int | None
    gpus_per_node: int | None
    note: str


@dataclass(frozen=True)
class QosPlan:
    name: str
    max_time: str | None
    max_gpus_per_job: int | None
    max_nodes: int | None
    partitions: tuple[str, ...]
    note: str


@dataclass
class SitePlan:
    site: str
    cluster_name: str | None
    syntax: str
    type_required: bool
    models: list[ModelPlan]
    node_map: list[NodeEntryPlan]
    partitions: list[PartitionPlan]
    account: str
    qos: list[QosPlan]
    header: list[str] = field(default_factory=list)
    syntax_note: str = ""
    account_note: str = ""
    left_out: list[str] = field(default_factory=list)
    not_probed: list[str] = field(default_factory=list)  # "NODES: why", after probe jobs


def _kind_of(gpu_type: str | None, layout: GpuLayout) -> tuple[str, str]:
    """How a layout's GPUs of one type are told apart: ("type", T), ("feature", F) for an
    untyped GPU on nodes with a feature that names a GPU, ("untyped", features)."""
    if gpu_type is not None:
        return "type", gpu_type
    named = [f for f in layout.features if known_model(f) is not None]
    if named:
        return "feature", named[0]
    return "untyped", "&".join(layout.features)


def _from_known(known: KnownModel, how: str) -> ModelPlan:
    return ModelPlan(
        name=known.name,
        gres_type=None,
        nvml_names=list(known.nvml_names),
        memory_gb=known.memory_gb,
        vendor=known.vendor,
        note=how,
        family=known.family,
        specific=known.memory_gb is not None and known.name != known.family,
    )


def _typed_model(gpu_type: str) -> ModelPlan:
    known = known_model(gpu_type)
    detected = autodetected_nvml_name(gpu_type)
    if known is None:
        return ModelPlan(
            name=gpu_type,
            gres_type=gpu_type,
            nvml_names=[detected or UNKNOWN_NVML],
            memory_gb=None,
            note=f"GUESS: GRES type {gpu_type!r} is no model clusterjob knows; named after it"
            + ("" if detected else "; its NVML name is unknown (the preflight warns)"),
            specific=detected is not None,
        )
    plan = _from_known(known, f"from GRES type {gpu_type!r}: {known.name} (a known model)")
    plan.gres_type = gpu_type
    if detected:
        plan.nvml_names = [detected] + [
            n for n in plan.nvml_names if n.casefold() != detected.casefold()
        ]
        plan.specific = True
        plan.note = f"from GRES type {gpu_type!r}, Slurm's NVML autodetection of {detected!r}"
    if known.vendor != "nvidia":
        plan.nvml_names = []
    return plan


def _feature_model(feature: str) -> ModelPlan:
    known = known_model(feature)
    assert known is not None
    plan = _from_known(known, f"from node feature {feature!r} (untyped GPU GRES)")
    plan.constraint = feature
    if known.vendor != "nvidia":
        plan.nvml_names = []
    return plan


def _untyped_model(features: str, several: bool) -> ModelPlan:
    name = "GPU" + (f"-{features.replace('&', '-')}" if several and features else "")
    return ModelPlan(
        name=name,
        gres_type=None,
        nvml_names=[UNKNOWN_NVML],
        memory_gb=None,
        constraint=features if several and features else None,
        note="GUESS: untyped GPU GRES and no node feature naming a GPU; the model is unknown "
        "(the preflight warns)",
        specific=False,
    )


def _unique_name(name: str, taken: set[str], fallback: str) -> str:
    if name.casefold() not in taken:
        return name
    if fallback.casefold() not in taken:
        return fallback
    i = 2
    while f"{fallback}-{i}".casefold() in taken:
        i += 1
    return f"{fallback}-{i}"


def _pack_slices(profiles: Sequence[str], memory_gb: int | None) -> list[list[str]]:
    """MIG slices onto as few GPUs as they fit (7 compute slices, the GPU's memory), largest
    first; Slurm's GRES says how many slices of each profile, not which GPU holds them."""
    gpus: list[list[str]] = []
    used: list[tuple[int, int]] = []
    for profile in sorted(profiles, key=lambda p: mig_profile_size(p), reverse=True):
        compute, memory = mig_profile_size(profile)
        for i, (c, m) in enumerate(used):
            if c + compute <= MIG_COMPUTE and (memory_gb is None or m + memory <= memory_gb):
                gpus[i].append(profile)
                used[i] = (c + compute, m + memory)
                break
        else:
            gpus.append([profile])
            used.append((compute, memory))
    return gpus


def _models(layouts: Sequence[GpuLayout]) -> tuple[list[ModelPlan], dict[tuple[str, str], str]]:
    """Every model, and (kind, key) -> its model's name."""
    models: list[ModelPlan] = []
    by_kind: dict[tuple[str, str], str] = {}
    taken: set[str] = set()
    all_types = [t for layout in layouts for t, _ in layout.gpus if t is not None]
    untyped = {
        _kind_of(t, layout)
        for layout in layouts
        for t, _ in layout.gpus
        if _kind_of(t, layout)[0] == "untyped"
    }

    def add(kind: tuple[str, str], plan: ModelPlan) -> ModelPlan:
        plan.name = _unique_name(plan.name, taken, plan.gres_type or plan.constraint or plan.name)
        taken.add(plan.name.casefold())
        models.append(plan)
        by_kind[kind] = plan.name
        return plan

    slices: list[tuple[str, GpuLayout]] = []
    for layout in layouts:
        for gpu_type, _count in layout.gpus:
            kind = _kind_of(gpu_type, layout)
            if kind in by_kind:
                continue
            if kind[0] == "type" and mig_profile(kind[1]):
                if all(s[0] != kind[1] for s in slices):
                    slices.append((kind[1], layout))
                continue
            if kind[0] == "type":
                add(kind, _typed_model(kind[1]))
            elif kind[0] == "feature":
                add(kind, _feature_model(kind[1]))
            else:
                add(kind, _untyped_model(kind[1], len(untyped) > 1))
    for gpu_type, layout in slices:
        nearby = [t for t, _ in layout.gpus if t and t != gpu_type] + all_types
        guess = guess_mig(gpu_type, nearby)
        assert guess is not None
        parent = _parent_model(guess.parent, models, add)
        profile_gb = mig_profile_size(guess.profile)[1]
        how = f"MIG slice {guess.profile} of {parent.name}, from GRES type {gpu_type!r}"
        if not guess.certain:
            how = f"GUESS: {how}; the profile is also one of {', '.join(guess.others)}"
        plan = ModelPlan(
            name=f"{parent.name}-{guess.profile}",
            gres_type=gpu_type,
            nvml_names=[f"{n} MIG {guess.profile}" for n in parent.nvml_names] or [UNKNOWN_NVML],
            memory_gb=profile_gb,
            note=how,
            family=None,
            parent=parent.name,
            profile=guess.profile,
        )
        add(("type", gpu_type), plan)
    _own_nvml_names(models)
    _aliases(models)
    _overlaps(models)
    return models, by_kind


def _parent_model(
    name: str, models: list[ModelPlan], add: Callable[[tuple[str, str], ModelPlan], ModelPlan]
) -> ModelPlan:
    """The model MIG slices are cut from: a whole-GPU model of the cluster of that family and
    size, else one added (with no GRES type of its own)."""
    known = KNOWN[name]
    for m in models:
        if m.family == known.family and m.memory_gb in (None, known.memory_gb):
            return m
    plan = _from_known(known, f"the GPU MIG slices are cut from ({known.name}); no GRES of its own")
    return add(("parent", known.name), plan)


def _own_nvml_names(models: list[ModelPlan]) -> None:
    """Each NVML name to one model: the one whose name says its size first."""
    owned: set[str] = set()
    for m in sorted(models, key=lambda m: not m.specific):
        mine = [n for n in m.nvml_names if n == UNKNOWN_NVML or n.casefold() not in owned]
        owned.update(n.casefold() for n in mine if n != UNKNOWN_NVML)
        if m.nvml_names and not mine:
            mine = [UNKNOWN_NVML]
            m.note += "; its NVML names belong to another model here (the preflight warns)"
        m.nvml_names = mine
    for m in models:  # one placeholder per site: the loader refuses a name listed twice
        if m.nvml_names == [UNKNOWN_NVML]:
            m.nvml_names = [f"{UNKNOWN_NVML} ({m.name})"]


def _aliases(models: list[ModelPlan]) -> None:
    """Each model's GRES type, feature and family as aliases, where no other model claims
    them (names and aliases are case-insensitive and name one model each)."""
    wanted = {
        m.name: [a for a in (m.family, m.gres_type, m.constraint) if a and "&" not in a]
        for m in models
    }
    names = {m.name.casefold() for m in models}
    counts: dict[str, int] = {}
    for aliases in wanted.values():
        for a in {a.casefold() for a in aliases}:
            counts[a] = counts.get(a, 0) + 1
    for m in models:
        seen: set[str] = {m.name.casefold()}
        for a in wanted[m.name]:
            key = a.casefold()
            if key in seen or key in names or counts[key] > 1:
                continue
            seen.add(key)
            m.aliases.append(a)


def _overlaps(models: list[ModelPlan]) -> None:
    """Slurm matches GRES types by substring: say where one type selects another's GPUs."""
    typed = [m for m in models if m.gres_type]
    for m in typed:
        assert m.gres_type is not None
        wider = [
            o.name
            for o in typed
            if o is not m
            and o.gres_type
            and m.gres_type.casefold() in o.gres_type.casefold()
            and m.gres_type.casefold() != o.gres_type.casefold()
        ]
        if wider:
            m.overlap = True
            m.note += (
                f"; Slurm matches GRES types by substring: asking for {m.gres_type!r} can also "
                f"select {', '.join(wider)}"
            )


def _node_map(
    layouts: Sequence[GpuLayout], by_kind: dict[tuple[str, str], str], models: list[ModelPlan]
) -> list[NodeEntryPlan]:
    by_name = {m.name: m for m in models}
    entries = []
    for layout in layouts:
        slots: list[SlotPlan] = []
        slices: dict[str, list[str]] = {}  # parent -> profiles
        said = []
        for gpu_type, count in layout.gpus:
            model = by_name[by_kind[_kind_of(gpu_type, layout)]]
            said.append(f"gpu:{gpu_type}:{count}" if gpu_type else f"gpu:{count}")
            if model.parent is not None and model.profile is not None:
                slices.setdefault(model.parent, []).extend([model.profile] * count)
            else:
                slots += [SlotPlan(model.name)] * count
        for parent, profiles in slices.items():
            memory = by_name[parent].memory_gb if parent in by_name else None
            slots += [SlotPlan(parent, tuple(g)) for g in _pack_slices(profiles, memory)]
        note = f"Slurm: Gres={','.join(said)}"
        if layout.features:
            note += f", features {','.join(layout.features)}"
        if slices:
            note += "; GUESS: which GPU holds which MIG slice"
        entries.append(NodeEntryPlan(layout.hostlist, tuple(slots), note))
    return entries


def _partitions(
    facts: ClusterFacts, layouts: Sequence[GpuLayout], by_kind: dict[tuple[str, str], str]
) -> tuple[list[PartitionPlan], list[str]]:
    node_layout = {n: layout for layout in layouts for n in layout.nodes}
    out: list[PartitionPlan] = []
    left: list[str] = []
    for record in facts.partitions:
        limits = partition_limits(record, facts.nodes)
        gpu_nodes = [n for n in limits.nodes if n in node_layout]
        if not gpu_nodes:
            left.append(limits.name)
            continue
        models: dict[str, list[str]] = {}
        for n in gpu_nodes:
            layout = node_layout[n]
            for t, _ in layout.gpus:
                models.setdefault(by_kind[_kind_of(t, layout)], []).append(n)
        where = "; ".join(f"{m} on {hostlist.collect_hostlist(ns)}" for m, ns in models.items())
        counts = {node_layout[n].count for n in gpu_nodes}
        whole = limits.exclusive and len(counts) == 1
        said = [f"MaxTime={record.max_time or 'UNLIMITED'}"]
        if limits.default_time:
            said.append(f"DefaultTime={limits.default_time}")
        if limits.qos:
            said.append(f"QoS={limits.qos}")
        if limits.allow_qos:
            said.append(f"AllowQos={','.join(limits.allow_qos)}")
        if limits.allow_accounts:
            said.append(f"AllowAccounts={','.join(limits.allow_accounts)}")
        if limits.exclusive:
            said.append("OverSubscribe=EXCLUSIVE (whole nodes)")
        if limits.state and limits.state.upper() != "UP":
            said.append(f"State={limits.state}")
        cpu_only = len(limits.nodes) - len(gpu_nodes)
        if cpu_only:
            said.append(f"{cpu_only} nodes without GPUs left out")
        out.append(
            PartitionPlan(
                name=limits.name,
                nodes=str(hostlist.collect_hostlist(gpu_nodes)),
                time_limit=limits.max_time,
                default=limits.default,
                max_nodes=limits.max_nodes,
                gpus_per_node=counts.pop() if whole else None,
                note=f"Slurm: {' '.join(said)}. Models: {where}",
            )
        )
    return out, left


def _qos(
    records: Iterable[QosRecord], partitions: Sequence[PartitionPlan], facts: ClusterFacts
) -> tuple[list[QosPlan], list[str]]:
    names = {p.name for p in partitions}
    allowed: dict[str, list[str]] = {}
    for record in facts.partitions:
        limits = partition_limits(record)
        for allowed_qos in limits.allow_qos:
            if record.name in names:
                allowed.setdefault(allowed_qos, []).append(record.name)
    out: list[QosPlan] = []
    plain: list[str] = []
    for q in records:
        if not (q.max_wall or q.max_gpus_per_job or q.max_nodes):
            plain.append(q.name)
            continue
        said = []
        if q.max_tres:
            said.append("MaxTRES=" + ",".join(f"{k}={v}" for k, v in q.max_tres.items()))
        if q.max_tres_per_user:
            said.append("MaxTRESPU=" + ",".join(f"{k}={v}" for k, v in q.max_tres_per_user.items()))
        if q.max_jobs_per_user is not None:
            said.append(f"MaxJobsPU={q.max_jobs_per_user}")
        out.append(
            QosPlan(
                q.name,
                q.max_wall,
                q.max_gpus_per_job,
                q.max_nodes,
                tuple(allowed.get(q.name, ())),
                "Slurm: " + (" ".join(said) or f"MaxWall={q.max_wall}"),
            )
        )
    return out, plain


def plan_site(facts: ClusterFacts, name: str | None = None) -> SitePlan:
    """The site file ``facts`` describe (pure)."""
    config = facts.config
    cluster = config.get("ClusterName") or None
    layouts = gpu_layouts(facts.nodes)
    models, by_kind = _models(layouts)
    node_map = _node_map(layouts, by_kind, models)
    partitions, cpu_partitions = _partitions(facts, layouts, by_kind)
    qos, plain_qos = _qos(facts.qos or (), partitions, facts)
    untyped_only = bool(models) and all(m.gres_type is None and m.constraint for m in models)
    syntax = "gres+constraint" if untyped_only else "gres"
    syntax_note = (
        "GUESS: untyped GPU GRES told apart by node features (--gres=gpu:N --constraint=F)"
        if untyped_only
        else "GUESS: --gres=gpu:TYPE:N, which every Slurm release takes; "
        "`clusterjob site init --probe` (or --probe-syntax) asks sbatch --test-only which "
        "forms this cluster takes"
    )
    if config.get("JobSubmitPlugins", "(null)") not in ("", "(null)"):
        syntax_note += (
            f"; JobSubmitPlugins={config['JobSubmitPlugins']}: a submit filter may require a "
            "GPU type (type_required: true) or other options"
        )
    words = enforced(config)
    account = "optional"
    account_note = (
        f"Slurm: AccountingStorageEnforce={config.get('AccountingStorageEnforce', 'none')}"
    )
    if "associations" in words:
        account = "required"
        account_note += (
            ": jobs run only under an account association; GUESS: you have no default "
            "account (`sacctmgr show user $USER` shows it; with one, say optional)"
        )
    nodes_with_gpus = sum(len(layout.nodes) for layout in layouts)
    version = slurm_version(config)
    header = [
        f"Written by `clusterjob site init` from the live cluster {cluster or '(no ClusterName)'}"
        + (f" (Slurm {version})" if version else "")
        + f" on {datetime.now(timezone.utc).strftime('%Y-%m-%d')}.",
        f"{len(facts.nodes)} nodes, {nodes_with_gpus} with GPUs in {len(layouts)} layouts; "
        f"{len(partitions)} partitions with GPUs.",
        "Lines marked GUESS are what Slurm does not say; check them. The node map gives each "
        "node's models and counts, not PCI bus IDs: the preflight checks model and count, and "
        "warns instead of ending the job (preflight: warn).",
    ]
    left = []
    if cpu_partitions:
        left.append(f"partitions without GPU nodes: {', '.join(cpu_partitions)}")
    if plain_qos:
        left.append(f"QoS without job limits: {', '.join(plain_qos)}")
    if facts.qos is None:
        left.append("QoS: no accounting (AccountingStorageType), sacctmgr not asked")
    return SitePlan(
        site=name or cluster or "cluster",
        cluster_name=cluster,
        syntax=syntax,
        type_required=False,
        models=models,
        node_map=node_map,
        partitions=partitions,
        account=account,
        qos=qos,
        header=header,
        syntax_note=syntax_note,
        account_note=account_note,
        left_out=left,
    )


# --- YAML --------------------------------------------------------------------------------------


def _q(text: str) -> str:
    """A YAML scalar in double quotes (JSON's escapes are YAML's)."""
    return json.dumps(text, ensure_ascii=False)


def _comment(text: str, indent: str, width: int = 100) -> list[str]:
    """``text`` as comment lines of at most ``width`` characters (a long word stays whole)."""
    lines = textwrap.wrap(text, width - len(indent) - 2, break_long_words=False,
                          break_on_hyphens=False)  # fmt: skip
    return [f"{indent}# {line}" for line in lines]


def render(plan: SitePlan) -> str:
    """The plan as a commented site file that the loader takes."""
    out = [line for paragraph in plan.header for line in _comment(paragraph, "")]
    out.append(f"site: {_q(plan.site)}")
    if plan.cluster_name:
        out.append(f"cluster_name: {_q(plan.cluster_name)}")
    if any(slot.bus_id for entry in plan.node_map for slot in entry.slots):
        out.append("preflight: warn   # bus IDs read by probe jobs; checked? then required")
    else:
        out.append("preflight: warn   # the node map below is read from Slurm, not from the GPUs")
    out += _comment(plan.account_note, "")
    out.append(f"account: {plan.account}")
    out.append("gpu_request:")
    out += _comment(plan.syntax_note, "  ")
    out.append(f"  syntax: {plan.syntax}")
    out.append(f"  type_required: {'true' if plan.type_required else 'false'}")
    out.append("models:")
    if not plan.models:
        out[-1] = "models: {}   # Slurm lists no GPU GRES on any node"
    for m in plan.models:
        out += _comment(m.note, "  ")
        out.append(f"  {_q(m.name)}:")
        if m.aliases:
            out.append(f"    aliases: [{', '.join(_q(a) for a in m.aliases)}]")
        out.append(f"    gres_type: {_q(m.gres_type) if m.gres_type else 'null'}")
        if m.vendor != "nvidia":
            out.append(f"    vendor: {m.vendor}")
        else:
            out.append(f"    nvml_names: [{', '.join(_q(n) for n in m.nvml_names)}]")
        if m.memory_gb:
            out.append(f"    memory_gb: {m.memory_gb}")
        if m.constraint:
            out.append(f"    constraint: {_q(m.constraint)}")
        if m.overlap:
            out.append("    gres_type_overlap: true")
    out.append("partitions:")
    if not plan.partitions:
        out[-1] = "partitions: {}   # no partition holds a GPU node"
    for p in plan.partitions:
        out += _comment(p.note, "  ")
        out.append(f"  {_q(p.name)}:")
        out.append(f"    nodes: {_q(p.nodes)}")
        if p.time_limit:
            out.append(f"    time_limit: {_q(p.time_limit)}")
        if p.default:
            out.append("    default: true")
        if p.max_nodes:
            out.append(f"    max_nodes: {p.max_nodes}")
        if p.gpus_per_node:
            out.append(f"    gpus_per_node: {p.gpus_per_node}")
    if plan.qos:
        out.append("qos:")
        for q in plan.qos:
            out += _comment(q.note, "  ")
            out.append(f"  {_q(q.name)}:")
            if q.max_time:
                out.append(f"    max_time: {_q(q.max_time)}")
            if q.max_gpus_per_job:
                out.append(f"    max_gpus_per_job: {q.max_gpus_per_job}")
            if q.max_nodes:
                out.append(f"    max_nodes: {q.max_nodes}")
            if q.partitions:
                out.append(f"    partitions: [{', '.join(_q(n) for n in q.partitions)}]")
    out.append("node_map:")
    if not plan.node_map:
        out[-1] = "node_map: []"
    for entry in plan.node_map:
        out += _comment(entry.note, "  ")
        out.append(f"  - nodes: {_q(entry.nodes)}")
        out.append("    gpus:")
        for slot in entry.slots:
            mig = f", mig: [{', '.join(slot.mig)}]" if slot.mig else ""
            bus = f", bus_id: {_q(slot.bus_id)}" if slot.bus_id else ""
            out.append(f"      - {{model: {_q(slot.model)}{bus}{mig}}}")
    for line in plan.left_out:
        out.append(f"# Left out: {line}")
    for line in plan.not_probed:
        out += _comment(f"Not probed (no bus IDs): {line}", "")
    return "\n".join(out) + "\n"


# --- the whole command ---------------------------------------------------------------------------


@dataclass(frozen=True)
class InitResult:
    text: str
    site: Site | None
    issues: tuple[ConfigIssue, ...]
    facts: ClusterFacts
    plan: SitePlan
    probes: tuple[ProbeOutcome, ...] = ()  # one per node configuration, with probe jobs


def init_record(result: InitResult, differences: Sequence[Difference] = ()) -> dict[str, object]:
    """What ``site init --json`` prints: the site file's text, the Slurm calls it took and,
    with ``--diff``, each difference from the given site file."""
    return {
        "site": result.plan.site,
        "calls": result.facts.calls,
        "text": result.text,
        "differences": [d.to_dict() for d in differences],
        "probe_jobs": [
            {
                "nodes": o.config.hostlist,
                "node": o.node,
                "job_id": o.job_id,
                "bus_ids": [g.bus_id for g in o.gpus] if o.gpus is not None else None,
                "reason": o.reason or None,
            }
            for o in result.probes
        ],
        "not_probed": result.plan.not_probed,
    }


def validate_text(text: str, name: str = "site-init.yaml") -> tuple[Site | None, list[ConfigIssue]]:
    """The loader's verdict on ``text`` (through a private temporary file)."""
    with tempfile.TemporaryDirectory(prefix="clusterjob-init-") as tmp:
        path = Path(tmp) / name
        path.write_text(text, encoding="utf-8")
        site, issues = validate_site_file(path)
    return site, [i.replace(file=name) for i in issues]  # not the temporary directory


def describe(facts: ClusterFacts, name: str | None = None) -> InitResult:
    """``facts`` as a site file, validated by the loader (pure but for a temporary file)."""
    plan = plan_site(facts, name)
    text = render(plan)
    site, issues = validate_text(text)
    return InitResult(text, site, tuple(issues), facts, plan)


def init_site(
    client: SlurmClient | None = None,
    *,
    name: str | None = None,
    probe: bool = False,
    probe_jobs: ProbeJobs | None = None,
) -> InitResult:
    """Read the live cluster and describe it; with ``probe``, also ask ``sbatch --test-only``
    which GPU request forms it takes (no job is created); with ``probe_jobs``, run one tiny
    job per node configuration to read its GPUs' PCI bus order (``probe_nodes``)."""
    client = client or SlurmClient()
    facts = read_cluster(client)
    result = describe(facts, name)
    if not result.plan.models:
        cluster = facts.config.get("ClusterName") or "this cluster"
        raise UsageError(
            f"no node of {cluster} lists a GPU in its Gres (scontrol show node, "
            f"{len(facts.nodes)} nodes): a site file describes GPUs, so there is nothing to write"
        )
    if probe and result.site is not None:
        plan = probe_syntax(client, result.plan)
        text = render(plan)
        site, issues = validate_text(text)
        result = InitResult(text, site, tuple(issues), facts, plan)
    if probe_jobs is not None and result.site is not None:
        plan, outcomes = probe_nodes(client, facts, result.plan, probe_jobs)
        text = render(plan)
        site, issues = validate_text(text)
        result = InitResult(text, site, tuple(issues), facts, plan, tuple(outcomes))
    if result.site is None:  # the loader refuses what was written: say where, write nothing
        raise ConfigError(
            [i.replace(message=f"{i.message} (in the file site init wrote)") for i in result.issues]
            or [ConfigIssue("site-init.yaml", None, "", "the written file could not be read")]
        )
    return result


def write_site(path: Path, text: str, *, force: bool = False) -> None:
    """Write ``text`` to ``path`` (a temporary file renamed over it); an existing file only
    with ``force``."""
    path = Path(path)
    if path.exists() and not force:
        raise UsageError(f"{path} exists; give --force to replace it, or another --out")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


# --- probing with sbatch --test-only --------------------------------------------------------


def _candidates(model: ModelPlan, syntax: str) -> list[tuple[str, tuple[str, ...]]]:
    """(syntax, sbatch options) to try for one GPU of ``model``, the site's usual first; an
    untyped model is asked for as the plan's ``syntax`` says (its feature, if any, beside)."""
    gres_type = model.gres_type
    constraint = (f"--constraint={model.constraint}",) if model.constraint else ()
    if gres_type is None:
        return [(syntax, ("--gres=gpu:1", *constraint))]
    return [
        ("gres", (f"--gres=gpu:{gres_type}:1",)),
        ("gpus-per-node", (f"--gpus-per-node={gres_type}:1",)),
        ("gpus", (f"--gpus={gres_type}:1",)),
    ]


def probe_syntax(client: SlurmClient, plan: SitePlan) -> SitePlan:
    """The first candidate form sbatch --test-only accepts for a model of the default (or
    first) partition, and whether an untyped request is refused (type_required)."""
    if not plan.partitions or not plan.models:
        return plan
    partition = next((p for p in plan.partitions if p.default), plan.partitions[0])
    names = {s.model for e in plan.node_map for s in e.slots}
    members = set(hostlist.expand_hostlist(partition.nodes))
    here = [e for e in plan.node_map if members & set(hostlist.expand_hostlist(e.nodes))]
    model_names = [s.model for e in here for s in e.slots if s.model in names and not s.mig]
    model = next((m for m in plan.models if m.name in model_names), None)
    if model is None:
        return plan

    def accepted(options: Sequence[str]) -> tuple[bool, str]:
        """Whether sbatch --test-only takes a one-GPU job with ``options``; what it said."""
        lines = [*options, f"--partition={partition.name}", "--time=1"]
        script = "#!/bin/sh\n" + "".join(f"#SBATCH {o}\n" for o in lines) + "true\n"
        fd, path = tempfile.mkstemp(prefix="clusterjob-probe-", suffix=".sh")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(script)
            client.sbatch_test_only(path, workdir=tempfile.gettempdir(), script=script)
        except SlurmError as exc:
            return False, sbatch_error_message(exc.stderr or "") or "refused"
        finally:
            Path(path).unlink(missing_ok=True)
        return True, "accepted"

    tried = []
    chosen = None
    for syntax, options in _candidates(model, plan.syntax):
        ok, said = accepted(options)
        tried.append(f"{' '.join(options)}: {said}")
        if ok:
            chosen = syntax
            break
    type_required = False
    if chosen is not None and model.gres_type is not None:
        untyped = {"gres": "--gres=gpu:1", "gpus-per-node": "--gpus-per-node=1",
                   "gpus": "--gpus=1"}[chosen]  # fmt: skip
        ok, said = accepted((untyped,))
        tried.append(f"{untyped}: {said}")
        type_required = not ok
        if type_required and any(m.gres_type is None for m in plan.models):
            type_required = False  # an untyped model could not be asked for
    note = f"sbatch --test-only on partition {partition.name} (no job created): " + "; ".join(tried)
    if chosen is None:
        return replace(plan, syntax_note=plan.syntax_note + f"; probed, none accepted: {note}")
    return replace(plan, syntax=chosen, type_required=type_required, syntax_note=note)


# --- probe jobs: the PCI bus order of each node configuration ---------------------------------


def _placeholder(nvml_name: str) -> bool:
    return nvml_name.startswith(UNKNOWN_NVML)


def slots_from_probe(
    slots: Sequence[SlotPlan], gpus: Sequence[ProbedGpu], nvml_names: dict[str, list[str]]
) -> tuple[tuple[SlotPlan, ...] | None, dict[str, str], str]:
    """Slurm's slots of a node put in the probed PCI bus order, each with its bus ID:
    (slots, {model: the NVML name read for a model whose name was unknown}, why not)."""
    models = list(dict.fromkeys(s.model for s in slots))
    learned: dict[str, str] = {}
    found: list[str] = []
    for gpu in gpus:
        name = gpu.nvml_name.casefold()
        match = [m for m in models if name in (n.casefold() for n in nvml_names.get(m, ()))]
        if not match:
            match = [
                m for m in models
                if all(_placeholder(n) for n in nvml_names.get(m, ()))
                and learned.get(m, gpu.nvml_name) == gpu.nvml_name
            ]  # fmt: skip
            if len(match) != 1:
                return None, {}, f"NVML name {gpu.nvml_name!r} is no model of Slurm's Gres here"
            learned[match[0]] = gpu.nvml_name
        found.append(match[0])
    wanted = [s.model for s in slots]
    if sorted(found) != sorted(wanted):
        return (
            None,
            {},
            (
                f"NVML shows {len(found)} GPUs ({', '.join(found) or 'none'}), Slurm's Gres "
                f"{len(wanted)} ({', '.join(wanted)})"
            ),
        )
    left = list(slots)
    out = []
    for model, gpu in zip(found, gpus, strict=True):
        k = next(k for k, s in enumerate(left) if s.model == model)
        out.append(replace(left.pop(k), bus_id=gpu.bus_id))
    return tuple(out), learned, ""


def _unnamed_models(models: Sequence[ModelPlan]) -> dict[str, str]:
    """Each NVIDIA model Slurm names by no GRES type and whose NVML name is unknown, as
    {model: the model it was split from} (itself, so far; see ``_own_model``)."""
    return {
        m.name: m.name
        for m in models
        if m.gres_type is None
        and m.vendor == "nvidia"
        and m.nvml_names
        and all(_placeholder(n) for n in m.nvml_names)
    }


def _own_model(
    slots: Sequence[SlotPlan],
    gpus: Sequence[ProbedGpu],
    models: Sequence[ModelPlan],
    unnamed: dict[str, str],
) -> tuple[tuple[SlotPlan, ...], ModelPlan | None]:
    """Slurm's GRES tells some GPUs apart by no name (untyped, no feature naming a GPU: the
    A100 and H100 nodes of a site are one model to it), NVML does: a probe that reads another
    NVML name than the one the slots' model learned on other nodes puts the slots under a
    model of that name, an earlier one split from the same model or a new one (returned)."""
    held = {s.model for s in slots}
    read = {g.nvml_name.casefold(): g.nvml_name for g in gpus}
    if len(held) != 1 or len(read) != 1 or not held <= unnamed.keys():
        return tuple(slots), None
    (name,), (nvml_name,) = held, read.values()
    by_name = {m.name: m for m in models}
    if any(_placeholder(n) or n.casefold() in read for n in by_name[name].nvml_names):
        return tuple(slots), None  # it learns this name, or has learned it
    origin = unnamed[name]
    for m in models:
        if unnamed.get(m.name) == origin and any(n.casefold() in read for n in m.nvml_names):
            return tuple(replace(s, model=m.name) for s in slots), None
    taken = {m.name.casefold() for m in models}
    new = replace(
        by_name[origin],
        name=_unique_name(origin, taken, origin),
        nvml_names=[nvml_name],
        aliases=[],
        note=f"GUESS: untyped GPU GRES like {origin}'s, but NVML name {nvml_name!r} read by a "
        f"probe job: Slurm tells these GPUs from {origin}'s by no name",
    )
    return tuple(replace(s, model=new.name) for s in slots), new


def apply_probes(plan: SitePlan, outcomes: Sequence[ProbeOutcome]) -> SitePlan:
    """The plan with the probe jobs' answers: nodes of one configuration share one node map
    entry with the bus IDs read on one of them; what was not probed keeps Slurm's slots and
    is listed (pure)."""
    models = [replace(m, nvml_names=list(m.nvml_names)) for m in plan.models]
    nvml = {m.name: m.nvml_names for m in models}
    owned = {n.casefold(): m.name for m in models for n in m.nvml_names if not _placeholder(n)}
    unnamed = _unnamed_models(models)
    entries: list[NodeEntryPlan] = []
    not_probed: list[str] = []
    for index, entry in enumerate(plan.node_map):
        groups: dict[tuple[SlotPlan, ...], tuple[list[str], list[str]]] = {}
        for o in (o for o in outcomes if o.config.layout == index):
            slots, why = None, o.reason
            if o.gpus is not None:
                mine, new = _own_model(entry.slots, o.gpus, models, unnamed)
                if new is not None and new.nvml_names[0].casefold() in owned:
                    mine, new = entry.slots, None  # another model's NVML name: not guessed
                slots, learned, why = slots_from_probe(
                    mine, o.gpus, {**nvml, **({new.name: new.nvml_names} if new else {})}
                )
                if slots is not None and new is not None:
                    models.append(new)
                    nvml[new.name] = new.nvml_names
                    owned[new.nvml_names[0].casefold()] = new.name
                    unnamed[new.name] = unnamed[entry.slots[0].model]
                if any(owned.get(n.casefold(), m) != m for m, n in learned.items()):
                    slots, why = None, "its NVML names belong to other models here"
                for model, name in learned.items():
                    nvml[model][:] = [name]
                    owned[name.casefold()] = model
                if slots is None:
                    why = f"job {o.job_id} on {o.node}: {why}"
            if slots is None:
                not_probed.append(f"{o.config.hostlist}: {why}")
            nodes, said = groups.setdefault(slots or entry.slots, ([], []))
            nodes.extend(o.config.nodes)
            said.append(f"bus order read on {o.node} by job {o.job_id}" if slots else "not probed")
        covered = {n for nodes, _ in groups.values() for n in nodes}
        rest = [n for n in hostlist.expand_hostlist(entry.nodes) if n not in covered]
        if rest:
            groups.setdefault(entry.slots, ([], []))[0].extend(rest)
        for slots, (nodes, said) in groups.items():
            note = entry.note + ("; " + ", ".join(dict.fromkeys(said)) if said else "")
            entries.append(NodeEntryPlan(str(hostlist.collect_hostlist(nodes)), slots, note))
    for m in models:
        if (
            m.nvml_names
            and not any(_placeholder(n) for n in m.nvml_names)
            and m.nvml_names
            != next((p.nvml_names for p in plan.models if p.name == m.name), m.nvml_names)
        ):
            m.note += f"; NVML name {m.nvml_names[0]!r} read by a probe job"
    probed = len(outcomes) - len(not_probed)
    header = [*plan.header[:2],
        "Lines marked GUESS are what Slurm does not say; check them. Probe jobs (`site init "
        f"--probe`) read the PCI bus order on {probed} of {len(outcomes)} node configurations: "
        "the node map's bus IDs are theirs"
        + ("; the nodes listed at the end were not probed and have models and counts only"
           if not_probed else "")
        + ". The preflight warns instead of ending the job (preflight: warn) until you have "
        "checked this file and set it to required.",
    ]  # fmt: skip
    return replace(plan, models=models, node_map=entries, header=header, not_probed=not_probed)


def probe_nodes(
    client: SlurmClient, facts: ClusterFacts, plan: SitePlan, options: ProbeJobs
) -> tuple[SitePlan, list[ProbeOutcome]]:
    """One tiny job per node configuration (per node with ``options.each_node``) runs
    ``clusterjob site probe`` there; the plan with their bus IDs, and each job's outcome."""
    configs = node_configurations(
        facts.nodes, gpu_layouts(facts.nodes), each_node=options.each_node
    )
    outcomes = run_probe_jobs(
        client,
        configs,
        facts.nodes,
        syntax=plan.syntax,
        partitions=[(p.name, p.default) for p in plan.partitions],
        site_text=render(plan),
        options=options,
    )
    return apply_probes(plan, outcomes), outcomes
