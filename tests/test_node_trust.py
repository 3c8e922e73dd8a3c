"""clusterjob.node.trust in process: the walk from ``/`` (relative paths, ``.``/``..``,
symlinks, loops), what each opener refuses and with which words, and what ``create`` makes.

The Prolog runs the same code as root in its own process (tests/test_hooks.py,
tests/test_security_prolog.py); these tests reach it where a mutation test can see them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir

from clusterjob.errors import UntrustedConfig
from clusterjob.node.trust import (
    MAX_SYMLINKS,
    open_trusted,
    open_trusted_append,
    open_trusted_dir,
)

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="trust means root-owned: run as root")


@pytest.fixture
def root_dir() -> Iterator[Path]:
    """A root-owned 0755 directory whose every parent is root's too."""
    yield from trusted_tmp_dir()


def site_in(directory: Path, name: str = "site.yaml") -> Path:
    path = directory / name
    path.write_text("site: lab\n")
    path.chmod(0o644)
    return path


def read(path: Path) -> tuple[str, str]:
    """(what was read through the descriptor, the walked path)."""
    opened = open_trusted(path)
    try:
        assert stat.S_ISREG(opened.st.st_mode) and opened.path == path
        return os.read(opened.fd, 100).decode(), opened.realpath
    finally:
        os.close(opened.fd)


def refused(path: Path) -> str:
    with pytest.raises(UntrustedConfig) as info:
        open_trusted(path)
    return str(info.value)


# -- open_trusted: the walk -------------------------------------------------------------------


def test_a_trusted_file_is_read_through_its_descriptor(root_dir: Path) -> None:
    site = site_in(root_dir)
    assert read(site) == ("site: lab\n", str(site))


def test_relative_dot_and_dotdot_components(
    root_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = site_in(root_dir)
    (root_dir / "sub").mkdir(mode=0o755)
    assert read(Path(f"{root_dir}/./sub/../site.yaml"))[1] == str(site)
    assert read(Path("/../.." + str(site)))[1] == str(site)  # no higher than /
    monkeypatch.chdir(root_dir / "sub")
    assert read(Path("../site.yaml"))[1] == str(site)
    monkeypatch.chdir(root_dir)
    assert read(Path("site.yaml"))[1] == str(site)


def test_symlinks_relative_and_absolute_are_walked_to_their_target(root_dir: Path) -> None:
    site = site_in(root_dir)
    (root_dir / "etc").mkdir(mode=0o755)
    (root_dir / "etc" / "rel.yaml").symlink_to("../site.yaml")
    (root_dir / "etc" / "abs.yaml").symlink_to(site)
    (root_dir / "dirlink").symlink_to("etc")
    assert read(root_dir / "etc" / "rel.yaml") == ("site: lab\n", str(site))
    assert read(root_dir / "etc" / "abs.yaml") == ("site: lab\n", str(site))
    assert read(root_dir / "dirlink" / "rel.yaml")[1] == str(site)


def test_a_chain_of_symlinks_up_to_the_kernels_limit(root_dir: Path) -> None:
    site = site_in(root_dir)
    previous = "site.yaml"
    for n in range(MAX_SYMLINKS + 1):
        (root_dir / f"link{n}").symlink_to(previous)
        previous = f"link{n}"
    assert read(root_dir / f"link{MAX_SYMLINKS - 1}")[1] == str(site)  # 40 links: followed
    last = root_dir / f"link{MAX_SYMLINKS}"
    assert refused(last) == f"{last}: cannot read: Too many levels of symbolic links"


def test_a_symlink_loop_is_refused(root_dir: Path) -> None:
    loop = root_dir / "loop.yaml"
    loop.symlink_to("loop.yaml")
    assert refused(loop) == f"{loop}: cannot read: Too many levels of symbolic links"


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d: d / "gone.yaml", "cannot read: No such file or directory"),
        (lambda d: d / "gone" / "site.yaml", "cannot read: No such file or directory"),
        (lambda d: site_in(d, "file") / "site.yaml", "cannot read: Not a directory"),
        (lambda d: d, "cannot read: Is a directory"),
    ],
)
def test_what_cannot_be_read(root_dir: Path, make, why: str) -> None:  # type: ignore[no-untyped-def]
    path = make(root_dir)
    assert refused(path) == f"{path}: {why}"


