"""``clusterjob sample-usage``: how busy a job's GPUs were, sampled inside the job.

The job script starts it in the background before its preflight, on the batch node; it
keeps NVML initialised and reads each of the job's GPUs' utilisation, memory used and power
every ``CLUSTERJOB_USAGE_INTERVAL`` seconds (default 30; 0 turns it off), until the job's
main process (the pid it is given: the batch shell, which ``exec`` makes the program) ends.
Memory is bounded whatever the job's length: running means and peaks, and a series of at most
``SERIES_POINTS`` means for a sparkline, neighbours merged pairwise when it fills up.

After every sample the record is replaced (written aside, then renamed) in the user's data
dir, ``usage/TOKEN/NODE.json`` (an array task: ``usage/TOKEN/TASK/NODE.json``), where
``status`` and ``show`` read it; a job killed outright loses at most one interval. Nothing
here can fail the job: every error ends the sampler quietly, said in the record when it can
be written.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusterjob import envvars
from clusterjob.node.allocation import Context, allocation_from_env

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from clusterjob.gpu.nvml import GpuUsage

__all__ = [
    "DEFAULT_INTERVAL",
    "SERIES_POINTS",
    "GpuSeries",
    "UsageRecord",
    "job_folder",
    "job_records_dir",
    "record_path",
    "sample_interval",
    "sample_usage_main",
    "usage_root",
]

DEFAULT_INTERVAL = 30.0  # seconds between samples: NVML reads cost ~0.1 ms, see benchmarks/
MIN_INTERVAL = 0.1
SERIES_POINTS = 60  # at most this many points per GPU in the record's series
RECORD_VERSION = 1
WATCH_SECONDS = 5.0  # how often the job's main process is looked for between samples


USAGE_HELP = """Usage: clusterjob sample-usage [PID]

  Sample this job's GPUs (utilisation, memory used, power; NVML) every
  $CLUSTERJOB_USAGE_INTERVAL seconds (default 30; 0: off) into the data dir's
  usage/TOKEN/NODE.json, until PID (default: the parent) ends. Started by the job
  script; always exits 0."""


def sample_interval(environ: Mapping[str, str]) -> float:
    """``CLUSTERJOB_USAGE_INTERVAL`` in seconds (0: no sampling); a bad value: the default."""
    text = environ.get(envvars.USAGE_INTERVAL, "").strip()
    if not text:
        return DEFAULT_INTERVAL
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_INTERVAL
    if value != value or value < 0:  # NaN or negative
        return DEFAULT_INTERVAL
    return 0.0 if value == 0 else max(MIN_INTERVAL, value)


def data_dir(environ: Mapping[str, str]) -> Path:
    """The user's clusterjob data dir, by the rule of ``clusterjob.jobs.private_files.data_dir``
    (a floor above: not imported here; tests/test_usage.py holds the two to one answer)."""
    override = environ.get(envvars.DATA_DIR)
    if override:
        return Path(override)
    base = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "clusterjob"


def record_path(base: Path, token: str, node: str, task: str | None = None) -> Path:
    """Where a job's usage record on ``node`` lives under the data dir ``base``."""
    where = job_records_dir(base, token)
    if task:
        where = where / _safe(task)
    return where / f"{_safe(node)}.json"


def usage_root(base: Path) -> Path:
    """The folder under the data dir ``base`` that holds every job's usage records."""
    return base / "usage"


def job_records_dir(base: Path, token: str) -> Path:
    """The folder under the data dir ``base`` that holds the records of the job ``token``."""
    return usage_root(base) / job_folder(token)


def job_folder(token: str) -> str:
    """The name of the folder under ``usage_root`` that holds the records of job ``token``."""
    return _safe(token)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".") or "_"


@dataclass
class GpuSeries:
    """One GPU's samples, in constant memory: sums and peaks, and a downsampled series."""

    bus_id: str
    samples: int = 0
    util_sum: float = 0.0
    util_samples: int = 0
    util_peak: int | None = None
    memory_sum: float = 0.0
    memory_samples: int = 0
    memory_peak: int | None = None
    power_sum: float = 0.0
    power_samples: int = 0
    power_peak: int | None = None
    points: list[float] = field(default_factory=list)  # each the mean of `width` samples
    width: int = 1
    _pending_sum: float = 0.0
    _pending: int = 0

    def add(self, utilization: int | None, memory_used: int | None, power_mw: int | None) -> None:
        self.samples += 1
        if utilization is not None:
            self.util_sum += utilization
            self.util_samples += 1
            self.util_peak = max(self.util_peak or 0, utilization)
            self._point(float(utilization))
        if memory_used is not None:
            self.memory_sum += memory_used
            self.memory_samples += 1
            self.memory_peak = max(self.memory_peak or 0, memory_used)
        if power_mw is not None:
            self.power_sum += power_mw
            self.power_samples += 1
            self.power_peak = max(self.power_peak or 0, power_mw)

    def _point(self, value: float) -> None:
        self._pending_sum += value
        self._pending += 1
        if self._pending < self.width:
            return
        self.points.append(self._pending_sum / self._pending)
        self._pending_sum, self._pending = 0.0, 0
        if len(self.points) >= SERIES_POINTS:  # merge neighbours: half the points, twice as wide
            pairs = zip(self.points[::2], self.points[1::2], strict=False)
            self.points = [(a + b) / 2 for a, b in pairs]
            self.width *= 2

    def series(self) -> list[float]:
        """The points, the one still filling included (as a mean of what it has)."""
        tail = [self._pending_sum / self._pending] if self._pending else []
        return [round(p, 1) for p in self.points + tail]

    def to_dict(self, interval: float) -> dict[str, object]:
        def mean(total: float, n: int) -> float | None:
            return round(total / n, 1) if n else None

        def mean_int(total: float, n: int) -> int | None:
            return int(total / n) if n else None

        power_mean = mean(self.power_sum, self.power_samples)
        return {
            "bus_id": self.bus_id,
            "samples": self.samples,
            "util_mean": mean(self.util_sum, self.util_samples),
            "util_peak": self.util_peak,
            "memory_mean": mean_int(self.memory_sum, self.memory_samples),
            "memory_peak": self.memory_peak,
            "power_mean_w": None if power_mean is None else round(power_mean / 1000, 1),
            "power_peak_w": None if self.power_peak is None else round(self.power_peak / 1000, 1),
            "series": self.series(),
            "series_step_s": round(self.width * interval, 3),
        }


