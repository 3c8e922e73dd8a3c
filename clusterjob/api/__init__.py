"""clusterjob from Python: ``Cluster`` (this login node, or one reached over ssh) and ``Job``
(a ``concurrent.futures.Future`` of a Slurm job). See ``clusterjob.api.cluster``.

This layer stands above ``clusterjob.jobs`` and below the CLI, which is a thin layer over it.
"""

from clusterjob.api.cluster import (
    Cluster,
    ClusterExecutor,
    Job,
    Prepared,
    RemoteTraceback,
    requeue,
)

__all__ = ["Cluster", "ClusterExecutor", "Job", "Prepared", "RemoteTraceback", "requeue"]
