"""Cancelling jobs: one scancel call for all of them."""

from __future__ import annotations

from collections.abc import Sequence

from clusterjob.errors import UsageError
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.status import StatusCache, cache_for
from clusterjob.slurm.commands import SlurmClient


def cancel(
    jobs: Sequence[str],
    *,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
    cache: StatusCache | None = None,
) -> list[str]:
    """Ask Slurm to cancel ``jobs`` (ids or ``last``) in one scancel call; the ids it took.

    A job Slurm does not know is a ``UsageError`` naming it (after the others were asked to
    cancel): scancel itself exits 0 for it.
    """
    client = client or SlurmClient()
    registry = registry or Registry(host=client.runner.transport.label)
    ids = [registry.resolve_id(j) for j in jobs]
    if not ids:
        raise UsageError("name at least one job to cancel")
    slurm_ids, unknown_elsewhere = _cancel_controlled(ids, registry)
    unknown = [*unknown_elsewhere, *(client.scancel(slurm_ids) if slurm_ids else [])]
    (cache or cache_for(client)).clear()  # the next status must not show them as they were
    if unknown:
        known = [i for i in ids if i not in unknown]
        plural = "s" if len(unknown) > 1 else ""
        message = (
            f"unknown job{plural} {', '.join(unknown)}: Slurm has no such job "
            "(or it ended long enough ago to be forgotten)"
            if not unknown_elsewhere
            else f"unknown job{plural} {', '.join(unknown)}: the scheduler has no such job "
            "(or it ended)"
        )
        if known:
            message += f" (cancel requested for {', '.join(known)})"
        raise UsageError(message)
    return ids


def _cancel_controlled(ids: list[str], registry: Registry) -> tuple[list[str], list[str]]:
    """Cancel the jobs of a scheduler other than Slurm through their backend: (the ids left
    for scancel, those the other scheduler did not know)."""
    from clusterjob.jobs.controlled import cancel as cancel_controlled

    return cancel_controlled(ids, registry)
