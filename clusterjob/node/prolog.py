"""``clusterjob prolog``: the Slurm Prolog that checks this node's GPUs before every job.

It runs as root before every job on every node, so this module and everything it imports at
the top is stdlib-only (no Typer, Click, Rich, Jinja2, ruamel, hostlist): the site config is
read through ``clusterjob.site.nodeview``, which answers from a cache without ruamel.

Its contract with slurmd: exit 0 when the GPUs are right; otherwise one line on stderr and
exit 1, which drains the node with reason "Prolog error" and logs our line in slurmd's log.
It never hangs (own deadline, NVML read in a forked child) and never prints a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from clusterjob import __version__
from clusterjob.errors import ClusterjobError, NvmlError, NvmlErrorKind, printable
from clusterjob.gpu.inventory import read_inventory
from clusterjob.gpu.isolation import ChildRead, kill_children
from clusterjob.node import drain
from clusterjob.node.allocation import Context, allocation_from_env
from clusterjob.node.checks import Facts, Finding, PreflightReport, Severity, run_checks
from clusterjob.node.context import (
    DEFAULT_CACHE_DIR,
    DEFAULT_POLICY,
    DEFAULT_SITE,
    node_name,
    one_line,
)
from clusterjob.node.trust import open_trusted, open_trusted_append, open_trusted_dir
from clusterjob.site.nodemodel import OnError, PrologPolicy
from clusterjob.site.nodeview import compiled_map_note, compiled_path, load_node_view_fd

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # typing is not imported at run time: ~3 ms of every job's start
    from typing import Any, NoReturn, TextIO

__all__ = ["PrologRun", "run_prolog"]


class PrologRun:
    """One Prolog run: enough state to give a verdict from anywhere, including the alarm."""

    __slots__ = (
        "node",
        "job_id",
        "log_override",
        "deadline_override",
        "under_slurmd",
        "started",
        "policy",
        "err",
        "notes",
    )

    def __init__(
        self,
        node: str,
        job_id: str | None,
        log_override: str | None,
        deadline_override: float | None,
        under_slurmd: bool = False,  # run by slurmd (SLURM_SCRIPT_CONTEXT=prolog_slurmd)
        started: float | None = None,  # time.monotonic() at the start; None: now
        policy: PrologPolicy | None = None,
        err: TextIO | None = None,  # None: sys.stderr
    ) -> None:
        self.node = node
        self.job_id = job_id
        self.log_override = log_override
        self.deadline_override = deadline_override
        self.under_slurmd = under_slurmd
        self.started = time.monotonic() if started is None else started
        self.policy = policy
        self.err = sys.stderr if err is None else err
        self.notes: list[str] = []  # warnings shown only when passing

    @property
    def deadline(self) -> float:
        if self.deadline_override is not None:
            return self.deadline_override
        return (self.policy or DEFAULT_POLICY).deadline_seconds

    def remaining(self) -> float:
        return self.deadline - (time.monotonic() - self.started)

    def arm_alarm(self) -> None:
        """Backstop for anything outside the NVML child (a config file on a hung mount).

        Python runs its SIGALRM handler only between bytecodes, so a long C-level loop would
        hold it off: CPU time past the deadline ends the process with SIGPROF's default
        action (a failed Prolog, which drains), whatever Python is doing.
        """
        left = max(self.remaining(), 0.01)
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, left + 0.5)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_PROF, left + 2.0)

    def disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)

    def _on_alarm(self, signum: int, frame: object) -> NoReturn:
        # From here on a plain SIGALRM ends the process: the verdict below (the log write
        # included) gets one more second, then slurmd sees the Prolog killed, and drains.
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        kill_children()
        code = self.cannot_check(f"no verdict within the {self.deadline:g}s deadline", "timeout")
        self.err.flush()
        os._exit(code)

    def log_fields(self) -> dict[str, Any]:
        """What every line of a hook's log starts with."""
        return {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "node": self.node,
            "job_id": self.job_id,
            "elapsed_s": round(time.monotonic() - self.started, 3),
            "version": __version__,  # a node running another clusterjob shows in `site diff`
            "notes": list(self.notes),  # the warnings it printed besides its findings
        }

    def log(self, record: dict[str, Any]) -> str | None:
        """Append one JSON line to the node-local log; return a problem instead of failing."""
        path = Path(self.log_override or (self.policy or DEFAULT_POLICY).log_path)
        record = {**self.log_fields(), **record}
        try:  # only into a path root alone controls; never a FIFO, symlink or hard link
            fd = open_trusted_append(path, 0o640)
            try:
                os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:
            return f"cannot write log {path}: {exc.strerror or exc}"
        return None

    def say(self, line: str) -> None:
        print(f"clusterjob prolog: {printable(line)}", file=self.err, flush=True)

    def cannot_check(self, reason: str, kind: str) -> int:
        """Could not check the GPUs: drain or pass per the site's ``on_error`` (default drain)."""
        on_error = (self.policy or DEFAULT_POLICY).on_error
        known = self.policy is not None
        action = "pass" if on_error is OnError.PASS else "drain"
        log_problem = self.log(
            {"outcome": "error", "action": action, "error": kind, "reason": reason, "findings": []}
        )
        policy = f"on_error={on_error.value}" + ("" if known else ", site policy unknown")
        if action == "pass":
            self.say(f"warning: {self.node}: GPUs not checked: {reason} -- passing ({policy})")
            for note in [*self.notes, log_problem]:
                if note:
                    self.say(f"warning: {note}")
            self.disarm()
            return 0
        tail = f"; {log_problem}" if log_problem else ""
        self.say(f"{self.node}: GPUs not checked: {reason} -- draining ({policy}){tail}")
        self.leave_drain_reason(f"GPUs not checked: {reason}")
        self.disarm()
        return 1

    def verdict(self, report: PreflightReport) -> int:
        errors, warnings = report.errors, report.warnings
        outcome = "ok" if report.ok else "failed"
        log_problem = self.log(
            {
                "outcome": outcome,
                "action": "pass" if report.ok else "drain",
                "error": None,
                "reason": errors[0].message if errors else None,
                "findings": [f.to_dict() for f in report.findings],
            }
        )
        if report.ok:
            for f in warnings:
                self.say(f"warning: {f.check_id}: {f.message}")
            for note in [*self.notes, log_problem]:
                if note:
                    self.say(f"warning: {note}")
            self.disarm()
            return 0
        more = f" (+{len(errors) - 1} more error(s))" if len(errors) > 1 else ""
        tail = f"; {log_problem}" if log_problem else ""
        self.say(f"{errors[0].check_id}: {errors[0].message}{more}{tail}")
        self.leave_drain_reason(f"{errors[0].check_id}: {errors[0].message}{more}")
        self.disarm()
        return 1

    def leave_drain_reason(self, reason: str) -> None:
        if self.under_slurmd:
            drain.set_drain_reason_later(self.node, f"clusterjob: {reason}")


