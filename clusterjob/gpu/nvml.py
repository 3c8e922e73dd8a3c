"""NVML read through pynvml and turned into a ``GpuInventory``: every call to NVML is here.

``pynvml`` is imported inside ``read_nvml`` so that nothing else pays for it. A field a GPU
does not support is ``None`` (unknown), never an error. Nothing here bounds the time a hung
driver takes: ``clusterjob.gpu.inventory.read_inventory`` does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable

from clusterjob.errors import NvmlError, NvmlErrorKind
from clusterjob.gpu.inventory import Gpu, GpuInventory, GpuProcess, MigDevice, cpu_list
from clusterjob.pci import normalise_bus_id
from clusterjob.record import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # not at run time: the Prolog imports this module before every job
    from typing import Any

__all__ = ["GpuUsage", "UsageReader", "read_nvml", "read_xid_events"]


def read_nvml() -> GpuInventory:
    """Every GPU NVML sees, sorted by PCI bus ID; blocks as long as the driver does."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlError(
            NvmlErrorKind.LIBRARY_NOT_FOUND,
            f"Python package nvidia-ml-py (module pynvml) is not installed: {exc}",
        ) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise _init_error(pynvml, exc) from exc
    try:
        driver = _optional(pynvml, pynvml.nvmlSystemGetDriverVersion)
        cuda = _optional(pynvml, pynvml.nvmlSystemGetCudaDriverVersion_v2)
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise _init_error(pynvml, exc) from exc
        gpus = [_read_gpu(pynvml, index) for index in range(count)]
    finally:
        # A failing shutdown leaves nothing to undo; the inventory (or the error) is what matters.
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    gpus.sort(key=lambda g: g.bus_id)
    return GpuInventory(gpus=tuple(gpus), driver_version=driver, cuda_driver_version=cuda)


class _Lost(Exception):
    """NVML said GPU_IS_LOST: stop reading this GPU, keep what was read."""


def _optional(pynvml: Any, call: Callable[..., Any], *args: Any) -> Any:
    """One NVML read: None when the GPU or driver cannot tell; _Lost when the GPU is gone."""
    try:
        return call(*args)
    except pynvml.NVMLError_GpuIsLost as exc:
        raise _Lost from exc
    except pynvml.NVMLError:
        return None


def _named(pynvml: Any, name: str, *args: Any) -> Any:
    """``_optional`` by the binding's name: None where this pynvml does not have it."""
    call = getattr(pynvml, name, None)
    return None if call is None else _optional(pynvml, call, *args)


