"""Real unprivileged Unix users for the tests that play a second user (created, then removed).

Needs root and ``useradd``; tests that use it are skipped otherwise.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class UnixUser:
    name: str
    uid: int
    gid: int
    home: str

    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 60,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as this user (real and effective ids, no supplementary groups)."""
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.home, "USER": self.name}
        return subprocess.run(
            ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *argv],
            env={**base, **(env or {})},
            cwd=cwd or "/",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def popen(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.home, "USER": self.name}
        return subprocess.Popen(
            ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *argv],
            env={**base, **(env or {})},
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _need_root() -> None:
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv to create a second Unix user")


@contextmanager
def unix_user(prefix: str = "cjsec") -> Iterator[UnixUser]:
    """A fresh unprivileged user with a 0755 home under /home; removed (with its files) after."""
    _need_root()
    name = next(n for i in range(1000) if not _exists(n := f"{prefix}{os.getpid() % 100000}x{i}"))
    subprocess.run(
        ["useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name],
        check=True,
        capture_output=True,
    )
    try:
        entry = pwd.getpwnam(name)
        os.chmod(entry.pw_dir, 0o755)
        yield UnixUser(name, entry.pw_uid, entry.pw_gid, entry.pw_dir)
    finally:
        subprocess.run(["userdel", "--force", "--remove", name], capture_output=True, check=False)
