"""Claim a job's GPUs on this host, keep them claimed while the job lives, and say which.

Claims are the workstation's (``clusterjob.workstation.claims``): a claim is held while a
process holds the flock of its file. A prolog ends before its job starts, so after claiming
it forks a *holder*: a small process in a session of its own that keeps the claim files open
until the process it watches is gone (the job's ``sge_shepherd``, which lives from prolog to
epilog, or the job script's shell where the job claims for itself) or the epilog ends it. A
job killed any way at all therefore frees its GPUs within a second of its shepherd's end.

Which GPUs: a file ``job-<key>.gpus`` in the claims' lock dir (JSON: the PCI positions, the
holder's pid and start time). The job's first step reads it and exports
CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER=PCI_BUS_ID: Grid Engine gives the job no way to
receive variables from a prolog.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterjob.errors import ClusterjobError, PreflightFailed
from clusterjob.gpu.inventory import GpuInventory
from clusterjob.gpubind.choice import (
    HostGpu,
    NotEnoughFreeGpus,
    check_model_here,
    choose_gpus,
    host_gpus,
    resolve_model,
    visible_devices,
)
from clusterjob.node.context import job_node_view
from clusterjob.node.preflight import read_gpus, run_preflight
from clusterjob.node.report import render_table
from clusterjob.site.discovery import find_site
from clusterjob.site.nodeview import NodeView
from clusterjob.workstation.claims import (
    HeldClaims,
    default_lock_dir,
    ensure_shared_dir,
    held_claims,
    selection_lock,
    try_claim,
    write_holder,
)

WATCH_INTERVAL_S = 0.5  # how soon a holder sees its job gone
BINDING_MODE = 0o644  # the job (another user) reads what root wrote


@dataclass(frozen=True)
class Binding:
    """A job's GPUs on this host, as the binding file says."""

    job: str  # "123" or "123.4"
    devices: str  # CUDA_VISIBLE_DEVICES, PCI order
    model: str | None
    holder_pid: int
    holder_start: int | None  # /proc/PID/stat start time: a reused pid is not our holder

    def exports(self) -> str:
        """Shell lines for the job (digits and commas only: nothing to quote)."""
        return f"export CUDA_DEVICE_ORDER=PCI_BUS_ID\nexport CUDA_VISIBLE_DEVICES={self.devices}\n"


