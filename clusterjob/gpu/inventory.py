"""The GPUs of this node as plain data, and the one way to read them from NVML.

``read_inventory`` is what every caller uses (the Prolog, the TaskProlog, ``preflight``,
``gpus``, ``run``, ``site probe``). It never imports pynvml itself (see ``clusterjob.gpu.nvml``)
and, given a timeout, never blocks past it, even when the driver hangs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from clusterjob.errors import NvmlError, NvmlErrorKind
from clusterjob.gpu import isolation

__all__ = [
    "CLOCK_EVENT_REASONS",
    "Gpu",
    "GpuInventory",
    "GpuProcess",
    "MigDevice",
    "clock_event_names",
    "cpu_list",
    "parse_cpu_list",
    "read_inventory",
]

# nvmlClocksEventReason* bits (the same values as the older ...ThrottleReason* ones) -> words.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}


def cpu_list(cpus: Iterable[int]) -> str:
    """CPU ids in the Linux list form: {0, 1, 2, 3, 8} -> "0-3,8"."""
    ranges: list[list[int]] = []
    for c in sorted(set(cpus)):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def parse_cpu_list(text: str) -> frozenset[int]:
    """ "0-3,8" -> {0, 1, 2, 3, 8}. Raises ValueError for what is no CPU list."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def clock_event_names(mask: int) -> tuple[str, ...]:
    """The words for the bits set in an NVML clocks-event mask (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    return (*names, hex(rest)) if rest else tuple(names)


@dataclass(frozen=True)
class GpuProcess:
    """A compute process NVML sees on a GPU."""

    pid: int
    used_memory: int | None  # bytes; None where the driver cannot tell
    name: str | None
    user: str | None = None  # the owner of /proc/PID (a uid where it has no name); None: gone


@dataclass(frozen=True)
class MigDevice:
    """A MIG device (GPU instance + compute instance) NVML lists under its GPU."""

    index: int  # NVML's MIG device index under the GPU
    uuid: str | None  # "MIG-..."
    name: str | None  # e.g. "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    memory_total: int | None = None  # bytes
    gpu_instance: int | None = None
    compute_instance: int | None = None

    @property
    def profile(self) -> str | None:
        """ "1g.10gb" from the name NVML gives ("... MIG 1g.10gb"); None when not there."""
        if not self.name or " MIG " not in self.name:
            return None
        return self.name.rsplit(" MIG ", 1)[1].strip() or None


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML reports it: identity, health and what runs on it (None: unknown)."""

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
    memory_used: int | None = None  # bytes
    processes: tuple[GpuProcess, ...] | None = None  # running compute processes
    pcie_link_width: int | None = None  # lanes the link trained at now
    pcie_link_width_max: int | None = None
    pcie_link_gen: int | None = None  # drops at idle on some boards (power saving)
    pcie_link_gen_max: int | None = None
    temperature: int | None = None  # degrees C, GPU die
    temperature_slowdown: int | None = None  # where the GPU starts slowing itself down
    clock_event_reasons: int | None = None  # nvmlClocksEventReason* bits active now
    nvlink_active: tuple[bool, ...] | None = None  # per NVLink link; None: no NVLink / unknown
    fabric_state: str | None = None  # NVSwitch fabric: not_started/in_progress/completed
    fabric_status: int | None = None  # nvmlReturn_t of the registration (0: success)
    cpu_affinity: str | None = None  # the CPUs near the GPU (its NUMA node), "0-31,64-95"
    mig_devices: tuple[MigDevice, ...] | None = None  # with MIG on; None: MIG off or unknown
    power_limit: int | None = None  # the enforced power limit, mW
    power_limit_default: int | None = None  # the board's default power limit, mW
    retired_pages_pending: bool | None = None  # page retirement waits for a reset (pre-Ampere)


@dataclass(frozen=True)
class GpuInventory:
    """Every GPU NVML sees on this node, and the driver's versions."""

    gpus: tuple[Gpu, ...]  # sorted by bus_id: physical order
    driver_version: str | None
    cuda_driver_version: int | None  # e.g. 12040

    def by_bus_id(self, bus_id: str) -> Gpu | None:
        for g in self.gpus:
            if g.bus_id == bus_id:
                return g
        return None


def read_inventory(
    timeout: float | None = None,
    *,
    isolate: bool = False,
    deadline: float | None = None,
    started: isolation.ChildRead | None = None,
) -> GpuInventory:
    """Every GPU NVML sees on this node, sorted by PCI bus ID.

    Raises NvmlError when NVML cannot be used at all, or a GPU is lost before its bus ID is
    known. With ``timeout`` (seconds), a hung driver gives NvmlError(TIMEOUT) instead of
    blocking. ``isolate`` reads in a forked child (see ``clusterjob.gpu.isolation``), as the
    Slurm hooks must: ``started`` is such a child already reading (``start_nvml_read``),
    else one is started now. Without ``isolate`` the read runs in this process (in a daemon
    thread when timed). ``deadline`` is the overall budget the timeout message names, when
    ``timeout`` is only what is left of it.
    """
    try:
        if isolate:
            inventory: GpuInventory = (started or isolation.start_nvml_read()).result(timeout)
            return inventory
        from clusterjob.gpu.nvml import read_nvml  # here: it imports this module's dataclasses

        if timeout is None:
            return read_nvml()
        return isolation.in_thread(read_nvml, timeout)
    except isolation.ReadTimedOut:
        # The Prolog's line goes to slurmd's log, so its hint is the short one.
        hint = "" if isolate else "; the node likely needs a GPU reset or reboot"
        raise NvmlError(
            NvmlErrorKind.TIMEOUT,
            f"NVML did not answer within {deadline or timeout:g}s: a GPU or the NVIDIA driver "
            f"is hung (look for Xid errors in dmesg{hint})",
        ) from None
