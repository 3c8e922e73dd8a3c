"""Health checks, once per GPU NVML sees: lost, ECC, row remapping, MIG mode.

A broken GPU the job was given (or may have been given: its GPUs unknown) is an error; one
it was not given is a warning, so the node is drained when a job would actually land on it.
A lost GPU gets only ``gpu-lost``: NVML stopped reading it, its other fields say nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from clusterjob.gpu.inventory import Gpu
from clusterjob.node.checks.facts import Facts
from clusterjob.node.checks.findings import Severity
from clusterjob.node.checks.registry import Observation, Stage, check


def _observe(
    facts: Facts, gpu: Gpu, what: str, found: str, severity: Severity | None = None
) -> Observation:
    slot = facts.slot_of(gpu)
    where = facts.where(slot, gpu.bus_id)
    label = f"{where}: {gpu.name}" if gpu.name else where
    return Observation(f"{label}: {what}", slot, gpu.bus_id, None, found, severity)


def _on_job(facts: Facts, gpu: Gpu) -> Severity | None:
    """The check's own severity, or a warning when the job certainly was not given ``gpu``."""
    return Severity.WARNING if facts.job_has(gpu) is False else None


@check("gpu-lost", Severity.ERROR, stage=Stage.HEALTH)
def gpu_lost(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    if gpu.lost:
        yield _observe(facts, gpu, "NVML says GPU is lost -- reset or reboot the node", "lost")


@check("ecc-uncorrectable", Severity.ERROR, stage=Stage.HEALTH)
def ecc_uncorrectable(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    n = gpu.ecc_uncorrectable_volatile
    if n and not gpu.lost:
        what = f"{n} uncorrectable ECC error(s) since the last reset"
        yield _observe(facts, gpu, what, str(n), _on_job(facts, gpu))


@check("row-remap-failure", Severity.ERROR, stage=Stage.HEALTH)
def row_remap_failure(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    if gpu.remapped_rows_failure and not gpu.lost:
        what = "row remapping failed -- the GPU needs service"
        yield _observe(facts, gpu, what, "remap failure", _on_job(facts, gpu))


@check("row-remap-pending", Severity.WARNING, stage=Stage.HEALTH)
def row_remap_pending(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    if gpu.remapped_rows_pending and not gpu.lost:
        what = "row remapping pending -- reset the GPU to apply it"
        yield _observe(facts, gpu, what, "remap pending")


@check("mig-pending", Severity.ERROR, stage=Stage.HEALTH)
def mig_pending(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    current, pending = gpu.mig_current, gpu.mig_pending
    if gpu.lost or current is None or pending is None or current == pending:
        return
    cur, pend = ("on" if current else "off"), ("on" if pending else "off")
    what = f"MIG mode is {cur}, {pend} pending a GPU reset"
    yield _observe(facts, gpu, what, f"mig {cur}->{pend}", _on_job(facts, gpu))
