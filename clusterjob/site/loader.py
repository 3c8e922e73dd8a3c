"""Read a site YAML file, validate it strictly, and build the frozen ``Site`` dataclasses.

This module is the site schema: which keys each section has and what their values mean.
Reading YAML with line numbers and checking values generically is ``clusterjob.site.
yamlcheck``; every problem is reported as ``file:line: key.path: message``. All problems are
collected in one pass and raised together in a ``ConfigError``: an admin fixing a config
should not have to run the validator once per typo.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import hostlist
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

from clusterjob.errors import ConfigError, ConfigIssue
from clusterjob.pci import normalise_bus_id
from clusterjob.site import jobpolicy, pinning, schema
from clusterjob.site.gpu_syntax import GpuRequestSyntax, syntax_named, syntax_names
from clusterjob.site.model import (
    SCHEDULERS,
    VENDORS,
    GpuModel,
    JobDefaults,
    JobEnvironment,
    NodeMap,
    Partition,
    RequestForm,
    Site,
    group_model,
    mig_profile_size,
    slice_model,
    slice_nvml_name,
    slice_of,
)
from clusterjob.site.nodemodel import (
    CHECK_SEVERITIES,
    NODE_CHECK_IDS,
    CheckPolicy,
    NodeGpu,
    OnError,
    PrologPolicy,
)
from clusterjob.site.yamlcheck import (
    INVALID,
    Entry,
    Invalid,
    Validator,
    compose,
    join_path,
    key_line,
    line_of,
    read_key,
    read_text,
)
from clusterjob.slurm.syntax import GRES_TYPE_NAME

MAX_BYTES = 16 * 1024 * 1024  # a real site is a few hundred KiB; refuse before parsing

_NVML_UUID = re.compile(schema.UUID_PATTERN)

# Keys of each mapping (name -> required), from the one schema definition (site/schema.py).
_TOP_KEYS = schema.SITE.key_table()
_GPU_REQUEST_KEYS = schema.GPU_REQUEST.key_table()
_MODEL_KEYS = schema.MODEL.key_table()
_PARTITION_KEYS = schema.PARTITION.key_table()
_JOB_KEYS = schema.JOB.key_table()
_DEFAULTS_KEYS = schema.DEFAULTS.key_table()
_NODE_ENTRY_KEYS = schema.NODE_ENTRY.key_table()
_MAX_NVLINKS = schema.GPU_SLOT.key("nvlinks").maximum or 36  # NVML_NVLINK_MAX_LINKS
_GPU_SLOT_KEYS = schema.GPU_SLOT.key_table()
_MIG_SLICE = re.compile(schema.MIG_SLICE_PATTERN)  # 1g.10gb, 1g.10gb+me, 3g.40gb@1
_MIG_PROFILE = re.compile(schema.MIG_PROFILE_PATTERN)
MIG_COMPUTE_SLICES = 7  # an A100/H100/H200 has 7 compute slices to share out
_PROLOG_KEYS = schema.PROLOG.key_table()
_CHECKS_KEYS = schema.CHECKS.key_table()
_CUDA_VERSION = re.compile(schema.CUDA_VERSION_PATTERN)
_NODE_FEATURE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
_DRIVER_VERSION = re.compile(schema.DRIVER_VERSION_PATTERN)


def _hostlist(v: Validator, node: Node, path: str) -> tuple[str, list[str]] | None:
    """A Slurm hostlist as written and expanded with python-hostlist (Slurm-compatible)."""
    text = v.string(node, path)
    if isinstance(text, Invalid):
        return None
    try:
        names: list[str] = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as exc:
        v.error(line_of(node), path, f"bad hostlist {text!r}: {exc}")
        return None
    if not names:
        v.error(line_of(node), path, f"hostlist {text!r} names no nodes")
        return None
    return text, names


# -- models ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ModelLines:
    """Where one model was written: its name, each alias, each key's value (cross-checks)."""

    name: int
    aliases: tuple[int, ...]
    keys: dict[str, int] = field(default_factory=dict)

    def of(self, key: str) -> int:
        """The line of ``key``'s value, or of the model's name when the key is absent."""
        return self.keys.get(key, self.name)


