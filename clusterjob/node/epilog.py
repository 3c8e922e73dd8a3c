"""``clusterjob epilog``: the Slurm Epilog that tells a GPU that failed from a program that did.

It runs as root after every job on every node of it, with the Prolog's rules (stdlib only,
config from the command line only and checked by ``node.trust``, its own deadline, NVML read in
a forked child, one line on stderr, never a traceback). For the job's GPUs only it reads NVML's
error state (Xid critical-error events, volatile uncorrectable ECC count, pending or failed row
remapping, pending page retirement, a GPU lost) and the kernel log's ``NVRM: Xid`` lines for
their bus IDs; it appends one JSON line per job to ``epilog.jsonl`` beside the Prolog's log
(rotated once past ``MAX_LOG_BYTES``), and on a fault that needs a reset it drains the node
itself (``scontrol update``: slurmctld does not wait for an Epilog) with a reason such as
``clusterjob: Xid 79 (GPU fell off the bus) on gpu2 0000:3b:00.0 during job 123``, which is
also how ``clusterjob status`` learns it (the reason names the job). Where Slurm cannot be
told, it exits 1: slurmd drains the node ("Epilog error") and a detached helper puts our
reason in its place, as for the Prolog.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from clusterjob.errors import ClusterjobError, NvmlError, NvmlErrorKind, printable
from clusterjob.gpu.inventory import GpuInventory
from clusterjob.gpu.isolation import ReadTimedOut, kill_children, start_in_child
from clusterjob.node import drain, xid
from clusterjob.node.allocation import Allocation, Context, allocation_from_env
from clusterjob.node.context import (
    DEFAULT_CACHE_DIR,
    DEFAULT_POLICY,
    DEFAULT_SITE,
    node_name,
    one_line,
)
from clusterjob.node.prolog import PrologRun, _open_cache, _open_compiled
from clusterjob.node.trust import open_trusted, open_trusted_append
from clusterjob.record import Record
from clusterjob.site.nodemodel import gres_units
from clusterjob.site.nodeview import NodeView, load_node_view_fd

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["EPILOG_LOG_NAME", "MAX_LOG_BYTES", "EpilogRun", "GpuFault", "run_epilog"]

EPILOG_LOG_NAME = "epilog.jsonl"  # beside the Prolog's log (the site's prolog.log)
MAX_LOG_BYTES = 16 * 1024 * 1024  # past this the log is moved to epilog.jsonl.1 (one kept)


class GpuFault(Record):
    """One thing found wrong with one of the job's GPUs."""

    __slots__ = ("kind", "slot", "bus_id", "summary", "cause", "drain", "xid", "source")

    kind: str  # "xid", "gpu-lost", "ecc-uncorrectable", "row-remap-failure", ...
    slot: int | None  # the node map's slot (gpuN); None: a GPU NVML could not place
    bus_id: str | None
    summary: str  # "Xid 79 (GPU fell off the bus)"
    cause: str  # "hardware", "driver", "application", "unknown"
    drain: bool
    xid: int | None
    source: str  # "nvml" or "kernel"

    def __init__(
        self,
        kind: str,
        slot: int | None,
        bus_id: str | None,
        summary: str,
        cause: str,
        drain: bool,
        xid: int | None = None,
        source: str = "nvml",
    ) -> None:
        self._fill(kind, slot, bus_id, summary, cause, drain, xid, source)

    def where(self) -> str:
        gpu = f"gpu{self.slot}" if self.slot is not None else "a GPU"
        return f"{gpu} {self.bus_id}" if self.bus_id else gpu

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "slot": self.slot,
            "bus_id": self.bus_id,
            "summary": self.summary,
            "cause": self.cause,
            "drain": self.drain,
            "xid": self.xid,
            "source": self.source,
        }


