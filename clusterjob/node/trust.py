"""Whether the root Prolog may believe a file: only if root could have been its only writer.

The Prolog's config comes only from the command line (the admin's wrapper in slurm.conf) or
the root-owned default, never from the environment, and is checked here first (like sshd's
StrictModes).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from clusterjob.errors import UntrustedConfig

__all__ = ["UntrustedConfig", "check_trusted"]


def check_trusted(path: Path) -> None:
    """Refuse ``path`` unless root could have been the only one to write it.

    The file (symlinks followed) and its directory must be root-owned and not group/world-
    writable. Directories further up must be root-owned and either not writable by others
    or sticky (as /tmp): there nobody else can rename a root-owned entry away.
    """
    path = Path(path)
    try:
        target = path.resolve(strict=True)
    except OSError as exc:
        raise UntrustedConfig(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except RuntimeError as exc:  # a symlink loop
        raise UntrustedConfig(f"{path}: cannot read: {exc}") from exc
    for depth, p in enumerate((target, *target.parents)):
        st = os.stat(p)
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
        if st.st_uid != 0:
            raise UntrustedConfig(
                f"refusing {path}: {kind} {p} is owned by uid {st.st_uid}, not root"
            )
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and (depth < 2 or not st.st_mode & stat.S_ISVTX):
            raise UntrustedConfig(
                f"refusing {path}: {kind} {p} is group/world-writable "
                f"(mode {stat.S_IMODE(st.st_mode):04o})"
            )