@dataclass
class UsageRecord:
    """What one node's sampler knows of the job so far."""

    job_id: str
    node: str
    interval: float
    started: float
    task: str | None = None
    gpus: list[GpuSeries] = field(default_factory=list)
    updated: float | None = None
    ended: bool = False
    error: str | None = None

    def add(self, sample: Sequence[GpuUsage], now: float) -> None:
        """One reading of every GPU, in PCI order."""
        by_bus = {g.bus_id: g for g in self.gpus}
        for u in sample:
            series = by_bus.get(u.bus_id)
            if series is None:
                series = by_bus[u.bus_id] = GpuSeries(u.bus_id)
                self.gpus.append(series)
            series.add(u.utilization, u.memory_used, u.power_mw)
        self.updated = now

    def to_dict(self) -> dict[str, object]:
        return {
            "version": RECORD_VERSION,
            "job_id": self.job_id,
            "task": self.task,
            "node": self.node,
            "interval_s": self.interval,
            "started": round(self.started, 3),
            "updated": None if self.updated is None else round(self.updated, 3),
            "ended": self.ended,
            "error": self.error,
            "gpus": [g.to_dict(self.interval) for g in self.gpus],
        }

    def write(self, path: Path) -> None:
        """Replace the record at ``path`` whole (readers never see half of one)."""
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the user's alone
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), separators=(",", ":")))
        os.replace(tmp, path)


class _Stop(Exception):
    """SIGTERM (Slurm ending the job): write the record one last time and go."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's: there all the same
    return True


def job_bus_ids(environ: Mapping[str, str], every: Sequence[str]) -> tuple[str, ...]:
    """The job's GPUs among ``every`` GPU NVML sees on the node (PCI order): GRES index i
    is the i-th GPU in PCI order, as the node map's slots; all of them where the
    environment does not say (a device cgroup then shows NVML only the job's)."""
    slots = allocation_from_env(environ, Context.JOB).slots
    if slots is None:
        return tuple(every)
    ordered = sorted(every)
    return tuple(ordered[s] for s in slots if 0 <= s < len(ordered))


def run_sampler(
    record: UsageRecord,
    path: Path,
    read: Callable[[], Sequence[GpuUsage]],
    *,
    alive: Callable[[], bool],
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    max_samples: int | None = None,
) -> None:
    """Sample every ``record.interval`` seconds while ``alive()``, writing after each."""
    taken = 0
    try:
        while alive():
            record.add(read(), clock())
            record.write(path)
            taken += 1
            if max_samples is not None and taken >= max_samples:
                break
            deadline = clock() + record.interval
            while alive():
                left = deadline - clock()
                if left <= 0:
                    break
                sleep(min(left, WATCH_SECONDS))
    except _Stop:
        pass
    finally:
        record.ended = True
        record.write(path)


def sample_usage_main(args: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """``clusterjob sample-usage [PID]``: sample until PID (default: the parent) ends.
    Always exit 0: a job is never failed by its own bookkeeping."""
    env = os.environ if environ is None else environ
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE_HELP)
        return 0
    try:
        interval = sample_interval(env)
        token = env.get(envvars.TOKEN, "")
        if interval == 0 or not token:
            return 0
        watch = int(args[0]) if args else os.getppid()
        node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        task = env.get("SLURM_ARRAY_TASK_ID") or None
        job_id = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID", "")
        path = record_path(data_dir(env), token, node, task)
        record = UsageRecord(job_id, node, interval, time.time(), task)
    except (OSError, ValueError):
        return 0
    try:
        from clusterjob.gpu.nvml import UsageReader

        everything = UsageReader()
        wanted = job_bus_ids(env, tuple(everything.handles))
        everything.handles = {b: h for b, h in everything.handles.items() if b in wanted}
    except Exception as exc:  # NVML absent or broken: said in the record, the job goes on
        record.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        record.ended = True
        with contextlib.suppress(OSError):
            record.write(path)
        return 0

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C of an interactive job: its program's
    try:
        run_sampler(record, path, everything.read, alive=lambda: _alive(watch))
    except Exception:  # the data dir went away, NVML died: the job is not ours to fail
        pass
    finally:
        everything.close()
    return 0