def _read_gpu(pynvml: Any, index: int) -> Gpu:
    """One GPU. Its handle and PCI bus ID are needed to place it at all; the rest is optional."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        raw_bus_id = pynvml.nvmlDeviceGetPciInfo_v3(handle).busId
    except pynvml.NVMLError_GpuIsLost as exc:
        raise NvmlError(
            NvmlErrorKind.GPU_LOST,
            f"GPU at NVML index {index} is lost (fell off the bus) before its PCI bus ID "
            "could be read: check dmesg for Xid 79, then reset the GPU or reboot the node",
        ) from exc
    except pynvml.NVMLError as exc:
        raise NvmlError(
            NvmlErrorKind.UNKNOWN, f"NVML could not identify the GPU at index {index}: {exc}"
        ) from exc
    if isinstance(raw_bus_id, bytes):
        raw_bus_id = raw_bus_id.decode("ascii", "replace")
    try:
        bus_id = normalise_bus_id(raw_bus_id)
    except ValueError as exc:
        raise NvmlError(NvmlErrorKind.UNKNOWN, f"NVML GPU {index}: {exc}") from exc

    fields: dict[str, Any] = {}
    lost = False
    try:
        read = _optional
        fields["name"] = read(pynvml, pynvml.nvmlDeviceGetName, handle)
        fields["uuid"] = read(pynvml, pynvml.nvmlDeviceGetUUID, handle)
        fields["serial"] = read(pynvml, pynvml.nvmlDeviceGetSerial, handle)
        fields["minor"] = read(pynvml, pynvml.nvmlDeviceGetMinorNumber, handle)
        memory = read(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            fields["memory_total"] = memory.total
            fields["memory_used"] = memory.used
        mig = read(pynvml, pynvml.nvmlDeviceGetMigMode, handle)
        if mig is not None:
            fields["mig_current"] = mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            fields["mig_pending"] = mig[1] == pynvml.NVML_DEVICE_MIG_ENABLE
        fields["ecc_uncorrectable_volatile"] = read(
            pynvml,
            pynvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        if fields.get("mig_current"):
            fields["mig_devices"] = _read_migs(pynvml, handle)
        remapped = read(pynvml, pynvml.nvmlDeviceGetRemappedRows, handle)
        if remapped is not None:
            fields["remapped_rows_pending"] = bool(remapped[2])
            fields["remapped_rows_failure"] = bool(remapped[3])
        persistence = read(pynvml, pynvml.nvmlDeviceGetPersistenceMode, handle)
        if persistence is not None:
            fields["persistence_mode"] = persistence == pynvml.NVML_FEATURE_ENABLED
        fields.update(_read_links(pynvml, handle))
        procs = read(pynvml, pynvml.nvmlDeviceGetComputeRunningProcesses_v3, handle)
        if procs is not None:
            fields["processes"] = tuple(
                GpuProcess(
                    pid=p.pid,
                    used_memory=p.usedGpuMemory,
                    name=_process_name(pynvml, p.pid),
                    user=process_owner(p.pid),
                )
                for p in procs
            )
    except _Lost:
        lost = True
    fields.setdefault("name", None)
    fields.setdefault("uuid", None)
    return Gpu(index=index, bus_id=bus_id, lost=lost, **fields)


def _read_migs(pynvml: Any, handle: Any) -> tuple[MigDevice, ...] | None:
    """The MIG devices of a GPU in MIG mode; None when NVML cannot list them. An index
    without a device (NOT_FOUND: that slice is not created) is skipped."""
    read = _named
    count = read(pynvml, "nvmlDeviceGetMaxMigDeviceCount", handle)
    if count is None:
        return None
    out = []
    for i in range(count):
        mig = read(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
        if mig is None:
            continue
        memory = read(pynvml, "nvmlDeviceGetMemoryInfo", mig)
        out.append(
            MigDevice(
                index=i,
                uuid=read(pynvml, "nvmlDeviceGetUUID", mig),
                name=read(pynvml, "nvmlDeviceGetName", mig),
                memory_total=memory.total if memory is not None else None,
                gpu_instance=read(pynvml, "nvmlDeviceGetGpuInstanceId", mig),
                compute_instance=read(pynvml, "nvmlDeviceGetComputeInstanceId", mig),
            )
        )
    return tuple(out)


_FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}  # 0: not supported


def _read_links(pynvml: Any, handle: Any) -> dict[str, Any]:
    """PCIe link, temperature, power limits, pending page retirement, clock-event reasons,
    NVLink states, CPU affinity and NVSwitch fabric.

    Each is None when the GPU or driver cannot tell (NOT_SUPPORTED, or a driver too old to
    have the function: pynvml raises FunctionNotFound, an NVMLError, for that too), or when
    the installed pynvml is too old to have the binding.
    """
    read = _named
    out: dict[str, Any] = {
        "pcie_link_width": read(pynvml, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        "pcie_link_width_max": read(pynvml, "nvmlDeviceGetMaxPcieLinkWidth", handle),
        "pcie_link_gen": read(pynvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "pcie_link_gen_max": read(pynvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "temperature": read(
            pynvml, "nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU
        ),
        "temperature_slowdown": read(
            pynvml,
            "nvmlDeviceGetTemperatureThreshold",
            handle,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
        ),
    }
    out["power_limit"] = read(pynvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
    out["power_limit_default"] = read(pynvml, "nvmlDeviceGetPowerManagementDefaultLimit", handle)
    pending = read(pynvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    out["retired_pages_pending"] = None if pending is None else bool(pending)
    reasons = read(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if reasons is None:  # drivers before 535 have only the older name
        reasons = read(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    out["clock_event_reasons"] = reasons
    # Links are numbered from 0; the first that does not answer ends the list (a GPU
    # without NVLink says NOT_SUPPORTED for link 0, one past its last link INVALID_ARGUMENT).
    states: list[bool] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state = read(pynvml, "nvmlDeviceGetNvLinkState", handle, link)
        if state is None:
            break
        states.append(state == pynvml.NVML_FEATURE_ENABLED)
    out["nvlink_active"] = tuple(states) if states else None
    words = max(1, ((os.sysconf("SC_NPROCESSORS_CONF") or 1) + 63) // 64)
    mask = read(pynvml, "nvmlDeviceGetCpuAffinity", handle, words)
    if mask is not None:
        near = [w * 64 + b for w, word in enumerate(mask) for b in range(64) if word >> b & 1]
        out["cpu_affinity"] = cpu_list(near) or None
    out.update(_read_fabric(pynvml, handle))
    return out


class _GpuFabricInfo(ctypes.Structure):
    """``nvmlGpuFabricInfo_t`` as nvml.h lays it out (28 bytes). Not pynvml's own
    ``c_nvmlGpuFabricInfo_t``: up to nvidia-ml-py 13.610 its ``clusterUuid`` is 80 bytes, not
    16, so ``status`` and ``state`` were read past what the driver wrote (a state of 0, "not
    supported": the fabric check never ran). pynvml's call passes the pointer on as given."""

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),  # NVML_GPU_FABRIC_UUID_LEN
        ("status", ctypes.c_uint),  # nvmlReturn_t
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),  # nvmlGpuFabricState_t
    ]


