"""Whether a job that ended badly was failed by a GPU, not by its program.

The Epilog (``clusterjob.node.epilog``) drains a node whose GPU faulted during a job, with a
reason that names the fault and the job: ``clusterjob: Xid 79 (GPU fell off the bus) on gpu2
0000:3b:00.0 during job 123``. That reason is the one record of it a user's machine can read
(the Epilog's own log is root's, on the node), so ``status`` reads the drain reasons of a
failed job's nodes once, with one ``scontrol show node`` for every such job, and keeps what it
found beside the status cache: a job first seen ended after an admin resumed the node is not
told (ask soon after the end: `wait` does).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from clusterjob.errors import ClusterjobError

if TYPE_CHECKING:
    from clusterjob.jobs.status import JobStatus, StatusCache
    from clusterjob.slurm.commands import SlurmClient

__all__ = ["finding_in_reason", "recorded_finding", "with_hardware"]

SLURM_EPILOG_REASON = "Epilog error"  # as clusterjob.node.drain (not imported: the node side)

# States where a program that did not fail on its own may have been failed by a GPU.
ENDED_BADLY = frozenset({"FAILED", "NODE_FAIL", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"})
_REASON = re.compile(r"clusterjob: (?P<what>.+?) during job (?P<job>\d+)(?P<more> \(\+\d+ more\))?")


def finding_in_reason(reason: str | None, job_id: str) -> str | None:
    """The fault a drain reason names for ``job_id`` (an array task: its own id), or None."""
    m = _REASON.search(reason or "")
    if m is None or m["job"] != job_id.split("_")[0]:
        return None
    return m["what"] + (m["more"] or "")


def with_hardware(
    rows: Sequence[JobStatus], client: SlurmClient, cache: StatusCache, now: float
) -> list[JobStatus]:
    """``rows`` with ``hardware`` (and the explanation) set where the job's node was drained
    by the Epilog for a fault during this job.

    Slurm is asked (one ``scontrol show node`` for all of them) only about jobs seen ending
    badly for the first time; what it said is kept beside the status cache, so a job whose
    end the registry already holds costs no call. A node still drained "Epilog error" (the
    Epilog's own reason not in place yet) leaves the job to be asked about again.
    """
    known = _Findings(cache.path.with_name("hardware-" + cache.path.name))
    suspects = [r for r in rows if r.state in ENDED_BADLY and r.nodes and not r.hardware]
    ask = [r for r in suspects if known.get(r) is None and r.source in ("squeue", "sacct")]
    if ask:
        names = sorted({r.nodes for r in ask if r.nodes})
        reasons = _drain_reasons(client, cache, names, now)
        for row in ask if reasons is not None else ():
            found = _finding(row, reasons or {})
            if found is not None:
                known.put(row, found)
        known.save()
    suspected = {id(r) for r in suspects}
    out = []
    for row in rows:
        found = known.get(row) if id(row) in suspected else None
        out.append(_said(row, found) if found else row)
    return out


def recorded_finding(cache: StatusCache, cluster: str, job_id: str) -> str | None:
    """What ``status`` found of a job's hardware (``clusterjob show``), without asking Slurm;
    None when nothing was found or it was never asked."""
    path = cache.path.with_name("hardware-" + cache.path.name)
    return _Findings(path).data.get(f"{cluster}|{job_id}") or None


def _finding(row: JobStatus, reasons: dict[str, str]) -> str | None:
    """What the job's nodes' drain reasons say of it: the fault, "" for nothing, or None
    while a node of it is still drained with Slurm's "Epilog error"."""
    settled = True
    for node, reason in reasons.items():
        if not node_in(node, row.nodes or ""):
            continue
        what = finding_in_reason(reason, row.job_id)
        if what:
            return f"{what} on node {node}"
        if reason.startswith(SLURM_EPILOG_REASON):
            settled = False
    return "" if settled else None


class _Findings:
    """Job -> its hardware finding ("" for none), a small JSON file; the newest kept."""

    LIMIT = 2000

    def __init__(self, path: Path) -> None:
        self.path = path
        self.changed = False
        try:
            data = json.loads(path.read_text())
            self.data: dict[str, str] = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            self.data = {}

    @staticmethod
    def _key(row: JobStatus) -> str:
        return f"{row.cluster}|{row.job_id}"

    def get(self, row: JobStatus) -> str | None:
        return self.data.get(self._key(row))

    def put(self, row: JobStatus, found: str) -> None:
        self.data.pop(self._key(row), None)
        self.data[self._key(row)] = found
        self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        keep = dict(list(self.data.items())[-self.LIMIT :])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(keep))
            os.replace(tmp, self.path)
        except OSError:
            pass  # not kept: only costs asking Slurm again


def _said(row: JobStatus, found: str) -> JobStatus:
    code = f" (its exit {row.exit_code} followed from it)" if row.exit_code else ""
    note = f"hardware: {found} during the job, not your program{code}; the node is drained"
    return replace(row, hardware=found, explanation=note)


def _drain_reasons(
    client: SlurmClient, cache: StatusCache, names: list[str], now: float
) -> dict[str, str] | None:
    hit = cache.get("drain-reasons", names, now)
    if hit is not None:
        return dict(hit["reasons"])
    try:
        nodes = client.nodes(",".join(names))
    except ClusterjobError:
        return None  # status still answers; this finding waits for the next call
    reasons = {n.name: n.reason for n in nodes if n.reason and n.drained}
    cache.put("drain-reasons", names, now, reasons=reasons)
    return reasons


def node_in(node: str, nodes: str) -> bool:
    """Whether ``node`` is one of a job's ``nodes`` (a Slurm hostlist such as gpu[1-3])."""
    import hostlist

    try:
        return node in hostlist.expand_hostlist(nodes)
    except hostlist.BadHostlist:
        return node in nodes.split(",")
