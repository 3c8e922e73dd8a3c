"""How busy a job's GPUs were, as its in-job sampler recorded it (``clusterjob.node.usage``).

The sampler writes one small JSON record per node (per array task and node) in the data dir,
``usage/TOKEN/``; here they are read back for ``status``, ``show`` and the API's
``JobStatus.gpu_usage``: per GPU the mean and peak utilisation, memory and power, the
utilisation over the job as a series, and whether the GPU stayed idle.

A GPU is *idle* when its mean utilisation stayed under ``IDLE_PERCENT`` (5 %) over at least
``IDLE_MIN_SAMPLES`` (2) samples: asked for, given, and not used. One sample is too few to
say (a job caught while loading its data).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterjob.jobs.private_files import data_dir

if TYPE_CHECKING:
    from clusterjob.jobs.registry import JobRecord
    from clusterjob.jobs.status import JobStatus

__all__ = [
    "IDLE_MIN_SAMPLES",
    "IDLE_PERCENT",
    "GpuUsage",
    "idle_note",
    "read_usage",
    "sparkline",
    "task_summaries",
    "usage_lines",
    "with_usage",
]

IDLE_PERCENT = 5.0  # mean utilisation below this ...
IDLE_MIN_SAMPLES = 2  # ... over at least this many samples: the GPU stayed idle
BARS = "▁▂▃▄▅▆▇█"
MAX_RECORDS = 4096  # records read for one job (an array's tasks x nodes), at most
MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True)
class GpuUsage:
    """One GPU of a job (of an array task) on one node, over the job so far."""

    node: str
    bus_id: str
    samples: int
    util_mean: float | None  # percent
    util_peak: int | None
    memory_mean: int | None  # bytes
    memory_peak: int | None
    power_mean_w: float | None
    power_peak_w: float | None
    idle: bool
    series: tuple[float, ...] = ()  # utilisation, at most 60 points over the job
    series_step_s: float | None = None  # seconds each point stands for
    task: str | None = None  # an array task's id
    ended: bool = False  # the sampler wrote its last record (the job ended)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def is_idle(util_mean: float | None, samples: int) -> bool:
    return util_mean is not None and samples >= IDLE_MIN_SAMPLES and util_mean < IDLE_PERCENT


def _from_record(data: dict[str, Any]) -> list[GpuUsage]:
    out = []
    for g in data.get("gpus") or ():
        if not isinstance(g, dict):
            continue
        samples = _int(g.get("samples")) or 0
        util_mean = _number(g.get("util_mean"))
        raw = g.get("series")
        series: list[Any] = raw if isinstance(raw, list) else []
        out.append(
            GpuUsage(
                node=str(data.get("node") or "?"),
                bus_id=str(g.get("bus_id") or "?"),
                samples=samples,
                util_mean=util_mean,
                util_peak=_int(g.get("util_peak")),
                memory_mean=_int(g.get("memory_mean")),
                memory_peak=_int(g.get("memory_peak")),
                power_mean_w=_number(g.get("power_mean_w")),
                power_peak_w=_number(g.get("power_peak_w")),
                idle=is_idle(util_mean, samples),
                series=tuple(v for v in (_number(p) for p in series[:256]) if v is not None),
                series_step_s=_number(g.get("series_step_s")),
                task=str(data["task"]) if data.get("task") is not None else None,
                ended=bool(data.get("ended")),
            )
        )
    return out


def usage_dir(token: str, base: Path | None = None) -> Path:
    from clusterjob.node.usage import job_records_dir

    return job_records_dir(base or data_dir(), token)


def read_usage(token: str, base: Path | None = None) -> tuple[GpuUsage, ...]:
    """Every GPU the job's samplers recorded, by task, node and bus id; () when none did
    (no GPUs, sampling off, not started yet, or the job ran where this data dir is not)."""
    root = usage_dir(token, base)
    if not token or not root.is_dir():
        return ()
    found: list[GpuUsage] = []
    paths = sorted(p for p in root.rglob("*.json") if not p.name.startswith("."))
    for path in paths[:MAX_RECORDS]:
        try:
            if path.stat().st_size > MAX_RECORD_BYTES:
                continue
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            found.extend(_from_record(data))

    def order(u: GpuUsage) -> tuple[int, str, str, str]:
        task = int(u.task) if u.task and u.task.isdigit() else -1
        return (task, u.task or "", u.node, u.bus_id)

    return tuple(sorted(found, key=order))


def with_usage(rows: Sequence[JobStatus], records: Sequence[JobRecord]) -> list[JobStatus]:
    """``rows`` with ``gpu_usage`` filled from the records of their jobs (an array task's row:
    that task's only). A few small local files per job; no Slurm call."""
    from clusterjob.node.usage import job_folder

    tokens = {r.job_id: r.token for r in records}
    recorded = _recorded_folders(data_dir())  # one listing, not a look per row
    out = []
    for row in rows:
        base, _, task = row.job_id.partition("_")
        token = tokens.get(base)
        usage = read_usage(token) if token and job_folder(token) in recorded else ()
        if task:
            usage = tuple(u for u in usage if u.task == task)
        out.append(replace(row, gpu_usage=usage) if usage else row)
    return out


def _recorded_folders(base: Path) -> frozenset[str]:
    """The jobs with usage records under the data dir ``base``: their folders' names."""
    from clusterjob.node.usage import usage_root

    try:
        return frozenset(os.listdir(usage_root(base)))
    except OSError:  # none yet (no job sampled), or not readable: as if none
        return frozenset()


def sparkline(series: Sequence[float]) -> str:
    """Utilisation percentages as one line of block characters, ▁ (0 %) to █ (100 %)."""
    top = len(BARS) - 1
    return "".join(BARS[max(0, min(top, round(v / 100 * top)))] for v in series)


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024**3:.1f} GiB"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def _watts(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} W"


