"""Read a site YAML file, validate it strictly, and build the frozen ``Site`` dataclasses.

The file is composed (not constructed) with ruamel.yaml so that every node keeps its line,
and every problem is reported as ``file:line: key.path: message``. All problems are
collected in one pass and raised together in a ``ConfigError``: an admin fixing a config
should not have to run the validator once per typo.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hostlist
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from clusterjob.errors import ConfigError, ConfigIssue
from clusterjob.pci import normalise_bus_id
from clusterjob.site.model import (
    GpuModel,
    GpuSyntax,
    NodeGpu,
    NodeMap,
    OnError,
    Partition,
    PartitionDefaults,
    PrologPolicy,
    Site,
)
from clusterjob.slurm.parse import GRES_TYPE_NAME, MEMORY_SIZE

MAX_BYTES = 16 * 1024 * 1024  # a real site is a few hundred KiB; refuse before parsing

_YAML_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {f"{_YAML_TAG}{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}

# Slurm time strings (sbatch --time): min, min:sec, h:min:sec, d-h, d-h:min, d-h:min:sec.
_TIME_LIMIT = re.compile(
    r"^(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}"
    r"|UNLIMITED|unlimited|INFINITE|infinite)$"
)
_NVML_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]+$")

# Keys of each mapping: name -> required.
_TOP_KEYS = {
    "site": True,
    "cluster_name": False,
    "node_command": False,
    "gpu_request": True,
    "models": True,
    "partitions": False,
    "node_map": True,
    "prolog": False,
    "templates": False,
}
_GPU_REQUEST_KEYS = {"syntax": True, "type_required": False}
_MODEL_KEYS = {
    "aliases": False,
    "gres_type": False,
    "nvml_names": True,
    "memory_gb": False,
    "constraint": False,
}
_PARTITION_KEYS = {"nodes": True, "time_limit": False, "default": False, "defaults": False}
_DEFAULTS_KEYS = {"account": False, "qos": False, "cpus_per_gpu": False, "mem_per_gpu": False}
_NODE_ENTRY_KEYS = {"nodes": True, "gpus": True}
_GPU_SLOT_KEYS = {"model": True, "bus_id": False, "uuid": False}
_PROLOG_KEYS = {"on_error": False, "deadline_seconds": False, "log": False}

_TYPED_SYNTAXES = (GpuSyntax.GRES, GpuSyntax.GPUS_PER_NODE, GpuSyntax.GPUS)


class _Invalid:
    """Marks a value that failed validation (the issue is already recorded)."""


INVALID: Any = _Invalid()


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(node: Node) -> str:
    """How a value reads in an error message: the text as written, or its kind."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == f"{_YAML_TAG}null":
        return "nothing (null)"
    if node.tag == f"{_YAML_TAG}str":
        return repr(node.value)
    return str(node.value)


def _to_int(text: str) -> int:
    cleaned = text.replace("_", "")
    try:
        return int(cleaned, 0)
    except ValueError:
        return int(cleaned, 10)  # YAML 1.2 reads 010 as ten


def _to_float(text: str) -> float:
    cleaned = text.replace("_", "").lower()
    specials = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
    return specials[cleaned] if cleaned in specials else float(cleaned)


@dataclass
class _Entry:
    """A key of a mapping with the nodes of the key and of its value."""

    key: ScalarNode
    value: Node