def _read_models(v: Validator, node: Node) -> tuple[list[GpuModel], dict[str, _ModelLines]]:
    """Models in file order; and, per model, where it was written (for cross-checks)."""
    models: list[GpuModel] = []
    lines: dict[str, _ModelLines] = {}
    named = v.any_mapping(node, "models", "a mapping of model name to model")
    if named is None:
        return models, lines
    if not named:
        v.error(line_of(node), "models", "at least one GPU model is required")
    for name, entry in named.items():
        path = join_path("models", name)
        fields = v.mapping(entry.value, path, _MODEL_KEYS)
        if fields is None:
            continue
        aliases = read_key(fields, "aliases", v.string_list, path)
        gres_type = read_key(fields, "gres_type", v.nullable_string, path)
        nvml = read_key(fields, "nvml_names", v.string_list, path)
        memory = read_key(fields, "memory_gb", lambda n, p: v.integer(n, p, minimum=1), path)
        constraint = read_key(fields, "constraint", v.nullable_string, path)
        if isinstance(constraint, str) and (problem := jobpolicy.constraint_problem(constraint)):
            v.error(key_line(fields, "constraint"), join_path(path, "constraint"), problem)
            constraint = INVALID
        vendor = jobpolicy.read_choice(v, fields, "vendor", path, VENDORS)
        model_defaults = jobpolicy.read_defaults(
            v, fields.get("defaults"), join_path(path, "defaults")
        )
        overlap = read_key(fields, "gres_type_overlap", v.boolean, path)
        if vendor in (None, "nvidia") and "nvml_names" not in fields:
            v.error(line_of(entry.value), join_path(path, "nvml_names"), "required key missing")
            nvml = None
        elif vendor == "amd" and "nvml_names" in fields:
            v.error(
                key_line(fields, "nvml_names"),
                join_path(path, "nvml_names"),
                "an AMD GPU has no NVML name (NVML reads NVIDIA GPUs only)",
            )
            nvml = None
        if vendor is INVALID or model_defaults is INVALID or overlap is INVALID:
            continue
        cap = read_key(fields, "max_per_job", lambda n, p: v.integer(n, p, minimum=1), path)
        if nvml is not None and not nvml:
            v.error(key_line(fields, "nvml_names"), join_path(path, "nvml_names"), "empty list")
        if isinstance(gres_type, str) and not GRES_TYPE_NAME.match(gres_type):
            v.error(
                key_line(fields, "gres_type"),
                join_path(path, "gres_type"),
                f"not a GRES type name: {gres_type!r} (letters, digits, '_', '-' and '.' only)",
            )
            gres_type = INVALID
        if gres_type is INVALID or memory is INVALID or constraint is INVALID or cap is INVALID:
            continue
        if (aliases is None and "aliases" in fields) or (nvml is None and "nvml_names" in fields):
            continue
        if nvml is None and vendor != "amd":
            continue
        lines[name] = _ModelLines(
            name=line_of(entry.key),
            aliases=tuple(line_of(n) for _, n in aliases or []),
            keys={k: line_of(e.value) for k, e in fields.items()},
        )
        models.append(
            GpuModel(
                name=name,
                aliases=tuple(a for a, _ in aliases or []),
                gres_type=gres_type,
                nvml_names=tuple(n for n, _ in nvml or ()),
                memory_gb=memory,
                constraint=constraint,
                vendor=vendor if isinstance(vendor, str) else "nvidia",
                defaults=model_defaults
                if isinstance(model_defaults, JobDefaults)
                else JobDefaults(),
                gres_type_overlap=overlap is True,
                max_per_job=cap,
            )
        )
    return models, lines


def _check_models(
    v: Validator,
    models: list[GpuModel],
    lines: dict[str, _ModelLines],
    syntax: GpuRequestSyntax | None,
    type_required: bool,
) -> set[str]:
    """Names and aliases must pick one model; each model must be expressible in the site's
    request syntax; GRES types must be tellable apart by Slurm. Returns the models the syntax
    cannot ask for (reported here, and left out of what refers to them)."""
    owner: dict[str, str] = {}  # casefolded name or alias -> canonical model
    for m in models:
        key = m.name.casefold()
        if key in owner:
            v.error(
                lines[m.name].name,
                join_path("models", m.name),
                f"model name collides with model {owner[key]} (names are case-insensitive)",
            )
        else:
            owner[key] = m.name
    for m in models:
        alias_lines = lines[m.name].aliases
        for i, alias in enumerate(m.aliases):
            key = alias.casefold()
            other = owner.get(key)
            if other is not None and other != m.name:
                v.error(
                    alias_lines[i],
                    f"models.{m.name}.aliases[{i}]",
                    f"alias {alias!r} already names model {other} (case-insensitive)",
                )
            else:
                owner[key] = m.name
    nvml_owner: dict[str, str] = {}
    for m in models:
        for name in m.nvml_names:
            other = nvml_owner.get(name.casefold())
            if other is not None and other != m.name:
                v.error(
                    lines[m.name].of("nvml_names"),
                    f"models.{m.name}.nvml_names",
                    f"NVML name {name!r} is already listed for model {other}",
                )
            nvml_owner.setdefault(name.casefold(), m.name)
    unaskable: set[str] = set()
    if syntax is not None:
        for m in models:
            for gap in syntax.gaps(m, type_required):
                v.error(lines[m.name].of(gap.key), f"models.{m.name}.{gap.key}", gap.in_config)
                unaskable.add(m.name)
    _check_gres_types(v, [m for m in models if m.name not in unaskable], lines)
    return unaskable


def _told_apart_by_feature(a: GpuModel, b: GpuModel) -> bool:
    return bool(a.constraint and b.constraint and a.constraint != b.constraint)


