"""NVML turned into plain data: the one small interface between clusterjob and the GPUs.

``pynvml`` is imported lazily inside ``read_inventory`` so that nothing else pays for it.
A field a GPU does not support is ``None`` (unknown), never an error.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clusterjob.errors import NvmlError
from clusterjob.pci import normalise_bus_id


@dataclass(frozen=True)
class GpuProcess:
    """A compute process NVML sees on a GPU."""

    pid: int
    used_memory: int | None  # bytes; None where the driver cannot tell
    name: str | None


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
    memory_used: int | None = None  # bytes
    processes: tuple[GpuProcess, ...] | None = None  # running compute processes


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


def read_inventory(timeout: float | None = None) -> GpuInventory:
    """Every GPU NVML sees on this node, sorted by PCI bus ID.

    Raises NvmlError when NVML cannot be used at all, or a GPU is lost before its bus ID is
    known. With ``timeout`` (seconds), a hung driver gives NvmlError("timeout") instead of
    blocking: the NVML call is left running in a daemon thread.
    """
    if timeout is None:
        return _read_inventory()
    result: list[GpuInventory] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            result.append(_read_inventory())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=work, name="clusterjob-nvml", daemon=True)
    worker.start()
    worker.join(timeout)
    if failure:
        raise failure[0]
    if not result:
        raise NvmlError(
            "timeout",
            f"NVML did not answer within {timeout:g}s: a GPU or the NVIDIA driver is hung "
            "(look for Xid errors in dmesg; the node likely needs a GPU reset or reboot)",
        )
    return result[0]


def _read_inventory() -> GpuInventory:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlError(
            "library_not_found",
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


def _read_gpu(pynvml: Any, index: int) -> Gpu:
    """One GPU. Its handle and PCI bus ID are needed to place it at all; the rest is optional."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        raw_bus_id = pynvml.nvmlDeviceGetPciInfo_v3(handle).busId
    except pynvml.NVMLError_GpuIsLost as exc:
        raise NvmlError(
            "gpu_lost",
            f"GPU at NVML index {index} is lost (fell off the bus) before its PCI bus ID "
            "could be read: check dmesg for Xid 79, then reset the GPU or reboot the node",
        ) from exc
    except pynvml.NVMLError as exc:
        raise NvmlError(
            "unknown", f"NVML could not identify the GPU at index {index}: {exc}"
        ) from exc
    if isinstance(raw_bus_id, bytes):
        raw_bus_id = raw_bus_id.decode("ascii", "replace")
    try:
        bus_id = normalise_bus_id(raw_bus_id)
    except ValueError as exc:
        raise NvmlError("unknown", f"NVML GPU {index}: {exc}") from exc

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
        remapped = read(pynvml, pynvml.nvmlDeviceGetRemappedRows, handle)
        if remapped is not None:
            fields["remapped_rows_pending"] = bool(remapped[2])
            fields["remapped_rows_failure"] = bool(remapped[3])
        persistence = read(pynvml, pynvml.nvmlDeviceGetPersistenceMode, handle)
        if persistence is not None:
            fields["persistence_mode"] = persistence == pynvml.NVML_FEATURE_ENABLED
        procs = read(pynvml, pynvml.nvmlDeviceGetComputeRunningProcesses_v3, handle)
        if procs is not None:
            fields["processes"] = tuple(
                GpuProcess(
                    pid=p.pid,
                    used_memory=p.usedGpuMemory,
                    name=_process_name(pynvml, p.pid),
                )
                for p in procs
            )
    except _Lost:
        lost = True
    fields.setdefault("name", None)
    fields.setdefault("uuid", None)
    return Gpu(index=index, bus_id=bus_id, lost=lost, **fields)


def _process_name(pynvml: Any, pid: int) -> str | None:
    try:
        name = pynvml.nvmlSystemGetProcessName(pid)
    except pynvml.NVMLError:
        return None  # the process ended between the two calls, or we may not look at it
    return name or None


def _init_error(pynvml: Any, exc: Exception) -> NvmlError:
    """NVML failing as a whole, in words a person on the node can act on."""
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return NvmlError(
            "library_not_found",
            "NVML library libnvidia-ml.so.1 not found: is the NVIDIA driver installed on this "
            "node (and its library directory known to the dynamic loader)?",
        )
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        return NvmlError(
            "driver_not_loaded",
            "NVIDIA driver is not loaded on this node (NVML: Driver Not Loaded): "
            "check 'lsmod | grep nvidia' and dmesg, or load it with 'modprobe nvidia'",
        )
    if isinstance(exc, pynvml.NVMLError_LibRmVersionMismatch):
        return NvmlError(
            "version_mismatch",
            "NVML library and NVIDIA kernel driver versions differ (driver upgraded without a "
            "reboot?): reboot the node or reload the nvidia kernel modules",
        )
    if isinstance(exc, pynvml.NVMLError_NoPermission):
        return NvmlError(
            "no_permission",
            "no permission to use NVML: check the modes of /dev/nvidiactl and /dev/nvidia*",
        )
    if isinstance(exc, pynvml.NVMLError_GpuIsLost):
        return NvmlError(
            "gpu_lost",
            "NVML reports a GPU lost (fell off the bus): check dmesg for Xid 79, then reset "
            "the GPU or reboot the node",
        )
    code = getattr(exc, "value", None)
    return NvmlError("unknown", f"NVML failed: {exc} (NVML error code {code})")
