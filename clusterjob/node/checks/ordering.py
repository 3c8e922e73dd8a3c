"""Ordering checks: does CUDA index i mean the job's i-th GPU in PCI order (GRES index order)."""

from __future__ import annotations

from collections.abc import Iterator

from clusterjob.node.checks.facts import Facts, Need
from clusterjob.node.checks.findings import Severity
from clusterjob.node.checks.registry import Observation, Stage, check


@check(
    "cuda-order",
    Severity.ERROR,
    stage=Stage.ORDERING,
    needs={Need.JOB},
    reads="`CUDA_DEVICE_ORDER` in the job",
    action="`export CUDA_DEVICE_ORDER=PCI_BUS_ID` (the TaskProlog does)",
)
def cuda_order(facts: Facts) -> Iterator[Observation]:
    """With mixed models, CUDA's default FASTEST_FIRST order is not the PCI order."""
    names = {gpu.name for _, gpu in facts.job_gpus if gpu is not None}
    order = facts.cuda_device_order
    if len(names) <= 1 or order == "PCI_BUS_ID":
        return
    mixed = ", ".join(sorted(n or "?" for n in names))
    yield Observation(
        f"{facts.node}: job has mixed GPUs ({mixed}) and "
        f"CUDA_DEVICE_ORDER is {order or 'unset (FASTEST_FIRST)'} -- CUDA index i is not GRES "
        "index i; export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        expected="PCI_BUS_ID",
        found=order,
    )