def _check_gres_types(v: Validator, models: list[GpuModel], lines: dict[str, _ModelLines]) -> None:
    """Two models of one GRES type are the same GPUs to Slurm (``--gres=gpu:a100:1`` gets
    either) unless a node feature of each tells them apart: refused. A type that is a
    substring of another's also selects the other (Slurm matches types by substring): warned,
    unless a model says it is meant (``gres_type_overlap``)."""
    typed = [(m, m.gres_type) for m in models if m.gres_type is not None]
    for position, (m, mine) in enumerate(typed):
        for rival_position, (rival, theirs) in enumerate(typed):
            if rival is m:
                continue
            if mine.casefold() == theirs.casefold():
                if rival_position < position and not _told_apart_by_feature(m, rival):
                    v.error(
                        lines[m.name].of("gres_type"),
                        f"models.{m.name}.gres_type",
                        f"GRES type {mine!r} is also the type of model {rival.name}: Slurm "
                        "cannot tell these models apart; give each its own gres_type, or each "
                        "its own constraint (node feature)",
                    )
            elif mine.casefold() in theirs.casefold() and not (
                m.gres_type_overlap or rival.gres_type_overlap
            ):
                v.warn(
                    lines[m.name].of("gres_type"),
                    f"models.{m.name}.gres_type",
                    f"GRES type {mine!r} is a substring of {theirs!r} "
                    f"(model {rival.name}): Slurm matches types by substring, so asking for "
                    f"{mine!r} can also select {rival.name} GPUs",
                )


def _read_gpu_request(
    v: Validator, entry: Entry | None
) -> tuple[GpuRequestSyntax | None, bool, RequestForm]:
    """The site's request syntax (None when missing or bad), whether types are required, and
    how CPUs, memory and multi-node GPUs are written."""
    if entry is None:
        return None, False, RequestForm()
    fields = v.mapping(entry.value, "gpu_request", _GPU_REQUEST_KEYS)
    if fields is None:
        return None, False, RequestForm()
    name = read_key(fields, "syntax", lambda n, p: v.choice(n, p, syntax_names()), "gpu_request")
    required = read_key(fields, "type_required", v.boolean, "gpu_request")
    form = jobpolicy.read_form(v, fields)
    return (
        syntax_named(name) if isinstance(name, str) else None,
        required is True,
        form if isinstance(form, RequestForm) else RequestForm(),
    )


# -- partitions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _ReadPartition:
    """A partition with the lines its cross-checks point at."""

    partition: Partition
    nodes_line: int  # of its ``nodes`` value
    default_line: int  # of its ``default`` flag (or its name when absent)
    lines: dict[str, int] = field(default_factory=dict)  # each key's value
    name_line: int = 0


def _read_partitions(v: Validator, node: Node) -> list[_ReadPartition]:
    """Partitions in file order."""
    out: list[_ReadPartition] = []
    named = v.any_mapping(node, "partitions", "a mapping of partition name to partition")
    if named is None:
        return out
    for name, entry in named.items():
        path = join_path("partitions", name)
        fields = v.mapping(entry.value, path, _PARTITION_KEYS)
        if fields is None:
            continue
        hosts = read_key(fields, "nodes", lambda n, p: _hostlist(v, n, p), path)
        time_limit = jobpolicy.read_time(
            v,
            fields,
            "time_limit",
            path,
            what="a Slurm time limit",
            example="2-00:00:00, 12:00:00, 30",
        )
        default = read_key(fields, "default", v.boolean, path)
        defaults = _read_defaults(v, fields.get("defaults"), join_path(path, "defaults"))
        checks = _read_checks(v, fields.get("checks"), join_path(path, "checks"))
        job = _read_job(v, fields.get("job"), join_path(path, "job"))
        policy = jobpolicy.read_partition_policy(v, fields, path)
        if hosts is None or time_limit is INVALID or default is INVALID:
            continue
        if isinstance(policy, Invalid):
            continue
        if isinstance(defaults, Invalid) or isinstance(job, Invalid):
            continue
        if isinstance(checks, Invalid):
            continue
        text, names = hosts
        out.append(
            _ReadPartition(
                Partition(
                    name=name,
                    nodes=text,
                    node_names=tuple(names),
                    time_limit=time_limit,
                    default=bool(default),
                    defaults=defaults,
                    checks=checks,
                    job=job,
                    **policy,  # type: ignore[arg-type]
                ),
                nodes_line=key_line(fields, "nodes") or line_of(entry.key),
                default_line=key_line(fields, "default") or line_of(entry.key),
                lines={k: line_of(e.value) for k, e in fields.items()},
                name_line=line_of(entry.key),
            )
        )
    return out


def _read_defaults(v: Validator, entry: Entry | None, path: str) -> JobDefaults | Invalid:
    return jobpolicy.read_defaults(v, entry, path)


