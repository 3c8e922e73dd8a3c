"""The core of ``clusterjob preflight`` (in the job) and of ``clusterjob gpus``.

Same checks as the Prolog, plus what only the job knows: the model and count it asked for,
and its ``CUDA_DEVICE_ORDER``. NVML is read in a child with the Prolog's deadline, so
neither command hangs on a stuck driver.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from clusterjob.errors import PreflightFailed, UsageError
from clusterjob.gpu.inventory import GpuInventory, read_inventory
from clusterjob.node.allocation import Context, allocation_from_env
from clusterjob.node.checks import Facts, PreflightReport, run_checks
from clusterjob.node.context import DEFAULT_POLICY, job_node_view

__all__ = ["read_gpus", "run_preflight"]


def read_gpus(timeout: float = DEFAULT_POLICY.deadline_seconds) -> GpuInventory:
    """This node's inventory, with the same never-hang guarantee as the Prolog."""
    return read_inventory(timeout, isolate=True)


def run_preflight(
    site_path: str | Path | None,
    node: str,
    environ: Mapping[str, str],
    expect_model: str | None = None,
    expect_count: int | None = None,
    read: Callable[[float], GpuInventory] = read_gpus,
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
    view = job_node_view(path, node)
    if expect_model is not None:
        canonical = next((m for m in view.models if m.casefold() == expect_model.casefold()), None)
        if canonical is None:
            known = ", ".join(sorted(view.models)) or "none"
            raise UsageError(f"unknown GPU model {expect_model!r} (site models: {known})")
        expect_model = canonical
        if not view.models[canonical]:
            raise PreflightFailed(
                f"cannot check {canonical} GPUs: clusterjob reads GPUs through NVML (NVIDIA), "
                f"and the site gives {canonical} no NVML name (an AMD GPU); where the preflight "
                "is required this stops the job: set preflight: warn (or off) for the site or "
                "partition to run such jobs unchecked"
            )
    if expect_count is not None and expect_count < 0:
        raise UsageError(f"expected GPU count must be >= 0, got {expect_count}")
    inventory = read(view.prolog.deadline_seconds)
    checks = view.checks_for(environ.get("SLURM_JOB_PARTITION"))
    facts = Facts(
        node,
        view.gpus,
        view.models,
        inventory,
        allocation_from_env(environ, Context.JOB),
        expect_model=expect_model,
        expect_count=expect_count,
        context=Context.JOB,
        cuda_device_order=environ.get("CUDA_DEVICE_ORDER"),
        driver_min=checks.driver_min,
        cuda_min=checks.cuda_min,
        severity=checks.severity,
        job_cpus=_job_cpus(),
    )
    return run_checks(facts)


def _job_cpus() -> frozenset[int] | None:
    """The CPUs this job step may run on (Slurm's cpuset and binding); None: not known."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
