"""The registry of node checks: each check is one function, registered with ``@check``.

A check declares its stable id (what logs and JSON carry), its severity, the stage it runs
in and the facts it needs; it yields ``Observation``s, which the runner turns into
``Finding``s with that id, severity and the node's name. Adding a check is adding one
decorated function to the file of its family (and its tests)::

    @check("gpu-uuid", Severity.WARNING, stage=Stage.SLOTS, needs={Need.NODE_MAP},
           reads="nvmlDeviceGetUUID", action="board replaced: update the slot's uuid")
    def gpu_uuid(facts: Facts, slot: NodeGpu, gpu: Gpu | None) -> Iterator[Observation]: ...

The stage fixes the order of the findings (the first error is what the Prolog drains
with); within a stage, checks run in the order they are defined. A per-node check takes
``(facts)``, a per-slot one ``(facts, slot, gpu)`` for each map slot, a per-GPU one
``(facts, gpu)`` for each GPU in PCI order. One id may name two functions of a family
(``alloc-env``: problems with the variables, and MIG devices as information).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from enum import Enum, IntEnum
from itertools import groupby

from clusterjob.node.checks.facts import Facts, Need
from clusterjob.node.checks.findings import Finding, Severity
from clusterjob.record import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # not at run time: the Prolog imports this module before every job
    from typing import Any, TypeVar

__all__ = ["REGISTRY", "Check", "Observation", "Registry", "Scope", "Stage", "check"]


class Scope(str, Enum):
    """What a check is called for: the node once, each map slot, or each GPU NVML sees."""

    NODE = "node"
    SLOT = "slot"
    GPU = "gpu"


class Stage(IntEnum):
    """The fixed order the checks run in."""

    MAP = 1  # the node against its map entry as a whole
    SLOTS = 2  # each map slot against the GPU in it
    EXTRA = 3  # GPUs the map does not know
    ALLOCATION = 4  # the job's GPUs, as the environment names them
    DEVICE_FILES = 5  # each slot's GRES index against its /dev/nvidiaN
    REQUEST = 6  # what the job asked for against what it was given
    ORDERING = 7  # CUDA's device order
    HEALTH = 8  # each GPU's health

    @property
    def scope(self) -> Scope:
        if self in (Stage.SLOTS, Stage.DEVICE_FILES):
            return Scope.SLOT
        if self is Stage.HEALTH:
            return Scope.GPU
        return Scope.NODE


class Observation(Record):
    """What one check found; the runner adds the check's id, its severity and the node."""

    __slots__ = ("message", "slot", "bus_id", "expected", "found", "severity")

    message: str  # one line naming node, slot, bus ID, expected and found
    slot: int | None
    bus_id: str | None
    expected: str | None
    found: str | None
    severity: Severity | None  # None: the check's; lower only (e.g. not the job's GPU)

    def __init__(
        self,
        message: str,
        slot: int | None = None,
        bus_id: str | None = None,
        expected: str | None = None,
        found: str | None = None,
        severity: Severity | None = None,
    ) -> None:
        self._fill(message, slot, bus_id, expected, found, severity)


class Check(Record):
    """A registered node check: its id, worst severity, stage and the facts it needs."""

    __slots__ = ("id", "severity", "stage", "needs", "run", "reads", "action")

    id: str
    severity: Severity  # the worst it reports
    stage: Stage
    needs: frozenset[Need]
    run: Callable[..., Iterable[Observation]]
    reads: str  # what it reads (NVML calls, the map's keys, Slurm's variables)
    action: str  # what a person should do when it fires

    def __init__(
        self,
        id: str,
        severity: Severity,
        stage: Stage,
        needs: frozenset[Need],
        run: Callable[..., Iterable[Observation]],
        reads: str = "",
        action: str = "",
    ) -> None:
        self._fill(id, severity, stage, needs, run, reads, action)

    def finding(self, node: str, o: Observation, cap: Severity | None = None) -> Finding:
        """``cap``: the site's severity for this check, in place of the check's own; an
        observation that lowered itself (not the job's GPU) stays lower."""
        severity = o.severity or cap or self.severity
        if cap is not None and _RANK[severity] > _RANK[cap]:
            severity = cap
        return Finding(self.id, severity, node, o.message, o.slot, o.bus_id, o.expected, o.found)


_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}

if TYPE_CHECKING:
    F = TypeVar("F", bound=Callable[..., Iterable[Observation]])


class Registry:
    """Checks in the order they run: by stage, then as registered."""

    def __init__(self) -> None:
        self._checks: list[Check] = []

    def check(
        self,
        check_id: str,
        severity: Severity,
        *,
        stage: Stage,
        needs: Collection[Need] = (),
        reads: str = "",
        action: str = "",
    ) -> Callable[[F], F]:
        """Register the decorated function as a check; the function itself is unchanged.
        ``reads`` and ``action`` are for people (the checks reference page): given once per
        id, at its first function."""

        def register(func: F) -> F:
            check = Check(check_id, severity, stage, frozenset(needs), func, reads, action)
            self._checks.append(check)
            return func

        return register

    @property
    def checks(self) -> tuple[Check, ...]:
        return tuple(sorted(self._checks, key=lambda c: c.stage))  # stable: registration order

    def described(self, check_id: str) -> tuple[str, str]:
        """What a check reads and what to do when it fires (its first function says)."""
        found = [c for c in self._checks if c.id == check_id and (c.reads or c.action)]
        return (found[0].reads, found[0].action) if found else ("", "")

    @property
    def ids(self) -> tuple[str, ...]:
        """Every check id, once each, in run order."""
        return tuple(dict.fromkeys(c.id for c in self.checks))

    def run(self, facts: Facts) -> list[Finding]:
        """Every finding of every check whose facts are there, in the fixed order."""
        findings: list[Finding] = []
        wanted = facts.severity  # the site's: check id -> "error", "warning" or "off"
        for stage, group in groupby(self.checks, key=lambda c: c.stage):
            active = [
                (c, None if c.id not in wanted else Severity(wanted[c.id]))
                for c in group
                if all(facts.has(n) for n in c.needs) and wanted.get(c.id) != "off"
            ]
            for args in _targets(facts, stage.scope):
                for c, cap in active:
                    findings.extend(c.finding(facts.node, o, cap) for o in c.run(facts, *args))
        return findings


def _targets(facts: Facts, scope: Scope) -> Iterator[tuple[Any, ...]]:
    """The arguments after ``facts`` for each call of a check of ``scope``."""
    if scope is Scope.SLOT:
        yield from facts.pairs
    elif scope is Scope.GPU:
        yield from ((gpu,) for gpu in facts.physical)
    else:
        yield ()


REGISTRY = Registry()
check = REGISTRY.check
