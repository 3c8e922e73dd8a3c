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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

from clusterjob import __version__
from clusterjob.errors import ClusterjobError, NvmlError, NvmlErrorKind
from clusterjob.gpu.inventory import read_inventory
from clusterjob.gpu.isolation import kill_children
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
from clusterjob.node.trust import check_trusted
from clusterjob.site.model import OnError, PrologPolicy
from clusterjob.site.nodeview import load_node_view

__all__ = ["PrologRun", "run_prolog"]


@dataclass
class PrologRun:
    """One Prolog run: enough state to give a verdict from anywhere, including the alarm."""

    node: str
    job_id: str | None
    log_override: str | None
    deadline_override: float | None
    under_slurmd: bool = False  # run by slurmd (SLURM_SCRIPT_CONTEXT=prolog_slurmd), not by hand
    started: float = field(default_factory=time.monotonic)
    policy: PrologPolicy | None = None
    err: TextIO = field(default_factory=lambda: sys.stderr)

    @property
    def deadline(self) -> float:
        if self.deadline_override is not None:
            return self.deadline_override
        return (self.policy or DEFAULT_POLICY).deadline_seconds

    def remaining(self) -> float:
        return self.deadline - (time.monotonic() - self.started)

    def arm_alarm(self) -> None:
        """Backstop for anything outside the NVML child (a config file on a hung mount)."""
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, max(self.remaining(), 0.01) + 0.5)

    def _on_alarm(self, signum: int, frame: object) -> NoReturn:
        kill_children()
        code = self.cannot_check(f"no verdict within the {self.deadline:g}s deadline", "timeout")
        self.err.flush()
        os._exit(code)

    def log(self, record: dict[str, Any]) -> str | None:
        """Append one JSON line to the node-local log; return a problem instead of failing."""
        path = Path(self.log_override or (self.policy or DEFAULT_POLICY).log_path)
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "node": self.node,
            "job_id": self.job_id,
            "elapsed_s": round(time.monotonic() - self.started, 3),
            "version": __version__,  # a node running another clusterjob shows in `site diff`
            **record,
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path, flags, 0o640)
            try:
                os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:
            return f"cannot write log {path}: {exc.strerror or exc}"
        return None

    def say(self, line: str) -> None:
        print(f"clusterjob prolog: {line}", file=self.err, flush=True)

    def cannot_check(self, reason: str, kind: str) -> int:
        """Could not check the GPUs: drain or pass per the site's ``on_error`` (default drain)."""
        signal.setitimer(signal.ITIMER_REAL, 0)
        on_error = (self.policy or DEFAULT_POLICY).on_error
        known = self.policy is not None
        action = "pass" if on_error is OnError.PASS else "drain"
        log_problem = self.log(
            {"outcome": "error", "action": action, "error": kind, "reason": reason, "findings": []}
        )
        policy = f"on_error={on_error.value}" + ("" if known else ", site policy unknown")
        if action == "pass":
            self.say(f"warning: {self.node}: GPUs not checked: {reason} -- passing ({policy})")
            if log_problem:
                self.say(f"warning: {log_problem}")
            return 0
        tail = f"; {log_problem}" if log_problem else ""
        self.say(f"{self.node}: GPUs not checked: {reason} -- draining ({policy}){tail}")
        self.leave_drain_reason(f"GPUs not checked: {reason}")
        return 1

    def verdict(self, report: PreflightReport) -> int:
        signal.setitimer(signal.ITIMER_REAL, 0)
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
            if log_problem:
                self.say(f"warning: {log_problem}")
            return 0
        more = f" (+{len(errors) - 1} more error(s))" if len(errors) > 1 else ""
        tail = f"; {log_problem}" if log_problem else ""
        self.say(f"{errors[0].check_id}: {errors[0].message}{more}{tail}")
        self.leave_drain_reason(f"{errors[0].check_id}: {errors[0].message}{more}")
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
) -> int:
    """Check the GPUs against the node map; the exit code for slurmd (0 pass, 1 drain).

    ``site``, ``cache_dir``, ``deadline`` and ``log`` come from the command line only.
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
            check_trusted(site_path)
            cache = Path(cache_dir or DEFAULT_CACHE_DIR)
            if cache.exists():
                check_trusted(cache)
            view = load_node_view(site_path, run.node, cache)
        except ClusterjobError as exc:
            return run.cannot_check(f"site config: {one_line(exc)}", "config")
        run.policy = view.prolog
        run.arm_alarm()
        try:
            left = max(run.remaining(), 0.01)
            inventory = read_inventory(left, isolate=True, deadline=run.deadline)
        except NvmlError as exc:
            if exc.kind is NvmlErrorKind.GPU_LOST:  # a known-broken node, whatever on_error
                return run.verdict(_lost_report(run.node, exc))
            return run.cannot_check(f"NVML: {one_line(exc)}", exc.kind.value)
        facts = Facts(
            run.node,
            view.gpus,
            view.models,
            inventory,
            allocation_from_env(environ, Context.PROLOG),
        )
        return run.verdict(run_checks(facts))
    except Exception as exc:  # a bug in clusterjob must still give slurmd one line
        return run.cannot_check(f"internal error: {type(exc).__name__}: {exc}", "internal")


def _lost_report(node: str, exc: NvmlError) -> PreflightReport:
    """A GPU lost before NVML could even place it: a failed check, not an unknown."""
    lost = Finding("gpu-lost", Severity.ERROR, node, f"{node}: {one_line(exc)}", found="lost")
    return PreflightReport(node=node, findings=(lost,), rows=())
