"""What the preflight reports: findings, one table row per slot, and the report itself.

Every finding has a stable ``check_id`` that logs, JSON output and tests rely on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum

__all__ = ["Finding", "PreflightReport", "Severity", "SlotRow"]


class Severity(str, Enum):
    ERROR = "error"  # the job would run on the wrong or a broken GPU: fail / drain
    WARNING = "warning"  # worth a person's look; the job may run
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """What one check found wrong (or worth a warning) on one node, in one line."""

    check_id: str
    severity: Severity
    node: str
    message: str  # one line naming node, slot, bus ID, expected and found
    slot: int | None = None
    bus_id: str | None = None
    expected: str | None = None
    found: str | None = None

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["severity"] = self.severity.value
        return d


@dataclass(frozen=True)
class SlotRow:
    """One line of the preflight table: a slot of the map and/or a GPU NVML sees."""

    slot: int | None  # None: a GPU the node map does not know (extra)
    bus_id: str | None
    expected: str | None  # canonical model from the map
    found: str | None  # NVML name, with the site model in parentheses when known
    status: str  # "ok" or the check_id of the worst finding for this slot
    allocated: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class PreflightReport:
    """A node's verdict: every finding, and the table of its slots."""

    node: str
    findings: tuple[Finding, ...]
    rows: tuple[SlotRow, ...]
    allocated_slots: tuple[int, ...] | None = None
    driver_version: str | None = None
    cuda_driver_version: int | None = None

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
