"""The Slurm hooks (``prolog``, ``task-prolog``) and the core of ``preflight`` and ``gpus``.

The hooks run before every job on every node, so this module and everything it imports at
the top is stdlib-only (no Typer, Click, Rich, Jinja2, ruamel, hostlist): the site config is
read through ``clusterjob.site.nodeview``, which answers from a cache without ruamel.

The Prolog runs as root. Its config comes only from the command line (the admin's wrapper
in slurm.conf) or the root-owned default, never from the environment, and both the file and
its directory must be root-owned and not group/world-writable (like sshd's StrictModes).
Its contract with slurmd: exit 0 when the GPUs are right; otherwise one line on stderr and
exit 1, which drains the node with reason "Prolog error" and logs our line in slurmd's log.
It never hangs (own deadline, NVML read in a forked child) and never prints a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import select
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

from clusterjob.errors import ClusterjobError, NvmlError, UntrustedConfig, UsageError
from clusterjob.gpu.inventory import GpuInventory
from clusterjob.node.allocation import Context, allocation_from_env, task_cuda_visible_devices
from clusterjob.node.checks import Finding, PreflightReport, Severity, run_checks
from clusterjob.site.model import NodeGpu, OnError, PrologPolicy

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DEFAULT_SITE",
    "UntrustedConfig",
    "check_trusted",
    "hook_main",
    "node_name",
    "read_inventory_isolated",
    "run_preflight",
]

DEFAULT_SITE = "/etc/clusterjob/site.yaml"
DEFAULT_CACHE_DIR = "/var/cache/clusterjob"
DEFAULT_POLICY = PrologPolicy()


# -- shared helpers ----------------------------------------------------------------------


def node_name(environ: Mapping[str, str]) -> str:
    """This node's Slurm name: ``SLURMD_NODENAME`` (set by slurmd), else the short hostname."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def check_trusted(path: Path) -> None:
    """Refuse ``path`` unless root could have been the only one to write it.

    The file (symlinks followed) and its directory must be root-owned and not group/world-
    writable. Directories further up must be root-owned and either not writable by others
    or sticky (as /tmp): there nobody else can rename a root-owned entry away.
    """
    path = Path(path)
    try:
        target = path.resolve(strict=True)
    except OSError as exc:
        raise UntrustedConfig(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except RuntimeError as exc:  # a symlink loop
        raise UntrustedConfig(f"{path}: cannot read: {exc}") from exc
    for depth, p in enumerate((target, *target.parents)):
        st = os.stat(p)
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
        if st.st_uid != 0:
            raise UntrustedConfig(
                f"refusing {path}: {kind} {p} is owned by uid {st.st_uid}, not root"
            )
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and (depth < 2 or not st.st_mode & stat.S_ISVTX):
            raise UntrustedConfig(
                f"refusing {path}: {kind} {p} is group/world-writable "
                f"(mode {stat.S_IMODE(st.st_mode):04o})"
            )


@dataclass(frozen=True)
class _NodeSite:
    """What the node side needs from a site config."""

    gpus: tuple[NodeGpu, ...] | None  # None: node not in the map
    models: Mapping[str, tuple[str, ...]]  # canonical model -> NVML names
    prolog: PrologPolicy


def _load_node_site(path: Path, node: str, cache_dir: Path | None) -> _NodeSite:
    from clusterjob.site.nodeview import load_node_view

    view = load_node_view(path, node, cache_dir)
    return _NodeSite(gpus=view.gpus, models=dict(view.models), prolog=view.prolog)


def read_inventory_isolated(timeout: float, *, deadline: float | None = None) -> GpuInventory:
    """``read_inventory`` in a forked child, given up on after ``timeout`` seconds.

    ``deadline`` is the overall budget named in the timeout message (what the admin set),
    when ``timeout`` is only what is left of it.

    A child rather than a thread: a driver stuck in the kernel cannot hold our exit, and
    whatever NVML prints goes to /dev/null instead of into slurmd's log. Raises NvmlError
    (kind "timeout" when the child did not answer in time).
    """
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        try:
            os.close(rfd)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            try:
                from clusterjob.gpu.inventory import read_inventory

                payload: tuple[Any, ...] = ("ok", read_inventory())
            except NvmlError as exc:
                payload = ("error", exc.kind, str(exc))
            except BaseException as exc:  # anything else is still an answer, not a hang
                payload = ("error", "unknown", f"{type(exc).__name__}: {exc}")
            data = pickle.dumps(payload)
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view) :]
        finally:
            os._exit(0)
    os.close(wfd)
    _READERS.add(pid)
    end = time.monotonic() + timeout
    chunks: list[bytes] = []
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([rfd], [], [], left)[0]:
                _kill_readers()
                raise NvmlError(
                    "timeout",
                    f"NVML did not answer within {deadline or timeout:g}s: a GPU or the NVIDIA "
                    "driver is "
                    "hung (look for Xid errors in dmesg)",
                )
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
    _reap(pid, block=True)
    _READERS.discard(pid)
    try:
        payload = pickle.loads(b"".join(chunks))
    except Exception as exc:
        raise NvmlError("unknown", "the NVML reader ended without an answer") from exc
    if payload[0] == "ok":
        inventory: GpuInventory = payload[1]
        return inventory
    raise NvmlError(payload[1], payload[2])


