"""The node-side GPU preflight: what the node map and the job say, against what NVML sees.

Pure logic, no I/O: the input is one ``Facts`` (the node's slots from the site map, the
model -> NVML-name table, a ``GpuInventory``, the job's ``Allocation``, the context), the
output a ``PreflightReport``. Each check is one function registered with ``@check`` (see
``registry``), in the file of its family: ``identity``, ``allocation``, ``ordering``,
``health``. Every finding has a stable ``check_id``; renaming one breaks log readers.
"""

from __future__ import annotations

from clusterjob.node.checks import allocation, health, identity, ordering  # noqa: F401 (registers)
from clusterjob.node.checks.facts import Facts, Need
from clusterjob.node.checks.findings import Finding, PreflightReport, Severity, SlotRow
from clusterjob.node.checks.registry import REGISTRY, Observation, Stage, check
from clusterjob.node.checks.runner import run_checks

__all__ = [
    "CHECK_IDS",
    "REGISTRY",
    "Facts",
    "Finding",
    "Need",
    "Observation",
    "PreflightReport",
    "Severity",
    "SlotRow",
    "Stage",
    "check",
    "run_checks",
]

# Every check_id a finding can carry, in run order: read from the registry, the one source.
CHECK_IDS = REGISTRY.ids
