"""``clusterjob task-prolog``: the Slurm TaskProlog that puts CUDA's device order right.

slurmd reads its stdout as directives (``export NAME=value``, ``print text``), one per line.
It never fails the task: a problem becomes a ``print`` line the job's output shows. Stdlib
only at the top, as the Prolog.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from clusterjob.errors import NvmlError
from clusterjob.gpu.inventory import read_inventory
from clusterjob.node.allocation import Context, allocation_from_env, task_cuda_visible_devices
from clusterjob.node.context import DEFAULT_POLICY, node_name, one_line

__all__ = ["run_task_prolog"]


def run_task_prolog(environ: Mapping[str, str], out: TextIO, site: str | None = None) -> int:
    """Write the TaskProlog directives to ``out``; always 0. ``site`` only sets NVML's deadline."""
    lines = ["export CUDA_DEVICE_ORDER=PCI_BUS_ID"]
    try:
        alloc = allocation_from_env(environ, Context.JOB)
        for problem in alloc.problems:
            lines.append(f"print clusterjob: warning: {problem}")
        uuid_bus_ids: dict[str, str] | None = None
        if alloc.uuids:
            deadline = DEFAULT_POLICY.deadline_seconds
            if site:
                from clusterjob.site.nodeview import load_node_view

                view = load_node_view(Path(site), node_name(environ), None)
                deadline = view.prolog.deadline_seconds
            try:
                inventory = read_inventory(deadline, isolate=True)
                uuid_bus_ids = {g.uuid: g.bus_id for g in inventory.gpus if g.uuid}
            except NvmlError as exc:
                lines.append(
                    "print clusterjob: warning: CUDA_VISIBLE_DEVICES not put in PCI order: "
                    f"NVML: {one_line(exc)}"
                )
        value = task_cuda_visible_devices(alloc, uuid_bus_ids)
        if value is not None:
            lines.append(f"export CUDA_VISIBLE_DEVICES={value}")
    except Exception as exc:
        lines.append(f"print clusterjob: warning: task prolog: {type(exc).__name__}: {exc}")
    for line in lines:
        out.write(_printable(line) + "\n")
    out.flush()
    return 0


def _printable(line: str) -> str:
    """TaskProlog output is line-based: keep each directive on one line."""
    return " ".join(line.split("\n"))