_READERS: set[int] = set()  # NVML reader children still running


def _kill_readers() -> None:
    """Leave no hung NVML reader behind (it may never return from the driver)."""
    for pid in list(_READERS):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        _reap(pid, block=False)
        _READERS.discard(pid)


def _reap(pid: int, block: bool) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0 if block else os.WNOHANG)


# -- prolog ------------------------------------------------------------------------------


@dataclass
class _PrologRun:
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
        _kill_readers()
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
            set_drain_reason_later(self.node, f"clusterjob: {reason}")


# Slurm drains a node whose Prolog fails with the reason "Prolog error"; only that reason is
# replaced, never one an admin set. Bounded: the helper gives up after this many seconds.
SLURM_PROLOG_REASON = "Prolog error"
DRAIN_REASON_WAIT_S = 60.0
_SLURM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin"


def set_drain_reason_later(node: str, reason: str, *, scontrol: str | None = None) -> None:
    """Make ``sinfo -R`` say why the Prolog drained the node, without stalling slurmd.

    The Prolog must not call Slurm itself: slurmd waits for it (and reads its output to EOF),
    and slurmctld only drains the node after the Prolog has exited. So a detached grandchild,
    in its own session and holding none of the Prolog's descriptors, waits until slurmctld has
    drained the node with "Prolog error", then replaces that reason with ours. Silent and
    bounded; the node-local JSON log has the same reason in any case.
    """
    import shutil  # failure path only: keep the passing Prolog's imports minimal

    scontrol = scontrol or shutil.which("scontrol", path=os.environ.get("PATH") or _SLURM_PATH)
    if not scontrol:
        return
    reason = " ".join(reason.split())[:250]
    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        _reap(pid, block=True)
        return
    try:  # first child: new session, then fork again so the helper is re-parented to init
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, 65536)
        _replace_prolog_reason(scontrol, node, reason)
    finally:
        os._exit(0)


def _replace_prolog_reason(scontrol: str, node: str, reason: str) -> None:
    from clusterjob.slurm import runner  # the one way Slurm commands run; failure path only

    end = time.monotonic() + DRAIN_REASON_WAIT_S
    while time.monotonic() < end:
        time.sleep(1.0)
        try:
            shown = runner.run([scontrol, "show", "node", "-o", node], timeout=10).stdout
            if f"Reason={SLURM_PROLOG_REASON}" in shown:
                runner.run([scontrol, "update", f"NodeName={node}", f"Reason={reason}"], timeout=10)
                return
        except ClusterjobError:
            continue


