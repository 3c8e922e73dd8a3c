"""The node-side GPU preflight: what the node map and the job say, against what NVML sees.

Pure logic, no I/O: inputs are plain data (the node's expected slots from the site map, the
model -> NVML-name table, a ``GpuInventory``, the job's ``Allocation``), the output is a
``PreflightReport``. Slot i is Slurm GRES index i, the i-th GPU in PCI bus order.
Every finding has a stable ``check_id`` that logs, JSON output and tests rely on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum

from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.node.allocation import Allocation
from clusterjob.site.model import NodeGpu

__all__ = [
    "CHECK_IDS",
    "Finding",
    "PreflightReport",
    "Severity",
    "SlotRow",
    "model_of",
    "run_checks",
]

# Every check_id this module can emit; renaming one is a breaking change for log readers.
CHECK_IDS = (
    "node-unmapped",
    "gpu-count",
    "gpu-missing",
    "gpu-extra",
    "model-mismatch",
    "gpu-uuid",
    "gres-index",
    "alloc-slot",
    "alloc-model",
    "alloc-count",
    "alloc-env",
    "cuda-order",
    "gpu-lost",
    "ecc-uncorrectable",
    "row-remap-pending",
    "row-remap-failure",
    "mig-pending",
)


class Severity(str, Enum):
    ERROR = "error"  # the job would run on the wrong or a broken GPU: fail / drain
    WARNING = "warning"  # worth a person's look; the job may run
    INFO = "info"


@dataclass(frozen=True)
class Finding:
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


def model_of(nvml_name: str | None, models: Mapping[str, tuple[str, ...]]) -> str | None:
    """The site's canonical model for an NVML device name (exact, case-insensitive), or None."""
    if nvml_name is None:
        return None
    wanted = nvml_name.casefold()
    for canonical, names in models.items():
        if any(wanted == n.casefold() for n in names):
            return canonical
    return None


def _found_text(gpu: Gpu | None, models: Mapping[str, tuple[str, ...]]) -> str | None:
    if gpu is None:
        return None
    if gpu.name is None:
        return "unknown GPU (NVML gave no name)"
    model = model_of(gpu.name, models)
    return f"{gpu.name} ({model})" if model else f"{gpu.name} (not a model of this site)"


def _where(node: str, slot: int | None, bus_id: str | None) -> str:
    if slot is None:
        return f"{node}: {bus_id}" if bus_id else node
    return f"{node}: slot {slot} ({bus_id or 'bus ID unknown'})"


@dataclass
class _Match:
    """Slots paired with GPUs; ``extra`` are GPUs no slot claims."""

    pairs: list[tuple[NodeGpu, Gpu | None]] = field(default_factory=list)
    extra: list[Gpu] = field(default_factory=list)
    by_bus_id: bool = False


def _match(expected: tuple[NodeGpu, ...], inventory: GpuInventory) -> _Match:
    """Pair slots and GPUs by PCI bus ID when the map gives every bus ID, else by PCI order."""
    physical = sorted(inventory.gpus, key=lambda g: g.bus_id)
    if expected and all(s.bus_id for s in expected):
        claimed: set[str] = set()
        pairs: list[tuple[NodeGpu, Gpu | None]] = []
        for slot in expected:
            gpu = next((g for g in physical if g.bus_id == slot.bus_id), None)
            if gpu is not None:
                claimed.add(gpu.bus_id)
            pairs.append((slot, gpu))
        extra = [g for g in physical if g.bus_id not in claimed]
        return _Match(pairs, extra, by_bus_id=True)
    pairs = [(slot, physical[i] if i < len(physical) else None) for i, slot in enumerate(expected)]
    return _Match(pairs, physical[len(expected) :], by_bus_id=False)