def _read_job(v: Validator, entry: Entry | None, path: str) -> JobEnvironment | Invalid:
    """``job:`` (top level or a partition's): the interpreter jobs get when the user names
    none and has no env active at submit, and setup lines run before the program."""
    if entry is None:
        return JobEnvironment()
    fields = v.mapping(entry.value, path, _JOB_KEYS)
    if fields is None:
        return INVALID
    failed = False
    values: dict[str, str | None] = {}
    for key in ("python", "venv", "conda"):
        value = read_key(fields, key, v.string, path)
        if value is INVALID:
            failed = True
            continue
        if key != "conda" and isinstance(value, str) and not value.startswith("/"):
            v.error(key_line(fields, key), join_path(path, key), f"not an absolute path: {value!r}")
            failed = True
        values[key] = value
    chosen = [k for k in ("python", "venv", "conda") if values.get(k) is not None]
    if len(chosen) > 1:
        v.error(
            key_line(fields, chosen[1]),
            join_path(path, chosen[1]),
            f"give one of python, venv, conda (this entry also has {chosen[0]})",
        )
        failed = True
    setup: list[str] = []
    if "setup" in fields:
        lines = v.string_list(fields["setup"].value, join_path(path, "setup"))
        if lines is None:
            failed = True
        for i, (line, node) in enumerate(lines or []):
            if "\n" in line or "\r" in line:
                v.error(line_of(node), f"{path}.setup[{i}]", "one shell line per item")
                failed = True
            setup.append(line)
    if failed:
        return INVALID
    return JobEnvironment(
        python=values.get("python"),
        venv=values.get("venv"),
        conda=values.get("conda"),
        setup=tuple(setup),
    )


# -- node map -------------------------------------------------------------------------------


def _read_gpus(
    v: Validator,
    node: Node,
    path: str,
    defined: dict[str, GpuModel | None] | None,
    names: list[str],
    uuids: dict[str, str],
) -> tuple[NodeGpu, ...] | None:
    """The GPU slots of one node-map entry (covering ``names``), in PCI bus order."""
    items = v.sequence(node, path, "a list of GPUs (in PCI bus order)")
    if items is None:
        return None
    slots: list[NodeGpu] = []
    bad = False
    used: dict[str, int] = {}
    previous: tuple[str, int] | None = None
    for i, item in enumerate(items):
        spath = f"{path}[{i}]"
        fields = v.mapping(item, spath, _GPU_SLOT_KEYS, "a mapping such as {model: A100}")
        if fields is None:
            bad = True
            continue
        model = read_key(fields, "model", v.string, spath)
        bus_id = read_key(fields, "bus_id", v.string, spath)
        uuid = read_key(fields, "uuid", v.string, spath)
        nvlinks = read_key(fields, "nvlinks", lambda n, p: v.integer(n, p, minimum=0), spath)
        if isinstance(nvlinks, int) and nvlinks > _MAX_NVLINKS:
            v.error(
                key_line(fields, "nvlinks"),
                join_path(spath, "nvlinks"),
                f"a GPU has at most {_MAX_NVLINKS} NVLink links, got {nvlinks}",
            )
            nvlinks = INVALID
        if isinstance(model, str) and defined is not None:
            model = _check_slot_model(v, model, key_line(fields, "model"), spath, defined)
        if isinstance(bus_id, str):
            bus_id = _check_bus_id(v, bus_id, key_line(fields, "bus_id"), spath, i, used, previous)
            if isinstance(bus_id, str):
                used[bus_id] = i
                previous = (bus_id, i)
        if isinstance(uuid, str):
            uuid = _check_uuid(
                v, uuid, key_line(fields, "uuid"), join_path(spath, "uuid"), names, i, uuids
            )
        if model is INVALID or bus_id is INVALID or uuid is INVALID or model is None:
            bad = True
            continue
        parent = defined.get(model) if defined is not None else None
        mig = _read_mig(v, fields, spath, parent, [m for m in (defined or {}).values() if m])
        if nvlinks is INVALID or mig is INVALID:
            bad = True
            continue
        profiles, gis = mig if mig is not None else (None, None)
        slots.append(NodeGpu(i, model, bus_id, uuid, nvlinks=nvlinks, mig=profiles, mig_gi=gis))
    return None if bad else tuple(slots)


def _check_slot_model(
    v: Validator, model: str, line: int | None, spath: str, defined: dict[str, GpuModel | None]
) -> str | Invalid:
    """A slot's model: defined in the models section, and a whole GPU."""
    if model in defined:
        return _check_whole_gpu(v, model, line, spath, defined)
    known = ", ".join(defined) or "none"
    near = next((m.name for m in defined.values() if m and m.matches(model)), None)
    hint = f" (write the canonical name {near!r})" if near else ""
    if not near and (_MIG_PROFILE.match(model) or slice_of(model)):
        hint = " (a MIG slice: list its GPU's model, and the slice in that slot's mig:)"
    v.error(
        line, join_path(spath, "model"), f"unknown model {model!r}{hint}; defined models: {known}"
    )
    return INVALID


def _check_whole_gpu(
    v: Validator, model: str, line: int | None, spath: str, defined: dict[str, GpuModel | None]
) -> str | Invalid:
    """A slot is a physical GPU: a MIG slice's model there would have gres-conf write device
    files that do not exist (a slice has no /dev/nvidiaN of its own)."""
    found = defined.get(model)
    cut = next((c for c in map(slice_of, found.nvml_names) if c), None) if found else None
    if cut is None:
        return model
    gpu_name, profile = cut
    parent = next((m.name for m in defined.values() if m and gpu_name in m.nvml_names), None)
    v.error(
        line,
        join_path(spath, "model"),
        f"{model} is a MIG slice ({gpu_name} MIG {profile}), not a GPU: list the GPU it is "
        f"cut from, its slices in mig: (e.g. {{model: {parent or '<the GPU>'}, "
        f"mig: [{profile}, ...]}})",
    )
    return INVALID


