"""Render preflight reports and inventories for people (tables) and programs (JSON).

Stdlib only: the Prolog path imports this too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from clusterjob import __version__
from clusterjob.errors import printable
from clusterjob.gpu.inventory import Gpu, GpuInventory, clock_event_names
from clusterjob.node.checks import PreflightReport, Severity
from clusterjob.node.checks.health import HOT_MARGIN_C

__all__ = [
    "format_table",
    "gpu_health",
    "inventory_to_dict",
    "render_inventory",
    "render_json",
    "render_table",
    "summary_line",
]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces; trailing spaces stripped. Cells come from
    NVML and the node (a process's name is its owner's choice): escaped, one line each."""
    rows = [[printable(c) for c in row] for row in rows]
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    return [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [list(header), *rows]
    ]


def summary_line(report: PreflightReport) -> str:
    """The last line of the preflight output: the verdict for this node."""
    n_err, n_warn = len(report.errors), len(report.warnings)
    if report.ok:
        extra = f", {n_warn} warning(s)" if n_warn else ""
        return f"preflight {report.node}: OK ({len(report.rows)} GPU slot(s){extra})"
    return f"preflight {report.node}: FAILED ({n_err} error(s), {n_warn} warning(s))"


def render_table(report: PreflightReport, summary: bool = True) -> str:
    """The human output: slot table, then one line per finding, then the summary line.

    Allocated slots are marked with ``*``. ``summary=False`` leaves the summary to the caller
    (the CLI's error line carries it when the preflight fails).
    """
    header = ("SLOT", "BUS ID", "EXPECTED", "FOUND", "STATUS")
    rows = [
        (
            ("-" if r.slot is None else str(r.slot)) + ("*" if r.allocated else ""),
            r.bus_id or "-",
            r.expected or "-",
            r.found or "-",
            r.status,
        )
        for r in report.rows
    ]
    lines = format_table(header, rows) if rows else [printable(f"{report.node}: no GPUs")]
    for f in report.findings:
        if f.severity is not Severity.INFO:
            lines.append(printable(f"{f.severity.value}: {f.check_id}: {f.message}"))
    if summary:
        lines.append(printable(summary_line(report)))
    return "\n".join(lines)


def render_json(report: PreflightReport) -> str:
    """The report, and which clusterjob made it (a node/login version skew shows here)."""
    return json.dumps({**report.to_dict(), "version": __version__}, indent=2, sort_keys=True)


def gpu_health(gpu: Gpu) -> str:
    """A short health word for the ``gpus`` table: ``ok`` or the problems, comma-separated."""
    if gpu.lost:
        return "lost"
    problems = []
    if gpu.ecc_uncorrectable_volatile:
        problems.append(f"ecc:{gpu.ecc_uncorrectable_volatile}")
    if gpu.remapped_rows_failure:
        problems.append("remap-failure")
    if gpu.remapped_rows_pending:
        problems.append("remap-pending")
    if gpu.mig_pending is not None and gpu.mig_current is not None:
        if gpu.mig_pending != gpu.mig_current:
            problems.append("mig-pending")
        elif gpu.mig_current:
            problems.append("mig")
    problems += _link_words(gpu)
    return ",".join(problems) or "ok"


_SLOWDOWN_BITS = 0x8 | 0x20 | 0x40 | 0x80  # hw_slowdown, sw_thermal, hw_thermal, hw_power_brake


def _link_words(gpu: Gpu) -> list[str]:
    """What the link, fabric and clock checks look at, where it is worth a look."""
    words = []
    width, width_max = gpu.pcie_link_width, gpu.pcie_link_width_max
    if width is not None and width_max is not None and width < width_max:
        words.append(f"pcie:x{width}/x{width_max}")
    links = gpu.nvlink_active
    if links and 0 < sum(links) < len(links):
        words.append(f"nvlink:{sum(links)}/{len(links)}")
    if gpu.fabric_state is not None and (gpu.fabric_state != "completed" or gpu.fabric_status):
        words.append(f"fabric:{gpu.fabric_state}")
    if gpu.clock_event_reasons and gpu.clock_event_reasons & _SLOWDOWN_BITS:
        words += clock_event_names(gpu.clock_event_reasons & _SLOWDOWN_BITS)
    temp, slowdown = gpu.temperature, gpu.temperature_slowdown
    if temp is not None and slowdown is not None and temp >= slowdown - HOT_MARGIN_C:
        words.append(f"hot:{temp}C")
    if gpu.power_limit and gpu.power_limit_default and gpu.power_limit < gpu.power_limit_default:
        words.append(f"power:{gpu.power_limit // 1000}W/{gpu.power_limit_default // 1000}W")
    if gpu.retired_pages_pending:
        words.append("retire-pending")
    if gpu.persistence_mode is False:
        words.append("persistence-off")
    return words


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.0f} GiB"


