"""Typed Grid Engine operations on top of the one runner, each one command.

``GridEngineClient`` is what the core talks to. Tests build it with a ``Runner`` around a
fake ``exec``; production code uses ``GridEngineClient()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from clusterjob.errors import GridEngineError
from clusterjob.gridengine import parse, states
from clusterjob.gridengine.parse import (
    AccountedJob,
    ComplexAttribute,
    HostRecord,
    JobDetail,
    QueuedJob,
    SubmittedJob,
)
from clusterjob.gridengine.runner import Runner
from clusterjob.gridengine.states import Outcome

QSUB_TIMEOUT = 30.0
QUERY_TIMEOUT = 30.0
QUERY_WINDOW = 60.0

# What qstat -j, qacct -j and qdel say of a job id they do not know (and exit 1).
_UNKNOWN_JOB = (
    "do not exist",
    "does not exist",
    "error: job id",  # qacct: "error: job id 12 not found"
    "not found",
)


def _unknown_job(exc: GridEngineError) -> bool:
    return any(marker in exc.stderr for marker in _UNKNOWN_JOB)


def _no_accounting_yet(exc: GridEngineError) -> bool:
    """qacct on a cluster where no job has ended yet: it has no accounting file at all."""
    return "accounting: No such file or directory" in exc.stderr


def _parsed(cmd: str, error: ValueError) -> GridEngineError:
    return GridEngineError([cmd], 0, f"unreadable output: {error}")


class GridEngineClient:
    """Grid Engine's commands as typed calls. One ``Runner`` counts and bounds every call."""

    def __init__(self, runner: Runner | None = None) -> None:
        self.runner = runner or Runner()

    def _query(self, cmd: list[str]) -> str:
        deadline = self.runner.clock() + QUERY_WINDOW
        return self.runner.run(cmd, timeout=QUERY_TIMEOUT, deadline=deadline, retry=True).stdout

    def qsub(
        self, script_path: str | Path, *, options: Sequence[str] = (), verify: bool = False
    ) -> SubmittedJob:
        """Submit the script; its directives carry the request, ``options`` come before it.
        ``verify``: ``-w v``, the scheduler checks the request and submits nothing. Not
        retried: a qsub that timed out may have created the job."""
        cmd = ["qsub", *(("-w", "v") if verify else ()), *options, str(script_path)]
        result = self.runner.run(cmd, timeout=QSUB_TIMEOUT)
        try:
            return parse.parse_qsub(result.stdout)
        except ValueError as exc:
            raise _parsed("qsub", exc) from None

    def qstat(self, *, user: str | None = None) -> list[QueuedJob]:
        """Every job ``qstat -xml -r`` shows (the user's, or ``-u '*'``: everyone's)."""
        text = self._query(["qstat", "-xml", "-r", "-u", user or "*"])
        try:
            return parse.parse_qstat_xml(text)
        except ValueError as exc:
            raise _parsed("qstat", exc) from None

    def job_detail(self, job_id: str) -> JobDetail | None:
        """``qstat -j ID``; None when the qmaster no longer knows the job (it ended)."""
        try:
            text = self._query(["qstat", "-j", job_id])
        except GridEngineError as exc:
            if _unknown_job(exc):
                return None
            raise
        try:
            return parse.parse_qstat_j(text)
        except ValueError as exc:
            raise _parsed("qstat", exc) from None

    def accounting(self, job_id: str) -> list[AccountedJob]:
        """``qacct -j ID``: one record per task; empty until qacct has it (it lags seconds
        behind the job's end)."""
        try:
            text = self._query(["qacct", "-j", job_id])
        except GridEngineError as exc:
            if _unknown_job(exc) or _no_accounting_yet(exc):
                return []
            raise
        try:
            return parse.parse_qacct(text)
        except ValueError as exc:
            raise _parsed("qacct", exc) from None

    def job_state(self, job_id: str) -> Outcome | str | None:
        """A job's state in clusterjob's words (``states.job_state``): from qstat while it is
        listed, else from qacct; None in the seconds between the two."""
        listed = [j for j in self.qstat() if j.job_id == job_id]
        return states.job_state(listed, [] if listed else self.accounting(job_id))

    def qdel(self, job_ids: Sequence[str]) -> bool:
        """Delete jobs; False when none of them is known any more."""
        try:
            self.runner.run(["qdel", *job_ids], timeout=QUERY_TIMEOUT)
        except GridEngineError as exc:
            if _unknown_job(exc):
                return False
            raise
        return True

    def hosts(self, resources: Sequence[str] = ("gpu", "gpu_type")) -> list[HostRecord]:
        """The execution hosts with the named resources (``qhost -F gpu,gpu_type``)."""
        text = self._query(["qhost", "-F", ",".join(resources)])
        return parse.parse_qhost(text)

    def complexes(self) -> dict[str, ComplexAttribute]:
        """The complex attributes (``qconf -sc``): whether gpu and gpu_type are defined."""
        return parse.parse_qconf_sc(self._query(["qconf", "-sc"]))