def _read_mig(
    v: Validator,
    fields: dict[str, Entry],
    spath: str,
    parent: GpuModel | None,
    models: list[GpuModel],
) -> tuple[tuple[str, ...], tuple[int, ...] | None] | None | Invalid:
    """A slot's ``mig``: the profiles of its MIG slices ([] for MIG off), as NVML names them,
    and their GPU instance ids (``3g.40gb@1``; None unless every slice gives one). The slices
    must fit the GPU (7 compute slices, its ``memory_gb``); a profile no model stands for is
    a warning: jobs cannot ask for it by model."""
    if "mig" not in fields:
        return None
    path = join_path(spath, "mig")
    items = v.string_list(fields["mig"].value, path)
    if items is None:
        return INVALID
    profiles: list[str] = []
    gis: dict[int, int] = {}  # GPU instance id -> its slice
    for i, (text, node) in enumerate(items):
        if not _MIG_SLICE.match(text):
            v.error(
                line_of(node),
                f"{path}[{i}]",
                f"not a MIG profile: {text!r} (e.g. 1g.10gb, or 1g.10gb@7 with its GPU instance)",
            )
            return INVALID
        profile, _, gi = text.partition("@")
        if gi and int(gi) in gis:
            v.error(
                line_of(node), f"{path}[{i}]", f"GPU instance {gi} is already slice {gis[int(gi)]}"
            )
            return INVALID
        if gi:
            gis[int(gi)] = i
        profiles.append(profile)
    line = key_line(fields, "mig")
    if gis and len(gis) != len(profiles):
        v.error(line, path, "give every slice its GPU instance id (@GI) or none")
        return INVALID
    compute = sum(mig_profile_size(p)[0] for p in profiles)
    memory = sum(mig_profile_size(p)[1] for p in profiles)
    if compute > MIG_COMPUTE_SLICES:
        v.error(
            line,
            path,
            f"the slices take {compute} compute slices, a GPU has {MIG_COMPUTE_SLICES}",
        )
        return INVALID
    if parent is not None and parent.memory_gb is not None and memory > parent.memory_gb:
        v.error(
            line, path, f"the slices take {memory} GB, a {parent.name} has {parent.memory_gb} GB"
        )
        return INVALID
    if parent is not None:
        _warn_unmodelled_slices(v, line, path, parent, models, profiles)
    return tuple(profiles), (tuple(gis) if gis else None)


def _warn_unmodelled_slices(
    v: Validator,
    line: int | None,
    path: str,
    parent: GpuModel,
    models: list[GpuModel],
    profiles: list[str],
) -> None:
    for profile in dict.fromkeys(profiles):
        if slice_model(models, parent, profile) is None:
            v.warn(
                line,
                path,
                f"no model stands for {parent.name} {profile} slices (one with nvml_names "
                f"[{slice_nvml_name(parent.nvml_names[0], profile)!r}]): jobs cannot ask for "
                "them by model",
            )


def _check_bus_id(
    v: Validator,
    bus_id: str,
    line: int | None,
    spath: str,
    slot: int,
    used: dict[str, int],
    previous: tuple[str, int] | None,
) -> str | Invalid:
    """A bus ID in normal form, used once on its node, and after the previous slot's."""
    path = join_path(spath, "bus_id")
    try:
        normal = normalise_bus_id(bus_id)
    except ValueError as exc:
        v.error(line, path, str(exc))
        return INVALID
    if normal in used:
        v.error(line, path, f"bus ID {normal} is already used by slot {used[normal]} of this node")
        return INVALID
    if previous is not None and normal < previous[0]:
        used[normal] = slot  # taken all the same: a later duplicate is still reported
        v.error(
            line,
            path,
            f"GPUs must be listed in PCI bus order: {normal} comes before "
            f"{previous[0]} (slot {previous[1]})",
        )
        return INVALID
    return normal


def _check_uuid(
    v: Validator,
    uuid: str,
    line: int | None,
    path: str,
    names: list[str],
    slot: int,
    uuids: dict[str, str],
) -> str | Invalid:
    """A UUID identifies one physical GPU: well-formed, on a one-node entry, used once."""
    if not _NVML_UUID.match(uuid):
        v.error(line, path, f"not an NVML UUID: {uuid!r} (expected GPU-xxxxxxxx-xxxx-...)")
        return INVALID
    if len(names) > 1:
        shown = hostlist.collect_hostlist(names)
        v.error(
            line, path, f"a UUID names one GPU, but this entry covers {len(names)} nodes ({shown})"
        )
        return INVALID
    if uuid in uuids:
        v.error(line, path, f"UUID {uuid} is already given to {uuids[uuid]}")
        return INVALID
    if names:
        uuids[uuid] = f"{names[0]} slot {slot}"
    return uuid