def test_a_fifo_is_refused_without_blocking(root_dir: Path) -> None:
    fifo = root_dir / "site.yaml"
    os.mkfifo(fifo, 0o644)
    assert refused(fifo) == f"refusing {fifo}: {fifo} is not a regular file"


def test_the_file_and_each_directory_are_checked(root_dir: Path) -> None:
    (root_dir / "etc").mkdir(mode=0o755)
    site = site_in(root_dir / "etc")
    os.chown(site, NOBODY, -1)
    assert refused(site) == f"refusing {site}: file {site} is owned by uid {NOBODY}, not root"
    os.chown(site, 0, -1)
    site.chmod(0o620)
    assert refused(site) == f"refusing {site}: file {site} is group/world-writable (mode 0620)"
    site.chmod(0o644)
    (root_dir / "etc").chmod(0o775)
    assert refused(site) == (
        f"refusing {site}: directory {root_dir}/etc is group/world-writable (mode 0775)"
    )
    (root_dir / "etc").chmod(0o755)
    os.chown(root_dir / "etc", NOBODY, -1)
    assert refused(site) == (
        f"refusing {site}: directory {root_dir}/etc is owned by uid {NOBODY}, not root"
    )


def test_a_symlink_target_is_checked_where_it_leads(root_dir: Path) -> None:
    (root_dir / "open").mkdir(mode=0o777)
    (root_dir / "open").chmod(0o777)
    site_in(root_dir / "open")
    link = root_dir / "site.yaml"
    link.symlink_to("open/site.yaml")
    assert refused(link) == (
        f"refusing {link}: directory {root_dir}/open is group/world-writable (mode 0777)"
    )


# -- open_trusted_dir ------------------------------------------------------------------------


def test_open_trusted_dir_gives_the_directory_and_its_walked_path(root_dir: Path) -> None:
    (root_dir / "cache").mkdir(mode=0o755)
    fd, shown = open_trusted_dir(root_dir / "cache" / ".")
    try:
        assert shown == f"{root_dir}/cache"
        assert os.path.samestat(os.fstat(fd), os.stat(root_dir / "cache"))
    finally:
        os.close(fd)


