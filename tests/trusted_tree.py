"""A temporary directory the root Prolog may trust: root-owned up to ``/``, no sticky /tmp.

The Prolog refuses any path through a directory others can write (``/tmp`` included, as sshd's
StrictModes does), so its tests build their file trees under a root-owned, 0755 directory.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

_BASES = ("/run", "/var/lib", "/var/cache", "/root")


def _trusted(path: Path) -> bool:
    for p in (path, *path.parents):
        try:
            st = os.stat(p)
        except OSError:
            return False
        if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def trusted_tmp_dir() -> Iterator[Path]:
    """Yield a fresh root-owned 0755 directory in a trusted tree (removed afterwards)."""
    base = next((Path(b) for b in _BASES if _trusted(Path(b))), None)
    if os.geteuid() != 0 or base is None:
        path = Path(tempfile.mkdtemp(prefix="clusterjob-test-"))
    else:
        path = Path(tempfile.mkdtemp(prefix="clusterjob-test-", dir=base))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