def _health(node: str, slot: int | None, gpu: Gpu, allocated: bool | None) -> list[Finding]:
    """Health findings for one GPU. ``allocated``: None when the job's GPUs are unknown.

    A broken GPU the job was given (or may have been given) is an error; one it was not
    given is a warning, so the node is drained when a job would actually land on it.
    """
    sev_job = Severity.WARNING if allocated is False else Severity.ERROR
    where = _where(node, slot, gpu.bus_id)
    label = f"{where}: {gpu.name}" if gpu.name else where
    out: list[Finding] = []

    def add(check_id: str, severity: Severity, what: str, found: str) -> None:
        out.append(
            Finding(check_id, severity, node, f"{label}: {what}", slot, gpu.bus_id, None, found)
        )

    if gpu.lost:
        add("gpu-lost", Severity.ERROR, "NVML says GPU is lost -- reset or reboot the node", "lost")
        return out
    if gpu.ecc_uncorrectable_volatile:
        add(
            "ecc-uncorrectable",
            sev_job,
            f"{gpu.ecc_uncorrectable_volatile} uncorrectable ECC error(s) since the last reset",
            str(gpu.ecc_uncorrectable_volatile),
        )
    if gpu.remapped_rows_failure:
        add(
            "row-remap-failure",
            sev_job,
            "row remapping failed -- the GPU needs service",
            "remap failure",
        )
    if gpu.remapped_rows_pending:
        add(
            "row-remap-pending",
            Severity.WARNING,
            "row remapping pending -- reset the GPU to apply it",
            "remap pending",
        )
    if (
        gpu.mig_pending is not None
        and gpu.mig_current is not None
        and gpu.mig_pending != gpu.mig_current
    ):
        cur = "on" if gpu.mig_current else "off"
        pend = "on" if gpu.mig_pending else "off"
        add(
            "mig-pending",
            sev_job,
            f"MIG mode is {cur}, {pend} pending a GPU reset",
            f"mig {cur}->{pend}",
        )
    return out


def _worst(findings: list[Finding]) -> str:
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    relevant = [f for f in findings if f.severity is not Severity.INFO]
    if not relevant:
        return "ok"
    return min(relevant, key=lambda f: order[f.severity]).check_id