def _read_node_map(
    v: Validator, node: Node, defined: dict[str, GpuModel | None] | None
) -> tuple[NodeMap, set[str]]:
    """Node name -> GPU slots. Nodes of one entry share one tuple (cheap for 10,000 nodes).
    Also the nodes whose GPUs were refused (reported here, not again by what counts them)."""
    nodes: dict[str, tuple[NodeGpu, ...]] = {}
    refused: set[str] = set()
    lines: dict[str, int] = {}
    where: dict[str, int] = {}  # node -> entry index
    uuids: dict[str, str] = {}
    features: dict[str, tuple[str, ...]] = {}
    items = v.sequence(node, "node_map", "a list of {nodes, gpus} entries")
    if items is None:
        return NodeMap(nodes, lines), refused
    for i, item in enumerate(items):
        path = f"node_map[{i}]"
        fields = v.mapping(item, path, _NODE_ENTRY_KEYS)
        if fields is None:
            continue
        hosts = read_key(fields, "nodes", lambda n, p: _hostlist(v, n, p), path)
        names = hosts[1] if hosts is not None else []
        gpus = None
        if "gpus" in fields:
            gpus = _read_gpus(v, fields["gpus"].value, f"{path}.gpus", defined, names, uuids)
        own = _read_node_features(v, fields, path)
        if hosts is None:
            continue
        line = key_line(fields, "nodes") or line_of(item)
        twice: dict[int, list[str]] = {}
        for name in names:
            first = where.get(name)
            if first is not None:
                twice.setdefault(first, []).append(name)
                continue
            where[name] = i
            lines[name] = line
            if gpus is not None:
                nodes[name] = gpus
            elif "gpus" in fields:
                refused.add(name)
            if own:
                features[name] = own
        for first, dup in twice.items():
            shown = hostlist.collect_hostlist(dup)
            v.error(
                line,
                join_path(path, "nodes"),
                f"{shown} already defined in node_map[{first}] (line {lines[dup[0]]})",
            )
    return NodeMap(nodes, lines, features), refused


def _read_node_features(v: Validator, fields: dict[str, Entry], path: str) -> tuple[str, ...]:
    """A node_map entry's own node features: plain names (no operators), as Slurm's
    ``Features=`` takes them."""
    items = read_key(fields, "features", v.string_list, path)
    if not isinstance(items, list):
        return ()
    out = []
    for text, node in items:
        if not _NODE_FEATURE.fullmatch(text):
            v.error(
                line_of(node),
                join_path(path, "features"),
                f"not a node feature: {text!r} (letters, digits, _ . : - only)",
            )
            continue
        out.append(text)
    return tuple(dict.fromkeys(out))


# -- the rest -------------------------------------------------------------------------------


def _read_version(
    v: Validator,
    fields: dict[str, Entry],
    path: str,
    key: str,
    pattern: re.Pattern[str],
    what: str,
    example: str,
) -> str | None | Invalid:
    """An optional version string that must match ``pattern``; INVALID (reported) if not."""
    value = read_key(fields, key, v.string, path)
    if isinstance(value, str) and not pattern.match(value):
        v.error(
            key_line(fields, key),
            join_path(path, key),
            f"not {what} version: {value!r} (e.g. {example})",
        )
        return INVALID
    return value


def _read_checks(v: Validator, entry: Entry | None, path: str) -> CheckPolicy | Invalid:
    """``checks:`` (top level or a partition's): the oldest NVIDIA driver the node checks
    accept, and per check id a severity (error, warning or off) in place of the check's own."""
    if entry is None:
        return CheckPolicy()
    fields = v.mapping(entry.value, path, _CHECKS_KEYS)
    if fields is None:
        return INVALID
    driver_min = _read_version(
        v, fields, path, "driver_min", _DRIVER_VERSION, "an NVIDIA driver", '"535.104.05"'
    )
    cuda_min = _read_version(v, fields, path, "cuda_min", _CUDA_VERSION, "a CUDA", '"12.4", quoted')
    failed = driver_min is INVALID or cuda_min is INVALID
    severity: dict[str, str] = {}
    if "severity" in fields:
        spath = join_path(path, "severity")
        named = v.any_mapping(fields["severity"].value, spath, "a mapping of check id to severity")
        failed = failed or named is None
        for check_id, item in (named or {}).items():
            cpath = join_path(spath, check_id)
            if check_id not in NODE_CHECK_IDS:
                v.error(
                    line_of(item.key),
                    cpath,
                    f"unknown check id; valid: {', '.join(sorted(NODE_CHECK_IDS))}",
                )
                failed = True
                continue
            word = v.choice(item.value, cpath, CHECK_SEVERITIES)
            if isinstance(word, str):
                severity[check_id] = word
            else:
                failed = True
    if failed:
        return INVALID
    return CheckPolicy(
        driver_min=driver_min if isinstance(driver_min, str) else None,
        severity=severity,
        cuda_min=cuda_min if isinstance(cuda_min, str) else None,
    )


def _read_prolog(v: Validator, entry: Entry | None) -> PrologPolicy | Invalid:
    if entry is None:
        return PrologPolicy()
    fields = v.mapping(entry.value, "prolog", _PROLOG_KEYS)
    if fields is None:
        return INVALID
    on_error = read_key(
        fields, "on_error", lambda n, p: v.choice(n, p, [e.value for e in OnError]), "prolog"
    )
    deadline = read_key(fields, "deadline_seconds", v.positive_number, "prolog")
    log = read_key(fields, "log", v.string, "prolog")
    if on_error is INVALID or deadline is INVALID or log is INVALID:
        return INVALID
    base = PrologPolicy()
    return PrologPolicy(
        on_error=OnError(on_error) if on_error else base.on_error,
        deadline_seconds=deadline if deadline is not None else base.deadline_seconds,
        log_path=log if log is not None else base.log_path,
    )


