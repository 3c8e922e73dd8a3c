"""clusterjob: GPU jobs on the right GPUs of a Slurm cluster, proven before training starts."""

__version__ = "0.1.0"

# The Python API (clusterjob.api), loaded on first use: `import clusterjob` stays as cheap as
# the Prolog needs it (no Slurm, YAML or Jinja2 code is imported here).
_API = ("Cluster", "ClusterExecutor", "Job", "RemoteTraceback", "requeue")

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

    from clusterjob.api import (  # noqa: F401
        Cluster,
        ClusterExecutor,
        Job,
        RemoteTraceback,
        requeue,
    )


def __getattr__(name: str) -> "Any":
    if name in _API:
        from clusterjob import api

        return getattr(api, name)
    raise AttributeError(f"module 'clusterjob' has no attribute {name!r}")


__all__ = ["__version__", *_API]
