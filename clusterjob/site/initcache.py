"""The last step of site discovery: a cluster with no site file is described by ``site init``.

Where neither ``--site``, ``$CLUSTERJOB_SITE``, the default files nor a site declaring the
cluster's ``ClusterName`` exists, ``submit``, ``avail`` and ``status`` use the description
``site init`` writes of the cluster, kept per user and cluster in the private cache
(``$XDG_CACHE_HOME/clusterjob/described/CLUSTER.yaml``, a directory only this user may
write) and written again once it is a day old, so a new partition or node type shows within
a day and Slurm is asked (at most four calls) about once a day, not on every command.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from clusterjob import resources
from clusterjob.errors import SiteNotFound

MAX_AGE_SECONDS = 24 * 3600
_CLUSTER = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def described_site_file(
    cluster: str,
    *,
    describe: Callable[[], str] | None = None,
    now: Callable[[], float] = time.time,
) -> Path:
    """The cached description of ``cluster`` (Slurm's ClusterName), written first when it is
    missing or older than a day. ``describe`` returns the site file's text (default: ``site
    init`` of this machine's Slurm). Raises SiteNotFound where there is no private cache."""
    if not _CLUSTER.match(cluster):
        raise SiteNotFound(f"Slurm ClusterName {cluster!r} cannot name a cached site file")
    directory = resources.private_cache_dir("described")
    if directory is None:
        raise SiteNotFound(
            "no site config found, and no private cache directory to keep this cluster's "
            "description in ($XDG_CACHE_HOME/clusterjob must be yours alone)"
        )
    path = directory / f"{cluster}.yaml"
    try:
        fresh = now() - path.stat().st_mtime < MAX_AGE_SECONDS
    except OSError:
        fresh = False
    if fresh:
        return path
    text = describe() if describe is not None else _init_text()
    fd, tmp = tempfile.mkstemp(prefix=f".{cluster}.", suffix=".tmp", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
    print(
        f"clusterjob: no site config for cluster {cluster}: using the description "
        f"`clusterjob site init` wrote to {path} (its guesses are marked GUESS; "
        "`clusterjob site init --out FILE` keeps one to edit)",
        file=sys.stderr,
    )
    return path


def _init_text() -> str:
    from clusterjob.site.init import init_site

    return init_site().text
