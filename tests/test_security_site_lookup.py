"""A site file's ``job.setup`` lines go into every job script: ``--site`` (and
``$CLUSTERJOB_SITE``) never reads one another user could have planted.

Two real Unix users: one plants a site file, the other runs clusterjob where it lies. A bare
NAME is looked up only in the site directories (never ``./NAME``); a PATH is read only when
the file and its directory are the user's or root's and not group- or world-writable.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from unix_users import UnixUser, unix_user, user_runtime

REPO = Path(__file__).resolve().parents[1]
PLANTED = (REPO / "site_configs" / "mllab.yaml").read_text().replace(
    "site: mllab", "site: planted"
) + 'job:\n  setup: ["echo PLANTED-BY-ANOTHER-USER"]\n'


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[UnixUser, UnixUser]]:
    """(the user who runs clusterjob, another user who plants files)."""
    with unix_user("cjsite") as me, unix_user("cjplant") as other:
        yield me, other


def clusterjob(user: UnixUser, *args: str, cwd: Path, env: dict[str, str] | None = None):
    script = user_runtime().path(REPO / "examples" / "train.py")
    return user.run(
        [
            sys.executable,
            "-m",
            "clusterjob",
            *args,
            *(("--", str(script)) if args[0] == "submit" else ()),
        ],
        env={"PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": f"{user.home}/.config", **(env or {})},
        cwd=str(cwd),
    )


def plant(owner: UnixUser, directory: Path, name: str, *, mode: int = 0o644) -> Path:
    """The planted site at ``directory/name``, owned by ``owner`` (root writes, hands it over)."""
    path = directory / name
    path.write_text(PLANTED)
    os.chown(path, owner.uid, owner.gid)
    path.chmod(mode)
    return path


def their_dir(user: UnixUser, name: str, mode: int = 0o755) -> Path:
    path = Path(user.home) / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    os.chown(path, user.uid, user.gid)
    path.chmod(mode)
    return path


def sticky_dir(path: Path) -> Path:
    """Like /tmp: root's, mode 1777 (anyone may add a file, only its owner remove it)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    path.chmod(0o1777)
    return path


SUBMIT = ("submit", "--gpus", "1", "--model", "A100", "--dry-run")


@pytest.mark.parametrize("origin", ["--site", "CLUSTERJOB_SITE"])
def test_a_bare_name_is_never_read_from_the_current_directory(
    users: tuple[UnixUser, UnixUser], origin: str
) -> None:
    me, other = users
    shared = their_dir(other, "shared")
    plant(other, shared, "lab")
    args, env = (
        ((*SUBMIT, "--site", "lab"), None) if origin == "--site" else (SUBMIT, {origin: "lab"})
    )
    done = clusterjob(me, *args, cwd=shared, env=env)
    assert "PLANTED-BY-ANOTHER-USER" not in done.stdout, done.stdout
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"clusterjob: error: {origin} lab: no site named 'lab' (tried ")
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    ("where", "spec", "refused"),
    [
        ("other-dir", "./lab.yaml", "refusing directory {dir}: owned by uid {other}"),
        ("other-dir", "lab.yaml", "refusing directory {dir}: owned by uid {other}"),
        ("sticky-dir", "{dir}/lab.yaml", "refusing directory {dir}: group/world-writable"),
        ("world-writable-dir", "{dir}/mine.yaml", "refusing directory {dir}: group/world-writable"),
        (
            "my-dir-their-file",
            "{dir}/lab.yaml",
            "refusing file {dir}/lab.yaml: owned by uid {other}",
        ),
        ("my-dir-writable-file", "{dir}/mine.yaml", "refusing file {dir}/mine.yaml: group/world"),
        ("my-dir-symlink", "{dir}/link.yaml", "refusing directory {other_dir}: owned by uid"),
    ],
)
def test_a_site_path_others_could_have_written_is_refused(
    users: tuple[UnixUser, UnixUser], where: str, spec: str, refused: str
) -> None:
    me, other = users
    other_dir = their_dir(other, "shared")
    plant(other, other_dir, "lab.yaml")
    directory = {
        "other-dir": other_dir,
        "sticky-dir": sticky_dir(Path(me.home) / "tmp"),
        "world-writable-dir": their_dir(me, "open", 0o777),
    }.get(where) or their_dir(me, "mine")
    if where == "sticky-dir":
        plant(other, directory, "lab.yaml")
    if where == "my-dir-their-file":
        plant(other, directory, "lab.yaml")
    if where in ("world-writable-dir", "my-dir-writable-file"):
        plant(me, directory, "mine.yaml", mode=0o666 if "file" in where else 0o644)
    if where == "my-dir-symlink":
        (directory / "link.yaml").symlink_to(other_dir / "lab.yaml")
    site = spec.format(dir=directory)
    for args, env in (((*SUBMIT, "--site", site), None), (SUBMIT, {"CLUSTERJOB_SITE": site})):
        done = clusterjob(me, *args, cwd=directory, env=env)
        assert "PLANTED-BY-ANOTHER-USER" not in done.stdout, done.stdout
        assert done.returncode != 0, done.stdout
        [line] = done.stderr.splitlines()
        expected = refused.format(dir=directory, other=other.uid, other_dir=other_dir)
        assert line.startswith("clusterjob: error: "), line
        assert expected in line, line


@pytest.mark.parametrize("spec", ["{dir}/mine.yaml", "mine.yaml", "{repo}/site_configs/mllab.yaml"])
def test_the_users_own_and_roots_site_files_are_read(
    users: tuple[UnixUser, UnixUser], spec: str
) -> None:
    me, _ = users
    mine = their_dir(me, "mine")
    plant(me, mine, "mine.yaml")
    repo = user_runtime().path(REPO)  # the checkout as this user reaches it
    done = clusterjob(me, *SUBMIT, "--site", spec.format(dir=mine, repo=repo), cwd=mine)
    assert done.returncode == 0, done.stderr
    assert ("PLANTED-BY-ANOTHER-USER" in done.stdout) == ("mine.yaml" in spec)