def _read_node_command(v: Validator, top: dict[str, Entry]) -> str | None | Invalid:
    """How job scripts call clusterjob on a node; they split it into words
    (render.default_node_command), so it must split."""
    node_command = read_key(top, "node_command", v.nullable_string, "")
    if isinstance(node_command, str):
        try:
            shlex.split(node_command)
        except ValueError as exc:
            line = key_line(top, "node_command")
            v.error(line, "node_command", f"not a command line: {str(exc).lower()}")
            return INVALID
    return node_command


def _defined_models(top: dict[str, Entry], models: list[GpuModel]) -> dict[str, GpuModel | None]:
    """Every name in the models section: its model, or None where the model has a bad field
    (node-map entries naming it are not reported as unknown on top of that)."""
    defined: dict[str, GpuModel | None] = {m.name: m for m in models}
    section = top["models"].value
    if isinstance(section, MappingNode):
        for key, _ in section.value:
            if isinstance(key, ScalarNode):
                defined.setdefault(str(key.value), None)
    return defined


def _check_pinning(
    v: Validator, site: Site, lines: dict[str, _ModelLines], group_lines: dict[str, int]
) -> None:
    """Each model and model group, on every partition that holds it, asked for so that Slurm
    gives only its GPUs (``clusterjob.site.pinning``). A warning: the site stays usable for
    what it can ask for (a group of a whole-node partition's models), and ``resolve`` refuses
    the rest."""
    asked: list[tuple[GpuModel, int | None, str]] = [
        (m, lines[m.name].name, "models") for m in site.models
    ]
    for group in site.model_groups:
        members = [site.model_by_name(name) for name in group.models]
        asked.append((group_model(group, members), group_lines.get(group.name), "model_groups"))
    holdings = pinning.site_holdings(site)
    for model, line, section in asked:
        problem = pinning.first_unpinned(site, model, holdings)
        if problem:
            message = f"{problem} (until then a request for {model.name} there is refused)"
            v.warn(line, join_path(section, model.name), message)


def _key_lines(top: dict[str, Entry], section: str) -> dict[str, int]:
    """Where each name of a mapping section was written."""
    node = top[section].value if section in top else None
    if not isinstance(node, MappingNode):
        return {}
    return {str(k.value): line_of(k) for k, _ in node.value if isinstance(k, ScalarNode)}


def _gpu_counts(partition: Partition, node_map: NodeMap, refused: set[str]) -> dict[str, int]:
    """GPUs per node of a partition, for the nodes whose GPUs are known: a node missing from
    the node map, or whose GPUs were refused there, has its own error already."""
    return {
        n: len(node_map.nodes.get(n) or ())
        for n in partition.node_names
        if n in node_map.lines and n not in refused
    }


def _scheduler_written(root: Node) -> str | None:
    """The ``scheduler:`` value as written, before the file is checked: whether
    ``gpu_request`` is required depends on it."""
    if not isinstance(root, MappingNode):
        return None
    for key, value in root.value:
        if isinstance(key, ScalarNode) and key.value == "scheduler":
            return value.value if isinstance(value, ScalarNode) else None
    return None


def _check_gpu_types(v: Validator, models: list[GpuModel], lines: dict[str, _ModelLines]) -> None:
    """On a Grid Engine site a job asks for ``-l gpu=N,gpu_type=T``: each model's gres_type is
    its hosts' ``gpu_type`` value, and without it a job could land on any model."""
    for model in models:
        if model.gres_type is None and model.name in lines:
            v.error(
                lines[model.name].of("gres_type"),
                f"models.{model.name}.gres_type",
                "required on a Grid Engine site (scheduler: gridengine): the hosts' gpu_type "
                "value, asked for as -l gpu_type=NAME",
            )


