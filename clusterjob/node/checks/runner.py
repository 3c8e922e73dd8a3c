"""``run_checks``: every registered check over one node's facts, and the slot table."""

from __future__ import annotations

from clusterjob.node.checks.facts import Facts
from clusterjob.node.checks.findings import Finding, PreflightReport, Severity, SlotRow
from clusterjob.node.checks.registry import REGISTRY, Registry

__all__ = ["run_checks"]


def run_checks(facts: Facts, registry: Registry = REGISTRY) -> PreflightReport:
    """Compare the node map and the job's request with the inventory; return every finding.

    Pure: no I/O. Without a map entry only the per-job and health checks run (each check
    says which facts it needs).
    """
    findings = registry.run(facts)
    return PreflightReport(
        node=facts.node,
        findings=tuple(findings),
        rows=_rows(facts, findings),
        allocated_slots=tuple(sorted(facts.allocated_set)) if facts.allocated is not None else None,
        driver_version=facts.inventory.driver_version,
        cuda_driver_version=facts.inventory.cuda_driver_version,
    )


def _rows(facts: Facts, findings: list[Finding]) -> tuple[SlotRow, ...]:
    """One row per map slot (per GPU without a map entry), then the GPUs the map lacks."""
    per_slot: dict[int, list[Finding]] = {}
    per_extra: dict[str, list[Finding]] = {}
    for f in findings:
        if f.slot is not None:
            per_slot.setdefault(f.slot, []).append(f)
        elif f.bus_id is not None:
            per_extra.setdefault(f.bus_id, []).append(f)
    mine = facts.allocated_set
    if facts.node_map is not None:
        rows = [
            SlotRow(
                slot.slot,
                gpu.bus_id if gpu else slot.bus_id,
                slot.model,
                facts.found_text(gpu),
                _worst(per_slot.get(slot.slot, [])),
                slot.slot in mine,
            )
            for slot, gpu in facts.pairs
        ]
    else:
        rows = [
            SlotRow(
                i,
                gpu.bus_id,
                None,
                facts.found_text(gpu),
                _worst(per_slot.get(i, [])),
                i in mine,
            )
            for i, gpu in enumerate(facts.physical)
        ]
    rows += [
        SlotRow(
            None,
            gpu.bus_id,
            None,
            facts.found_text(gpu),
            _worst(per_extra.get(gpu.bus_id, [])),
        )
        for gpu in facts.extra
    ]
    return tuple(rows)


_RANK = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def _worst(findings: list[Finding]) -> str:
    """A row's status: "ok", or the check id of its worst finding (information aside)."""
    relevant = [f for f in findings if f.severity is not Severity.INFO]
    if not relevant:
        return "ok"
    return min(relevant, key=lambda f: _RANK[f.severity]).check_id
