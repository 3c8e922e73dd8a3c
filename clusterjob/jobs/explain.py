"""What Slurm says about a job, in GPU terms and in the site's own vocabulary.

A pending reason or an end state becomes one line a researcher can act on (``explain``);
a refused ``sbatch`` gets a next step naming the site's GRES types and partitions
(``with_sbatch_hint``). The Slurm layer raises sbatch's error as it is; wording it for a
site happens here, where the site is known.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from clusterjob.errors import SlurmError
from clusterjob.jobs.followup import follow_up
from clusterjob.slurm import parse

if TYPE_CHECKING:
    from clusterjob.site.model import Site

# --- pending reasons and end states, in GPU terms -------------------------------------------

REASONS = {
    "Resources": "waiting for free GPUs of that type (or CPUs/memory on the nodes with them)",
    "Priority": "other jobs are ahead in the queue (priority / fair share); it waits its turn",
    "QOSMaxGRESPerUser": "you already use as many GPUs as your QOS allows; it starts when one "
    "of your jobs ends",
    "QOSMaxGRESPerAccount": "your account already uses as many GPUs as its QOS allows",
    "AssocGrpGRES": "your account's GPU limit is reached; it starts when its jobs end",
    "AssocGrpGRESMinutes": "your account's GPU-hours budget is used up; ask its coordinator",
    "AssocGrpGRESRunMinutes": "your account has too many GPU-minutes running at once",
    "QOSMaxJobsPerUserLimit": "you already run as many jobs as your QOS allows",
    "QOSMaxSubmitJobPerUserLimit": "you already have as many jobs queued as your QOS allows",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved (see `sinfo -R`)",
    # what squeue prints for a job whose only possible nodes are down or drained (seen on 22.05)
    "Nodes required for job are DOWN, DRAINED": "every node that could run it is down or "
    "drained (see `sinfo -R`; the clusterjob Prolog drains nodes whose GPUs are wrong)",
    "NodeDown": "a node it needs is down",
    "Dependency": "waiting for the jobs it depends on",
    "DependencyNeverSatisfied": "a job it depends on failed or was cancelled, so it will never "
    "start: cancel it",
    "BeginTime": "waiting for its --begin time (or, after a requeue, for Slurm's restart delay)",
    "JobArrayTaskLimit": "the array's %N limit lets only that many tasks run at once; the "
    "others wait their turn",
    "JobHeldUser": "held by you: `scontrol release <id>` to let it start",
    "JobHeldAdmin": "held by an administrator",
    "PartitionTimeLimit": "its --time is over the partition's limit, so it will never start: "
    "cancel it and resubmit with a shorter --time",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows; it will never start",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "BadConstraints": "no node can satisfy this request (GPU type/count, constraint)",
    "Reservation": "waiting for its reservation to start",
    "Prolog": "the nodes are running the Prolog (clusterjob's GPU check)",
    "launch failed requeued held": "the clusterjob Prolog (or another) failed on the node; the "
    "node was drained and your job is held: `scontrol release <id>` once it can run elsewhere "
    "(`sinfo -R` shows the node's reason)",
}

STATE_NOTES = {
    "OUT_OF_MEMORY": "killed for using more host memory than requested (--mem-per-gpu)",
    "TIMEOUT": "reached its time limit",
    "NODE_FAIL": "a node of the job failed; resubmit (`<resubmit>`)",
    "PREEMPTED": "preempted by a higher-priority job",
    "BOOT_FAIL": "a node failed to boot for the job",
    "DEADLINE": "could not finish before its --deadline",
}


def is_pending_reason(reason: str | None) -> bool:
    """Whether ``reason`` is why a job waits (sacct keeps the last one after the job ended)."""
    return reason is not None and any(reason.startswith(key) for key in REASONS)


def explain(state: str, reason: str | None, job_id: str = "<id>", host: str = "") -> str:
    """One line saying why a job is where it is, in GPU terms; "" when nothing to add. A
    command it names reaches the job's cluster (``host``: the job went over ssh).

    An ended job's pending reason (sacct keeps ``Dependency`` on a job that since ran) is
    history, not news: it is not explained."""
    if reason and parse.is_final(state) and is_pending_reason(reason):
        reason = None
    if reason:
        text = REASONS.get(reason)
        if text is None and reason.startswith("launch failed requeued held"):
            text = REASONS["launch failed requeued held"]
        if text is None:
            for key, value in REASONS.items():
                if reason.startswith(key):
                    text = value
                    break
        if text:
            return text.replace("<id>", job_id)
    note = STATE_NOTES.get(state, "").replace("<id>", job_id)
    return note.replace("<resubmit>", follow_up("resubmit", job_id, host=host))


# --- sbatch errors, explained with the site's own vocabulary --------------------------------


def _gres_types(site: Site) -> str:
    types = [f"{m.gres_type} ({m.name})" for m in site.models if m.gres_type]
    return ", ".join(types) if types else "none configured"


def _partitions(site: Site) -> str:
    return ", ".join(p.name + (" (default)" if p.default else "") for p in site.partitions)


def sbatch_hint(message: str, site: Site | None) -> str:
    """A next step for a known sbatch error, naming what this site offers."""
    m = message.casefold()
    where = f" at site {site.name}" if site else ""
    # a site's own words first: they say more than Slurm's summary after them
    if any(w in m for w in ("must always specify a type", "specify a gpu type", "gpu:type")):
        extra = f"; types here: {_gres_types(site)}" if site else ""
        return f"this cluster requires a GPU type: pass --model{extra}"
    if "cannot find gpu specification" in m:
        extra = f"; partitions{where}: {_partitions(site)}" if site else ""
        return (
            "this partition takes only jobs that ask for GPUs: pass --gpus N (with --model), "
            f"or submit to a CPU partition{extra}"
        )
    if parse.is_invalid_gres(message):
        if site:
            return (
                f"the GPU request does not match a GRES type{where}; types here: "
                f"{_gres_types(site)}; ask with --model instead of raw --gres"
            )
        return "the --gres/--gpus request is malformed or names an unknown GRES type"
    if "requested node configuration is not available" in m:
        extra = (
            f"; GPU types{where}: {_gres_types(site)}; partitions: {_partitions(site)}"
            if site
            else ""
        )
        return (
            "no node in the partition can ever satisfy this request (unknown GPU type, more "
            f"GPUs/CPUs/memory per node than any node has){extra}"
        )
    if "invalid account" in m:
        return (
            "your user has no association with this account (or partition); list yours with "
            "`sacctmgr show assoc user=$USER format=account,partition,qos`"
        )
    if "invalid partition" in m:
        return f"partitions{where}: {_partitions(site)}" if site else "see `sinfo -s`"
    if "invalid qos" in m:
        return "list the QOS you may use with `sacctmgr show assoc user=$USER format=qos`"
    if "time limit" in m and ("invalid" in m or "exceed" in m):
        if site:
            limits = ", ".join(f"{p.name}: {p.time_limit or 'none'}" for p in site.partitions)
            return f"--time exceeds the partition limit ({limits})"
        return "--time exceeds the partition's MaxTime (see `sinfo -o '%P %l'`)"
    if "qosmaxgresperuser" in m or "maxgres" in m:
        return "you already use as many GPUs as your QOS allows; wait or use fewer GPUs"
    if "unable to open file" in m:
        return "the job script is missing or unreadable"
    return ""


def with_sbatch_hint(exc: SlurmError, site: Site | None) -> SlurmError:
    """The same error, with every error line of sbatch on one line (a job_submit plugin's own
    words first, Slurm's summary last) and a hint matched on any of them; the whole stderr
    follows on the next lines."""
    message = parse.sbatch_error_message(exc.stderr)
    hint = sbatch_hint(message, site)
    stderr = f"{message}\n{exc.stderr}" if message and message != exc.stderr else exc.stderr
    return type(exc)(exc.cmd, exc.returncode, stderr, hint=hint)


@contextmanager
def sbatch_hints(site: Site | None) -> Iterator[None]:
    """Re-raise an sbatch refusal from the block with ``with_sbatch_hint`` for ``site``.

    An error that already carries a hint is the Slurm layer's own account of a submission
    it could not finish (a lost reply, the window spent, no Slurm here); it says what is
    safe to do next and passes unchanged.
    """
    try:
        yield
    except SlurmError as exc:
        if exc.hint:
            raise
        raise with_sbatch_hint(exc, site) from None