def _prolog(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    run = _PrologRun(
        node=node_name(environ),
        job_id=environ.get("SLURM_JOB_ID"),
        log_override=args.log,
        deadline_override=args.deadline,
        under_slurmd=environ.get("SLURM_SCRIPT_CONTEXT") == "prolog_slurmd",
    )
    try:
        run.arm_alarm()
        site_path = Path(args.site or DEFAULT_SITE)
        try:
            check_trusted(site_path)
            cache_dir = Path(args.cache_dir or DEFAULT_CACHE_DIR)
            if cache_dir.exists():
                check_trusted(cache_dir)
            site = _load_node_site(site_path, run.node, cache_dir)
        except ClusterjobError as exc:
            return run.cannot_check(f"site config: {_one_line(exc)}", "config")
        run.policy = site.prolog
        run.arm_alarm()
        try:
            inventory = read_inventory_isolated(max(run.remaining(), 0.01), deadline=run.deadline)
        except NvmlError as exc:
            if exc.kind == "gpu_lost":  # not "cannot check": a known-broken node, whatever on_error
                return run.verdict(_lost_report(run.node, exc))
            return run.cannot_check(f"NVML: {_one_line(exc)}", exc.kind)
        report = run_checks(
            run.node,
            site.gpus,
            site.models,
            inventory,
            allocation_from_env(environ, Context.PROLOG),
        )
        return run.verdict(report)
    except Exception as exc:  # a bug in clusterjob must still give slurmd one line
        return run.cannot_check(f"internal error: {type(exc).__name__}: {exc}", "internal")


def _lost_report(node: str, exc: NvmlError) -> PreflightReport:
    """A GPU lost before NVML could even place it: a failed check, not an unknown."""
    lost = Finding("gpu-lost", Severity.ERROR, node, f"{node}: {_one_line(exc)}", found="lost")
    return PreflightReport(node=node, findings=(lost,), rows=())


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first + (f" (+{len(text) - 1} more line(s))" if len(text) > 1 else "")


# -- task prolog -------------------------------------------------------------------------


def _task_prolog(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO) -> int:
    """Print TaskProlog directives. Never fails the task: problems become ``print`` lines."""
    lines = ["export CUDA_DEVICE_ORDER=PCI_BUS_ID"]
    try:
        alloc = allocation_from_env(environ, Context.JOB)
        for problem in alloc.problems:
            lines.append(f"print clusterjob: warning: {problem}")
        uuid_bus_ids: dict[str, str] | None = None
        if alloc.uuids:
            deadline = DEFAULT_POLICY.deadline_seconds
            if args.site:
                site = _load_node_site(Path(args.site), node_name(environ), None)
                deadline = site.prolog.deadline_seconds
            try:
                inventory = read_inventory_isolated(deadline)
                uuid_bus_ids = {g.uuid: g.bus_id for g in inventory.gpus if g.uuid}
            except NvmlError as exc:
                lines.append(
                    "print clusterjob: warning: CUDA_VISIBLE_DEVICES not put in PCI order: "
                    f"NVML: {_one_line(exc)}"
                )
        value = task_cuda_visible_devices(alloc, uuid_bus_ids)
        if value is not None:
            lines.append(f"export CUDA_VISIBLE_DEVICES={value}")
    except Exception as exc:
        lines.append(f"print clusterjob: warning: task prolog: {type(exc).__name__}: {exc}")
    for line in lines:
        out.write(_printable(line) + "\n")
    out.flush()
    return 0


def _printable(line: str) -> str:
    """TaskProlog output is line-based: keep each directive on one line."""
    return " ".join(line.split("\n"))


# -- preflight core ----------------------------------------------------------------------


def run_preflight(
    site_path: str | Path | None,
    node: str,
    environ: Mapping[str, str],
    expect_model: str | None = None,
    expect_count: int | None = None,
    read: Callable[[float], GpuInventory] = read_inventory_isolated,
) -> PreflightReport:
    """The job-side preflight: this node's GPUs against the map and the job's request.

    Raises SiteNotFound/ConfigError for the config, UsageError for an unknown model,
    NvmlError when NVML cannot be read. Error findings are in the report, not raised.
    """
    from clusterjob.site.discovery import find_site

    path = find_site(
        str(site_path) if site_path else None,
        environ=environ,
        cluster_name=environ.get("SLURM_CLUSTER_NAME"),  # set by Slurm in jobs; no Slurm call
    )
    site = _load_node_site(path, node, None)
    if expect_model is not None:
        canonical = next((m for m in site.models if m.casefold() == expect_model.casefold()), None)
        if canonical is None:
            known = ", ".join(sorted(site.models)) or "none"
            raise UsageError(f"unknown GPU model {expect_model!r} (site models: {known})")
        expect_model = canonical
    if expect_count is not None and expect_count < 0:
        raise UsageError(f"expected GPU count must be >= 0, got {expect_count}")
    inventory = read(site.prolog.deadline_seconds)
    return run_checks(
        node,
        site.gpus,
        site.models,
        inventory,
        allocation_from_env(environ, Context.JOB),
        expect_model=expect_model,
        expect_count=expect_count,
        cuda_device_order=environ.get("CUDA_DEVICE_ORDER"),
        check_cuda_order=True,
    )


def read_gpus(timeout: float = DEFAULT_POLICY.deadline_seconds) -> GpuInventory:
    """The ``gpus`` command's inventory, with the same never-hang guarantee as the Prolog."""
    return read_inventory_isolated(timeout)


# -- entry point -------------------------------------------------------------------------


class _ArgParser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (exit 2) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"clusterjob {self.prog.split()[-1]}: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser(command: str) -> argparse.ArgumentParser:
    p = _ArgParser(prog=f"clusterjob {command}", allow_abbrev=False)
    if command == "task-prolog":
        p.add_argument("--site", help="site config (only for its NVML deadline)")
        return p
    p.add_argument("--site", help=f"site config (default {DEFAULT_SITE}; never from env)")
    if command == "prolog":
        p.add_argument("--cache-dir", help=f"parsed-config cache (default {DEFAULT_CACHE_DIR})")
        p.add_argument("--deadline", type=float, help="seconds (default: site prolog policy)")
        p.add_argument("--log", help="JSON-lines log (default: site prolog policy)")
    return p


def hook_main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    """``argv`` is ``["prolog", ...]`` or ``["task-prolog", ...]``; returns the exit code."""
    env = os.environ if environ is None else environ
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command not in ("prolog", "task-prolog"):
        print(f"clusterjob: unknown hook {command!r}", file=sys.stderr)
        return 2
    try:
        args = _parser(command).parse_args(rest)
    except SystemExit as exc:
        if exc.code == 0:  # --help
            return 0
        if command == "task-prolog":  # never fail the task, even for a bad wrapper line
            print("print clusterjob: warning: task-prolog: bad arguments", flush=True)
            return 0
        return int(exc.code or 0)
    if command == "prolog":
        try:
            return _prolog(args, env)
        except BaseException as exc:  # last resort: one line, drain
            print(f"clusterjob prolog: internal error: {type(exc).__name__}", file=sys.stderr)
            return 1
    return _task_prolog(args, env, sys.stdout)