def describe(u: GpuUsage) -> str:
    """``gpu1 0000:3b:00.0: util mean 48% peak 97%, memory mean 9.0 GiB peak 9.1 GiB,
    power mean 420 W peak 650 W, 12 samples``, with ``IDLE`` in front of an idle GPU's."""
    where = f"{u.node} {u.bus_id}"
    text = (
        f"{where}: util mean {_pct(u.util_mean)} peak {_pct(u.util_peak)}, memory mean "
        f"{_gib(u.memory_mean)} peak {_gib(u.memory_peak)}, power mean {_watts(u.power_mean_w)} "
        f"peak {_watts(u.power_peak_w)}, {u.samples} sample{'s' if u.samples != 1 else ''}"
    )
    return f"IDLE {text}" if u.idle else text


def idle_note(usage: Sequence[GpuUsage]) -> str | None:
    """One line for ``status``: which of the job's GPUs stayed idle, or None."""
    idle = [u for u in usage if u.idle]
    if not idle:
        return None
    names = ", ".join(
        f"{'task ' + u.task + ' ' if u.task else ''}{u.node} {u.bus_id} (mean {_pct(u.util_mean)})"
        for u in idle[:4]
    )
    more = f" and {len(idle) - 4} more" if len(idle) > 4 else ""
    return (
        f"{len(idle)} of {len(usage)} GPU(s) stayed idle (mean utilisation under "
        f"{IDLE_PERCENT:g}%): {names}{more}"
    )


def task_summaries(usage: Sequence[GpuUsage]) -> list[str]:
    """An array's GPUs, one short line per task: its mean utilisation and idle GPUs."""
    by_task: dict[str, list[GpuUsage]] = {}
    for u in usage:
        if u.task is not None:
            by_task.setdefault(u.task, []).append(u)
    lines = []
    for task, gpus in by_task.items():
        means = [u.util_mean for u in gpus if u.util_mean is not None]
        mean = sum(means) / len(means) if means else None
        idle = sum(u.idle for u in gpus)
        said = f", {idle} of {len(gpus)} idle" if idle else ""
        lines.append(f"task {task}: {len(gpus)} GPU(s), util mean {_pct(mean)}{said}")
    return lines


def usage_lines(usage: Sequence[GpuUsage], *, spark: bool = True) -> list[str]:
    """``show``'s lines: each GPU's figures and its utilisation as a sparkline (an array:
    one summary line per task instead, kept short)."""
    if any(u.task is not None for u in usage):
        return task_summaries(usage)
    lines = []
    for u in usage:
        lines.append(describe(u))
        if spark and u.series:
            step = f" (one mark per {u.series_step_s:g}s)" if u.series_step_s else ""
            lines.append(f"  {sparkline(u.series)}{step}")
    return lines
