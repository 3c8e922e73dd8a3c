"""``clusterjob site probe``: a node's real GPUs as a node-map entry, and merging it in.

Writing node maps by hand is where slot order goes wrong; NVML knows each GPU's PCI bus ID,
so the entry is generated in PCI bus order (slot i == Slurm GRES index i). ``--merge`` edits
the site file with ruamel.yaml's round-trip mode so the admin's comments and key order stay,
and validates the result with the loader before anything is written.
"""

from __future__ import annotations

import io
import os
import socket
import stat
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import hostlist

from clusterjob.errors import ConfigError, ConfigIssue, UsageError
from clusterjob.gpu.inventory import GpuInventory, read_inventory
from clusterjob.gpu.models import model_for_nvml_name
from clusterjob.site.loader import validate_site_file
from clusterjob.site.model import Site


@dataclass(frozen=True)
class ProbedGpu:
    slot: int
    nvml_name: str | None
    model: str | None  # the site's canonical model; None when no model lists the NVML name
    bus_id: str
    uuid: str | None


@dataclass(frozen=True)
class ProbedNode:
    node: str
    gpus: tuple[ProbedGpu, ...]  # PCI bus order

    @property
    def unknown(self) -> tuple[ProbedGpu, ...]:
        return tuple(g for g in self.gpus if g.model is None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpus": [
                {
                    "slot": g.slot,
                    "model": g.model,
                    "nvml_name": g.nvml_name,
                    "bus_id": g.bus_id,
                    "uuid": g.uuid,
                }
                for g in self.gpus
            ],
        }


def this_node(environ: Mapping[str, str] | None = None) -> str:
    """The Slurm node name here: $SLURMD_NODENAME (inside a job or hook), else the short
    hostname, which is what Slurm node names usually are."""
    env = os.environ if environ is None else environ
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def describe(inventory: GpuInventory, node: str, site: Site | None) -> ProbedNode:
    """The inventory as node-map slots; models looked up by NVML name in ``site``."""
    nvml_names = {m.name: m.nvml_names for m in site.models} if site else {}
    gpus = []
    for slot, gpu in enumerate(sorted(inventory.gpus, key=lambda g: g.bus_id)):
        model = model_for_nvml_name(gpu.name, nvml_names)
        gpus.append(ProbedGpu(slot, gpu.name, model, gpu.bus_id, gpu.uuid))
    return ProbedNode(node, tuple(gpus))


def probe(node: str | None = None, site: Site | None = None) -> ProbedNode:
    """Read NVML on this node (raises NvmlError) and describe it."""
    return describe(read_inventory(timeout=30), node or this_node(), site)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def entry_yaml(probed: ProbedNode) -> str:
    """The node-map entry as YAML to paste under ``node_map:`` (two-space indent)."""
    lines = [f"  - nodes: {probed.node}", "    gpus:"]
    if not probed.gpus:
        lines[-1] = "    gpus: []"
    for g in probed.gpus:
        fields = [f"model: {g.model if g.model else _quote(g.nvml_name or 'unknown')}"]
        fields.append(f"bus_id: {_quote(g.bus_id)}")
        if g.uuid:
            fields.append(f"uuid: {_quote(g.uuid)}")
        line = "      - {" + ", ".join(fields) + "}"
        if g.model is None:
            line += (
                f"  # define a model with nvml_names: [{_quote(g.nvml_name or '')}] "
                "and write its name here"
            )
        lines.append(line)
    return "\n".join(lines) + "\n"


# --- merging into a site file ------------------------------------------------------------------


@dataclass(frozen=True)
class MergeResult:
    path: Path
    action: str  # "updated" | "split" | "appended" | "unchanged"
    text: str  # the file's new text

    def __str__(self) -> str:
        return {
            "updated": f"{self.path}: node map entry updated",
            "split": f"{self.path}: node moved out of its hostlist entry into its own",
            "appended": f"{self.path}: node map entry appended",
            "unchanged": f"{self.path}: node map entry already matches; nothing written",
        }[self.action]


def _yaml() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap an admin's long lines
    return yaml


def _slot_map(g: ProbedGpu) -> Any:
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    item = CommentedMap()
    assert g.model is not None
    item["model"] = g.model
    item["bus_id"] = DoubleQuotedScalarString(g.bus_id)
    if g.uuid:
        item["uuid"] = DoubleQuotedScalarString(g.uuid)
    item.fa.set_flow_style()
    return item


def _gpu_seq(probed: ProbedNode, with_uuid: bool = True) -> Any:
    from ruamel.yaml.comments import CommentedSeq

    seq = CommentedSeq()
    for g in probed.gpus:
        seq.append(_slot_map(g if with_uuid else replace(g, uuid=None)))
    return seq


