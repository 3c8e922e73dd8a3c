"""Where the shipped templates and example site configs live, and the user's private cache.

In a wheel they are inside the package (``clusterjob/_data/``, see pyproject.toml);
in a source checkout or an editable install they are the top-level folders.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    installed = _PACKAGE / "_data" / name
    if installed.is_dir():
        return installed
    return _PACKAGE.parent / name


def templates_dir() -> Path:
    return _data_dir("templates")


def site_configs_dir() -> Path:
    return _data_dir("site_configs")


def private_cache_dir(name: str) -> Path | None:
    """``$XDG_CACHE_HOME/clusterjob/NAME`` (default ``~/.cache``), made if missing; None
    unless it is this user's own and no one else may write to it: what the caches there hold
    (compiled templates, loaded sites) is read back as code or pickled objects."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(base, "clusterjob", name)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return Path(directory)