def _build(v: Validator, root: Node, path: Path) -> Site | None:
    # A Grid Engine site asks for GPUs by its own complexes: gpu_request is optional there.
    grid_engine = _scheduler_written(root) == "gridengine"
    keys = {**_TOP_KEYS, "gpu_request": not grid_engine}
    top = v.mapping(root, "", keys, "a mapping of site settings at the top")
    if top is None:
        return None
    name = read_key(top, "site", v.string, "")
    cluster_name = read_key(top, "cluster_name", v.nullable_string, "")
    node_command = _read_node_command(v, top)
    syntax, type_required, form = _read_gpu_request(v, top.get("gpu_request"))
    ge_types = grid_engine and "gpu_request" not in top  # every model needs its gpu_type
    if ge_types:
        syntax = syntax_named("gres")
    site_defaults = jobpolicy.read_defaults(v, top.get("defaults"), "defaults")
    if isinstance(site_defaults, Invalid):
        site_defaults = JobDefaults()
    preflight = jobpolicy.read_preflight(v, top, "")
    account = jobpolicy.read_account_rule(v, top, "")
    scheduler = jobpolicy.read_choice(v, top, "scheduler", "", SCHEDULERS)

    models: list[GpuModel] = []
    model_lines: dict[str, _ModelLines] = {}
    unaskable: set[str] = set()
    if "models" in top:
        models, model_lines = _read_models(v, top["models"].value)
        unaskable = _check_models(v, models, model_lines, syntax, type_required)
        if ge_types:
            _check_gpu_types(v, models, model_lines)
    # Node-map models are checked against the names in the models section, even where a
    # model has a bad field; without a readable models section they cannot be checked.
    defined: dict[str, GpuModel | None] | None = None
    if "models" in top and isinstance(top["models"].value, MappingNode):
        defined = _defined_models(top, models)

    refused_models = frozenset(n for n, m in (defined or {}).items() if m is None) | unaskable
    groups = jobpolicy.read_model_groups(
        v,
        top.get("model_groups"),
        models,
        syntax.name if syntax else None,
        type_required,
        refused_models,
    )
    node_map, refused_nodes = NodeMap({}, {}), set[str]()
    if "node_map" in top:
        node_map, refused_nodes = _read_node_map(v, top["node_map"].value, defined)

    partitions: list[Partition] = []
    if "partitions" in top:
        default_seen: tuple[str, int] | None = None
        for read in _read_partitions(v, top["partitions"].value):
            partition = read.partition
            counts = _gpu_counts(partition, node_map, refused_nodes)
            jobpolicy.check_partition(
                v,
                partition,
                read.lines,
                read.name_line,
                counts,
                site_defaults,
                whole_nodes=syntax is not None and syntax.name == "none",
            )
            missing = [n for n in partition.node_names if n not in node_map.lines]
            if missing and "node_map" in top:
                v.error(
                    read.nodes_line,
                    f"partitions.{partition.name}.nodes",
                    f"not in node_map: {hostlist.collect_hostlist(missing)}",
                )
            if partition.default:
                if default_seen is not None:
                    v.error(
                        read.default_line,
                        f"partitions.{partition.name}.default",
                        f"partition {default_seen[0]} is already the default "
                        f"(line {default_seen[1]}); at most one partition can be",
                    )
                else:
                    default_seen = (partition.name, read.default_line)
            partitions.append(partition)

    qos = jobpolicy.read_qos_limits(v, top.get("qos"), {p.name: p for p in partitions})
    prolog = _read_prolog(v, top.get("prolog"))
    checks = _read_checks(v, top.get("checks"), "checks")
    job = _read_job(v, top.get("job"), "job")
    templates = read_key(top, "templates", v.string, "")
    templates_dir: Path | None = None
    if isinstance(templates, str):
        templates_dir = Path(os.path.normpath(path.absolute().parent / templates))
        if not templates_dir.is_dir():
            v.error(key_line(top, "templates"), "templates", f"not a directory: {templates_dir}")

    if v.failed or syntax is None or not isinstance(name, str):
        return None
    if cluster_name is INVALID or node_command is INVALID or prolog is INVALID:
        return None  # each has recorded an error: not reached
    if isinstance(job, Invalid):
        return None
    site = Site(
        name=name,
        cluster_name=cluster_name,
        source=path.absolute(),
        gpu_syntax=syntax,
        type_required=type_required,
        models=tuple(models),
        partitions=tuple(partitions),
        node_map=node_map,
        prolog=prolog,
        checks=checks if isinstance(checks, CheckPolicy) else CheckPolicy(),
        templates_dir=templates_dir,
        node_command=node_command,
        job=job,
        defaults=site_defaults,
        preflight=preflight if isinstance(preflight, str) else "required",
        form=form,
        model_groups=groups,
        account=account if isinstance(account, str) else "optional",
        qos=qos,
        scheduler=scheduler if isinstance(scheduler, str) else "slurm",
    )
    _check_pinning(v, site, model_lines, _key_lines(top, "model_groups"))
    return None if v.failed else site


# -- reading the file -----------------------------------------------------------------------


def validate_site_file(path: Path, fd: int | None = None) -> tuple[Site | None, list[ConfigIssue]]:
    """Every problem in one site file, warnings included; the Site when there is no error.

    With ``fd`` the text is read from that open descriptor (the root Prolog's checked file).
    """
    path = Path(path)
    file = str(path)
    text, issues = read_text(path, file, MAX_BYTES, fd)
    if text is None:
        return None, issues
    root, issues = compose(text, file, "a site config mapping")
    if root is None:
        return None, issues
    validator = Validator(file)
    site = _build(validator, root, path)
    ordered = sorted(validator.issues, key=lambda i: (i.line or 0, i.warning))
    return (None if validator.failed else site), ordered


def load_site(path: Path, fd: int | None = None) -> Site:
    """The site in ``path`` (read from ``fd`` when given); raises ConfigError listing every
    problem (warnings included)."""
    site, issues = validate_site_file(path, fd)
    if site is None:
        if not issues:  # cannot happen; keep the promise of never returning None silently
            issues = [ConfigIssue(str(path), None, "", "site config could not be read")]
        raise ConfigError(issues)
    return site