class EpilogRun(PrologRun):
    """The Prolog's run state, with the Epilog's log, prefix and drain reason."""

    __slots__ = ("kernel_log",)

    def __init__(
        self,
        node: str,
        job_id: str | None,
        log_override: str | None,
        deadline_override: float | None,
        under_slurmd: bool = False,
        kernel_log: str | None = None,  # a file instead of /dev/kmsg (tests; --kernel-log)
    ) -> None:
        super().__init__(node, job_id, log_override, deadline_override, under_slurmd)
        self.kernel_log = kernel_log

    def log_path(self) -> Path:
        if self.log_override:
            return Path(self.log_override)
        prolog_log = Path((self.policy or DEFAULT_POLICY).log_path)
        return prolog_log.with_name(EPILOG_LOG_NAME)

    def log(self, record: dict[str, Any]) -> str | None:
        """Append one JSON line (rotated past MAX_LOG_BYTES); a problem instead of failing."""
        path = self.log_path()
        record = {**self.log_fields(), "hook": "epilog", **record}
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        try:  # only into a path root alone controls; never a FIFO, symlink or hard link
            fd = open_trusted_append(path, 0o640)
            if os.fstat(fd).st_size + len(line) > MAX_LOG_BYTES:
                os.close(fd)
                os.replace(path, path.with_name(path.name + ".1"))  # checked dir: root's
                fd = open_trusted_append(path, 0o640)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as exc:
            return f"cannot write log {path}: {exc.strerror or exc}"
        return None

    def say(self, line: str) -> None:
        print(f"clusterjob epilog: {printable(line)}", file=self.err, flush=True)

    def leave_drain_reason(self, reason: str) -> None:
        if self.under_slurmd:
            drain.set_drain_reason_later(
                self.node, f"clusterjob: {reason}", replacing=drain.SLURM_EPILOG_REASON
            )


def run_epilog(
    environ: Mapping[str, str],
    *,
    site: str | None = None,
    cache_dir: str | None = None,
    deadline: float | None = None,
    log: str | None = None,
    kernel_log: str | None = None,
) -> int:
    """Read the job's GPUs' error state; the exit code for slurmd (0 pass, 1 drain)."""
    run = EpilogRun(
        node=node_name(environ),
        job_id=environ.get("SLURM_JOB_ID"),
        log_override=log,
        deadline_override=deadline,
        under_slurmd=environ.get("SLURM_SCRIPT_CONTEXT") == "epilog_slurmd",
        kernel_log=kernel_log,
    )
    try:
        run.arm_alarm()
        try:
            view = _load_view(run, site, cache_dir)
        except ClusterjobError as exc:
            return run.cannot_check(f"site config: {one_line(exc)}", "config")
        run.policy = view.prolog
        run.arm_alarm()
        allocation = allocation_from_env(environ, Context.PROLOG)
        if not allocation.known:  # a job without GPUs: nothing of ours to look at
            return _verdict(run, [], [], "no GPUs in the job")
        try:
            reading = start_in_child(_read_faults).result(max(run.remaining(), 0.01))
        except ReadTimedOut:
            return run.cannot_check(
                f"NVML did not answer within {run.deadline:g}s (a hung GPU or driver: look "
                "for Xid errors in dmesg)",
                "timeout",
            )
        except NvmlError as exc:
            return run.cannot_check(f"NVML: {one_line(exc)}", exc.kind.value)
        text, source = xid.read_kernel_log(run.kernel_log)
        since = _job_start_uptime(environ, run)
        kernel = xid.parse_kernel_log(text, since)
        if reading["inventory"] is not None:
            reading["inventory"] = GpuInventory.from_dict(reading["inventory"])
        gpus = _job_gpus(view, allocation, reading["inventory"])
        faults = _faults(gpus, reading, kernel)
        rows = [_gpu_row(slot, bus_id, reading) for slot, bus_id in gpus]
        return _verdict(run, faults, rows, f"kernel log: {source}")
    except Exception as exc:  # a bug in clusterjob must still give slurmd one line
        return run.cannot_check(f"internal error: {type(exc).__name__}: {exc}", "internal")
    finally:
        kill_children()


def _load_view(run: EpilogRun, site: str | None, cache_dir: str | None) -> NodeView:
    """The site's node view, read as the Prolog reads it (trusted files only)."""
    site_path = Path(site or DEFAULT_SITE)
    opened = open_trusted(site_path)
    try:
        cache_fd = _open_cache(Path(cache_dir or DEFAULT_CACHE_DIR), run.notes)
        try:
            return load_node_view_fd(
                opened.fd,
                opened.realpath,
                site_path,
                run.node,
                cache_fd,
                lambda: _open_compiled(site_path, run.notes),
                run.notes,
            )
        finally:
            if cache_fd is not None:
                os.close(cache_fd)
    finally:
        os.close(opened.fd)


