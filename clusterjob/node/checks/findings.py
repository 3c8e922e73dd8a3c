"""What the preflight reports: findings, one table row per slot, and the report itself.

Every finding has a stable ``check_id`` that logs, JSON output and tests rely on.
"""

from __future__ import annotations

from enum import Enum

from clusterjob.record import Record

__all__ = ["Finding", "PreflightReport", "Severity", "SlotRow"]


class Severity(str, Enum):
    ERROR = "error"  # the job would run on the wrong or a broken GPU: fail / drain
    WARNING = "warning"  # worth a person's look; the job may run
    INFO = "info"


class Finding(Record):
    """What one check found wrong (or worth a warning) on one node, in one line."""

    __slots__ = ("check_id", "severity", "node", "message", "slot", "bus_id", "expected", "found")

    check_id: str
    severity: Severity
    node: str
    message: str  # one line naming node, slot, bus ID, expected and found
    slot: int | None
    bus_id: str | None
    expected: str | None
    found: str | None

    def __init__(
        self,
        check_id: str,
        severity: Severity,
        node: str,
        message: str,
        slot: int | None = None,
        bus_id: str | None = None,
        expected: str | None = None,
        found: str | None = None,
    ) -> None:
        self._fill(check_id, severity, node, message, slot, bus_id, expected, found)

    def to_dict(self) -> dict[str, object]:
        d = self.as_dict()
        d["severity"] = self.severity.value
        return d


class SlotRow(Record):
    """One line of the preflight table: a slot of the map and/or a GPU NVML sees."""

    __slots__ = ("slot", "bus_id", "expected", "found", "status", "allocated")

    slot: int | None  # None: a GPU the node map does not know (extra)
    bus_id: str | None
    expected: str | None  # canonical model from the map
    found: str | None  # NVML name, with the site model in parentheses when known
    status: str  # "ok" or the check_id of the worst finding for this slot
    allocated: bool

    def __init__(
        self,
        slot: int | None,
        bus_id: str | None,
        expected: str | None,
        found: str | None,
        status: str,
        allocated: bool = False,
    ) -> None:
        self._fill(slot, bus_id, expected, found, status, allocated)

    def to_dict(self) -> dict[str, object]:
        return self.as_dict()


class PreflightReport(Record):
    """A node's verdict: every finding, and the table of its slots."""

    __slots__ = (
        "node",
        "findings",
        "rows",
        "allocated_slots",
        "driver_version",
        "cuda_driver_version",
    )

    node: str
    findings: tuple[Finding, ...]
    rows: tuple[SlotRow, ...]
    allocated_slots: tuple[int, ...] | None
    driver_version: str | None
    cuda_driver_version: int | None

    def __init__(
        self,
        node: str,
        findings: tuple[Finding, ...],
        rows: tuple[SlotRow, ...],
        allocated_slots: tuple[int, ...] | None = None,
        driver_version: str | None = None,
        cuda_driver_version: int | None = None,
    ) -> None:
        self._fill(node, findings, rows, allocated_slots, driver_version, cuda_driver_version)

    @property
    def ok(self) -> bool:
        """True when no finding is an error (warnings do not fail a job)."""
        return not self.errors

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.WARNING)

    def to_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "ok": self.ok,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "allocated_slots": (
                list(self.allocated_slots) if self.allocated_slots is not None else None
            ),
            "findings": [f.to_dict() for f in self.findings],
            "rows": [r.to_dict() for r in self.rows],
        }
