"""Which of a host's GPUs a job gets: pure functions over an inventory and a node view.

Nothing here reads NVML or takes a lock, so the rules (model from the node map, PCI order,
GPUs claimed by others) are tested on hand-made inventories.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from clusterjob.errors import ClusterjobError, PreflightFailed
from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.site.nodeview import NodeView


class NotEnoughFreeGpus(ClusterjobError):
    """Fewer GPUs of the model are free here than the job booked (held by other claims)."""


@dataclass(frozen=True)
class HostGpu:
    """One GPU of the host: its place in PCI bus order (what CUDA_VISIBLE_DEVICES counts with
    CUDA_DEVICE_ORDER=PCI_BUS_ID), the GPU, and its model by the node map (else NVML)."""

    position: int
    gpu: Gpu
    model: str

    @property
    def key(self) -> str:
        """The claim key: the UUID, else the bus ID (as ``clusterjob run`` claims)."""
        return self.gpu.uuid or self.gpu.bus_id


def resolve_model(view: NodeView, requested: str) -> str | None:
    """The site's canonical model for a requested name: a canonical name, or a model's
    ``gres_type`` (Grid Engine's ``gpu_type`` value), case-insensitively."""
    folded = requested.casefold()
    for name in view.models:
        if name.casefold() == folded:
            return name
    for name, gres_type in view.gres_types.items():
        if gres_type is not None and gres_type.casefold() == folded:
            return name
    return None


def host_gpus(view: NodeView, inventory: GpuInventory) -> tuple[HostGpu, ...]:
    """The host's GPUs in PCI order, each with its model: the node map's slot at that bus ID
    (what the site says is there), else the model NVML's name belongs to."""
    by_bus = {g.bus_id: g.model for g in view.gpus or () if g.bus_id}
    found = []
    for position, gpu in enumerate(sorted(inventory.gpus, key=lambda g: g.bus_id)):
        model = by_bus.get(gpu.bus_id) or view.model_for_nvml_name(gpu.name or "")
        found.append(HostGpu(position, gpu, model or (gpu.name or "unknown")))
    return tuple(found)


def check_model_here(view: NodeView, model: str, count: int, job: str) -> None:
    """PreflightFailed when the node map gives this host fewer than ``count`` GPUs of
    ``model``: the scheduler's host config (``complex_values gpu_type=...``) and the site's
    node map disagree, and the job must not run here."""
    if view.gpus is None:
        return  # not in the node map: NVML's names decide (the preflight says more)
    have = sum(1 for g in view.gpus if g.model == model)
    if have >= count:
        return
    here = ", ".join(f"{m} x{n}" for m, n in _counts(view).items()) or "no GPUs"
    raise PreflightFailed(
        f"job {job} asks for {count} {model} GPU(s), but the site's node map ({view.source}) "
        f"gives {view.node} {here}: fix this host's gpu_type in Grid Engine (qconf -me "
        f"{view.node}) or its node_map entry; the job was not run here"
    )


def _counts(view: NodeView) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in view.gpus or ():
        out[g.model] = out.get(g.model, 0) + 1
    return out


def choose_gpus(
    gpus: tuple[HostGpu, ...], model: str | None, count: int, taken: Collection[str]
) -> tuple[HostGpu, ...]:
    """The first ``count`` GPUs of ``model`` (any, when None) in PCI order that nobody has
    claimed (``taken``: claim keys). NotEnoughFreeGpus, naming what is taken, otherwise."""
    fitting = [g for g in gpus if model is None or g.model == model]
    free = [g for g in fitting if g.key not in taken]
    if len(free) >= count:
        return tuple(free[:count])
    what = f"{model} GPUs" if model else "GPUs"
    busy = ", ".join(f"GPU {g.position} ({g.gpu.bus_id})" for g in fitting if g.key in taken)
    raise NotEnoughFreeGpus(
        f"{count} {what} wanted, {len(free)} free of {len(fitting)} here"
        + (f" (claimed: {busy})" if busy else "")
    )


def visible_devices(chosen: tuple[HostGpu, ...]) -> str:
    """CUDA_VISIBLE_DEVICES for the chosen GPUs, with CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    return ",".join(str(g.position) for g in chosen)
