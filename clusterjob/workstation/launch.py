"""``clusterjob run``: claim free GPUs of one model on this machine, then exec the command.

The command replaces this process (same pid), so signals sent to ``clusterjob run`` reach it
and its exit status is the run's. The claims stay held across exec: their descriptors are
made inheritable, and the kernel releases them when the command (and whatever it forked that
still holds them) is gone.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, TextIO

from clusterjob import envvars
from clusterjob.errors import ClusterjobError, UsageError, printable
from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.workstation import claims as claims_mod
from clusterjob.workstation import queue as queue_mod
from clusterjob.workstation.selection import (
    Choice,
    GpuRequest,
    ModelCatalog,
    busy_message,
    choose_gpus,
    describe_gpu,
    gpu_key,
    gpus_for_request,
    pci_positions,
)

POLL_SECONDS = 0.2
NVML_TIMEOUT = 15.0


@dataclass
class Acquired:
    """GPUs this process now holds claims on, in PCI bus order."""

    model: str
    gpus: tuple[Gpu, ...]
    held: claims_mod.HeldClaims = field(repr=False)
    positions: dict[str, int] = field(default_factory=dict)  # bus_id -> PCI position


class StatusLine:
    """The live waiting line on stderr: rewritten in place on a terminal, else one line per
    change (a log file should show what happened, not a thousand carriage returns)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last = ""

    def show(self, text: str) -> None:
        if text == self.last:
            return
        self.last = text
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and self.last:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def parse_timeout(text: str | None) -> float | None:
    """``--wait`` value: None (wait forever), seconds, or ``30s``/``10m``/``2h``/``1d``."""
    if text is None or text in ("", "forever"):
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:].isalpha() else (text, "s")
    try:
        value = float(number) * units[unit.lower()]
    except (ValueError, KeyError):
        raise UsageError(f"--wait {text!r}: give seconds or e.g. 30s, 10m, 2h") from None
    if value < 0:
        raise UsageError(f"--wait {text!r}: a timeout cannot be negative")
    return value


