"""What one user submits is not readable by another: the registry and the saved scripts.

Two real unprivileged users (created for the test, then removed): one submits under the
common umask 022 with a home directory others may enter; the other tries to read.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from unix_users import UnixUser, unix_user

REPO = Path(__file__).resolve().parents[1]
SECRET = "--api-key=SECRET123"


@pytest.fixture(scope="module")
def owner() -> Iterator[UnixUser]:
    with unix_user("cjown") as u:
        yield u


@pytest.fixture(scope="module")
def other() -> Iterator[UnixUser]:
    with unix_user("cjoth") as u:
        yield u


def as_user(user: UnixUser, code: str) -> str:
    """Run ``code`` as ``user`` with umask 022 and the tests on sys.path; its stdout."""
    done = user.run(
        [sys.executable, "-c", "import os; os.umask(0o022)\n" + textwrap.dedent(code)],
        env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


ADD = f"""
from test_registry import record
from clusterjob.jobs.registry import Registry
Registry().add(record("7", "tok7", command_line="clusterjob submit {SECRET} train.py",
                      script="#!/bin/bash\\npython train.py {SECRET}\\n"))
"""


def data_dir(user: UnixUser) -> Path:
    return Path(user.home) / ".local" / "share" / "clusterjob"


def test_registry_is_created_owner_only(owner: UnixUser, other: UnixUser) -> None:
    as_user(owner, ADD)
    db = data_dir(owner) / "jobs.sqlite"
    assert stat.S_IMODE(data_dir(owner).stat().st_mode) == 0o700
    for path in data_dir(owner).iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    peek = other.run(["cat", str(db)])
    assert peek.returncode != 0 and SECRET not in peek.stdout
    assert "Permission denied" in peek.stderr


def test_an_existing_readable_registry_is_narrowed_when_opened(
    owner: UnixUser, other: UnixUser
) -> None:
    legacy = Path(owner.home) / "legacy"
    as_user(
        owner,
        f"""
        import os, sqlite3
        os.makedirs({str(legacy)!r}, mode=0o755)
        sqlite3.connect({str(legacy / "jobs.sqlite")!r}).close()
        os.chmod({str(legacy / "jobs.sqlite")!r}, 0o644)
        """,
    )
    assert stat.S_IMODE((legacy / "jobs.sqlite").stat().st_mode) == 0o644
    as_user(owner, f"import os; os.environ['CLUSTERJOB_DATA_DIR'] = {str(legacy)!r}\n" + ADD)
    assert stat.S_IMODE(legacy.stat().st_mode) == 0o700
    assert stat.S_IMODE((legacy / "jobs.sqlite").stat().st_mode) == 0o600
    assert other.run(["cat", str(legacy / "jobs.sqlite")]).returncode != 0


def test_saved_script_is_never_readable_by_others(owner: UnixUser) -> None:
    """Every moment the script's bytes exist on disk, only its owner can read them: the modes
    are sampled at each chmod/rename the writer does (the old code wrote, then chmod'ed)."""
    out = as_user(
        owner,
        """
        import json, os
        from pathlib import Path
        from clusterjob.jobs import submit
        seen = []
        def sample():
            d = submit.scripts_dir()
            for p in (d.iterdir() if d.is_dir() else []):
                st = p.stat()
                seen.append([p.name, st.st_mode & 0o777, st.st_size])
            if d.is_dir():
                seen.append(["<dir>", d.stat().st_mode & 0o777, 0])
        for name in ("chmod", "fchmod", "replace", "rename"):
            real = getattr(os, name)
            def spy(*a, _real=real, **k):
                sample()
                return _real(*a, **k)
            setattr(os, name, spy)
        path = submit._write_script("#!/bin/bash\\npython train.py --api-key=SECRET123\\n", "t1")
        sample()
        print(json.dumps(seen))
        """,
    )
    seen = json.loads(out)
    assert seen, "the writer was not observed"
    readable = [s for s in seen if s[1] & 0o077 and (s[2] > 0 or s[0] == "<dir>")]
    assert readable == []
    os.stat(data_dir(owner) / "scripts" / "clusterjob-t1.sh")
