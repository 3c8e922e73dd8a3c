"""Cancelling jobs: one scancel call for all of them."""

from __future__ import annotations

from collections.abc import Sequence

from clusterjob.errors import UsageError
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.status import StatusCache
from clusterjob.slurm.commands import SlurmClient


def cancel(
    jobs: Sequence[str],
    *,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
) -> list[str]:
    """Ask Slurm to cancel ``jobs`` (ids or ``last``) in one scancel call."""
    client = client or SlurmClient()
    registry = registry or Registry()
    ids = [registry.resolve_id(j) for j in jobs]
    if not ids:
        raise UsageError("name at least one job to cancel")
    client.scancel(ids)
    StatusCache().clear()  # the next status must not show the jobs as they were
    return ids
