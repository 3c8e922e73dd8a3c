"""After the Prolog drained the node: make ``sinfo -R`` say why, without stalling slurmd.

Slurm drains a node whose Prolog fails with the reason "Prolog error"; only that reason is
replaced, never one an admin set. Bounded: the helper gives up after DRAIN_REASON_WAIT_S.
"""

from __future__ import annotations

import contextlib
import os
import time

from clusterjob.errors import ClusterjobError, printable

__all__ = [
    "DRAIN_REASON_WAIT_S",
    "SLURM_EPILOG_REASON",
    "SLURM_PROLOG_REASON",
    "drain_now",
    "set_drain_reason_later",
]

SLURM_PROLOG_REASON = "Prolog error"
SLURM_EPILOG_REASON = "Epilog error"  # the same, for a failed Epilog
DRAIN_REASON_WAIT_S = 60.0
_SLURM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin"


def set_drain_reason_later(
    node: str, reason: str, *, scontrol: str | None = None, replacing: str = SLURM_PROLOG_REASON
) -> None:
    """Replace Slurm's "Prolog error" drain reason with ``reason``, from a detached helper.

    The Prolog must not call Slurm itself: slurmd waits for it (and reads its output to EOF),
    and slurmctld only drains the node after the Prolog has exited. So a detached grandchild,
    in its own session and holding none of the Prolog's descriptors, waits until slurmctld has
    drained the node with "Prolog error", then replaces that reason with ours. Silent and
    bounded; the node-local JSON log has the same reason in any case. ``replacing``: the
    reason Slurm gives (the Epilog's is "Epilog error").
    """
    import shutil  # failure path only: keep the passing Prolog's imports minimal

    scontrol = scontrol or shutil.which("scontrol", path=os.environ.get("PATH") or _SLURM_PATH)
    if not scontrol:
        return
    reason = printable(reason)[:250]  # one line, nothing that drives `sinfo -R`
    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        return
    try:  # first child: new session, then fork again so the helper is re-parented to init
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, 65536)
        _replace_prolog_reason(scontrol, node, reason, replacing)
    finally:
        os._exit(0)


def _replace_prolog_reason(
    scontrol: str, node: str, reason: str, replacing: str = SLURM_PROLOG_REASON
) -> None:
    from clusterjob.slurm import runner  # the one way Slurm commands run; failure path only

    end = time.monotonic() + DRAIN_REASON_WAIT_S
    while time.monotonic() < end:
        time.sleep(1.0)
        try:
            shown = runner.run([scontrol, "show", "node", "-o", node], timeout=10).stdout
            if f"Reason={replacing}" in shown:
                runner.run([scontrol, "update", f"NodeName={node}", f"Reason={reason}"], timeout=10)
                return
        except ClusterjobError:
            continue


def drain_now(node: str, reason: str, timeout: float, *, scontrol: str | None = None) -> bool:
    """Drain ``node`` with ``reason`` at once; False when Slurm could not be told.

    For the Epilog: slurmctld does not wait for it (unlike the Prolog, which it does), so the
    drain and its reason are in place before the job leaves COMPLETING, and ``status`` never
    sees Slurm's bare "Epilog error" in between.
    """
    import shutil

    scontrol = scontrol or shutil.which("scontrol", path=os.environ.get("PATH") or _SLURM_PATH)
    if not scontrol or timeout <= 0:
        return False
    from clusterjob.slurm import runner

    reason = printable(reason)[:250]
    cmd = [scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]
    try:
        runner.run(cmd, timeout=timeout)
    except (ClusterjobError, OSError):
        return False
    return True