def in_use_by(gpu: Gpu, holders: Mapping[str, str]) -> str:
    """Who holds a GPU: a ``clusterjob run`` claim (keyed by UUID, else bus ID) and the compute
    processes NVML sees on it ("?" where NVML cannot list them)."""
    parts = []
    claim = holders.get(gpu.uuid or gpu.bus_id)
    if claim:
        parts.append(f"claimed by {claim}")
    if gpu.processes is None:
        parts.append("processes: ?")
    elif gpu.processes:
        parts.append(
            ", ".join(
                f"pid {p.pid} {p.name or '?'} ({_gib(p.used_memory)}, {p.user or '?'})"
                for p in gpu.processes
            )
        )
    return "; ".join(parts) or "-"


def gpu_links(gpu: Gpu) -> str:
    """The ``gpus`` table's LINKS: PCIe width and generation (``x8/x16`` below the board's
    maximum), NVLinks up of all, NVSwitch fabric state, and the clock-event reasons active now;
    "-" where NVML tells none of these."""
    parts = []
    if gpu.pcie_link_width is not None:
        width, most = gpu.pcie_link_width, gpu.pcie_link_width_max
        shown = f"x{width}/x{most}" if most is not None and width < most else f"x{width}"
        parts.append(f"{shown} gen{gpu.pcie_link_gen if gpu.pcie_link_gen is not None else '?'}")
    if gpu.nvlink_active:
        parts.append(f"nvlink {sum(gpu.nvlink_active)}/{len(gpu.nvlink_active)}")
    if gpu.fabric_state is not None:
        failed = gpu.fabric_state == "completed" and gpu.fabric_status
        parts.append(f"fabric {'failed' if failed else gpu.fabric_state}")
    if gpu.clock_event_reasons:
        parts.append("clocks " + "+".join(clock_event_names(gpu.clock_event_reasons)))
    return ", ".join(parts) or "-"


def render_inventory(inv: GpuInventory, holders: Mapping[str, str] | None = None) -> str:
    """The ``clusterjob gpus`` table, in PCI bus order (NVML's own index shown for reference)."""
    holders = holders or {}
    header = (
        "INDEX", "BUS ID", "NAME", "MEMORY", "MINOR", "UUID", "HEALTH", "LINKS", "IN USE BY"
    )  # fmt: skip
    rows: list[tuple[str, ...]] = []
    gpus = sorted(inv.gpus, key=lambda g: g.bus_id)
    for g in gpus:
        rows.append(
            (
                str(g.index),
                g.bus_id,
                g.name or "-",
                _gib(g.memory_total),
                "-" if g.minor is None else str(g.minor),
                g.uuid or "-",
                gpu_health(g),
                gpu_links(g),
                in_use_by(g, holders),
            )
        )
        rows += [  # its MIG slices, under it: GPU index/MIG device index
            (f"{g.index}/{m.index}", g.bus_id, m.name or "-", _gib(m.memory_total), "-",
             m.uuid or "-", "-", "-", "-")
            for m in g.mig_devices or ()
        ]  # fmt: skip
    lines = format_table(header, rows) if rows else ["no GPUs"]
    cuda = inv.cuda_driver_version
    cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "-"
    slices = sum(len(g.mig_devices or ()) for g in gpus)
    counted = f"{len(gpus)} GPU(s)" + (f", {slices} MIG slice(s)" if slices else "")
    lines.append(printable(f"driver {inv.driver_version or '-'}, CUDA {cuda_text}, {counted}"))
    return "\n".join(lines)


def inventory_to_dict(
    inv: GpuInventory, holders: Mapping[str, str] | None = None
) -> dict[str, object]:
    return {
        "driver_version": inv.driver_version,
        "cuda_driver_version": inv.cuda_driver_version,
        "gpus": [g.as_dict() for g in inv.gpus],
        "claims": dict(holders or {}),  # clusterjob run claims: GPU UUID (or bus ID) -> holder
    }
