"""The nodes a user's jobs stay off for a while: one bad node must not eat every retry.

A job whose in-job preflight failed on a node (the job script exits ``PREFLIGHT_EXIT``, or a
``preflight: warn`` site's job said so in its log and went on), that ended ``NODE_FAIL`` on
one node, or whose GPU the Epilog found faulted (``jobs.hardware``) names a node and a
finding. The side that waits for the job (``wait``, the API's ``Job.wait``) records it here:
a small JSON file in the user's data dir, one per cluster reached (as the status cache),
written atomically and owner-only as the registry. ``submit`` adds the nodes not yet expired
to ``--exclude`` (``--no-avoid``: not); ``clusterjob nodes`` lists them, ``--clear`` forgets.
No admin and no daemon is involved: the list is the user's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from clusterjob.jobs.private_files import data_dir, ensure_private_dir
from clusterjob.jobscript.requeues import PREFLIGHT_EXIT
from clusterjob.slurm.ssh import file_key

__all__ = [
    "DEFAULT_HOURS",
    "PREFLIGHT_EXIT",
    "AvoidList",
    "BadNode",
    "findings",
    "merged_exclude",
    "retry_token",
]

DEFAULT_HOURS = 24.0  # how long a node stays on the list
FILE = "bad-nodes.json"

# `clusterjob preflight`'s verdict line in a job's log, and the finding lines before it
_VERDICT = re.compile(r"^clusterjob: error: preflight (?P<node>\S+): (?P<what>FAILED.*)$")
_FINDING = re.compile(r"^error: (?P<check>[\w-]+): (?P<message>.+)$")
_FAILED_EXIT = re.compile(r"^clusterjob: preflight failed \(exit (?P<code>\d+)\)")
_ON_NODE = re.compile(r" on node (?P<node>\S+)$")
_NVML_EXIT = 5  # ExitCode.NVML: the preflight could not read the node's GPUs


@dataclass(frozen=True)
class BadNode:
    """A node to stay off until ``until``: what was found there, by which job, when."""

    node: str
    cluster: str
    finding: str  # "preflight failed: gpu-model: slot 0 ...", "NODE_FAIL", "hardware: Xid 79 ..."
    job_id: str
    since: float
    until: float

    def line(self, now: float) -> str:
        """``gpu3 (preflight failed 2h ago: ...)``, as submit says it avoids it."""
        kind, _, detail = self.finding.partition(": ")
        told = f"{kind} {ago(now - self.since)}" + (f": {detail}" if detail else "")
        return f"{self.node} ({told}, job {self.job_id})"


def ago(seconds: float) -> str:
    """``40s ago``, ``12m ago``, ``2h ago``, ``3d ago``."""
    s = max(0, int(seconds))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if s >= size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"


class AvoidList:
    """The user's avoid list of one cluster reached (``host``: a ``--host``'s, "" here)."""

    def __init__(self, path: Path | None = None, *, host: str = "") -> None:
        if path is None:
            path = data_dir() / (FILE if not host else f"bad-nodes-{file_key(host)}.json")
        self.path = path

    def _load(self) -> list[BadNode]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []  # none yet, or unreadable: nothing is avoided
        out = []
        for item in data.get("nodes", []) if isinstance(data, dict) else []:
            try:
                out.append(BadNode(**item))
            except TypeError:
                continue
        return out

    def _save(self, entries: Sequence[BadNode]) -> None:
        """Replace the file at once (readers see the old or the new list), owner-only from
        the first byte; the temporary name is unique to this writer, thread or process."""
        text = json.dumps({"nodes": [asdict(e) for e in entries]}, indent=1) + "\n"
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:  # mkstemp: mode 0600
                fh.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time (a second `wait`, the API's poller): each reads the list
        afresh under the lock, so no one's entry is lost."""
        import fcntl

        ensure_private_dir(self.path.parent)
        lock = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def entries(self, cluster: str | None = None, now: float | None = None) -> list[BadNode]:
        """The nodes not yet expired (of ``cluster``; None or "": of every cluster)."""
        now = time.time() if now is None else now
        return [
            e
            for e in self._load()
            if e.until > now and (not cluster or not e.cluster or e.cluster == cluster)
        ]

    def add(
        self,
        found: Iterable[tuple[str, str]],
        *,
        cluster: str,
        job_id: str,
        now: float | None = None,
        hours: float = DEFAULT_HOURS,
    ) -> list[BadNode]:
        """Record (node, finding) pairs of ``job_id``; a node already listed for another job
        is listed again from now (the same job's finding, seen again, is not). The entries
        added."""
        now = time.time() if now is None else now
        found = list(found)
        if not found:
            return []
        with self._locked():
            current = [e for e in self._load() if e.until > now]
            seen = {(e.node, e.cluster, e.job_id) for e in current}
            added = [
                BadNode(n, cluster, f, job_id, now, now + hours * 3600)
                for n, f in found
                if (n, cluster, job_id) not in seen
            ]
            if added:
                names = {(e.node, e.cluster) for e in added}
                kept = [e for e in current if (e.node, e.cluster) not in names]
                self._save([*kept, *added])
        return added

    def clear(self, node: str | None = None) -> list[BadNode]:
        """Forget ``node`` (None: every node); the entries forgotten (expired ones too)."""
        if not self.path.exists():
            return []
        with self._locked():
            entries = self._load()
            gone = [e for e in entries if node is None or e.node == node]
            if gone:
                self._save([e for e in entries if e not in gone])
        return gone