def run_checks(
    node: str,
    expected: tuple[NodeGpu, ...] | None,
    models: Mapping[str, tuple[str, ...]],
    inventory: GpuInventory,
    allocation: Allocation | None = None,
    expect_model: str | None = None,
    expect_count: int | None = None,
    cuda_device_order: str | None = None,
    check_cuda_order: bool = False,
) -> PreflightReport:
    """Compare the node map and the job's request with the inventory; return every finding.

    ``expected`` is None when the node is not in the map: only the per-job checks and the
    health checks can run then. ``check_cuda_order`` is for job context (the Prolog runs
    before the TaskProlog sets ``CUDA_DEVICE_ORDER``, so there it would always fire).
    """
    findings: list[Finding] = []
    per_slot: dict[int, list[Finding]] = {}
    per_extra: dict[str, list[Finding]] = {}

    def add(f: Finding) -> None:
        findings.append(f)
        if f.slot is not None:
            per_slot.setdefault(f.slot, []).append(f)
        elif f.bus_id is not None:
            per_extra.setdefault(f.bus_id, []).append(f)

    # -- which GPU is in which slot ------------------------------------------------------
    physical = sorted(inventory.gpus, key=lambda g: g.bus_id)
    if expected is None:
        add(
            Finding(
                "node-unmapped",
                Severity.WARNING,
                node,
                f"{node}: not in the site's node map -- only the job's own request and GPU health "
                f"are checked ({len(physical)} GPU(s) found)",
                expected="in node map",
                found="not in node map",
            )
        )
        slot_gpu: dict[int, Gpu | None] = dict(enumerate(physical))
        match = _Match([(NodeGpu(i, ""), g) for i, g in enumerate(physical)], [], False)
    else:
        match = _match(expected, inventory)
        slot_gpu = {s.slot: g for s, g in match.pairs}
        if len(physical) != len(expected):
            add(
                Finding(
                    "gpu-count",
                    Severity.ERROR,
                    node,
                    f"{node}: expected {len(expected)} GPU(s), found {len(physical)}",
                    expected=str(len(expected)),
                    found=str(len(physical)),
                )
            )
        how = "" if match.by_bus_id else " (matched by PCI order: the node map has no bus IDs)"
        for slot, gpu in match.pairs:
            if gpu is None:
                add(
                    Finding(
                        "gpu-missing",
                        Severity.ERROR,
                        node,
                        f"{_where(node, slot.slot, slot.bus_id)}: expected {slot.model}, found "
                        f"nothing -- GPU missing or fallen off the bus{how}",
                        slot.slot,
                        slot.bus_id,
                        slot.model,
                        None,
                    )
                )
                continue
            if gpu.lost:
                continue  # NVML could not say what it is; the health checks report it lost
            found_model = model_of(gpu.name, models)
            if found_model != slot.model:
                add(
                    Finding(
                        "model-mismatch",
                        Severity.ERROR,
                        node,
                        f"{_where(node, slot.slot, gpu.bus_id)}: expected {slot.model}, found "
                        f"{_found_text(gpu, models)} -- boards swapped or node map wrong{how}",
                        slot.slot,
                        gpu.bus_id,
                        slot.model,
                        gpu.name,
                    )
                )
            if slot.uuid and gpu.uuid and slot.uuid != gpu.uuid:
                add(
                    Finding(
                        "gpu-uuid",
                        Severity.WARNING,
                        node,
                        f"{_where(node, slot.slot, gpu.bus_id)}: expected UUID {slot.uuid}, found "
                        f"{gpu.uuid} -- board replaced or node map out of date",
                        slot.slot,
                        gpu.bus_id,
                        slot.uuid,
                        gpu.uuid,
                    )
                )
        for gpu in match.extra:
            add(
                Finding(
                    "gpu-extra",
                    Severity.ERROR,
                    node,
                    f"{node}: {gpu.bus_id}: expected no GPU, found {_found_text(gpu, models)} -- "
                    "not in the node map, so GRES indices and CUDA indices disagree",
                    None,
                    gpu.bus_id,
                    None,
                    gpu.name,
                )
            )

    # -- the job's GPUs ------------------------------------------------------------------
    allocated: list[int] | None = None
    if allocation is not None:
        for problem in allocation.problems:
            add(Finding("alloc-env", Severity.WARNING, node, f"{node}: {problem}"))
        if allocation.slots is not None:
            allocated = list(allocation.slots)
        if allocation.uuids:
            resolved: list[int] = []
            for u in allocation.uuids:
                hits = [
                    s
                    for s, g in slot_gpu.items()
                    if g is not None and g.uuid and g.uuid.startswith(u)
                ]
                if len(hits) == 1:
                    resolved.append(hits[0])
                else:
                    add(
                        Finding(
                            "alloc-slot",
                            Severity.ERROR,
                            node,
                            f"{node}: CUDA_VISIBLE_DEVICES names {u}, which is "
                            f"{'no GPU' if not hits else 'more than one GPU'} on this node",
                            expected="a GPU of this node",
                            found=u,
                        )
                    )
            if allocated is None:
                allocated = resolved
        if allocation.mig_devices:
            add(
                Finding(
                    "alloc-env",
                    Severity.INFO,
                    node,
                    f"{node}: job was given MIG devices ({','.join(allocation.mig_devices)}); "
                    "their parent GPUs are not checked per slot",
                )
            )
    allocated_set = set(allocated or ())
    if allocated is not None:
        for s in allocated:
            if s not in slot_gpu:
                n = len(expected) if expected is not None else len(physical)
                add(
                    Finding(
                        "alloc-slot",
                        Severity.ERROR,
                        node,
                        f"{node}: job was given GRES index {s}, but the node has {n} GPU slot(s) "
                        "-- gres.conf and the node map disagree",
                        expected=f"index < {n}",
                        found=str(s),
                    )
                )

    # -- GRES index vs device file (minor number) -----------------------------------------
    if expected is not None:
        for slot, gpu in match.pairs:
            if gpu is None or gpu.lost or gpu.minor is None or gpu.minor == slot.slot:
                continue
            job_has_it = slot.slot in allocated_set
            add(
                Finding(
                    "gres-index",
                    Severity.ERROR if job_has_it else Severity.WARNING,
                    node,
                    f"{_where(node, slot.slot, gpu.bus_id)}: GRES index {slot.slot} is "
                    f"/dev/nvidia{gpu.minor} (minor {gpu.minor}) -- with gres.conf "
                    f"File=/dev/nvidia{slot.slot} this slot's job gets another GPU; use "
                    "AutoDetect=nvml or list File= in bus order",
                    slot.slot,
                    gpu.bus_id,
                    f"minor {slot.slot}",
                    f"minor {gpu.minor}",
                )
            )

    # -- what the job asked for ----------------------------------------------------------
    job_gpus = [(s, slot_gpu.get(s)) for s in sorted(allocated_set)]
    if expect_count is not None:
        got = len(allocated_set) if allocated is not None else 0
        if got != expect_count:
            src = allocation.source if allocation is not None and allocation.source else None
            detail = f" ({src})" if src else " (SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES unset)"
            add(
                Finding(
                    "alloc-count",
                    Severity.ERROR,
                    node,
                    f"{node}: job asked for {expect_count} GPU(s) on this node, was given "
                    f"{got}{detail if got == 0 else ''}",
                    expected=str(expect_count),
                    found=str(got),
                )
            )
    if expect_model is not None:
        for s, gpu in job_gpus:
            if gpu is None:
                continue
            found_model = model_of(gpu.name, models)
            if found_model is None or found_model.casefold() != expect_model.casefold():
                add(
                    Finding(
                        "alloc-model",
                        Severity.ERROR,
                        node,
                        f"{_where(node, s, gpu.bus_id)}: job asked for {expect_model}, was given "
                        f"{_found_text(gpu, models)}",
                        s,
                        gpu.bus_id,
                        expect_model,
                        gpu.name,
                    )
                )
    if check_cuda_order:
        names = {gpu.name for _, gpu in job_gpus if gpu is not None}
        if len(names) > 1 and cuda_device_order != "PCI_BUS_ID":
            order = cuda_device_order or "unset (FASTEST_FIRST)"
            mixed = ", ".join(sorted(n or "?" for n in names))
            add(
                Finding(
                    "cuda-order",
                    Severity.ERROR,
                    node,
                    f"{node}: job has mixed GPUs ({mixed}) and "
                    f"CUDA_DEVICE_ORDER is {order} -- CUDA index i is not GRES index i; "
                    "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
                    expected="PCI_BUS_ID",
                    found=cuda_device_order,
                )
            )

    # -- health --------------------------------------------------------------------------
    slot_of_bus = {g.bus_id: s for s, g in slot_gpu.items() if g is not None}
    for gpu in physical:
        at = slot_of_bus.get(gpu.bus_id)
        given = None if allocated is None else (at is not None and at in allocated_set)
        for f in _health(node, at, gpu, given):
            add(f)

    # -- the table -----------------------------------------------------------------------
    rows: list[SlotRow] = []
    if expected is not None:
        for slot, gpu in match.pairs:
            rows.append(
                SlotRow(
                    slot.slot,
                    gpu.bus_id if gpu else slot.bus_id,
                    slot.model,
                    _found_text(gpu, models),
                    _worst(per_slot.get(slot.slot, [])),
                    slot.slot in allocated_set,
                )
            )
        extra = match.extra
    else:
        extra = []
        for i, gpu in enumerate(physical):
            rows.append(
                SlotRow(
                    i,
                    gpu.bus_id,
                    None,
                    _found_text(gpu, models),
                    _worst(per_slot.get(i, [])),
                    i in allocated_set,
                )
            )
    for gpu in extra:
        rows.append(
            SlotRow(
                None,
                gpu.bus_id,
                None,
                _found_text(gpu, models),
                _worst(per_extra.get(gpu.bus_id, [])),
            )
        )

    return PreflightReport(
        node=node,
        findings=tuple(findings),
        rows=tuple(rows),
        allocated_slots=tuple(sorted(allocated_set)) if allocated is not None else None,
        driver_version=inventory.driver_version,
        cuda_driver_version=inventory.cuda_driver_version,
    )