def run_prolog(
    environ: Mapping[str, str],
    *,
    site: str | None = None,
    cache_dir: str | None = None,
    deadline: float | None = None,
    log: str | None = None,
    reading: ChildRead | None = None,
) -> int:
    """Check the GPUs against the node map; the exit code for slurmd (0 pass, 1 drain).

    ``site``, ``cache_dir``, ``deadline`` and ``log`` come from the command line only.
    ``reading``: the NVML read already started (``start_nvml_read``); else it starts once
    the site is loaded. Either way no reader child outlives this call.
    """
    run = PrologRun(
        node=node_name(environ),
        job_id=environ.get("SLURM_JOB_ID"),
        log_override=log,
        deadline_override=deadline,
        under_slurmd=environ.get("SLURM_SCRIPT_CONTEXT") == "prolog_slurmd",
    )
    try:
        run.arm_alarm()
        site_path = Path(site or DEFAULT_SITE)
        try:
            opened = open_trusted(site_path)  # checked on the descriptor that is then read
            try:
                cache_fd = _open_cache(Path(cache_dir or DEFAULT_CACHE_DIR), run.notes)
                try:
                    view = load_node_view_fd(
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
        except ClusterjobError as exc:
            return run.cannot_check(f"site config: {one_line(exc)}", "config")
        run.policy = view.prolog
        run.arm_alarm()
        try:
            left = max(run.remaining(), 0.01)
            inventory = read_inventory(left, isolate=True, deadline=run.deadline, started=reading)
        except NvmlError as exc:
            if exc.kind is NvmlErrorKind.GPU_LOST:  # a known-broken node, whatever on_error
                return run.verdict(_lost_report(run.node, exc))
            return run.cannot_check(f"NVML: {one_line(exc)}", exc.kind.value)
        checks = view.checks_for(environ.get("SLURM_JOB_PARTITION"))
        facts = Facts(
            run.node,
            view.gpus,
            view.models,
            inventory,
            allocation_from_env(environ, Context.PROLOG),
            driver_min=checks.driver_min,
            cuda_min=checks.cuda_min,
            severity=checks.severity,
        )
        return run.verdict(run_checks(facts))
    except Exception as exc:  # a bug in clusterjob must still give slurmd one line
        return run.cannot_check(f"internal error: {type(exc).__name__}: {exc}", "internal")
    finally:
        kill_children()  # a read started early whose answer was not needed (a config error)


def _open_cache(path: Path, notes: list[str]) -> int | None:
    """The cache directory, made 0755 where missing, if only root can write it; else no cache.

    The cache only saves time: one someone else could write (or a user made first) is not
    used, and is no reason to drain.
    """
    try:
        fd, _ = open_trusted_dir(path, create=True)
    except ClusterjobError as exc:
        notes.append(f"cache not used: {one_line(exc)}")
        return None
    return fd


def _open_compiled(site_path: Path, notes: list[str]) -> int | None:
    """The compiled node map beside the site file (``site validate --compile``), checked as
    the site file is; None when there is none or it cannot be used (the YAML is read), the
    latter said in ``notes``."""
    path = compiled_path(site_path)
    try:
        return open_trusted(path).fd
    except ClusterjobError as exc:
        if os.path.lexists(path):  # there, but not to be trusted (or read): say so
            notes.append(compiled_map_note(site_path, one_line(exc)))
        return None


def _lost_report(node: str, exc: NvmlError) -> PreflightReport:
    """A GPU lost before NVML could even place it: a failed check, not an unknown."""
    lost = Finding("gpu-lost", Severity.ERROR, node, f"{node}: {one_line(exc)}", found="lost")
    return PreflightReport(node=node, findings=(lost,), rows=())