def acquire_gpus(
    request: GpuRequest,
    command: Sequence[str],
    catalog_for: Callable[[GpuInventory], ModelCatalog],
    read: Callable[[], GpuInventory],
    *,
    lock_dir: Path,
    wait: bool,
    timeout: float | None = None,
    status: StatusLine | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Acquired:
    """Claim GPUs for ``request`` or raise: UsageError when this machine can never serve it,
    ClusterjobError (exit 1) when it is busy and we may not (or no longer) wait."""
    inventory = read()
    catalog = catalog_for(inventory)
    model, _ = gpus_for_request(inventory, catalog, request)  # impossible requests fail first
    claims_mod.ensure_shared_dir(lock_dir)
    junk = claims_mod.foreign_files(lock_dir)
    if junk:  # never a claim and never waited on, but someone should clean it up
        shown = ", ".join(junk[:5]) + (f" (+{len(junk) - 5} more)" if len(junk) > 5 else "")
        print(
            printable(
                f"clusterjob: warning: ignoring {len(junk)} file(s) in {lock_dir} that are not "
                f"GPU claims or tickets: {shown}"
            ),
            file=sys.stderr,
        )
    qdir = queue_mod.queue_dir(lock_dir)
    text = shlex.join(command)
    if not wait:
        return _acquire_now(request, model, inventory, catalog, lock_dir, text, clock)

    status = status or StatusLine()
    deadline = None if timeout is None else clock() + timeout

    def lock_wait() -> float:  # the selection lock never keeps us past our own deadline
        left = claims_mod.SELECTION_WAIT_S if deadline is None else deadline - clock()
        return max(0.0, min(claims_mod.SELECTION_WAIT_S, left))

    def gpus_claimed() -> bool:
        with claims_mod.selection_lock(lock_dir, lock_wait()):
            return _gpus_claimed(lock_dir, inventory)

    with claims_mod.selection_lock(lock_dir, lock_wait()):
        ticket = queue_mod.take_ticket(qdir, text)
    message = ""
    summary_at = -1.0
    try:
        while True:
            ahead = ticket.waiters_ahead(gpus_claimed, clock())
            if not ahead:
                fresh = read()
                with claims_mod.selection_lock(lock_dir, lock_wait()):
                    acquired, message = _attempt(request, fresh, catalog, lock_dir, text)
                if acquired is not None:
                    status.done()
                    return acquired
                status.show(f"clusterjob: waiting (first in queue): {message}")
            elif clock() - summary_at >= 1.0 or summary_at < 0:
                summary_at = clock()  # other runs' claims, looked up at most once a second
                status.show(
                    f"clusterjob: waiting for {request.describe(model)}: position "
                    f"{len(ahead) + 1} in queue (first: {_first(ahead)}); "
                    f"{_claims_summary(lock_dir, inventory, lock_wait())}"
                )
            if deadline is not None and clock() >= deadline:
                status.done()
                reason = message or f"{len(ahead)} run(s) still ahead in the queue"
                raise ClusterjobError(
                    f"gave up after waiting {timeout:g}s for {request.describe(model)}: {reason}"
                )
            time.sleep(POLL_SECONDS)
    finally:
        ticket.leave()


def _acquire_now(
    request: GpuRequest,
    model: str,
    inventory: GpuInventory,
    catalog: ModelCatalog,
    lock_dir: Path,
    command: str,
    clock: Callable[[], float],
) -> Acquired:
    """Without ``--wait``: the GPUs now, unless earlier runs wait in the queue for claimed
    GPUs. Waiters while nothing is claimed get IDLE_WAITER_S to take their GPUs first."""
    qdir = queue_mod.queue_dir(lock_dir)
    watch: queue_mod.QueueWatch | None = None
    told = False
    while True:
        with claims_mod.selection_lock(lock_dir):
            present = queue_mod.waiters(qdir)
            watch = watch or queue_mod.QueueWatch.of(present)
            ahead = watch.still_ahead(present, lambda: _gpus_claimed(lock_dir, inventory), clock())
            if not ahead:
                acquired, message = _attempt(request, inventory, catalog, lock_dir, command)
                break
        if not watch.quiet:
            raise ClusterjobError(
                f"no {request.describe(model)} for you now: {len(ahead)} earlier run(s) are "
                f"waiting in the queue (first: {_first(ahead)}; first come, first served): "
                "use --wait to queue"
            )
        if not told:
            told = True
            print(
                f"clusterjob: {len(ahead)} earlier run(s) wait in the queue though no GPU is "
                f"claimed: letting them go first for up to {queue_mod.IDLE_WAITER_S:g}s",
                file=sys.stderr,
            )
        time.sleep(POLL_SECONDS)
    if acquired is None:
        raise ClusterjobError(f"{message} (use --wait to queue for them)")
    return acquired


def _gpus_claimed(lock_dir: Path, inventory: GpuInventory) -> bool:
    """Whether a GPU of this machine is claimed; the caller holds the selection lock. A claim
    on a GPU the machine lacks holds nothing and keeps no waiter in its place."""
    keys = {gpu_key(g) for g in inventory.gpus}
    return any(c.key in keys for c in claims_mod.held_claims(lock_dir))


def _first(ahead: Sequence[queue_mod.Waiter]) -> str:
    holder = ahead[0].holder()
    return holder.brief() if holder else "another run"


def _attempt(
    request: GpuRequest,
    inventory: GpuInventory,
    catalog: ModelCatalog,
    lock_dir: Path,
    command: str,
) -> tuple[Acquired | None, str]:
    """One look-and-claim; the caller holds the selection lock. Returns the claims or why not.

    NVML was read before the lock was taken: claims, not NVML's process list, are what keep
    two runs apart, and a slow driver must not stall every other run.
    """
    model, candidates = gpus_for_request(inventory, catalog, request)
    held = claims_mod.HeldClaims()
    claimed: dict[str, str] = {}
    for gpu in candidates:
        key = gpu_key(gpu)
        if not claims_mod.try_claim(lock_dir, key, held):
            holder = claims_mod.holder_of(lock_dir, key)
            claimed[key] = str(holder) if holder else "another clusterjob run"
    choice: Choice = choose_gpus(candidates, request, claimed)
    chosen_keys = {gpu_key(g) for g in choice.chosen}
    for key in list(held.fds):
        if key not in chosen_keys:
            held.release(key)
    if not choice.ok:
        return None, busy_message(model, request, choice, pci_positions(inventory))
    for gpu in choice.chosen:
        claims_mod.write_holder(held, gpu_key(gpu), command)
    acquired = Acquired(model, choice.chosen, held, pci_positions(inventory))
    return acquired, ""


def _claims_summary(lock_dir: Path, inventory: GpuInventory, lock_wait: float) -> str:
    positions = pci_positions(inventory)
    by_key = {gpu_key(g): g for g in inventory.gpus}
    parts = []
    for claim in claims_mod.current_claims(lock_dir, lock_wait):
        gpu = by_key.get(claim.key)
        where = describe_gpu(positions[gpu.bus_id], gpu) if gpu else claim.key
        parts.append(f"{where} claimed by {claim.holder_text()}")
    return "; ".join(parts) if parts else "no GPU claimed by clusterjob"


def visible_devices(gpus: Sequence[Gpu], inventory_order: Mapping[str, int]) -> str:
    """The value for CUDA_VISIBLE_DEVICES: GPU UUIDs, falling back to PCI-order indices.

    UUIDs, because they name the card itself. An index means "the i-th GPU CUDA enumerates",
    which equals our PCI position only if CUDA sees exactly the GPUs NVML sees, in PCI order:
    a CUDA_VISIBLE_DEVICES already set by a container or a parent, a GPU CUDA skips (MIG,
    a driver problem), or a forgotten CUDA_DEVICE_ORDER breaks that silently, and the command
    then runs on a card someone else claimed. A UUID is either that card or an error. CUDA has
    accepted full ``GPU-...`` UUIDs here for years; CUDA_DEVICE_ORDER=PCI_BUS_ID is set too,
    so the chosen GPUs are numbered 0..n-1 in bus order inside the command.
    """
    return ",".join(g.uuid or str(inventory_order[g.bus_id]) for g in gpus)


def command_environment(acquired: Acquired, environ: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: exactly the claimed GPUs, numbered in PCI bus order."""
    env = dict(environ)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = visible_devices(acquired.gpus, acquired.positions)
    env[envvars.GPU_BUS_IDS] = ",".join(g.bus_id for g in acquired.gpus)
    return env


def exec_command(acquired: Acquired, command: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """Replace this process with ``command``; the claims go with it (inherited descriptors)."""
    if not command:
        raise UsageError(
            "no command to run: put it after '--', e.g. clusterjob run --gpus 1 -- python train.py"
        )
    acquired.held.make_inheritable()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), dict(env))
    except OSError as exc:
        acquired.held.release_all()
        raise UsageError(f"cannot run {command[0]!r}: {exc.strerror}") from exc
