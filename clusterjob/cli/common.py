"""What many commands share: the one way every command finds and loads its site config, and
the cluster a job command works on. Without Typer: the fast path (``fastpath``) runs on it;
the options many commands declare the same way are in ``options``.

A site is found through the documented order (``clusterjob.site.discovery``); its last step
asks Slurm for ``ClusterName``, through the one Slurm module, only when nothing else named a
site. Workstation mode (no Slurm) uses a site only when one is named.
"""

from __future__ import annotations

import os
from pathlib import Path

from clusterjob import envvars

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # imported where used: `clusterjob --help` loads neither YAML nor Slurm code
    from clusterjob.api.cluster import Cluster
    from clusterjob.site.model import Site

# The app's --host, --remote-dir and --no-sync, as given (None: not given).
REMOTE: dict[str, object] = {"host": None, "remote_dir": None, "sync": None}


def set_remote(host: str | None, remote_dir: str | None, *, no_sync: bool) -> None:
    """The app's --host, --remote-dir and --no-sync of this run (the fast path: none given)."""
    REMOTE.update(host=host, remote_dir=remote_dir, sync=False if no_sync else None)


def the_cluster(site: str | None = None) -> Cluster:
    """The cluster a job command works on: this machine's, or --host's (``$CLUSTERJOB_HOST``)
    over ssh; the CLI's commands are calls on it (``clusterjob.api``)."""
    from clusterjob.api.cluster import Cluster

    host, remote_dir, sync = REMOTE["host"], REMOTE["remote_dir"], REMOTE["sync"]
    return Cluster(
        site,
        host=host if isinstance(host, str) else None,
        remote_dir=remote_dir if isinstance(remote_dir, str) else None,
        sync=sync if isinstance(sync, bool) else None,
    )


def slurm_cluster_name(budget: float | None = None) -> str:
    """This cluster's Slurm ``ClusterName``; discovery asks for it only as its last step.
    ``budget``: seconds Slurm may take in all (shell completion cannot wait long)."""
    from clusterjob.slurm.commands import SlurmClient
    from clusterjob.slurm.runner import Runner

    return SlurmClient(Runner(budget=budget)).cluster_name()


def find_site_file(
    spec: str | None, *, slurm_budget: float | None = None, describe: bool = False
) -> Path:
    """The site config file for ``--site`` (a name or a file), else the one discovery finds;
    with ``describe``, at last the cluster as ``site init`` describes it (cached)."""
    from clusterjob.site.discovery import find_site

    def described(name: str) -> Path:
        from clusterjob.site.initcache import described_site_file

        return described_site_file(name)

    return find_site(
        spec,
        environ=os.environ,
        cluster_name=lambda: slurm_cluster_name(slurm_budget),
        describe=described if describe else None,
    )


def load_site(
    spec: str | None, *, slurm_budget: float | None = None, describe: bool = False
) -> Site:
    """The site of a command that works with Slurm: ``--site`` or the discovery order (with
    ``describe``: a job command's, which falls back on ``site init``'s description)."""
    from clusterjob.site.sitecache import load_site as load_file

    return load_file(find_site_file(spec, slurm_budget=slurm_budget, describe=describe))


def load_named_site(spec: str | None) -> Site | None:
    """The site of a command that needs none (workstation mode): only when ``--site`` or
    ``$CLUSTERJOB_SITE`` names one; no Slurm is asked and no default file is read."""
    if not (spec or os.environ.get(envvars.SITE)):
        return None
    from clusterjob.site.discovery import find_site
    from clusterjob.site.sitecache import load_site as load_file

    return load_file(find_site(spec, environ=os.environ, cluster_name=None))