def test_open_trusted_dir_creates_missing_directories_0755_whatever_the_umask(
    root_dir: Path,
) -> None:
    old = os.umask(0o077)
    try:
        fd, shown = open_trusted_dir(root_dir / "a" / "b", create=True)
    finally:
        os.umask(old)
    os.close(fd)
    assert shown == f"{root_dir}/a/b"
    for made in (root_dir / "a", root_dir / "a" / "b"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o755


def test_open_trusted_dir_refusals(root_dir: Path) -> None:
    gone = root_dir / "gone"
    with pytest.raises(UntrustedConfig) as info:
        open_trusted_dir(gone)
    assert str(info.value) == f"{gone}: cannot read: No such file or directory"
    assert not gone.exists()
    in_the_way = site_in(root_dir, "file")
    with pytest.raises(UntrustedConfig) as info:
        open_trusted_dir(in_the_way / "sub", create=True)
    assert str(info.value) == f"{in_the_way / 'sub'}: cannot read: File exists"
    (root_dir / "open").mkdir()
    (root_dir / "open").chmod(0o777)
    with pytest.raises(UntrustedConfig) as info:
        open_trusted_dir(root_dir / "open")
    assert str(info.value) == (
        f"refusing {root_dir / 'open'}: directory {root_dir}/open is group/world-writable "
        "(mode 0777)"
    )


# -- open_trusted_append ---------------------------------------------------------------------


def test_append_creates_the_file_and_its_directories_and_appends(root_dir: Path) -> None:
    log = root_dir / "log" / "deep" / "prolog.jsonl"
    for line in (b"one\n", b"two\n"):
        fd = open_trusted_append(log)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    assert log.read_bytes() == b"one\ntwo\n"
    assert stat.S_IMODE(log.stat().st_mode) == 0o640
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o755
    fd = open_trusted_append(root_dir / "other.log", 0o600)
    os.close(fd)
    assert stat.S_IMODE((root_dir / "other.log").stat().st_mode) == 0o600


def _append_refusal(path: Path) -> OSError:
    with pytest.raises(OSError) as info:
        os.close(open_trusted_append(path))
    return info.value


def test_append_refuses_what_root_alone_does_not_control(root_dir: Path) -> None:
    log = root_dir / "prolog.jsonl"
    log.write_text("")
    log.chmod(0o640)
    os.link(log, root_dir / "hard")
    err = _append_refusal(log)
    assert (err.errno, err.strerror) == (errno.EPERM, "refusing it: has 2 hard links")
    (root_dir / "hard").unlink()
    os.chown(log, NOBODY, -1)
    err = _append_refusal(log)
    assert err.strerror == f"refusing it: owned by uid {NOBODY}, mode 0640"
    os.chown(log, 0, -1)
    log.chmod(0o602)
    assert _append_refusal(log).strerror == "refusing it: owned by uid 0, mode 0602"
    log.chmod(0o620)
    assert _append_refusal(log).strerror == "refusing it: owned by uid 0, mode 0620"


def test_append_refuses_an_untrusted_directory_and_odd_files(root_dir: Path) -> None:
    (root_dir / "open").mkdir()
    (root_dir / "open").chmod(0o777)
    err = _append_refusal(root_dir / "open" / "prolog.jsonl")
    assert err.errno == errno.EPERM
    assert err.strerror == f"directory {root_dir}/open is group/world-writable (mode 0777)"
    assert not (root_dir / "open" / "prolog.jsonl").exists()
    fifo = root_dir / "fifo"
    os.mkfifo(fifo, 0o600)
    assert _append_refusal(fifo).errno == errno.ENXIO  # no reader: refused, never blocks
    os.mkdir(root_dir / "dir", 0o755)
    assert _append_refusal(root_dir / "dir").errno == errno.EISDIR


# -- what mutation testing showed untested ---------------------------------------------------


def test_a_path_that_ends_in_a_directory_is_not_a_file(root_dir: Path) -> None:
    (root_dir / "sub").mkdir(mode=0o755)
    for path in (Path("/"), root_dir / "sub" / ".."):
        assert refused(path) == f"{path}: cannot read: Is a directory"
    err = _append_refusal(root_dir / "sub" / "..")
    assert (err.errno, err.strerror) == (errno.EISDIR, "Is a directory")


def test_dotdot_just_below_the_root_goes_back_to_the_root(root_dir: Path) -> None:
    site = site_in(root_dir)
    first = root_dir.parts[1]  # e.g. run: /run/../run/<dir>/site.yaml
    assert read(Path(f"/{first}/../{str(site).lstrip('/')}"))[1] == str(site)


def test_walked_paths_keep_names_ending_in_x_or_a_space(
    root_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walked path is built by joining names: only a trailing slash may be trimmed."""
    x_dir = root_dir / "dX"
    space_dir = x_dir / "e "
    space_dir.mkdir(mode=0o755, parents=True)
    x_dir.chmod(0o755)
    in_x, in_space = site_in(x_dir), site_in(space_dir)
    assert read(in_x)[1] == str(in_x)
    assert read(in_space)[1] == str(in_space)
    monkeypatch.chdir(x_dir)
    assert read(Path("site.yaml"))[1] == str(in_x)
    monkeypatch.chdir(space_dir)
    assert read(Path("site.yaml"))[1] == str(in_space)
    fd, shown = open_trusted_dir(space_dir)
    os.close(fd)
    assert shown == str(space_dir)


def test_a_symlink_through_dot_names_the_file(root_dir: Path) -> None:
    site = site_in(root_dir)
    (root_dir / "dot.yaml").symlink_to("./site.yaml")
    assert read(root_dir / "dot.yaml")[1] == str(site)


def test_the_descriptor_handed_out_blocks(root_dir: Path) -> None:
    """Opened without blocking (a FIFO must not hang the open), then read normally."""
    opened = open_trusted(site_in(root_dir))
    try:
        assert os.get_blocking(opened.fd)
    finally:
        os.close(opened.fd)


def test_append_refuses_a_device(root_dir: Path) -> None:
    err = _append_refusal(Path("/dev/null"))
    assert (err.errno, err.strerror) == (errno.EPERM, "refusing it: not a regular file")