def retry_token(token: str) -> str:
    """The token of a ``--retry-bad-node`` retry of the job of ``token``: derived, not drawn,
    so every waiter (and a retry of a timed-out sbatch) names the same one job."""
    import hashlib

    return hashlib.sha256(f"retry-bad-node:{token}".encode()).hexdigest()[:16]


def merged_exclude(
    exclude: str | None, avoided: Sequence[str], nodelist: str | None = None
) -> tuple[str | None, list[str]]:
    """The ``--exclude`` with the avoided nodes added, and the nodes added. A node the user
    excluded already, or named in ``--nodelist`` (sbatch refuses a node both wanted and
    excluded: the user's own choice wins), is not added."""
    import hostlist

    def names(text: str | None) -> list[str]:
        if not text:
            return []
        try:
            return list(hostlist.expand_hostlist(text))
        except hostlist.BadHostlist:
            return text.split(",")

    own, wanted = set(names(exclude)), set(names(nodelist))
    added = [n for n in dict.fromkeys(avoided) if n not in own and n not in wanted]
    if not added:
        return exclude, []
    joined = ",".join([exclude] if exclude else []) + ("," if exclude else "") + ",".join(added)
    return joined, added


def findings(
    state: str,
    exit_code: int | None,
    nodes: str | None,
    hardware: str | None,
    log: str | None,
) -> list[tuple[str, str]]:
    """The (node, finding) pairs a job's end names: its preflight's verdict lines in its
    ``log`` (a required preflight that failed, or a warn site's that went on), its exit
    ``PREFLIGHT_EXIT`` on one node when the log does not say (NVML unreadable), its Epilog's
    ``hardware`` finding, ``NODE_FAIL`` on one node. A multi-node NODE_FAIL names no node:
    Slurm does not say which one failed."""
    found: dict[str, str] = {}
    last_finding = ""
    failed_exit: int | None = None
    for line in (log or "").splitlines():
        line = line.strip()
        if m := _FINDING.match(line):
            last_finding = f"{m['check']}: {m['message']}"
        elif m := _VERDICT.match(line):
            found.setdefault(m["node"], f"preflight failed: {last_finding or m['what']}")
            last_finding = ""
        elif m := _FAILED_EXIT.match(line):
            failed_exit = int(m["code"])
    one = _one_node(nodes)
    if not found and exit_code == PREFLIGHT_EXIT and one and failed_exit == _NVML_EXIT:
        found[one] = "preflight failed: NVML could not read the node's GPUs"
    if hardware and (m := _ON_NODE.search(hardware)):
        found.setdefault(m["node"], f"hardware: {hardware[: m.start()]}")
    if state == "NODE_FAIL" and one:
        found.setdefault(one, "NODE_FAIL: Slurm lost the node during the job")
    return list(found.items())


def _one_node(nodes: str | None) -> str | None:
    if not nodes:
        return None
    import hostlist

    try:
        names = list(hostlist.expand_hostlist(nodes))
    except hostlist.BadHostlist:
        return None
    return names[0] if len(names) == 1 else None