def _same_gpus(existing: Any, probed: ProbedNode) -> bool:
    """Same models in the same slots, and the same bus IDs where the map gives them."""
    from clusterjob.pci import normalise_bus_id

    if not isinstance(existing, list) or len(existing) != len(probed.gpus):
        return False
    for slot, g in zip(existing, probed.gpus, strict=True):
        if not isinstance(slot, Mapping) or slot.get("model") != g.model:
            return False
        bus = slot.get("bus_id")
        if bus is not None and normalise_bus_id(str(bus)) != g.bus_id:
            return False
    return True


def _update_slots(existing: Any, probed: ProbedNode) -> bool:
    """Fill in bus IDs and UUIDs of matching slots in place (keeps their style); changed?"""
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    changed = False
    for slot, g in zip(existing, probed.gpus, strict=True):
        for key, value in (("bus_id", g.bus_id), ("uuid", g.uuid)):
            # a missing bus ID or UUID is filled in; a different UUID means a swapped board
            if value and (slot.get(key) is None or (key == "uuid" and slot.get(key) != value)):
                slot[key] = DoubleQuotedScalarString(value)
                changed = True
    return changed


def _same_style(old: Any, new: str) -> Any:
    """``new`` written with the quotes the admin used for ``old``."""
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString, SingleQuotedScalarString

    if isinstance(old, DoubleQuotedScalarString):
        return DoubleQuotedScalarString(new)
    if isinstance(old, SingleQuotedScalarString):
        return SingleQuotedScalarString(new)
    return new


def _mapping_indent(text: str) -> int:
    """How far the file indents a nested mapping (ruamel guesses sequence indents only)."""
    lines = [
        line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    for above, line in zip(lines, lines[1:], strict=False):
        if not above[0].isspace() and above.rstrip().endswith(":"):
            stripped = line.lstrip()
            if line[0].isspace() and not stripped.startswith("-"):
                return len(line) - len(stripped)
    return 2


def merge_text(text: str, probed: ProbedNode, file: str = "<site>") -> tuple[str, str]:
    """The site file text with ``probed``'s entry merged in, and what was done."""
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.util import load_yaml_guess_indent

    if probed.unknown:
        g = probed.unknown[0]
        raise UsageError(
            f"{file}: GPU {g.bus_id} of {probed.node} is {g.nvml_name!r}, which no model in "
            f"the file lists in nvml_names; add it to a model (or define one) first"
        )
    _, sequence, offset = load_yaml_guess_indent(text)
    yaml = _yaml()
    yaml.indent(mapping=_mapping_indent(text), sequence=sequence or 2, offset=offset or 0)
    data: Any = yaml.load(text)
    if not isinstance(data, MutableMapping):
        raise ConfigError(ConfigIssue(file, 1, "", "not a site config mapping"))
    node_map = data.get("node_map")
    if node_map is None:
        from ruamel.yaml.comments import CommentedSeq

        node_map = data["node_map"] = CommentedSeq()
    if not isinstance(node_map, list):
        raise ConfigError(ConfigIssue(file, None, "node_map", "expected a list of entries"))

    action = "appended"
    for i, entry in enumerate(node_map):
        if not isinstance(entry, MutableMapping) or "nodes" not in entry:
            continue
        try:
            names = hostlist.expand_hostlist(str(entry["nodes"]))
        except hostlist.BadHostlist:
            continue
        if probed.node not in names:
            continue
        gpus = entry.get("gpus")
        if len(names) == 1:
            if _same_gpus(gpus, probed):
                action = "updated" if _update_slots(gpus, probed) else "unchanged"
            else:
                entry["gpus"] = _gpu_seq(probed)
                action = "updated"
        elif _same_gpus(gpus, probed):
            action = "unchanged"  # a UUID names one GPU: it cannot go on a shared entry
        else:
            rest = [n for n in names if n != probed.node]
            entry["nodes"] = _same_style(entry["nodes"], hostlist.collect_hostlist(rest))
            new = CommentedMap()
            new["nodes"] = probed.node
            new["gpus"] = _gpu_seq(probed)
            node_map.insert(i + 1, new)
            action = "split"
        break
    else:
        new = CommentedMap()
        new["nodes"] = probed.node
        new["gpus"] = _gpu_seq(probed)
        node_map.append(new)
    if action == "unchanged":
        return text, action
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue(), action


def merge_file(path: Path, probed: ProbedNode) -> MergeResult:
    """Merge ``probed`` into the site file at ``path``: validated first, written atomically
    (a temporary file in the same directory, renamed over it), file mode kept."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise ConfigError(
            ConfigIssue(str(path), None, "", f"cannot read: {exc.strerror}")
        ) from None
    new_text, action = merge_text(text, probed, str(path))
    if action == "unchanged":
        return MergeResult(path, action, text)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(new_text)
        site, issues = validate_site_file(tmp)
        if site is None:
            raise ConfigError(
                [
                    i.replace(file=str(path), message=i.message + " (merge not written)")
                    for i in issues
                    if not i.warning
                ]
            )
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return MergeResult(path, action, new_text)
