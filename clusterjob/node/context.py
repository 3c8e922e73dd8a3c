"""What every hook may assume about where it runs: this node's name, the default paths and
policy, and that what it prints is read line by line (slurmd's log, TaskProlog directives)."""

from __future__ import annotations

from collections.abc import Mapping

from clusterjob.site.nodemodel import PrologPolicy

__all__ = ["DEFAULT_CACHE_DIR", "DEFAULT_POLICY", "DEFAULT_SITE", "node_name", "one_line"]

DEFAULT_SITE = "/etc/clusterjob/site.yaml"
DEFAULT_CACHE_DIR = "/var/cache/clusterjob"
DEFAULT_POLICY = PrologPolicy()  # until the site config says otherwise (or when it cannot)


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
