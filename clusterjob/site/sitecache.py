"""A loaded site kept in the user's private cache, read back instead of parsed again.

Parsing and validating a site is ruamel and hostlist to import, then the whole YAML to
compose and check: ~30 ms for a small site, seconds for 10,000 nodes written one entry per
node. The commands a user runs (``submit``, ``avail``, ...) load the same file again and
again, so the loaded ``Site`` is pickled to ``$XDG_CACHE_HOME/clusterjob/sites`` (a directory
only this user may write, see ``resources.private_cache_dir``) and read back while the file
and the code that built it are unchanged: the key is the file as named, its realpath, the
SHA-256 of its content, clusterjob's version, and the size and mtime of every module under
``clusterjob/site`` and ``clusterjob/gpu``. Only a site that loaded is kept
(an error is reported by the loader every time), and a site whose template directory is
gone is loaded again (the loader refuses it). The root Prolog does not use it: it reads its
trusted file through ``nodeview``, with its own per-node cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import tempfile
import zlib
from pathlib import Path
from typing import Any

from clusterjob import __version__, resources
from clusterjob.site.model import Site

__all__ = ["load_site"]

_READ_LIMIT = 64 * 1024 * 1024  # the loader refuses a site file a quarter this size
_CODE = Path(__file__).resolve().parents[1]
_CODE_DIRS = (_CODE / "site", _CODE / "site" / "gpu_syntax", _CODE / "gpu")


def load_site(path: Path) -> Site:
    """``clusterjob.site.loader.load_site(path)``, answered from the cache when it can be."""
    directory = resources.private_cache_dir("sites")
    key = _key(Path(path)) if directory is not None else None
    entry = None
    if directory is not None and key is not None:
        # one entry per site file (as named): an edit replaces it, never adds another
        entry = directory / f"{zlib.crc32(repr(key[1:3]).encode()):08x}.pickle"
        cached = _read(entry, key)
        if cached is not None:
            return cached
    from clusterjob.site.loader import load_site as load_file

    site = load_file(Path(path))
    if entry is not None:
        _write(entry, (key, site))
    return site


def _key(path: Path) -> tuple[Any, ...] | None:
    try:
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read(_READ_LIMIT)).hexdigest()
        code = tuple(
            (e.name, e.stat().st_size, e.stat().st_mtime_ns)
            for d in _CODE_DIRS
            for e in sorted(os.scandir(d), key=lambda e: e.name)
            if e.name.endswith(".py")
        )
        real = os.path.realpath(path)
    except OSError:
        return None
    return (__version__, str(path), real, digest, code)


def _read(entry: Path, key: tuple[Any, ...]) -> Site | None:
    try:
        with open(entry, "rb") as fh:
            stored = pickle.load(fh)
    except FileNotFoundError:
        return None
    except Exception:  # damaged, or written by other code: load the file again
        return None
    if not (isinstance(stored, tuple) and len(stored) == 2 and stored[0] == key):
        return None
    site = stored[1]
    if not isinstance(site, Site):
        return None
    if site.templates_dir is not None and not site.templates_dir.is_dir():
        return None  # the loader refuses such a site: let it say so
    return site


def _write(entry: Path, value: tuple[Any, ...]) -> None:
    """Atomically (a reader never sees half an entry); a full disk costs a parse next time."""
    with contextlib.suppress(OSError, pickle.PicklingError):
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".site-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, entry)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
