"""Which site config applies here: the documented search order, and nothing clever.

1. ``--site PATH|NAME``  2. ``$CLUSTERJOB_SITE`` (PATH|NAME)  3. ``~/.config/clusterjob/site.yaml``
4. ``/etc/clusterjob/site.yaml``  5. the known site file whose ``cluster_name`` is this
cluster's Slurm ClusterName  6. (for the commands that pass ``describe``) the cluster as
``clusterjob site init`` describes it, cached per user and cluster. A NAME is looked up as
``NAME.yaml`` in the user's sites directory, ``/etc/clusterjob/sites/``, then the example
sites shipped with clusterjob, and nowhere else (never the current directory). A spec that
names nothing is an error, not a reason to fall through to the next source: a typo must not
silently select another cluster's config.

A site file's ``job.setup`` lines go into every job script, so a PATH is read only where no
one but the user and root could have written it: the file and its directory owned by the
user or root and not group- or world-writable.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from clusterjob import envvars
from clusterjob.errors import ClusterjobError, SiteNotFound, UntrustedConfig
from clusterjob.resources import site_configs_dir

ETC_DIR = Path("/etc/clusterjob")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# A cheap look at the cluster_name line, so that finding a site does not validate every file.
_CLUSTER_NAME_LINE = re.compile(
    r"""^cluster_name:[ \t]*(?:"([^"\n]*)"|'([^'\n]*)'|([^\s#'"][^\s#]*))""", re.MULTILINE
)
_SCAN_BYTES = 1 << 16  # cluster_name sits near the top of a site file


def user_config_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/clusterjob``, else ``~/.config/clusterjob``."""
    xdg = environ.get("XDG_CONFIG_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "clusterjob"
    home = environ.get("HOME")
    return (Path(home) if home else Path.home()) / ".config" / "clusterjob"


def site_dirs(environ: Mapping[str, str], etc_dir: Path = ETC_DIR) -> list[Path]:
    """Directories searched for ``NAME.yaml``, in order."""
    return [user_config_dir(environ) / "sites", etc_dir / "sites", site_configs_dir()]


def _is_path(spec: str) -> bool:
    return "/" in spec or spec.endswith((".yaml", ".yml")) or not _NAME.match(spec)


def _resolve_spec(spec: str, origin: str, environ: Mapping[str, str], etc_dir: Path) -> Path:
    """A PATH or a NAME given by ``origin`` (``--site`` or ``$CLUSTERJOB_SITE``)."""
    if _is_path(spec):
        path = Path(spec).expanduser()
        shown = spec if spec.isprintable() else repr(spec)  # the message stays one line
        if path.is_file():
            check_own_file(path, f"{origin} {shown}")
            return path
        raise SiteNotFound(f"{origin} {shown}: no such site config file")
    tried = [d / f"{spec}.yaml" for d in site_dirs(environ, etc_dir)]
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise SiteNotFound(
        f"{origin} {spec}: no site named {spec!r} (tried {', '.join(map(str, tried))}; "
        f"known sites: {', '.join(known_site_names(environ, etc_dir)) or 'none'})"
    )


def check_own_file(path: Path, shown: str) -> None:
    """Refuse ``path`` unless only this user or root could have written it: the file (its
    symlinks followed) and the directories that hold it, owned by one of them and not
    group- or world-writable (a shared or sticky directory such as /tmp is refused)."""
    mine = (os.geteuid(), 0)
    real = path.resolve()
    given = path.absolute().parent
    for what, where in (("directory", given), ("directory", real.parent), ("file", real)):
        try:
            st = where.stat()
        except OSError as exc:
            raise UntrustedConfig(f"{shown}: cannot read {where}: {exc.strerror or exc}") from None
        if st.st_uid not in mine:
            raise UntrustedConfig(
                f"{shown}: refusing {what} {where}: owned by uid {st.st_uid}, not by you or root"
            )
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UntrustedConfig(
                f"{shown}: refusing {what} {where}: group/world-writable "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); others could have written it"
            )


def known_site_files(environ: Mapping[str, str], etc_dir: Path = ETC_DIR) -> list[Path]:
    """Every ``*.yaml`` in the site directories, in search order (first name wins)."""
    found: list[Path] = []
    seen: set[str] = set()
    for directory in site_dirs(environ, etc_dir):
        try:
            files = sorted(directory.glob("*.yaml"))
        except OSError:
            continue
        for path in files:
            if path.stem not in seen and path.is_file():
                seen.add(path.stem)
                found.append(path)
    return found


def known_site_names(environ: Mapping[str, str], etc_dir: Path = ETC_DIR) -> list[str]:
    return [p.stem for p in known_site_files(environ, etc_dir)]


def declared_cluster_name(path: Path) -> str | None:
    """The ``cluster_name:`` a site file declares, read with a regex (no YAML parse)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(_SCAN_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    m = _CLUSTER_NAME_LINE.search(head)
    if not m:
        return None
    return next(g for g in m.groups() if g is not None).strip() or None


def find_site(
    spec: str | None,
    *,
    environ: Mapping[str, str],
    cluster_name: Callable[[], str | None] | str | None = None,
    etc_dir: Path = ETC_DIR,
    describe: Callable[[str], Path] | None = None,
) -> Path:
    """The site config file to use here; raises SiteNotFound saying everything it tried.

    ``cluster_name`` returns Slurm's ClusterName (asked only when nothing else matched);
    a plain string is accepted too, for callers that already know it. ``describe``, the last
    step: the file describing a cluster no site file declares (``site.initcache``).
    """
    if spec:
        return _resolve_spec(spec, "--site", environ, etc_dir)
    env_spec = environ.get(envvars.SITE)
    if env_spec:
        return _resolve_spec(env_spec, envvars.SITE, environ, etc_dir)
    tried = ["--site (not given)", "CLUSTERJOB_SITE (not set)"]
    for default in (user_config_dir(environ) / "site.yaml", etc_dir / "site.yaml"):
        if default.is_file():
            return default
        tried.append(str(default))
    name: str | None
    if callable(cluster_name):
        try:
            name = cluster_name()
        except ClusterjobError as exc:
            name = None
            tried.append(f"Slurm ClusterName (could not be read: {exc})")
    else:
        name = cluster_name
    if name:
        for path in known_site_files(environ, etc_dir):
            if declared_cluster_name(path) == name:
                return path
        dirs = ", ".join(str(d) for d in site_dirs(environ, etc_dir))
        tried.append(f"a site with cluster_name {name} in {dirs}")
        if describe is not None:
            try:
                return describe(name)
            except ClusterjobError as exc:
                tried.append(f"`clusterjob site init` of {name} ({exc})")
    elif not any(t.startswith("Slurm ClusterName") for t in tried):
        tried.append("Slurm ClusterName (unknown)")
    raise SiteNotFound(
        "no site config found; tried " + "; ".join(tried) + ". Pass --site PATH|NAME or set "
        "CLUSTERJOB_SITE"
    )