def _read_faults() -> dict[str, Any]:  # in the forked child
    """The inventory (or why a GPU could not even be placed) and NVML's Xid events."""
    from clusterjob.gpu.nvml import read_nvml, read_xid_events

    out: dict[str, Any] = {"inventory": None, "lost": None, "xids": {}, "xid_error": None}
    try:
        out["inventory"] = read_nvml().as_dict()  # plain data across the fork
    except NvmlError as exc:
        if exc.kind is not NvmlErrorKind.GPU_LOST:
            raise
        out["lost"] = one_line(exc)
    try:
        out["xids"] = read_xid_events(0)
    except NvmlError as exc:
        out["xid_error"] = one_line(exc)
    return out


def _job_start_uptime(environ: Mapping[str, str], run: EpilogRun) -> float | None:
    """The job's start in kernel-log time (seconds since boot): ``SLURM_JOB_START_TIME``
    where Slurm sets it for the Epilog, else the time of this job's record in the Prolog's
    log; None (every Xid line still in the kernel's buffer counts) when neither tells."""
    try:
        start = float(environ.get("SLURM_JOB_START_TIME", ""))
    except ValueError:
        start = 0.0
    if start <= 0 and run.job_id:
        start = _prolog_time(Path((run.policy or DEFAULT_POLICY).log_path), run.job_id) or 0.0
    return xid.boot_uptime_at(start - 2.0) if start > 0 else None


PROLOG_TAIL = 1024 * 1024  # bytes of the Prolog's log searched for the job's record


