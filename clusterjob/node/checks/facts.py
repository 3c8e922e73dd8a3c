"""The facts every check reads: what the node map and the job say, and what NVML sees.

One frozen value per preflight. What several checks derive (which GPU sits in which slot,
which slots the job has) is worked out here once, lazily, so the checks stay one small
function each. Slot i is Slurm GRES index i, the i-th GPU in PCI bus order, except where the
map puts a GPU in MIG mode: there each slice is a GRES index of its own (``gres_units``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from functools import cached_property

from clusterjob.gpu.inventory import Gpu, GpuInventory, MigDevice
from clusterjob.gpu.models import model_for_nvml_name
from clusterjob.node.allocation import Allocation, Context
from clusterjob.record import Record
from clusterjob.site.nodemodel import GresUnit, NodeGpu, gres_units

__all__ = ["Facts", "JobSlice", "Need"]


class JobSlice(Record):
    """A MIG slice the job was given: named by a GRES index or a MIG UUID, with its GPU and
    the MIG device NVML lists for it (None: NVML lists none there)."""

    __slots__ = ("named", "gpu", "device", "unit")

    named: str  # "GRES index 2" or the MIG UUID of CUDA_VISIBLE_DEVICES
    gpu: Gpu
    device: MigDevice | None
    unit: GresUnit | None  # the map's slice, when named by GRES index

    def __init__(
        self, named: str, gpu: Gpu, device: MigDevice | None, unit: GresUnit | None = None
    ) -> None:
        self._fill(named, gpu, device, unit)


def unit_device(unit: GresUnit, gpu: Gpu) -> MigDevice | None:
    """The MIG device NVML lists for a map slice: the one of its GPU instance id where the map
    gives it, else the one at its position (NVML's MIG device index order)."""
    devices = gpu.mig_devices or ()
    if unit.gpu_instance is not None:
        return next((m for m in devices if m.gpu_instance == unit.gpu_instance), None)
    position = unit.slice or 0
    return devices[position] if position < len(devices) else None


class Need(str, Enum):
    """A fact a check cannot run without; the runner skips the check when it is absent."""

    NODE_MAP = "node_map"  # the node is in the site's node map
    ALLOCATION = "allocation"  # the job's GPUs, as far as the environment tells
    EXPECT_MODEL = "expect_model"  # the GPU model the job asked for
    EXPECT_COUNT = "expect_count"  # how many GPUs the job asked for on this node
    JOB = "job"  # running inside the job (the Prolog runs before CUDA_DEVICE_ORDER is set)
    DRIVER_MIN = "driver_min"  # the site (or the job's partition) names a minimum driver/CUDA
    JOB_CPUS = "job_cpus"  # the CPUs the job may run on (inside the job: its affinity)


class Facts(Record):
    """Everything the checks compare. ``node_map`` is None when the node is not in the map."""

    __slots__ = (
        "node",
        "node_map",
        "models",
        "inventory",
        "allocation",
        "expect_model",
        "expect_count",
        "context",
        "cuda_device_order",
        "driver_min",
        "cuda_min",
        "severity",
        "job_cpus",
        "__dict__",  # room for the cached properties below
    )

    node: str
    node_map: tuple[NodeGpu, ...] | None
    models: Mapping[str, tuple[str, ...]]  # canonical model -> NVML names
    inventory: GpuInventory
    allocation: Allocation | None
    expect_model: str | None
    expect_count: int | None
    context: Context
    cuda_device_order: str | None  # the job's CUDA_DEVICE_ORDER (job context only)
    driver_min: str | None  # the oldest NVIDIA driver the site accepts here
    cuda_min: str | None  # the oldest CUDA driver API version, e.g. "12.4"
    severity: Mapping[str, str]  # check id -> error/warning/off
    job_cpus: frozenset[int] | None  # the job's CPUs (None: not known here)

    def __init__(
        self,
        node: str,
        node_map: tuple[NodeGpu, ...] | None,
        models: Mapping[str, tuple[str, ...]],
        inventory: GpuInventory,
        allocation: Allocation | None = None,
        expect_model: str | None = None,
        expect_count: int | None = None,
        context: Context = Context.PROLOG,
        cuda_device_order: str | None = None,
        driver_min: str | None = None,
        cuda_min: str | None = None,
        severity: Mapping[str, str] | None = None,
        job_cpus: frozenset[int] | None = None,
    ) -> None:
        self._fill(
            node,
            node_map,
            models,
            inventory,
            allocation,
            expect_model,
            expect_count,
            context,
            cuda_device_order,
            driver_min,
            cuda_min,
            {} if severity is None else severity,
            job_cpus,
        )

    def has(self, need: Need) -> bool:
        if need is Need.NODE_MAP:
            return self.node_map is not None
        if need is Need.ALLOCATION:
            return self.allocation is not None
        if need is Need.EXPECT_MODEL:
            return self.expect_model is not None
        if need is Need.EXPECT_COUNT:
            return self.expect_count is not None
        if need is Need.DRIVER_MIN:
            return self.driver_min is not None or self.cuda_min is not None
        if need is Need.JOB_CPUS:
            return self.job_cpus is not None
        return self.context is Context.JOB  # Need.JOB

    # -- which GPU is in which slot ----------------------------------------------------------

    @cached_property
    def physical(self) -> tuple[Gpu, ...]:
        """Every GPU NVML sees, in PCI bus order."""
        return tuple(sorted(self.inventory.gpus, key=lambda g: g.bus_id))

    @property
    def map_slots(self) -> tuple[NodeGpu, ...]:
        """The node map's slots for this node (none when it is not in the map)."""
        return self.node_map or ()

    @property
    def matched_by_bus_id(self) -> bool:
        """Slots are paired with GPUs by PCI bus ID when the map gives every bus ID."""
        return bool(self.map_slots) and all(s.bus_id for s in self.map_slots)

    @cached_property
    def pairs(self) -> tuple[tuple[NodeGpu, Gpu | None], ...]:
        """Each map slot with the GPU in it (None: nothing there), by bus ID or PCI order."""
        if self.matched_by_bus_id:
            by_bus = {g.bus_id: g for g in reversed(self.physical)}  # first of equal bus IDs
            return tuple((slot, by_bus.get(slot.bus_id or "")) for slot in self.map_slots)
        physical = self.physical
        return tuple(
            (slot, physical[i] if i < len(physical) else None)
            for i, slot in enumerate(self.map_slots)
        )

    @cached_property
    def extra(self) -> tuple[Gpu, ...]:
        """GPUs no map slot claims (none when the node is not in the map)."""
        if self.node_map is None:
            return ()
        if self.matched_by_bus_id:
            claimed = {g.bus_id for _, g in self.pairs if g is not None}
            return tuple(g for g in self.physical if g.bus_id not in claimed)
        return self.physical[len(self.map_slots) :]

    @cached_property
    def slot_gpu(self) -> dict[int, Gpu | None]:
        """Slot -> GPU; without a map entry, slot i is the i-th GPU in PCI order."""
        if self.node_map is None:
            return dict(enumerate(self.physical))
        return {s.slot: g for s, g in self.pairs}

    def slot_of(self, gpu: Gpu) -> int | None:
        return self._slot_of_bus.get(gpu.bus_id)

    def map_slot(self, gpu: Gpu) -> NodeGpu | None:
        """The node map's slot holding ``gpu`` (None: unmapped node or a GPU the map lacks)."""
        for slot, held in self.pairs:
            if held is not None and held.bus_id == gpu.bus_id:
                return slot
        return None

    @cached_property
    def _slot_of_bus(self) -> dict[str, int]:
        return {g.bus_id: s for s, g in self.slot_gpu.items() if g is not None}

    @property
    def match_note(self) -> str:
        """Said after a slot finding when slots were paired by position."""
        return (
            "" if self.matched_by_bus_id else " (matched by PCI order: the node map has no bus IDs)"
        )

    # -- the job's GPUs ----------------------------------------------------------------------

    @cached_property
    def uuid_matches(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Each GPU UUID (or prefix) of CUDA_VISIBLE_DEVICES with the slots it can name."""
        if self.allocation is None:
            return ()
        return tuple(
            (
                u,
                tuple(
                    s
                    for s, g in self.slot_gpu.items()
                    if g is not None and g.uuid and g.uuid.startswith(u)
                ),
            )
            for u in self.allocation.uuids
        )

    @cached_property
    def allocated(self) -> tuple[int, ...] | None:
        """The job's slots (GRES indices), by index or resolved from UUIDs; None: unknown."""
        if self.allocation is None:
            return None
        if self.allocation.slots is not None:
            return self.allocation.slots
        if self.allocation.uuids:
            return tuple(hits[0] for _, hits in self.uuid_matches if len(hits) == 1)
        return None

    @cached_property
    def units(self) -> tuple[GresUnit, ...] | None:
        """The node's GRES indices where the map puts a GPU in MIG mode (its slices count);
        None: GRES index i is slot i."""
        slots = self.map_slots
        return gres_units(slots) if any(s.mig for s in slots) else None

    def index_known(self, index: int) -> bool:
        """Whether a GRES index is one of this node's (a slot, or a slice where MIG is on)."""
        return index < len(self.units) if self.units is not None else index in self.slot_gpu

    @cached_property
    def allocated_set(self) -> frozenset[int]:
        """The job's GPU slots: those of its GRES indices (a slice's is its GPU's)."""
        if self.units is None:
            return frozenset(self.allocated or ())
        units = self.units
        return frozenset(units[i].slot.slot for i in self.allocated or () if i < len(units))

    @cached_property
    def job_gpus(self) -> tuple[tuple[int, Gpu | None], ...]:
        """The whole GPUs the job was given, by slot in order, each with its GPU (None: no
        such slot). A GPU the job has only a slice of is not here: see ``job_slices``."""
        if self.units is None:
            return tuple((s, self.slot_gpu.get(s)) for s in sorted(self.allocated_set))
        units = self.units
        whole = sorted({units[i].slot.slot for i in self.allocated or () if i < len(units)
                        and units[i].slice is None})  # fmt: skip
        return tuple((s, self.slot_gpu.get(s)) for s in whole)

    @cached_property
    def job_slices(self) -> tuple[JobSlice, ...]:
        """The MIG slices the job was given: its GRES indices that are slices in the map, and
        the MIG UUIDs of CUDA_VISIBLE_DEVICES that NVML lists; each slice once."""
        out: list[JobSlice] = []
        seen: set[tuple[str, int]] = set()
        for i in sorted(set(self.allocated or ())):
            unit = self.units[i] if self.units is not None and i < len(self.units) else None
            gpu = self.slot_gpu.get(unit.slot.slot) if unit is not None else None
            if unit is None or unit.slice is None or gpu is None:
                continue
            device = unit_device(unit, gpu)
            if device is not None:
                seen.add((gpu.bus_id, device.index))
            out.append(JobSlice(f"GRES index {i}", gpu, device, unit))
        migs = self.allocation.mig_devices if self.allocation is not None else ()
        for text in migs:
            hit = next(((g, m) for g, m in self.mig_devices if names_mig(text, g, m)), None)
            if hit is not None and (hit[0].bus_id, hit[1].index) not in seen:
                seen.add((hit[0].bus_id, hit[1].index))
                out.append(JobSlice(text, hit[0], hit[1]))
        return tuple(out)

    @cached_property
    def mig_devices(self) -> tuple[tuple[Gpu, MigDevice], ...]:
        """Every MIG device NVML lists on this node, with its GPU."""
        return tuple((g, m) for g in self.physical for m in g.mig_devices or ())

    def job_has(self, gpu: Gpu) -> bool | None:
        """Whether the job was given ``gpu``; None when the job's GPUs are unknown."""
        if self.allocated is None:
            return None
        slot = self.slot_of(gpu)
        return slot is not None and slot in self.allocated_set

    # -- words -------------------------------------------------------------------------------

    def model_of(self, gpu: Gpu) -> str | None:
        """The site's model of ``gpu`` by its NVML name, or None."""
        return model_for_nvml_name(gpu.name, self.models)

    def where(self, slot: int | None, bus_id: str | None) -> str:
        if slot is None:
            return f"{self.node}: {bus_id}" if bus_id else self.node
        return f"{self.node}: slot {slot} ({bus_id or 'bus ID unknown'})"

    def found_text(self, gpu: Gpu | None) -> str | None:
        if gpu is None:
            return None
        if gpu.name is None:
            return "unknown GPU (NVML gave no name)"
        model = self.model_of(gpu)
        return f"{gpu.name} ({model})" if model else f"{gpu.name} (not a model of this site)"


def names_mig(text: str, gpu: Gpu, mig: MigDevice) -> bool:
    """Whether a CUDA_VISIBLE_DEVICES entry names ``mig``: its MIG- UUID, or the older
    MIG-GPU-<uuid>/<gpu instance>/<compute instance> form (drivers before R470)."""
    if text.startswith("MIG-GPU-"):
        parts = text[4:].split("/")
        wanted = [str(mig.gpu_instance), str(mig.compute_instance)]
        return len(parts) == 3 and parts[0] == gpu.uuid and parts[1:] == wanted
    return bool(mig.uuid) and mig.uuid == text
