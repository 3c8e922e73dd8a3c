"""NVML read through pynvml and turned into a ``GpuInventory``: every call to NVML is here.

``pynvml`` is imported inside ``read_nvml`` so that nothing else pays for it. A field a GPU
does not support is ``None`` (unknown), never an error. Nothing here bounds the time a hung
driver takes: ``clusterjob.gpu.inventory.read_inventory`` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from clusterjob.errors import NvmlError, NvmlErrorKind
from clusterjob.gpu.inventory import Gpu, GpuInventory, GpuProcess
from clusterjob.pci import normalise_bus_id

__all__ = ["read_nvml"]


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