def _prolog_time(path: Path, job_id: str) -> float | None:
    """When the Prolog ran for ``job_id`` (its latest record), from the end of its log."""
    from datetime import datetime

    try:
        opened = open_trusted(path)
    except ClusterjobError:
        return None
    try:
        size = opened.st.st_size
        os.lseek(opened.fd, max(0, size - PROLOG_TAIL), os.SEEK_SET)
        tail = os.read(opened.fd, PROLOG_TAIL).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(opened.fd)
    needle = json.dumps({"job_id": job_id})[1:-1]  # '"job_id": "123"'
    for line in reversed(tail.splitlines()):
        if needle not in line:
            continue
        try:
            record = json.loads(line)
            when = datetime.strptime(record["time"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        if record.get("job_id") == job_id:
            return when
    return None


def _job_gpus(
    view: NodeView, allocation: Allocation, inventory: GpuInventory | None
) -> list[tuple[int | None, str | None]]:
    """(node-map slot, bus ID) of each GPU the job was given; the bus ID from the node map,
    else from NVML's bus order (slot i is the i-th GPU by bus ID, as the node map is)."""
    found = list(inventory.gpus) if inventory is not None else []
    units = gres_units(view.gpus) if view.gpus is not None else ()
    out: list[tuple[int | None, str | None]] = []
    for index in allocation.slots or ():
        slot = units[index].slot.slot if index < len(units) else index
        bus = units[index].slot.bus_id if index < len(units) else None
        if bus is None and slot < len(found):
            bus = found[slot].bus_id
        if (slot, bus) not in out:
            out.append((slot, bus))
    for uuid in allocation.uuids:
        for n, gpu in enumerate(found):
            if gpu.uuid and gpu.uuid.startswith(uuid) and (n, gpu.bus_id) not in out:
                out.append((n, gpu.bus_id))
    return out


def _faults(
    gpus: list[tuple[int | None, str | None]],
    reading: dict[str, Any],
    kernel: list[xid.KernelXid],
) -> list[GpuFault]:
    inventory: GpuInventory | None = reading["inventory"]
    faults: list[GpuFault] = []
    if reading["lost"]:
        faults.append(
            GpuFault("gpu-lost", None, None, f"GPU lost ({reading['lost']})", "hardware", True)
        )
    for slot, bus_id in gpus:
        seen: set[int] = set()
        for code in reading["xids"].get(bus_id, ()):
            faults.append(_xid_fault(code, slot, bus_id, "nvml"))
            seen.add(code)
        for line in kernel:
            if line.bus_id == bus_id and line.code not in seen:
                faults.append(_xid_fault(line.code, slot, bus_id, "kernel"))
                seen.add(line.code)
        gpu = inventory.by_bus_id(bus_id) if inventory is not None and bus_id else None
        if gpu is None:
            continue
        if gpu.lost and 79 not in seen:
            faults.append(
                GpuFault("gpu-lost", slot, bus_id, "GPU lost (NVML: GPU is lost)", "hardware", True)
            )
        if gpu.ecc_uncorrectable_volatile:
            n = gpu.ecc_uncorrectable_volatile
            faults.append(
                GpuFault(
                    "ecc-uncorrectable",
                    slot,
                    bus_id,
                    f"{n} uncorrectable ECC error(s) since the last GPU reset",
                    "hardware",
                    True,
                )
            )
        if gpu.remapped_rows_failure:
            faults.append(
                GpuFault(
                    "row-remap-failure", slot, bus_id, "row remapping failed", "hardware", True
                )
            )
        if gpu.remapped_rows_pending:
            faults.append(
                GpuFault(
                    "row-remap-pending",
                    slot,
                    bus_id,
                    "row remapping pending (a GPU reset applies it)",
                    "hardware",
                    False,
                )
            )
        if gpu.retired_pages_pending:
            faults.append(
                GpuFault(
                    "retired-pages-pending",
                    slot,
                    bus_id,
                    "page retirement pending (a GPU reset applies it)",
                    "hardware",
                    False,
                )
            )
    return faults


def _xid_fault(code: int, slot: int | None, bus_id: str | None, source: str) -> GpuFault:
    known = xid.describe(code)
    summary = f"Xid {code} ({known.meaning})"
    return GpuFault("xid", slot, bus_id, summary, known.cause, known.drain, code, source)


def _gpu_row(slot: int | None, bus_id: str | None, reading: dict[str, Any]) -> dict[str, Any]:
    inventory: GpuInventory | None = reading["inventory"]
    gpu = inventory.by_bus_id(bus_id) if inventory is not None and bus_id else None
    row: dict[str, Any] = {"slot": slot, "bus_id": bus_id, "found": gpu is not None}
    if gpu is not None:
        row.update(
            uuid=gpu.uuid,
            lost=gpu.lost,
            ecc_uncorrectable_volatile=gpu.ecc_uncorrectable_volatile,
            remapped_rows_pending=gpu.remapped_rows_pending,
            remapped_rows_failure=gpu.remapped_rows_failure,
            retired_pages_pending=gpu.retired_pages_pending,
            nvml_xids=list(reading["xids"].get(bus_id, ())),
        )
    return row


def _verdict(run: EpilogRun, faults: list[GpuFault], rows: list[dict[str, Any]], note: str) -> int:
    fatal = [f for f in faults if f.drain]
    reason = None
    if fatal:
        first = fatal[0]
        during = f" during job {run.job_id}" if run.job_id else ""
        more = f" (+{len(fatal) - 1} more)" if len(fatal) > 1 else ""
        reason = f"{first.summary} on {first.where()}{during}{more}"
    log_problem = run.log(
        {
            "outcome": "fault" if fatal else ("warning" if faults else "ok"),
            "action": "drain" if fatal else "pass",
            "reason": reason,
            "faults": [f.to_dict() for f in faults],
            "gpus": rows,
            "note": note,
        }
    )
    for f in faults:
        if not f.drain:
            run.say(f"warning: {f.summary} on {f.where()}")
    for line in [*run.notes, log_problem]:
        if line:
            run.say(f"warning: {line}")
    run.disarm()
    if reason is None:
        return 0
    run.say(reason)
    if run.under_slurmd and drain.drain_now(
        run.node, f"clusterjob: {reason}", min(10.0, max(run.remaining(), 1.0))
    ):
        return 0  # drained with our reason: exit 1 would have Slurm write "Epilog error" over it
    run.leave_drain_reason(reason)
    return 1
