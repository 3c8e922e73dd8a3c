"""Real unprivileged Unix users for the tests that play a second user (created, then removed).

Needs root and ``useradd``; tests that use it are skipped otherwise.

A user runs clusterjob as the tests run it (``sys.executable``, ``PYTHONPATH`` naming the
checkout) when every user can reach this interpreter and checkout. Root's clone lands in root's
home (0700) by default, where no other user can: then ``sys.executable`` in a user's command
line is an interpreter every user can run, and the checkout's paths in its ``PYTHONPATH`` are a
copy of clusterjob, its dependencies and tests/ (``clusterjob.sandbox.runtime``) that every
user can read, made once per test run.
"""

from __future__ import annotations

import atexit
import functools
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterjob.sandbox import runtime

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class UserRuntime:
    """The interpreter a second user runs, and what stands for the checkout's paths."""

    python: str
    paths: dict[str, str]  # a path in the checkout -> where the user finds it

    def argv(self, argv: Sequence[str]) -> list[str]:
        first, *rest = argv
        return [self.python if first == sys.executable else first, *rest]

    def path(self, path: Path) -> Path:
        """Where a second user finds ``path`` of the checkout (itself when reachable)."""
        if not self.paths or not path.is_relative_to(REPO):
            return path
        if path == REPO:
            return Path(self.paths[str(REPO)])
        top, *rest = path.relative_to(REPO).parts
        mapped = self.paths.get(str(REPO / top))
        return Path(mapped, *rest) if mapped else Path(self.paths[str(REPO)], top, *rest)

    def env(self, env: dict[str, str]) -> dict[str, str]:
        if "PYTHONPATH" not in env:
            return env
        entries = [self.paths.get(e, e) for e in env["PYTHONPATH"].split(os.pathsep)]
        if self.python != sys.executable:  # the copied dependencies after the given paths
            entries.append(self.paths["site-packages"])
        return {**env, "PYTHONPATH": os.pathsep.join(entries)}


@functools.cache
def user_runtime() -> UserRuntime:
    if runtime.reachable_here() and runtime.reachable_by_all(REPO / "tests"):
        return UserRuntime(sys.executable, {})
    python = runtime.world_python()
    if python is None:
        pytest.skip("no Python of this version every user can run (and the checkout is not)")
    top = Path(tempfile.mkdtemp(prefix="clusterjob-test-runtime-", dir="/var/tmp"))
    atexit.register(shutil.rmtree, top, ignore_errors=True)
    top.chmod(0o755)
    copied = runtime.copy_runtime(top / "runtime", extra=("pytest", "hypothesis"))
    paths = {str(REPO): str(copied.src), "site-packages": str(copied.site_packages)}
    for name in ("tests", "examples"):  # what the tests run as a second user, beside the package
        shutil.copytree(REPO / name, top / name, ignore=shutil.ignore_patterns("__pycache__"))
        for d in (top / name, *(p for p in (top / name).rglob("*") if p.is_dir())):
            d.chmod(0o755)
        paths[str(REPO / name)] = str(top / name)
    return UserRuntime(str(python), paths)


@dataclass(frozen=True)
class UnixUser:
    name: str
    uid: int
    gid: int
    home: str

    def _as_user(
        self, argv: Sequence[str], env: dict[str, str] | None
    ) -> tuple[list[str], dict[str, str]]:
        """``argv`` under setpriv with this user's ids, and its environment."""
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.home, "USER": self.name}
        reach = user_runtime()
        ids = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
        return [*ids, *reach.argv(argv)], reach.env({**base, **(env or {})})

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
        command, environment = self._as_user(argv, env)
        return subprocess.run(
            command,
            env=environment,
            cwd=cwd or "/",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def popen(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        command, environment = self._as_user(argv, env)
        return subprocess.Popen(
            command,
            env=environment,
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
