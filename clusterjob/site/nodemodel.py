"""The node side's part of a site: what a node's GPU slots should hold, which GRES index is
which, and what the node checks and the Prolog are asked to do. Frozen records
(``clusterjob.record``), built by ``clusterjob.site.loader`` as parts of a ``Site``
(``clusterjob.site.model``) or read back from the Prolog's per-node cache
(``clusterjob.site.nodeview``).

A module of its own because the Prolog imports it before every job on every node: it imports
no more than the standard library's enum (no dataclasses, no pathlib, none of the submission
side's models, partitions and syntaxes).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from clusterjob.record import Record

__all__ = [
    "CHECK_SEVERITIES",
    "NODE_CHECK_IDS",
    "CheckPolicy",
    "GresUnit",
    "NodeGpu",
    "OnError",
    "PrologPolicy",
    "gres_units",
]


class OnError(str, Enum):
    """What the Prolog does when it cannot check (internal error, NVML unavailable)."""

    DRAIN = "drain"
    PASS = "pass"


# The node checks' ids, as clusterjob.node.checks registers them (a test keeps the two equal):
# the site file may name them (checks.severity) and is validated below the node layer.
NODE_CHECK_IDS = (
    "node-unmapped",
    "gpu-count",
    "driver-version",
    "gpu-missing",
    "model-mismatch",
    "gpu-uuid",
    "gpu-extra",
    "alloc-env",
    "alloc-slot",
    "gres-index",
    "alloc-count",
    "alloc-model",
    "cuda-order",
    "gpu-lost",
    "ecc-uncorrectable",
    "row-remap-failure",
    "row-remap-pending",
    "mig-pending",
    "mig-mode",
    "mig-layout",
    "alloc-mig",
    "pcie-degraded",
    "nvlink-down",
    "nvlink-fabric",
    "clocks-throttled",
    "gpu-hot",
    "power-capped",
    "retired-pages-pending",
    "gpu-busy",
    "numa-affinity",
    "persistence-off",
)
CHECK_SEVERITIES = ("error", "warning", "off")


class CheckPolicy(Record):
    """What a site, or one partition, asks of the node checks: the oldest NVIDIA driver and
    CUDA driver API it accepts, and per check id a severity ("error", "warning" or "off")
    instead of the check's own."""

    __slots__ = ("driver_min", "severity", "cuda_min")

    driver_min: str | None  # e.g. "535.104.05"
    severity: Mapping[str, str]
    cuda_min: str | None  # the CUDA version the driver supports, e.g. "12.4"

    def __init__(
        self,
        driver_min: str | None = None,
        severity: Mapping[str, str] | None = None,
        cuda_min: str | None = None,
    ) -> None:
        self._fill(driver_min, {} if severity is None else severity, cuda_min)

    def under(self, partition: CheckPolicy) -> CheckPolicy:
        """This site-wide policy with a partition's on top of it."""
        return CheckPolicy(
            partition.driver_min or self.driver_min,
            {**self.severity, **partition.severity},
            partition.cuda_min or self.cuda_min,
        )


class NodeGpu(Record):
    """One GPU slot of a node, in physical (PCI bus) order; slot i is Slurm GRES index i."""

    __slots__ = ("slot", "model", "bus_id", "uuid", "nvlinks", "mig", "mig_gi")

    slot: int
    model: str  # canonical model name
    bus_id: str | None  # normalised with clusterjob.pci.normalise_bus_id
    uuid: str | None
    nvlinks: int | None  # NVLink links that must be active (the slot's nvlinks: key)
    mig: tuple[str, ...] | None  # MIG profiles of its slices; (): MIG off; None: any
    mig_gi: tuple[int, ...] | None  # each slice's GPU instance id, where the map gives them

    def __init__(
        self,
        slot: int,
        model: str,
        bus_id: str | None = None,
        uuid: str | None = None,
        nvlinks: int | None = None,
        mig: tuple[str, ...] | None = None,
        mig_gi: tuple[int, ...] | None = None,
    ) -> None:
        self._fill(slot, model, bus_id, uuid, nvlinks, mig, mig_gi)


class GresUnit(Record):
    """One Slurm GRES index of a node: a whole GPU, or one MIG slice of it.

    The generated gres.conf lists a node's GPUs in slot order and a GPU in MIG mode as one
    record per slice (in the order of its ``mig:`` list), so GRES index i is the i-th unit.
    """

    __slots__ = ("index", "slot", "slice")

    index: int  # the GRES index
    slot: NodeGpu  # the GPU (the slice's parent)
    slice: int | None  # position in the slot's ``mig:`` list; None: the whole GPU

    def __init__(self, index: int, slot: NodeGpu, slice: int | None = None) -> None:
        self._fill(index, slot, slice)

    @property
    def profile(self) -> str | None:
        return None if self.slice is None or not self.slot.mig else self.slot.mig[self.slice]

    @property
    def gpu_instance(self) -> int | None:
        gis = self.slot.mig_gi
        return None if self.slice is None or gis is None else gis[self.slice]


def gres_units(gpus: tuple[NodeGpu, ...]) -> tuple[GresUnit, ...]:
    """A node's GRES indices: one per GPU, one per MIG slice of a GPU the map puts in MIG mode."""
    units: list[GresUnit] = []
    for slot in gpus:
        if slot.mig:
            units += [GresUnit(len(units) + k, slot, k) for k in range(len(slot.mig))]
        else:
            units.append(GresUnit(len(units), slot))
    return tuple(units)


class PrologPolicy(Record):
    """The site's ``prolog:`` keys: what to do when the GPUs cannot be checked, the deadline,
    and the node-local JSON-lines log."""

    __slots__ = ("on_error", "deadline_seconds", "log_path")

    on_error: OnError  # documented default: an unchecked node is not trusted
    deadline_seconds: float  # well under a typical PrologEpilogTimeout
    log_path: str

    def __init__(
        self,
        on_error: OnError = OnError.DRAIN,
        deadline_seconds: float = 20.0,
        log_path: str = "/var/log/clusterjob/prolog.jsonl",
    ) -> None:
        self._fill(on_error, deadline_seconds, log_path)
