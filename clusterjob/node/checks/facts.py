"""The facts every check reads: what the node map and the job say, and what NVML sees.

One frozen value per preflight. What several checks derive (which GPU sits in which slot,
which slots the job has) is worked out here once, lazily, so the checks stay one small
function each. Slot i is Slurm GRES index i, the i-th GPU in PCI bus order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.gpu.models import model_for_nvml_name
from clusterjob.node.allocation import Allocation, Context
from clusterjob.site.model import NodeGpu

__all__ = ["Facts", "Need"]


class Need(str, Enum):
    """A fact a check cannot run without; the runner skips the check when it is absent."""

    NODE_MAP = "node_map"  # the node is in the site's node map
    ALLOCATION = "allocation"  # the job's GPUs, as far as the environment tells
    EXPECT_MODEL = "expect_model"  # the GPU model the job asked for
    EXPECT_COUNT = "expect_count"  # how many GPUs the job asked for on this node
    JOB = "job"  # running inside the job (the Prolog runs before CUDA_DEVICE_ORDER is set)
    DRIVER_MIN = "driver_min"  # the site (or the job's partition) names a minimum driver/CUDA
    JOB_CPUS = "job_cpus"  # the CPUs the job may run on (inside the job: its affinity)


@dataclass(frozen=True)
class Facts:
    """Everything the checks compare. ``node_map`` is None when the node is not in the map."""

    node: str
    node_map: tuple[NodeGpu, ...] | None
    models: Mapping[str, tuple[str, ...]]  # canonical model -> NVML names
    inventory: GpuInventory
    allocation: Allocation | None = None
    expect_model: str | None = None
    expect_count: int | None = None
    context: Context = Context.PROLOG
    cuda_device_order: str | None = None  # the job's CUDA_DEVICE_ORDER (job context only)
    driver_min: str | None = None  # the oldest NVIDIA driver the site accepts here
    cuda_min: str | None = None  # the oldest CUDA driver API version, e.g. "12.4"
    severity: Mapping[str, str] = field(default_factory=dict)  # check id -> error/warning/off
    job_cpus: frozenset[int] | None = None  # the job's CPUs (None: not known here)

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
    def allocated_set(self) -> frozenset[int]:
        return frozenset(self.allocated or ())

    @cached_property
    def job_gpus(self) -> tuple[tuple[int, Gpu | None], ...]:
        """The job's slots in order, each with its GPU (None: no such slot)."""
        return tuple((s, self.slot_gpu.get(s)) for s in sorted(self.allocated_set))

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