def binding_path(lock_dir: Path, job: str) -> Path:
    return lock_dir / f"job-{''.join(c if c.isalnum() or c in '.-' else '_' for c in job)}.gpus"


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None
    when it is gone. With the pid it names one process for good (pids are reused)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(text.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def process_name(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.partition("(")[2].rpartition(")")[0] or None


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def ancestor_named(name: str, pid: int | None = None) -> int | None:
    """The nearest ancestor of ``pid`` (default: this process) whose command is ``name``."""
    current = parent_of(os.getpid() if pid is None else pid)
    while current is not None and current > 1:
        if process_name(current) == name:
            return current
        current = parent_of(current)
    return None


def node_view(site: str | None, environ: Mapping[str, str], node: str | None = None) -> NodeView:
    """This host's view of the site (``site``, else as ``clusterjob`` finds it in
    ``environ``); ``node`` defaults to the host's short name."""
    node = node or socket.gethostname().split(".")[0]
    return job_node_view(find_site(site, environ=environ), node)


def bind(
    view: NodeView,
    environ: Mapping[str, str],
    *,
    job: str,
    count: int,
    model_spec: str | None,
    watch_pid: int,
    lock_dir: Path | None = None,
    inventory: GpuInventory | None = None,
    say: Callable[[str], object] | None = None,
) -> Binding:
    """Claim ``count`` GPUs of ``model_spec`` for ``job``, run the node-map preflight on them,
    and leave a holder watching ``watch_pid``. PreflightFailed: this host cannot give the
    job what it booked (the job must not run here); NotEnoughFreeGpus: others hold them.
    ``say`` is given the preflight's table of a check that passed (the job's output shows
    it, as on Slurm)."""
    model = None
    if model_spec:
        model = resolve_model(view, model_spec)
        if model is None:
            known = ", ".join(sorted(view.models)) or "none"
            raise PreflightFailed(
                f"job {job} asks for GPU model {model_spec!r}, which the site does not know "
                f"(its models: {known}; a model's gres_type is its gpu_type value)"
            )
        check_model_here(view, model, count, job)
    if inventory is None:
        inventory = read_gpus(view.prolog.deadline_seconds)
    gpus = host_gpus(view, inventory)
    lock_dir = ensure_shared_dir(default_lock_dir(environ) if lock_dir is None else lock_dir)
    held = HeldClaims()
    try:
        with selection_lock(lock_dir):
            chosen = _claim(lock_dir, gpus, model, count, held)
        devices = visible_devices(chosen)
        passed = _preflight(view, environ, inventory, chosen, model)
        path = binding_path(lock_dir, job)
        holder = _start_holder(held, watch_pid, start_time(watch_pid), path)
        for g in chosen:
            write_holder(held, g.key, f"job {job} on {view.node}", pid=holder)
    finally:
        held.release_all()  # ours only: the holder keeps its own copies open
    binding = Binding(job, devices, model, holder, start_time(holder))
    _write_binding(path, binding)
    if say is not None:
        say(passed)
    return binding


def _claim(
    lock_dir: Path, gpus: tuple[HostGpu, ...], model: str | None, count: int, held: HeldClaims
) -> tuple[HostGpu, ...]:
    taken = {c.key for c in held_claims(lock_dir)}
    chosen = choose_gpus(gpus, model, count, taken)
    for g in chosen:
        if not try_claim(lock_dir, g.key, held):  # someone raced us past the selection lock
            raise NotEnoughFreeGpus(f"GPU {g.position} ({g.gpu.bus_id}) was claimed meanwhile")
    return chosen


def _preflight(
    view: NodeView,
    environ: Mapping[str, str],
    inventory: GpuInventory,
    chosen: tuple[HostGpu, ...],
    model: str | None,
) -> str:
    """The job preflight on the chosen GPUs, as the job would run it with these variables;
    its table when it passes."""
    positions = visible_devices(chosen)
    env = {
        **{k: v for k, v in environ.items() if not k.startswith("SLURM_")},
        # the allocation as the checks read it: node-map slots, which are PCI positions
        "SLURM_JOB_GPUS": positions,
        "CUDA_VISIBLE_DEVICES": positions,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    report = run_preflight(
        view.source, view.node, env, expect_model=model, expect_count=len(chosen),
        read=lambda _timeout: inventory,
    )  # fmt: skip
    if not report.ok:
        raise PreflightFailed(
            f"the GPUs chosen on {view.node} fail the preflight against the site's node map:\n"
            + render_table(report)
        )
    return render_table(report)


def _start_holder(held: HeldClaims, watch_pid: int, watch_start: int | None, path: Path) -> int:
    """Fork the process that keeps ``held`` open until ``watch_pid`` is gone or it is sent
    SIGTERM; it then removes ``path`` (the binding) if it still names it."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the holder: never return into the caller's code
        os.setsid()  # not in the job's process group: the shepherd's kill is not ours
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)  # a `$(...)` in the job script waits for its pipe to close
        keep = sorted({0, 1, 2, *held.fds.values()})
        for low, high in zip(keep, [*keep[1:], 65536], strict=True):
            os.closerange(low + 1, high)
        stop = [False]
        signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while not stop[0] and watch_start is not None and start_time(watch_pid) == watch_start:
            time.sleep(WATCH_INTERVAL_S)
        with contextlib.suppress(OSError, ValueError):
            if read_binding(path, trust_uid=os.geteuid()).holder_pid == os.getpid():
                path.unlink()
    finally:
        os._exit(0)


def _write_binding(path: Path, binding: Binding) -> None:
    """Write the binding anew (never through a file someone placed under its name)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, BINDING_MODE)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), BINDING_MODE)
        json.dump(
            {
                "job": binding.job,
                "devices": binding.devices,
                "model": binding.model,
                "holder_pid": binding.holder_pid,
                "holder_start": binding.holder_start,
            },
            f,
        )


def read_binding(path: Path, trust_uid: int) -> Binding:
    """The binding in ``path``, if root or ``trust_uid`` wrote it (anyone may create files
    in the lock dir); OSError or ValueError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, trust_uid):
            raise ValueError(f"{path} is not a binding clusterjob wrote")
        data = json.loads(f.read(65536))
    devices = str(data["devices"])
    if devices and not all(part.isdigit() for part in devices.split(",")):
        raise ValueError(f"{path}: bad devices {devices!r}")
    start = data.get("holder_start")
    return Binding(
        job=str(data["job"]),
        devices=devices,
        model=data.get("model"),
        holder_pid=int(data["holder_pid"]),
        holder_start=None if start is None else int(start),
    )


def current_binding(job: str, environ: Mapping[str, str]) -> Binding | None:
    """The binding the prolog (or an earlier step) made for ``job``, while its holder lives."""
    path = binding_path(default_lock_dir(environ), job)
    try:
        binding = read_binding(path, trust_uid=os.geteuid())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if binding.holder_start is None or start_time(binding.holder_pid) != binding.holder_start:
        return None
    return binding


def release(job: str, environ: Mapping[str, str]) -> bool:
    """End ``job``'s holder (its claims go with it) and remove its binding; False when there
    was none. For the epilog: the holder would see the shepherd's end anyway, a little later."""
    path = binding_path(default_lock_dir(environ), job)
    try:
        binding = read_binding(path, trust_uid=os.geteuid())
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if binding.holder_start is not None and start_time(binding.holder_pid) == binding.holder_start:
        with contextlib.suppress(OSError):
            os.kill(binding.holder_pid, signal.SIGTERM)
        for _ in range(50):  # the holder removes the file as it goes; wait a little for it
            if start_time(binding.holder_pid) != binding.holder_start:
                break
            time.sleep(0.02)
    with contextlib.suppress(OSError):
        path.unlink()
    return True


__all__ = [
    "Binding",
    "ClusterjobError",
    "NotEnoughFreeGpus",
    "ancestor_named",
    "bind",
    "current_binding",
    "node_view",
    "release",
]
