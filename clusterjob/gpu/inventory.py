"""The GPUs of this node as plain data, and the one way to read them from NVML.

``read_inventory`` is what every caller uses (the Prolog, the TaskProlog, ``preflight``,
``gpus``, ``run``, ``site probe``). It never imports pynvml itself (see ``clusterjob.gpu.nvml``)
and, given a timeout, never blocks past it, even when the driver hangs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from clusterjob.errors import NvmlError, NvmlErrorKind
from clusterjob.gpu import isolation
from clusterjob.record import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # not at run time: the Prolog imports this module before every job
    from typing import Any

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


class GpuProcess(Record):
    """A compute process NVML sees on a GPU."""

    __slots__ = ("pid", "used_memory", "name", "user")
    pid: int
    used_memory: int | None  # bytes; None where the driver cannot tell
    name: str | None
    user: str | None  # the owner of /proc/PID (a uid where it has no name); None: gone

    def __init__(
        self, pid: int, used_memory: int | None, name: str | None, user: str | None = None
    ) -> None:
        self._fill(pid, used_memory, name, user)


class MigDevice(Record):
    """A MIG device (GPU instance + compute instance) NVML lists under its GPU."""

    __slots__ = ("index", "uuid", "name", "memory_total", "gpu_instance", "compute_instance")
    index: int  # NVML's MIG device index under the GPU
    uuid: str | None  # "MIG-..."
    name: str | None  # e.g. "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    memory_total: int | None  # bytes
    gpu_instance: int | None
    compute_instance: int | None

    def __init__(
        self,
        index: int,
        uuid: str | None,
        name: str | None,
        memory_total: int | None = None,
        gpu_instance: int | None = None,
        compute_instance: int | None = None,
    ) -> None:
        self._fill(index, uuid, name, memory_total, gpu_instance, compute_instance)

    @property
    def profile(self) -> str | None:
        """ "1g.10gb" from the name NVML gives ("... MIG 1g.10gb"); None when not there."""
        if not self.name or " MIG " not in self.name:
            return None
        return self.name.rsplit(" MIG ", 1)[1].strip() or None


class Gpu(Record):
    """One GPU as NVML reports it: identity, health and what runs on it (None: unknown)."""

    __slots__ = (
        "index",
        "bus_id",
        "name",
        "uuid",
        "serial",
        "minor",
        "memory_total",
        "mig_current",
        "mig_pending",
        "ecc_uncorrectable_volatile",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "persistence_mode",
        "lost",
        "memory_used",
        "processes",
        "pcie_link_width",
        "pcie_link_width_max",
        "pcie_link_gen",
        "pcie_link_gen_max",
        "temperature",
        "temperature_slowdown",
        "clock_event_reasons",
        "nvlink_active",
        "fabric_state",
        "fabric_status",
        "cpu_affinity",
        "mig_devices",
        "power_limit",
        "power_limit_default",
        "retired_pages_pending",
    )
    index: int  # NVML index (PCI bus order on current drivers; never trusted alone)
    bus_id: str  # normalised, see clusterjob.pci.normalise_bus_id
    name: str | None
    uuid: str | None
    serial: str | None
    minor: int | None  # /dev/nvidiaN
    memory_total: int | None  # bytes
    mig_current: bool | None
    mig_pending: bool | None
    ecc_uncorrectable_volatile: int | None
    remapped_rows_pending: bool | None
    remapped_rows_failure: bool | None
    persistence_mode: bool | None
    lost: bool  # NVML said GPU_IS_LOST while reading this GPU
    memory_used: int | None  # bytes
    processes: tuple[GpuProcess, ...] | None  # running compute processes
    pcie_link_width: int | None  # lanes the link trained at now
    pcie_link_width_max: int | None
    pcie_link_gen: int | None  # drops at idle on some boards (power saving)
    pcie_link_gen_max: int | None
    temperature: int | None  # degrees C, GPU die
    temperature_slowdown: int | None  # where the GPU starts slowing itself down
    clock_event_reasons: int | None  # nvmlClocksEventReason* bits active now
    nvlink_active: tuple[bool, ...] | None  # per NVLink link; None: no NVLink / unknown
    fabric_state: str | None  # NVSwitch fabric: not_started/in_progress/completed
    fabric_status: int | None  # nvmlReturn_t of the registration (0: success)
    cpu_affinity: str | None  # the CPUs near the GPU (its NUMA node), "0-31,64-95"
    mig_devices: tuple[MigDevice, ...] | None  # with MIG on; None: MIG off or unknown
    power_limit: int | None  # the enforced power limit, mW
    power_limit_default: int | None  # the board's default power limit, mW
    retired_pages_pending: bool | None  # page retirement waits for a reset (pre-Ampere)

    def __init__(
        self,
        index: int,
        bus_id: str,
        name: str | None,
        uuid: str | None,
        serial: str | None = None,
        minor: int | None = None,
        memory_total: int | None = None,
        mig_current: bool | None = None,
        mig_pending: bool | None = None,
        ecc_uncorrectable_volatile: int | None = None,
        remapped_rows_pending: bool | None = None,
        remapped_rows_failure: bool | None = None,
        persistence_mode: bool | None = None,
        lost: bool = False,
        memory_used: int | None = None,
        processes: tuple[GpuProcess, ...] | None = None,
        pcie_link_width: int | None = None,
        pcie_link_width_max: int | None = None,
        pcie_link_gen: int | None = None,
        pcie_link_gen_max: int | None = None,
        temperature: int | None = None,
        temperature_slowdown: int | None = None,
        clock_event_reasons: int | None = None,
        nvlink_active: tuple[bool, ...] | None = None,
        fabric_state: str | None = None,
        fabric_status: int | None = None,
        cpu_affinity: str | None = None,
        mig_devices: tuple[MigDevice, ...] | None = None,
        power_limit: int | None = None,
        power_limit_default: int | None = None,
        retired_pages_pending: bool | None = None,
    ) -> None:
        self._fill(
            index,
            bus_id,
            name,
            uuid,
            serial,
            minor,
            memory_total,
            mig_current,
            mig_pending,
            ecc_uncorrectable_volatile,
            remapped_rows_pending,
            remapped_rows_failure,
            persistence_mode,
            lost,
            memory_used,
            processes,
            pcie_link_width,
            pcie_link_width_max,
            pcie_link_gen,
            pcie_link_gen_max,
            temperature,
            temperature_slowdown,
            clock_event_reasons,
            nvlink_active,
            fabric_state,
            fabric_status,
            cpu_affinity,
            mig_devices,
            power_limit,
            power_limit_default,
            retired_pages_pending,
        )


class GpuInventory(Record):
    """Every GPU NVML sees on this node, and the driver's versions."""

    __slots__ = ("gpus", "driver_version", "cuda_driver_version")
    gpus: tuple[Gpu, ...]  # sorted by bus_id: physical order
    driver_version: str | None
    cuda_driver_version: int | None  # e.g. 12040

    def __init__(
        self, gpus: tuple[Gpu, ...], driver_version: str | None, cuda_driver_version: int | None
    ) -> None:
        self._fill(gpus, driver_version, cuda_driver_version)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuInventory:
        """The inventory ``as_dict`` gave (how a forked NVML reader sends it back)."""
        return cls(
            tuple(_gpu_from_dict(g) for g in data["gpus"]),
            data["driver_version"],
            data["cuda_driver_version"],
        )

    def by_bus_id(self, bus_id: str) -> Gpu | None:
        for g in self.gpus:
            if g.bus_id == bus_id:
                return g
        return None


def _gpu_from_dict(data: Mapping[str, Any]) -> Gpu:
    processes, migs = data["processes"], data["mig_devices"]
    return Gpu(
        **{
            **data,
            "processes": None if processes is None else tuple(GpuProcess(**p) for p in processes),
            "mig_devices": None if migs is None else tuple(MigDevice(**m) for m in migs),
        }
    )


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
            return GpuInventory.from_dict((started or isolation.start_nvml_read()).result(timeout))
        from clusterjob.gpu.nvml import read_nvml  # here: pynvml's reader, where it is used

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
