"""``clusterjob task-prolog``: the Slurm TaskProlog that puts CUDA's device order right.

slurmd reads its stdout as directives (``export NAME=value``, ``print text``), one per line.
It never fails the task: a problem becomes a ``print`` line the job's output shows. Stdlib
only at the top, as the Prolog.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from clusterjob.errors import NvmlError, printable
from clusterjob.gpu.inventory import GpuInventory, read_inventory
from clusterjob.node.allocation import (
    Allocation,
    Context,
    allocation_from_env,
    task_cuda_visible_devices,
)
from clusterjob.node.context import DEFAULT_POLICY, job_node_view, node_name, one_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # imported where a MIG node needs them: every task runs this hook
    from typing import TextIO

    from clusterjob.site.nodeview import NodeView

__all__ = ["run_task_prolog"]


def run_task_prolog(environ: Mapping[str, str], out: TextIO, site: str | None = None) -> int:
    """Write the TaskProlog directives to ``out``; always 0. ``site`` only sets NVML's deadline."""
    lines = ["export CUDA_DEVICE_ORDER=PCI_BUS_ID"]
    try:
        alloc = allocation_from_env(environ, Context.JOB)
        for problem in alloc.problems:
            lines.append(f"print clusterjob: warning: {problem}")
        uuid_bus_ids: dict[str, str] | None = None
        view = None
        if site and (alloc.uuids or (alloc.slots and not alloc.mig_devices)):
            view = job_node_view(Path(site), node_name(environ))
        sliced = view is not None and any(g.mig for g in view.gpus or ()) and bool(alloc.slots)
        if alloc.uuids or sliced:
            deadline = view.prolog.deadline_seconds if view else DEFAULT_POLICY.deadline_seconds
            try:
                inventory = read_inventory(deadline, isolate=True)
                uuid_bus_ids = {g.uuid: g.bus_id for g in inventory.gpus if g.uuid}
            except NvmlError as exc:
                lines.append(
                    "print clusterjob: warning: CUDA_VISIBLE_DEVICES not put in PCI order: "
                    f"NVML: {one_line(exc)}"
                )
                sliced = False
        value = task_cuda_visible_devices(alloc, uuid_bus_ids)
        if sliced and view is not None:
            value = _slice_uuids(environ, view, inventory, alloc, lines) or value
        if value is not None:
            lines.append(f"export CUDA_VISIBLE_DEVICES={value}")
    except Exception as exc:
        lines.append(f"print clusterjob: warning: task prolog: {type(exc).__name__}: {exc}")
    for line in lines:
        out.write(printable(line) + "\n")  # slurmd reads one directive a line
    out.flush()
    return 0


def _slice_uuids(
    environ: Mapping[str, str],
    view: NodeView,
    inventory: GpuInventory,
    alloc: Allocation,
    lines: list[str],
) -> str | None:
    """Where the node map puts a GPU in MIG mode, Slurm's GRES indices count its slices, and
    without NVML autodetection Slurm sets CUDA_VISIBLE_DEVICES to those indices, which CUDA
    would take for whole GPUs: the job's devices become the MIG UUIDs of its slices (whole
    GPUs by their UUID), in the order of its GRES indices. None: no slice among them."""
    from clusterjob.node.checks.facts import Facts

    facts = Facts(node_name(environ), view.gpus, view.models, inventory, alloc, context=Context.JOB)
    slices = {p.unit.index: p for p in facts.job_slices if p.unit is not None}
    if not slices or facts.units is None:
        return None
    out: list[str] = []
    for index in alloc.slots or ():
        piece = slices.get(index)
        if piece is not None:
            if piece.device is None or not piece.device.uuid:
                lines.append(
                    f"print clusterjob: warning: GRES index {index} is a MIG slice NVML does not "
                    "list: CUDA_VISIBLE_DEVICES left as Slurm set it"
                )
                return None
            out.append(piece.device.uuid)
            continue
        gpu = facts.slot_gpu.get(facts.units[index].slot.slot) if index < len(facts.units) else None
        if gpu is None or not gpu.uuid:
            return None
        out.append(gpu.uuid)
    return ",".join(out)
