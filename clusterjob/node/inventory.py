"""NVML turned into plain data: the one small interface between clusterjob and the GPUs.

``pynvml`` is imported lazily inside ``read_inventory`` so that nothing else pays for it.
A field a GPU does not support is ``None`` (unknown), never an error.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML index (PCI bus order on current drivers; never trusted alone)
    bus_id: str  # normalised, see clusterjob.pci.normalise_bus_id
    name: str | None
    uuid: str | None
    serial: str | None = None
    minor: int | None = None  # /dev/nvidiaN
    memory_total: int | None = None  # bytes
    mig_current: bool | None = None
    mig_pending: bool | None = None
    ecc_uncorrectable_volatile: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    persistence_mode: bool | None = None
    lost: bool = False  # NVML said GPU_IS_LOST while reading this GPU


@dataclass(frozen=True)
class GpuInventory:
    gpus: tuple[Gpu, ...]  # sorted by bus_id: physical order
    driver_version: str | None
    cuda_driver_version: int | None  # e.g. 12040

    def by_bus_id(self, bus_id: str) -> Gpu | None:
        for g in self.gpus:
            if g.bus_id == bus_id:
                return g
        return None
