"""What every hook may assume about where it runs: this node's name, the default paths and
policy, and that what it prints is read line by line (slurmd's log, TaskProlog directives)."""

from __future__ import annotations

from collections.abc import Mapping

from clusterjob.site.nodemodel import PrologPolicy

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from pathlib import Path

    from clusterjob.site.nodeview import NodeView

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DEFAULT_POLICY",
    "DEFAULT_SITE",
    "job_node_view",
    "node_name",
    "one_line",
]

DEFAULT_SITE = "/etc/clusterjob/site.yaml"
DEFAULT_CACHE_DIR = "/var/cache/clusterjob"
DEFAULT_POLICY = PrologPolicy()  # until the site config says otherwise (or when it cannot)


def job_node_view(site: Path, node: str) -> NodeView:
    """This node's view of ``site`` as a job's own processes read it (the in-job preflight,
    the TaskProlog, Grid Engine's GPU binding): the entry the Prolog cached for this node
    before the job (``DEFAULT_CACHE_DIR``, only read), else the compiled node map, else the
    YAML (``load_node_view``). Flat with the site's size where the Prolog runs or the site
    is compiled: a 10,000-node site written one entry per node is ~5 s of YAML a job."""
    from clusterjob.site.nodeview import load_node_view

    return load_node_view(site, node, hooks_cache_dir=DEFAULT_CACHE_DIR)


def node_name(environ: Mapping[str, str]) -> str:
    """This node's Slurm name: ``SLURMD_NODENAME`` (set by slurmd), else the short hostname."""
    named = environ.get("SLURMD_NODENAME")
    if named:
        return named
    import socket  # only by hand: slurmd always names the node (socket: ~3 ms per job)

    return socket.gethostname().split(".")[0]


def one_line(exc: BaseException) -> str:
    """An error's first line, saying how many more there were."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first + (f" (+{len(text) - 1} more line(s))" if len(text) > 1 else "")