def _read_fabric(pynvml: Any, handle: Any) -> dict[str, Any]:
    """NVSwitch fabric registration: nothing on a GPU without one (NOT_SUPPORTED)."""
    info = _GpuFabricInfo()
    if _named(pynvml, "nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info)) is None:
        return {}
    state = _FABRIC_STATES.get(info.state)
    return {} if state is None else {"fabric_state": state, "fabric_status": int(info.status)}


def _process_name(pynvml: Any, pid: int) -> str | None:
    try:
        name = pynvml.nvmlSystemGetProcessName(pid)
    except pynvml.NVMLError:
        return None  # the process ended between the two calls, or we may not look at it
    return name or None


def process_owner(pid: int, proc: str = "/proc") -> str | None:
    """Who runs ``pid``: the owner of its /proc directory (lstat: nothing is followed or
    opened), by name where the user database has one, else the uid; None when it is gone or
    not ours to see (a process in another PID namespace)."""
    import pwd

    try:
        uid = os.lstat(f"{proc}/{int(pid)}").st_uid
    except (OSError, ValueError):
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _init_error(pynvml: Any, exc: Exception) -> NvmlError:
    """NVML failing as a whole, in words a person on the node can act on."""
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return NvmlError(
            NvmlErrorKind.LIBRARY_NOT_FOUND,
            "NVML library libnvidia-ml.so.1 not found: is the NVIDIA driver installed on this "
            "node (and its library directory known to the dynamic loader)?",
        )
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        return NvmlError(
            NvmlErrorKind.DRIVER_NOT_LOADED,
            "NVIDIA driver is not loaded on this node (NVML: Driver Not Loaded): "
            "check 'lsmod | grep nvidia' and dmesg, or load it with 'modprobe nvidia'",
        )
    if isinstance(exc, pynvml.NVMLError_LibRmVersionMismatch):
        return NvmlError(
            NvmlErrorKind.VERSION_MISMATCH,
            "NVML library and NVIDIA kernel driver versions differ (driver upgraded without a "
            "reboot?): reboot the node or reload the nvidia kernel modules",
        )
    if isinstance(exc, pynvml.NVMLError_NoPermission):
        return NvmlError(
            NvmlErrorKind.NO_PERMISSION,
            "no permission to use NVML: check the modes of /dev/nvidiactl and /dev/nvidia*",
        )
    if isinstance(exc, pynvml.NVMLError_GpuIsLost):
        return NvmlError(
            NvmlErrorKind.GPU_LOST,
            "NVML reports a GPU lost (fell off the bus): check dmesg for Xid 79, then reset "
            "the GPU or reboot the node",
        )
    code = getattr(exc, "value", None)
    return NvmlError(NvmlErrorKind.UNKNOWN, f"NVML failed: {exc} (NVML error code {code})")


def read_xid_events(timeout_ms: int = 0) -> dict[str, tuple[int, ...]]:
    """The Xid critical-error events NVML has for each GPU, by normalised bus ID.

    Registers every GPU that supports them for ``nvmlEventTypeXidCriticalError`` and drains
    the event set without waiting (``timeout_ms`` per wait, 0 by default): NVML delivers only
    events that occur while a set is registered, so this sees what the driver reports now,
    not a job's history (the kernel log keeps that). A GPU NVML cannot register is left out;
    NvmlError when NVML cannot be used at all.
    """
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlError(
            NvmlErrorKind.LIBRARY_NOT_FOUND,
            f"Python package nvidia-ml-py (module pynvml) is not installed: {exc}",
        ) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise _init_error(pynvml, exc) from exc
    found: dict[str, list[int]] = {}
    try:
        event_set = pynvml.nvmlEventSetCreate()
        try:
            by_handle: dict[int, str] = {}
            for index in range(pynvml.nvmlDeviceGetCount()):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    bus_id = normalise_bus_id(_text(pynvml.nvmlDeviceGetPciInfo_v3(handle).busId))
                    pynvml.nvmlDeviceRegisterEvents(
                        handle, pynvml.nvmlEventTypeXidCriticalError, event_set
                    )
                except (pynvml.NVMLError, ValueError):
                    continue
                found[bus_id] = []
                by_handle[ctypes.cast(handle, ctypes.c_void_p).value or 0] = bus_id
            for _ in range(1024):  # bounded: a driver that keeps reporting cannot hold us
                try:
                    data = pynvml.nvmlEventSetWait_v2(event_set, timeout_ms)
                except pynvml.NVMLError:  # TIMEOUT: nothing (more) pending
                    break
                if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
                    continue
                where = by_handle.get(ctypes.cast(data.device, ctypes.c_void_p).value or 0)
                if where is not None:
                    found[where].append(int(data.eventData))
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(event_set)
    except pynvml.NVMLError as exc:
        raise _init_error(pynvml, exc) from exc
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return {bus_id: tuple(codes) for bus_id, codes in found.items()}


class GpuUsage(Record):
    """One GPU's load at one moment; a field NVML cannot tell is None."""

    __slots__ = ("bus_id", "utilization", "memory_used", "power_mw")

    bus_id: str
    utilization: int | None  # percent of the last sample period a kernel ran
    memory_used: int | None  # bytes
    power_mw: int | None  # milliwatts

    def __init__(
        self, bus_id: str, utilization: int | None, memory_used: int | None, power_mw: int | None
    ) -> None:
        self._fill(bus_id, utilization, memory_used, power_mw)


class UsageReader:
    """NVML kept initialised for a job's whole life, reading the load of some GPUs.

    ``nvmlInit`` costs far more than the three reads of a sample, so a sampler opens one
    reader and calls ``read`` at its interval. ``bus_ids``: the GPUs to read (normalised
    PCI bus ids); None: every GPU NVML sees. NvmlError when NVML cannot be used at all.
    """

    def __init__(self, bus_ids: tuple[str, ...] | None = None) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlError(
                NvmlErrorKind.LIBRARY_NOT_FOUND,
                f"Python package nvidia-ml-py (module pynvml) is not installed: {exc}",
            ) from exc
        self._pynvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise _init_error(pynvml, exc) from exc
        self.handles: dict[str, Any] = {}
        try:
            for index in range(pynvml.nvmlDeviceGetCount()):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    bus_id = normalise_bus_id(_text(pynvml.nvmlDeviceGetPciInfo_v3(handle).busId))
                except (pynvml.NVMLError, ValueError):
                    continue
                if bus_ids is None or bus_id in bus_ids:
                    self.handles[bus_id] = handle
        except pynvml.NVMLError as exc:
            self.close()
            raise _init_error(pynvml, exc) from exc
        self.handles = dict(sorted(self.handles.items()))

    def read(self) -> list[GpuUsage]:
        """The load of each GPU now, in PCI order; a GPU lost or not answering: all None."""
        n = self._pynvml
        out = []
        for bus_id, handle in self.handles.items():
            try:
                util = _optional(n, n.nvmlDeviceGetUtilizationRates, handle)
                memory = _optional(n, n.nvmlDeviceGetMemoryInfo, handle)
                power = _optional(n, n.nvmlDeviceGetPowerUsage, handle)
            except _Lost:
                util = memory = power = None
            out.append(
                GpuUsage(
                    bus_id,
                    None if util is None else int(util.gpu),
                    None if memory is None else int(memory.used),
                    None if power is None else int(power),
                )
            )
        return out

    def close(self) -> None:
        with contextlib.suppress(self._pynvml.NVMLError):
            self._pynvml.nvmlShutdown()


def _text(raw: str | bytes) -> str:
    return raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