class _Validator:
    """Walks the composed YAML tree, records issues, and returns plain values."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.issues: list[ConfigIssue] = []
        self._seen_anchors: set[int] = set()

    # -- recording ------------------------------------------------------------------------

    def error(self, line: int | None, path: str, message: str) -> None:
        self.issues.append(ConfigIssue(self.file, line, path, message))

    def warn(self, line: int | None, path: str, message: str) -> None:
        self.issues.append(ConfigIssue(self.file, line, path, message, warning=True))

    @property
    def failed(self) -> bool:
        return any(not i.warning for i in self.issues)

    # -- generic node checks --------------------------------------------------------------

    def usable(self, node: Node, path: str) -> bool:
        """Refuse anchors/aliases (alias bombs, and values that silently change in two
        places) and explicit tags (no object construction from a config)."""
        anchor = getattr(node, "anchor", None)
        if anchor is not None:
            name = getattr(anchor, "value", anchor)
            if id(node) not in self._seen_anchors:
                self._seen_anchors.add(id(node))
                self.error(
                    _line(node),
                    path,
                    f"YAML anchors and aliases (&{name}, *{name}) are not supported in site "
                    "configs; write the value out",
                )
            return False
        tag = str(node.tag)
        if tag not in _PLAIN_TAGS:
            shown = "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag
            self.error(_line(node), path, f"YAML tags are not supported here (found {shown})")
            return False
        return True

    def mapping(
        self, node: Node, path: str, keys: dict[str, bool], what: str = "a mapping"
    ) -> dict[str, _Entry] | None:
        """A mapping with a fixed key set: unknown keys name the valid ones."""
        entries = self.any_mapping(node, path, what)
        if entries is None:
            return None
        valid = ", ".join(sorted(keys))
        for name, entry in entries.items():
            if name not in keys:
                close = difflib.get_close_matches(name, list(keys), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.error(
                    _line(entry.key),
                    _join(path, name),
                    f"unknown key{hint}; valid keys: {valid}",
                )
        for name, required in keys.items():
            if required and name not in entries:
                self.error(_line(node), _join(path, name), "required key missing")
        return {k: v for k, v in entries.items() if k in keys}

    def any_mapping(
        self, node: Node, path: str, what: str = "a mapping"
    ) -> dict[str, _Entry] | None:
        """A mapping with free-form string keys (model and partition names), checked for
        duplicates (which YAML forbids but many parsers silently resolve)."""
        if not self.usable(node, path):
            return None
        if not isinstance(node, MappingNode):
            self.error(_line(node), path, f"expected {what}, got {_describe(node)}")
            return None
        entries: dict[str, _Entry] = {}
        for key, value in node.value:
            if (
                not isinstance(key, ScalarNode)
                or str(key.tag) != f"{_YAML_TAG}str"
                or getattr(key, "anchor", None) is not None
            ):
                shown = _describe(key) if isinstance(key, ScalarNode) else "a complex key"
                self.error(_line(key), path, f"keys must be plain text, got {shown}")
                continue
            name = str(key.value)
            if name in entries:
                first = _line(entries[name].key)
                self.error(
                    _line(key), _join(path, name), f"duplicate key (first defined at line {first})"
                )
                continue
            entries[name] = _Entry(key, value)
        return entries

    def sequence(self, node: Node, path: str, what: str = "a list") -> list[Node] | None:
        if not self.usable(node, path):
            return None
        if not isinstance(node, SequenceNode):
            self.error(_line(node), path, f"expected {what}, got {_describe(node)}")
            return None
        return list(node.value)

    def scalar(self, node: Node, path: str, tags: Iterable[str], what: str) -> ScalarNode | None:
        if not self.usable(node, path):
            return None
        if not isinstance(node, ScalarNode) or str(node.tag) not in {
            f"{_YAML_TAG}{t}" for t in tags
        }:
            hint = ""
            if isinstance(node, ScalarNode) and what == "a string":
                hint = f' (write "{node.value}" for text)'
            self.error(_line(node), path, f"expected {what}, got {_describe(node)}{hint}")
            return None
        return node

    def string(self, node: Node, path: str, *, nullable: bool = False) -> Any:
        if nullable and isinstance(node, ScalarNode) and str(node.tag) == f"{_YAML_TAG}null":
            return None if self.usable(node, path) else INVALID
        got = self.scalar(node, path, ("str",), "a string")
        if got is None:
            return INVALID
        text = str(got.value)
        if not text.strip():
            self.error(_line(node), path, "expected a non-empty string")
            return INVALID
        return text

    def integer(self, node: Node, path: str, *, minimum: int | None = None) -> Any:
        got = self.scalar(node, path, ("int",), "an integer")
        if got is None:
            return INVALID
        try:
            value = _to_int(str(got.value))
        except ValueError:  # more digits than Python converts (4300)
            self.error(_line(node), path, f"number too large: {len(str(got.value))} digits")
            return INVALID
        if minimum is not None and value < minimum:
            self.error(_line(node), path, f"expected an integer >= {minimum}, got {value}")
            return INVALID
        return value

    def positive_number(self, node: Node, path: str) -> Any:
        got = self.scalar(node, path, ("int", "float"), "a number")
        if got is None:
            return INVALID
        text = str(got.value)
        try:
            value = float(_to_int(text)) if str(got.tag).endswith("int") else _to_float(text)
        except (ValueError, OverflowError):  # too many digits for an int, or for a float
            value = math.inf
        if not math.isfinite(value) or value <= 0:
            self.error(_line(node), path, f"expected a positive number, got {text}")
            return INVALID
        return value

    def boolean(self, node: Node, path: str) -> Any:
        got = self.scalar(node, path, ("bool",), "true or false")
        if got is None:
            return INVALID
        return str(got.value).lower() == "true"

    def choice(self, node: Node, path: str, choices: Iterable[str]) -> Any:
        options = list(choices)
        text = self.string(node, path)
        if text is INVALID:
            return INVALID
        if text not in options:
            self.error(_line(node), path, f"expected one of {', '.join(options)}, got {text!r}")
            return INVALID
        return text

    def string_list(self, node: Node, path: str) -> list[tuple[str, Node]] | None:
        items = self.sequence(node, path, "a list of strings")
        if items is None:
            return None
        out: list[tuple[str, Node]] = []
        for i, item in enumerate(items):
            text = self.string(item, f"{path}[{i}]")
            if text is not INVALID:
                out.append((text, item))
        return out

    def hostlist(self, node: Node, path: str) -> tuple[str, list[str]] | None:
        """A Slurm hostlist, expanded with python-hostlist (Slurm-compatible)."""
        text = self.string(node, path)
        if text is INVALID:
            return None
        try:
            names = hostlist.expand_hostlist(text)
        except hostlist.BadHostlist as exc:
            self.error(_line(node), path, f"bad hostlist {text!r}: {exc}")
            return None
        if not names:
            self.error(_line(node), path, f"hostlist {text!r} names no nodes")
            return None
        return text, names


def _field(
    entries: dict[str, _Entry], key: str, read: Callable[[Node, str], Any], path: str
) -> Any:
    """Read ``key`` with ``read`` when present; None when absent, INVALID when bad."""
    entry = entries.get(key)
    if entry is None:
        return None
    return read(entry.value, _join(path, key))


def _key_line(entries: dict[str, _Entry], key: str, default: int | None = None) -> int | None:
    entry = entries.get(key)
    return _line(entry.value) if entry is not None else default


# -- sections -------------------------------------------------------------------------------


def _read_models(v: _Validator, node: Node) -> tuple[list[GpuModel], dict[str, dict[str, Any]]]:
    """Models in file order; and, per model, the line of each field (for cross-checks)."""
    models: list[GpuModel] = []
    lines: dict[str, dict[str, Any]] = {}
    named = v.any_mapping(node, "models", "a mapping of model name to model")
    if named is None:
        return models, lines
    if not named:
        v.error(_line(node), "models", "at least one GPU model is required")
    for name, entry in named.items():
        path = _join("models", name)
        fields = v.mapping(entry.value, path, _MODEL_KEYS)
        if fields is None:
            continue
        aliases = _field(fields, "aliases", v.string_list, path)
        gres_type = _field(fields, "gres_type", lambda n, p: v.string(n, p, nullable=True), path)
        nvml = _field(fields, "nvml_names", v.string_list, path)
        memory = _field(fields, "memory_gb", lambda n, p: v.integer(n, p, minimum=1), path)
        constraint = _field(fields, "constraint", lambda n, p: v.string(n, p, nullable=True), path)
        if nvml is not None and not nvml:
            v.error(_key_line(fields, "nvml_names"), _join(path, "nvml_names"), "empty list")
        if gres_type not in (None, INVALID) and not GRES_TYPE_NAME.match(gres_type):
            v.error(
                _key_line(fields, "gres_type"),
                _join(path, "gres_type"),
                f"not a GRES type name: {gres_type!r} (letters, digits, '_', '-' and '.' only)",
            )
            gres_type = INVALID
        if INVALID in (gres_type, memory, constraint) or aliases is None and "aliases" in fields:
            continue
        if nvml is None:
            continue
        lines[name] = {k: _line(e.value) for k, e in fields.items()}
        lines[name]["_name"] = _line(entry.key)
        lines[name]["_aliases"] = [_line(n) for _, n in aliases or []]
        models.append(
            GpuModel(
                name=name,
                aliases=tuple(a for a, _ in aliases or []),
                gres_type=gres_type,
                nvml_names=tuple(n for n, _ in nvml),
                memory_gb=memory,
                constraint=constraint,
            )
        )
    return models, lines


def _check_models(
    v: _Validator,
    models: list[GpuModel],
    lines: dict[str, dict[str, Any]],
    syntax: GpuSyntax | None,
    type_required: bool,
) -> None:
    """Names and aliases must pick one model; GRES types must be tellable apart by Slurm."""
    owner: dict[str, str] = {}  # casefolded name or alias -> canonical model
    for m in models:
        key = m.name.casefold()
        if key in owner:
            v.error(
                lines[m.name]["_name"],
                _join("models", m.name),
                f"model name collides with model {owner[key]} (names are case-insensitive)",
            )
        else:
            owner[key] = m.name
    for m in models:
        alias_lines: list[int] = lines[m.name]["_aliases"]
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
                    lines[m.name]["nvml_names"],
                    f"models.{m.name}.nvml_names",
                    f"NVML name {name!r} is already listed for model {other}",
                )
            nvml_owner.setdefault(name.casefold(), m.name)
    for m in models:
        if syntax in _TYPED_SYNTAXES and type_required and m.gres_type is None:
            v.error(
                lines[m.name].get("gres_type", lines[m.name]["_name"]),
                f"models.{m.name}.gres_type",
                f"required when gpu_request.syntax is {syntax.value} and type_required is true",
            )
        if syntax is GpuSyntax.GRES_CONSTRAINT and m.constraint is None:
            v.error(
                lines[m.name].get("constraint", lines[m.name]["_name"]),
                f"models.{m.name}.constraint",
                "required when gpu_request.syntax is gres+constraint",
            )
    typed = [(m, m.gres_type) for m in models if m.gres_type is not None]
    for position, (m, mine) in enumerate(typed):
        for rival_position, (rival, theirs) in enumerate(typed):
            if rival is m:
                continue
            if mine.casefold() == theirs.casefold():
                if rival_position < position:
                    v.warn(
                        lines[m.name]["gres_type"],
                        f"models.{m.name}.gres_type",
                        f"GRES type {mine!r} is also the type of model {rival.name}: "
                        "Slurm cannot tell these models apart",
                    )
            elif mine.casefold() in theirs.casefold():
                v.warn(
                    lines[m.name]["gres_type"],
                    f"models.{m.name}.gres_type",
                    f"GRES type {mine!r} is a substring of {theirs!r} "
                    f"(model {rival.name}): Slurm matches types by substring, so asking for "
                    f"{mine!r} can also select {rival.name} GPUs",
                )


def _read_partitions(v: _Validator, node: Node) -> list[tuple[Partition, int, int]]:
    """Partitions, each with the line of its ``nodes`` value and of its ``default`` flag."""
    out: list[tuple[Partition, int, int]] = []
    named = v.any_mapping(node, "partitions", "a mapping of partition name to partition")
    if named is None:
        return out
    for name, entry in named.items():
        path = _join("partitions", name)
        fields = v.mapping(entry.value, path, _PARTITION_KEYS)
        if fields is None:
            continue
        hosts = _field(fields, "nodes", v.hostlist, path)
        time_limit = _field(fields, "time_limit", v.string, path)
        if time_limit not in (None, INVALID) and not _TIME_LIMIT.match(time_limit):
            v.error(
                _key_line(fields, "time_limit"),
                _join(path, "time_limit"),
                f"not a Slurm time limit: {time_limit!r} (e.g. 2-00:00:00, 12:00:00, 30)",
            )
            time_limit = INVALID
        default = _field(fields, "default", v.boolean, path)
        defaults = _read_defaults(v, fields.get("defaults"), _join(path, "defaults"))
        if hosts is None or INVALID in (time_limit, default, defaults):
            continue
        text, names = hosts
        out.append(
            (
                Partition(
                    name=name,
                    nodes=text,
                    node_names=tuple(names),
                    time_limit=time_limit,
                    default=bool(default),
                    defaults=defaults,
                ),
                _key_line(fields, "nodes") or _line(entry.key),
                _key_line(fields, "default") or _line(entry.key),
            )
        )
    return out


def _read_defaults(v: _Validator, entry: _Entry | None, path: str) -> Any:
    if entry is None:
        return PartitionDefaults()
    fields = v.mapping(entry.value, path, _DEFAULTS_KEYS)
    if fields is None:
        return INVALID
    account = _field(fields, "account", v.string, path)
    qos = _field(fields, "qos", v.string, path)
    cpus = _field(fields, "cpus_per_gpu", lambda n, p: v.integer(n, p, minimum=1), path)
    mem = _field(fields, "mem_per_gpu", v.string, path)
    if mem not in (None, INVALID) and not MEMORY_SIZE.match(mem):
        v.error(
            _key_line(fields, "mem_per_gpu"),
            _join(path, "mem_per_gpu"),
            f"not a Slurm memory size: {mem!r} (e.g. 64G, 500M, 1T)",
        )
        mem = INVALID
    if INVALID in (account, qos, cpus, mem):
        return INVALID
    return PartitionDefaults(account=account, qos=qos, cpus_per_gpu=cpus, mem_per_gpu=mem)


def _read_gpus(
    v: _Validator,
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
        model = _field(fields, "model", v.string, spath)
        bus_id = _field(fields, "bus_id", v.string, spath)
        uuid = _field(fields, "uuid", v.string, spath)
        if model not in (None, INVALID) and defined is not None and model not in defined:
            known = ", ".join(defined) or "none"
            near = next((m.name for m in defined.values() if m and m.matches(model)), None)
            hint = f" (write the canonical name {near!r})" if near else ""
            v.error(
                _key_line(fields, "model"),
                _join(spath, "model"),
                f"unknown model {model!r}{hint}; defined models: {known}",
            )
            model = INVALID
        if bus_id not in (None, INVALID):
            line = _key_line(fields, "bus_id")
            try:
                bus_id = normalise_bus_id(bus_id)
            except ValueError as exc:
                v.error(line, _join(spath, "bus_id"), str(exc))
                bus_id = INVALID
            else:
                if bus_id in used:
                    v.error(
                        line,
                        _join(spath, "bus_id"),
                        f"bus ID {bus_id} is already used by slot {used[bus_id]} of this node",
                    )
                    bus_id = INVALID
                else:
                    used[bus_id] = i
                    if previous is not None and bus_id < previous[0]:
                        v.error(
                            line,
                            _join(spath, "bus_id"),
                            f"GPUs must be listed in PCI bus order: {bus_id} comes before "
                            f"{previous[0]} (slot {previous[1]})",
                        )
                        bus_id = INVALID
                    previous = (str(bus_id), i) if bus_id is not INVALID else previous
        if uuid not in (None, INVALID):
            uuid = _check_uuid(
                v, uuid, _key_line(fields, "uuid"), _join(spath, "uuid"), names, i, uuids
            )
        if INVALID in (model, bus_id, uuid) or model is None:
            bad = True
            continue
        slots.append(NodeGpu(slot=i, model=model, bus_id=bus_id, uuid=uuid))
    return None if bad else tuple(slots)


def _check_uuid(
    v: _Validator,
    uuid: str,
    line: int | None,
    path: str,
    names: list[str],
    slot: int,
    uuids: dict[str, str],
) -> Any:
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
    v: _Validator, node: Node, defined: dict[str, GpuModel | None] | None
) -> NodeMap:
    """Node name -> GPU slots. Nodes of one entry share one tuple (cheap for 10,000 nodes)."""
    nodes: dict[str, tuple[NodeGpu, ...]] = {}
    lines: dict[str, int] = {}
    where: dict[str, int] = {}  # node -> entry index
    uuids: dict[str, str] = {}
    items = v.sequence(node, "node_map", "a list of {nodes, gpus} entries")
    if items is None:
        return NodeMap(nodes, lines)
    for i, item in enumerate(items):
        path = f"node_map[{i}]"
        fields = v.mapping(item, path, _NODE_ENTRY_KEYS)
        if fields is None:
            continue
        hosts = _field(fields, "nodes", v.hostlist, path)
        names = hosts[1] if hosts is not None else []
        gpus = None
        if "gpus" in fields:
            gpus = _read_gpus(v, fields["gpus"].value, f"{path}.gpus", defined, names, uuids)
        if hosts is None:
            continue
        line = _key_line(fields, "nodes", _line(item))
        assert line is not None
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
        for first, dup in twice.items():
            shown = hostlist.collect_hostlist(dup)
            v.error(
                line,
                _join(path, "nodes"),
                f"{shown} already defined in node_map[{first}] (line {lines[dup[0]]})",
            )
    return NodeMap(nodes, lines)


def _read_prolog(v: _Validator, entry: _Entry | None) -> Any:
    if entry is None:
        return PrologPolicy()
    fields = v.mapping(entry.value, "prolog", _PROLOG_KEYS)
    if fields is None:
        return INVALID
    on_error = _field(
        fields, "on_error", lambda n, p: v.choice(n, p, [e.value for e in OnError]), "prolog"
    )
    deadline = _field(fields, "deadline_seconds", v.positive_number, "prolog")
    log = _field(fields, "log", v.string, "prolog")
    if INVALID in (on_error, deadline, log):
        return INVALID
    base = PrologPolicy()
    return PrologPolicy(
        on_error=OnError(on_error) if on_error else base.on_error,
        deadline_seconds=deadline if deadline is not None else base.deadline_seconds,
        log_path=log if log is not None else base.log_path,
    )


def _build(v: _Validator, root: Node, path: Path) -> Site | None:
    top = v.mapping(root, "", _TOP_KEYS, "a mapping of site settings at the top")
    if top is None:
        return None
    name = _field(top, "site", v.string, "")
    cluster_name = _field(top, "cluster_name", lambda n, p: v.string(n, p, nullable=True), "")
    node_command = _field(top, "node_command", lambda n, p: v.string(n, p, nullable=True), "")
    if isinstance(node_command, str):
        try:  # job scripts run it split into words (render.default_node_command)
            shlex.split(node_command)
        except ValueError as exc:
            line = _key_line(top, "node_command")
            v.error(line, "node_command", f"not a command line: {str(exc).lower()}")
            node_command = INVALID

    syntax: GpuSyntax | None = None
    type_required = False
    request = top.get("gpu_request")
    if request is not None:
        fields = v.mapping(request.value, "gpu_request", _GPU_REQUEST_KEYS)
        if fields is not None:
            raw = _field(
                fields,
                "syntax",
                lambda n, p: v.choice(n, p, [s.value for s in GpuSyntax]),
                "gpu_request",
            )
            syntax = GpuSyntax(raw) if raw not in (None, INVALID) else None
            required = _field(fields, "type_required", v.boolean, "gpu_request")
            type_required = bool(required) if required is not INVALID else False

    models: list[GpuModel] = []
    if "models" in top:
        models, model_lines = _read_models(v, top["models"].value)
        _check_models(v, models, model_lines, syntax, type_required)
    # Node-map models are checked against the names in the models section, even where a
    # model has a bad field; without a readable models section they cannot be checked.
    defined: dict[str, GpuModel | None] | None = None
    if "models" in top and isinstance(top["models"].value, MappingNode):
        defined = {m.name: m for m in models}
        for key, _ in top["models"].value.value:
            if isinstance(key, ScalarNode):
                defined.setdefault(str(key.value), None)

    node_map = NodeMap({}, {})
    if "node_map" in top:
        node_map = _read_node_map(v, top["node_map"].value, defined)

    partitions: list[Partition] = []
    if "partitions" in top:
        read = _read_partitions(v, top["partitions"].value)
        default_seen: tuple[str, int] | None = None
        for partition, nodes_line, default_line in read:
            missing = [n for n in partition.node_names if n not in node_map.lines]
            if missing and "node_map" in top:
                v.error(
                    nodes_line,
                    f"partitions.{partition.name}.nodes",
                    f"not in node_map: {hostlist.collect_hostlist(missing)}",
                )
            if partition.default:
                if default_seen is not None:
                    v.error(
                        default_line,
                        f"partitions.{partition.name}.default",
                        f"partition {default_seen[0]} is already the default "
                        f"(line {default_seen[1]}); at most one partition can be",
                    )
                else:
                    default_seen = (partition.name, default_line)
            partitions.append(partition)

    prolog = _read_prolog(v, top.get("prolog"))
    templates = _field(top, "templates", v.string, "")
    templates_dir: Path | None = None
    if templates not in (None, INVALID):
        templates_dir = Path(os.path.normpath(path.absolute().parent / templates))
        if not templates_dir.is_dir():
            v.error(_key_line(top, "templates"), "templates", f"not a directory: {templates_dir}")

    if v.failed or syntax is None or name is INVALID or name is None:
        return None
    if INVALID in (cluster_name, node_command):
        return None
    return Site(
        name=name,
        cluster_name=cluster_name,
        source=path.absolute(),
        gpu_syntax=syntax,
        type_required=type_required,
        models=tuple(models),
        partitions=tuple(partitions),
        node_map=node_map,
        prolog=prolog,
        templates_dir=templates_dir,
        node_command=node_command,
    )


# -- reading the file -----------------------------------------------------------------------


def _yaml_issue(file: str, exc: BaseException) -> ConfigIssue:
    """One line for a parser error: where the parser stopped, and what it expected."""
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = int(mark.line) + 1 if mark is not None else None
        problem = exc.problem or ""
        context = exc.context or ""
        start = exc.context_mark
        if context and start is not None and mark is not None and start.line != mark.line:
            context += f" (started at line {int(start.line) + 1})"
        text = ": ".join(p for p in (context, problem) if p)
        return ConfigIssue(file, line, "", f"YAML syntax error: {text}")
    return ConfigIssue(file, None, "", f"YAML error: {str(exc).splitlines()[0]}")


def _read_text(path: Path, file: str) -> tuple[str | None, list[ConfigIssue]]:
    try:
        with path.open("rb") as fh:
            if os.fstat(fh.fileno()).st_size > MAX_BYTES:
                return None, [
                    ConfigIssue(
                        file, None, "", f"file is larger than {MAX_BYTES // (1024 * 1024)} MiB"
                    )
                ]
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        return None, [ConfigIssue(file, None, "", f"cannot read: {exc.strerror or exc}")]
    if len(raw) > MAX_BYTES:
        return None, [ConfigIssue(file, None, "", f"file is larger than {MAX_BYTES >> 20} MiB")]
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return None, [
            ConfigIssue(
                file, line, "", f"not UTF-8 text: byte 0x{raw[exc.start]:02x} cannot be decoded"
            )
        ]
    return text, []


def _compose(text: str, file: str) -> tuple[Node | None, list[ConfigIssue]]:
    """The YAML node tree (with line numbers). libyaml (ruamel.yaml.clib) composes a large site
    ~5x faster than the pure-Python parser. The pure parser takes a document that libyaml
    rejects (its error messages are the ones reported) and any document that may use anchors
    or aliases: only its nodes carry the anchor that the validator refuses."""
    if "&" not in text and "*" not in text:
        try:
            return _compose_with(text, file, pure=False)
        except YAMLError:
            pass
    return _compose_with(text, file, pure=True)


def _compose_with(text: str, file: str, *, pure: bool) -> tuple[Node | None, list[ConfigIssue]]:
    yaml = YAML(typ="safe", pure=pure)  # composing only; the rt scanner is slower
    try:
        root = yaml.compose(text)
    except YAMLError as exc:
        if not pure:
            raise
        if getattr(exc, "position", None) is not None and not isinstance(exc, MarkedYAMLError):
            line = text[: exc.position].count("\n") + 1  # type: ignore[attr-defined]
            reason = getattr(exc, "reason", None) or str(exc).splitlines()[0]
            return None, [ConfigIssue(file, line, "", f"YAML error: {reason}")]
        return None, [_yaml_issue(file, exc)]
    except RecursionError:
        return None, [ConfigIssue(file, None, "", "YAML nesting is too deep")]
    if root is None:
        return None, [ConfigIssue(file, 1, "", "empty file: expected a site config mapping")]
    return root, []


def validate_site_file(path: Path) -> tuple[Site | None, list[ConfigIssue]]:
    """Every problem in one site file, warnings included; the Site when there is no error."""
    path = Path(path)
    file = str(path)
    text, issues = _read_text(path, file)
    if text is None:
        return None, issues
    root, issues = _compose(text, file)
    if root is None:
        return None, issues
    validator = _Validator(file)
    site = _build(validator, root, path)
    ordered = sorted(validator.issues, key=lambda i: (i.line or 0, i.warning))
    return (None if validator.failed else site), ordered


def load_site(path: Path) -> Site:
    """The site in ``path``; raises ConfigError listing every problem (warnings included)."""
    site, issues = validate_site_file(path)
    if site is None:
        if not issues:  # cannot happen; keep the promise of never returning None silently
            issues = [ConfigIssue(str(path), None, "", "site config could not be read")]
        raise ConfigError(issues)
    return site
