"""Which GPUs of this machine a ``clusterjob run`` gets: pure functions over a GpuInventory.

Nothing here reads NVML or takes a lock, so every rule (model, free memory, running compute
processes, claims, PCI order) is tested directly on hand-made inventories.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from clusterjob.errors import UsageError
from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.gpu.models import model_for_nvml_name
from clusterjob.site.model import Site
from clusterjob.workstation.known_models import known_model, known_model_for_nvml_name, model_key

GIB = 1024**3


def gpu_key(gpu: Gpu) -> str:
    """What a claim is keyed by: the UUID (stable across reboots and re-cabling), else bus ID."""
    return gpu.uuid or gpu.bus_id


def describe_gpu(position: int, gpu: Gpu) -> str:
    """``GPU 2 (0000:88:00.0)``: its place in PCI bus order, which nvidia-smi also shows."""
    return f"GPU {position} ({gpu.bus_id})"


def format_size(size: int) -> str:
    return f"{size / GIB:.1f} GiB"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt])(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """``20G``, ``20GB``, ``20GiB``, ``512M`` -> bytes (binary units, as NVML counts memory).

    A bare number is refused: MB or GB would be a guess, and a wrong guess is a wrong GPU.
    """
    m = _SIZE.match(text)
    if not m:
        raise UsageError(f"--min-free-mem {text!r}: give a size with a unit, e.g. 20G or 512M")
    return int(float(m[1]) * _UNITS[m[2].lower()])


@dataclass(frozen=True)
class ModelCatalog:
    """How this machine's GPUs are named: a site's node map and models, or the built-in table."""

    source: str  # for messages: "site lab-a, node ws01" or "built-in model table"
    site: Site | None = None
    slot_models: Mapping[str, str] | None = None  # bus_id -> canonical model (from a node map)

    def model_of(self, gpu: Gpu) -> str:
        """Canonical model of ``gpu``; a card nobody knows keeps its NVML name."""
        if self.slot_models and gpu.bus_id in self.slot_models:
            return self.slot_models[gpu.bus_id]
        if self.site is not None:
            nvml_names = {m.name: m.nvml_names for m in self.site.models}
            site_model = model_for_nvml_name(gpu.name, nvml_names)
            if site_model is not None:
                return site_model
        if gpu.name:
            known = known_model_for_nvml_name(gpu.name)
            return known.name if known else gpu.name
        return "unknown"

    def resolve(self, spec: str, present: Mapping[str, str]) -> str | None:
        """Canonical model for what the user typed; ``present`` maps models here to NVML names.

        The site's names and aliases come first, then the built-in table, then the exact
        canonical or NVML name of a GPU on this machine.
        """
        if self.site is not None:
            site_model = self.site.model(spec)
            if site_model is not None:
                return site_model.name
        known = known_model(spec)
        if known is not None:
            return known.name
        key = model_key(spec)
        for model, nvml_name in present.items():
            if key in (model_key(model), model_key(nvml_name)):
                return model
        return None


def builtin_catalog() -> ModelCatalog:
    return ModelCatalog(source="built-in model table")


def site_catalog(site: Site, node_names: tuple[str, ...], inventory: GpuInventory) -> ModelCatalog:
    """The catalog a site gives when its node map describes this machine; else the built-in one.

    Node-map slots are matched by bus ID where the map gives one, else by position (slot i is
    the i-th GPU in PCI bus order, the schema's definition).
    """
    slots = None
    node = None
    for name in node_names:
        slots = site.node_map.gpus(name)
        if slots is not None:
            node = name
            break
    if slots is None:
        return ModelCatalog(
            source=f"built-in model table (site {site.name} has no node "
            f"{' or '.join(dict.fromkeys(node_names))})",
            site=site,
        )
    ordered = sorted(inventory.gpus, key=lambda g: g.bus_id)
    slot_models: dict[str, str] = {}
    for slot in slots:
        if slot.bus_id is not None:
            slot_models[slot.bus_id] = slot.model
        elif slot.slot < len(ordered):
            slot_models.setdefault(ordered[slot.slot].bus_id, slot.model)
    return ModelCatalog(source=f"site {site.name}, node {node}", site=site, slot_models=slot_models)


@dataclass(frozen=True)
class GpuRequest:
    count: int
    model: str | None = None  # as typed; None: whatever this machine has, if one model
    min_free_mem: int | None = None  # bytes
    allow_shared: bool = False

    def describe(self, model: str | None = None) -> str:
        model = f" {model or self.model}" if (model or self.model) else ""
        mem = f" with {format_size(self.min_free_mem)} free" if self.min_free_mem else ""
        return f"{self.count}{model} GPU{'s' if self.count != 1 else ''}{mem}"


def machine_summary(inventory: GpuInventory, catalog: ModelCatalog) -> str:
    """``2x A100 (NVIDIA A100-SXM4-80GB), 1x V100 (Tesla V100-SXM2-32GB)``."""
    counts: dict[str, int] = {}
    names: dict[str, str] = {}
    for gpu in inventory.gpus:
        model = catalog.model_of(gpu)
        counts[model] = counts.get(model, 0) + 1
        names.setdefault(model, gpu.name or "?")
    if not counts:
        return "no GPUs"
    return ", ".join(
        f"{n}x {m}" + (f" ({names[m]})" if names[m] != m else "") for m, n in counts.items()
    )


def gpus_for_request(
    inventory: GpuInventory, catalog: ModelCatalog, request: GpuRequest
) -> tuple[str, tuple[Gpu, ...]]:
    """The model asked for and every GPU of it here, in PCI bus order.

    Raises UsageError when the request can never be met on this machine, whatever runs on it:
    unknown model, too few GPUs of it, or too little memory on them even when idle.
    """
    if request.count < 1:
        raise UsageError(f"--gpus {request.count}: ask for at least 1 GPU")
    here = f"this machine has {machine_summary(inventory, catalog)} ({catalog.source})"
    ordered = tuple(sorted(inventory.gpus, key=lambda g: g.bus_id))
    present: dict[str, str] = {}
    for gpu in ordered:
        present.setdefault(catalog.model_of(gpu), gpu.name or "?")
    if request.model is None:
        if len(present) > 1:
            raise UsageError(
                f"--gpus {request.count} without --model on a machine with several GPU models: "
                f"say which with --model ({here})"
            )
        model = next(iter(present), "")
    else:
        resolved = catalog.resolve(request.model, present)
        if resolved is None:
            raise UsageError(f"unknown GPU model {request.model!r}: {here}")
        model = resolved
    of_model = tuple(g for g in ordered if catalog.model_of(g) == model)
    if len(of_model) < request.count:
        have = len(of_model)
        if have == 0:
            raise UsageError(f"--model {request.model}: no {model} GPU on this machine; {here}")
        raise UsageError(
            f"--gpus {request.count} --model {model}: "
            f"only {have} {model} GPU{'s' if have != 1 else ''} here; {here}"
        )
    if request.min_free_mem is not None:
        big_enough = [
            g for g in of_model if g.memory_total is None or g.memory_total >= request.min_free_mem
        ]
        if len(big_enough) < request.count:
            totals = ", ".join(
                sorted({format_size(g.memory_total) for g in of_model if g.memory_total})
            )
            raise UsageError(
                f"--min-free-mem {format_size(request.min_free_mem)}: only {len(big_enough)} "
                f"{model} GPU(s) here have that much memory in all (total per GPU: {totals})"
            )
    return model, of_model


@dataclass(frozen=True)
class Choice:
    """The GPUs chosen, or none, with why each GPU of the model was passed over."""

    chosen: tuple[Gpu, ...]
    passed_over: tuple[tuple[Gpu, str], ...]  # (gpu, reason), PCI bus order

    @property
    def ok(self) -> bool:
        return bool(self.chosen)


def choose_gpus(
    candidates: tuple[Gpu, ...],
    request: GpuRequest,
    claimed: Mapping[str, str],
) -> Choice:
    """Pick ``request.count`` of ``candidates`` (GPUs of the model), deterministically.

    ``claimed`` maps gpu_key -> who holds it; a claimed GPU is never shared. Without
    ``allow_shared`` a GPU with any running compute process is skipped; with it, the GPUs
    with the fewest processes win. Ties go to the lowest PCI bus ID. A GPU whose process
    list NVML cannot give (None) counts as having none: its memory use still counts.
    """
    eligible: list[Gpu] = []
    passed: list[tuple[Gpu, str]] = []
    for gpu in sorted(candidates, key=lambda g: g.bus_id):
        reason = _unusable(gpu, request, claimed)
        if reason:
            passed.append((gpu, reason))
        else:
            eligible.append(gpu)
    if request.allow_shared:
        eligible.sort(key=lambda g: (len(g.processes or ()), g.bus_id))
    if len(eligible) < request.count:
        return Choice(chosen=(), passed_over=tuple(passed))
    chosen = sorted(eligible[: request.count], key=lambda g: g.bus_id)
    return Choice(chosen=tuple(chosen), passed_over=tuple(passed))


def _unusable(gpu: Gpu, request: GpuRequest, claimed: Mapping[str, str]) -> str | None:
    if gpu.lost:
        return "lost (NVML: GPU is lost)"
    key = gpu_key(gpu)
    if key in claimed:
        return f"claimed by {claimed[key]}"
    if request.min_free_mem is not None:
        if gpu.memory_total is None or gpu.memory_used is None:
            return "free memory unknown (NVML cannot tell)"
        free = gpu.memory_total - gpu.memory_used
        if free < request.min_free_mem:
            return f"only {format_size(free)} free"
    if not request.allow_shared and gpu.processes:
        shown = ", ".join(f"pid {p.pid} {p.name or '?'}" for p in gpu.processes[:3])
        more = f", +{len(gpu.processes) - 3} more" if len(gpu.processes) > 3 else ""
        n = len(gpu.processes)
        return f"in use by {n} compute process{'es' if n != 1 else ''} ({shown}{more})"
    return None


def busy_message(
    model: str,
    request: GpuRequest,
    choice: Choice,
    positions: Mapping[str, int],
) -> str:
    """Why the request cannot be met now, naming each busy GPU and who holds it."""
    parts = [
        f"{describe_gpu(positions.get(g.bus_id, g.index), g)} {reason}"
        for g, reason in choice.passed_over
    ]
    return f"no {request.describe(model)} free now: " + "; ".join(parts)


def pci_positions(inventory: GpuInventory) -> dict[str, int]:
    """bus_id -> position in PCI bus order among all GPUs of the machine."""
    return {g.bus_id: i for i, g in enumerate(sorted(inventory.gpus, key=lambda g: g.bus_id))}
