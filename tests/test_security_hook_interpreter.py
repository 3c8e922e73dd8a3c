"""The root hooks run only an interpreter whose whole import path is root's alone.

slurmd runs the Prolog wrapper as root before every job, and the wrapper runs an interpreter
and its clusterjob: anything another user can write on that import path runs as root. The
review installed the hooks from a venv a user owned, edited ``clusterjob/__main__.py`` there,
and the Prolog ran ``id`` as uid 0, while ``install-hooks --check`` said "hooks ok". Here a
real second Unix user owns (or may write) one piece of the path at a time: the venv, the
package, a ``.pth`` file or the checkout it names, the directory of a symlinked interpreter
or its target, the source tree the wrappers put first. Each must be refused by install-hooks
with the path at fault, reported by ``--check`` without running it, and never run as root
while being checked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir
from unix_users import UnixUser, unix_user

from clusterjob.__main__ import main
from clusterjob.errors import UntrustedConfig
from clusterjob.node.wrappers import HookWrappers, check_wrappers, install_wrappers

REPO = Path(__file__).resolve().parent.parent
BASE_PYTHON = Path(getattr(sys, "_base_executable", sys.executable))

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root-owned files need root")

# Written as root only if the code someone planted ever runs as root.
PAYLOAD = "import os; open({marker!r}, 'w').write(str(os.getuid()))\n"


@pytest.fixture
def root_tree() -> Iterator[Path]:
    yield from trusted_tmp_dir()


@pytest.fixture
def user() -> Iterator[UnixUser]:
    with unix_user("cjpy") as someone:
        yield someone


@pytest.fixture
def site(root_tree: Path) -> Path:
    etc = root_tree / "etc"
    etc.mkdir(mode=0o755)
    site = etc / "site.yaml"
    shutil.copy(REPO / "site_configs" / "mllab.yaml", site)
    site.chmod(0o644)
    return site


def copy_package(into: Path) -> Path:
    """This clusterjob's package, as pip would lay it out (0755 directories, 0644 files)."""
    package = into / "clusterjob"
    shutil.copytree(REPO / "clusterjob", package, ignore=shutil.ignore_patterns("__pycache__"))
    for top, _dirs, files in os.walk(package):
        os.chmod(top, 0o755)
        for name in files:
            os.chmod(os.path.join(top, name), 0o644)
    return package


def make_venv(where: Path, *, package: bool = True, deps: bool = False) -> tuple[Path, Path]:
    """A venv of this Python (made by root), with clusterjob in it: (its python, site-packages).
    With ``deps``, a .pth names this environment's packages, so all of clusterjob runs there."""
    subprocess.run(
        [str(BASE_PYTHON), "-I", "-m", "venv", "--without-pip", str(where)],
        cwd="/",
        check=True,
        capture_output=True,
        timeout=120,
    )
    (site_packages,) = where.glob("lib/python*/site-packages")
    if package:
        copy_package(site_packages)
    if deps:
        here = sysconfig.get_paths()
        lines = dict.fromkeys([here["purelib"], here["platlib"]])
        (site_packages / "deps.pth").write_text("".join(f"{line}\n" for line in lines))
    return where / "bin" / "python", site_packages


def give_to(user: UnixUser, path: Path) -> None:
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(path)], check=True)


def users_dir(root_tree: Path, user: UnixUser, name: str) -> Path:
    """A directory the user owns inside root's tree: it, not a parent, is the fault."""
    path = root_tree / name
    path.mkdir(mode=0o755)
    give_to(user, path)
    return path


def args(site: Path, prefix: Path, *more: str) -> list[str]:
    cache = site.parent.parent / "cache"
    return ["site", "install-hooks", "--site", str(site), "--prefix", str(prefix),
            "--cache-dir", str(cache), *more]  # fmt: skip


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], prefix: Path) -> str:
    """Run install-hooks; it must fail with one line and write nothing."""
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 1, err
    assert len(err.splitlines()) == 1, err
    assert not prefix.exists()
    return err


@pytest.fixture
def root_venv(root_tree: Path) -> tuple[Path, Path]:
    return make_venv(root_tree / "venv")


def test_a_root_owned_venv_is_accepted_and_named_by_the_wrappers(
    site: Path, root_tree: Path, root_venv: tuple[Path, Path]
) -> None:
    python, _ = root_venv
    wrappers = HookWrappers(root_tree / "slurm", python, site)
    install_wrappers(wrappers)
    for hook in ("prolog", "epilog"):  # the two that run as root
        last = (root_tree / "slurm" / f"clusterjob-{hook}").read_text().splitlines()[-1]
        assert last.startswith(f"exec {python} -I -m clusterjob {hook} "), last


def test_a_venv_a_user_owns_is_refused_naming_it(
    site: Path, root_tree: Path, user: UnixUser, capsys: pytest.CaptureFixture[str]
) -> None:
    python, _ = make_venv(Path(user.home) / "venv")
    give_to(user, Path(user.home) / "venv")
    prefix = root_tree / "slurm"
    err = refused(capsys, args(site, prefix, "--python", str(python)), prefix)
    assert f"--python {python}" in err
    assert f"directory {user.home} is owned by uid {user.uid}, not root" in err


def test_the_review_case_check_reports_a_user_edited_package_and_does_not_run_it(
    site: Path, root_tree: Path, user: UnixUser, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hooks installed from the admin's venv; the venv then belongs to a user, who edits
    ``clusterjob/__main__.py``. ``--check`` must say so, and must not run the edit as root."""
    venv = root_tree / "venv"
    python, site_packages = make_venv(venv, deps=True)
    prefix = root_tree / "slurm"
    assert main(args(site, prefix, "--python", str(python))) == 0
    give_to(user, venv)
    marker = root_tree / "ran-as"
    main_py = site_packages / "clusterjob" / "__main__.py"
    # The line after `import sys`, among the imports at the top of the module.
    add_after_import_sys = "{print} /^import sys$/ {print add}"
    edit = f'awk -v add="$1" \'{add_after_import_sys}\' "$0" > "$0.new" && mv "$0.new" "$0"'
    done = user.run(["/bin/sh", "-c", edit, str(main_py), PAYLOAD.format(marker=str(marker))])
    assert done.returncode == 0, done.stderr
    capsys.readouterr()

    code = main(args(site, prefix, "--check", "--python", str(python)))
    out = capsys.readouterr().out
    assert not marker.exists(), f"--check ran the user's code as uid {marker.read_text()}"
    assert out.splitlines()[-1] == f"{prefix}: hooks NOT ok"
    assert f"directory {venv} is owned by uid {user.uid}, not root" in out
    assert code == 1


@pytest.mark.parametrize(
    "handed_over", ["the package", "one module", "the Epilog's module", "a .pth file"]
)
def test_a_piece_of_a_root_venv_a_user_may_write_is_refused(
    handed_over: str,
    site: Path,
    root_tree: Path,
    root_venv: tuple[Path, Path],
    user: UnixUser,
    capsys: pytest.CaptureFixture[str],
) -> None:
    python, site_packages = root_venv
    piece = {
        "the package": site_packages / "clusterjob",
        "one module": site_packages / "clusterjob" / "node" / "prolog.py",
        "the Epilog's module": site_packages / "clusterjob" / "node" / "epilog.py",
        "a .pth file": site_packages / "extra.pth",
    }[handed_over]
    if handed_over == "a .pth file":
        piece.write_text(f"{root_tree}\n")
    give_to(user, piece)
    prefix = root_tree / "slurm"
    err = refused(capsys, args(site, prefix, "--python", str(python)), prefix)
    assert f"{piece} is owned by uid {user.uid}, not root" in err

    # and --check, on wrappers written before it was handed over, reports the same path.
    subprocess.run(["chown", "-R", "0:0", str(piece)], check=True)
    assert main(args(site, prefix, "--python", str(python))) == 0
    give_to(user, piece)
    capsys.readouterr()
    assert main(args(site, prefix, "--check", "--python", str(python))) == 1
    out = capsys.readouterr().out
    assert f"{piece} is owned by uid {user.uid}, not root" in out
    assert out.splitlines()[-1] == f"{prefix}: hooks NOT ok"


def test_a_group_writable_package_directory_is_refused(
    site: Path, root_tree: Path, root_venv: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    python, site_packages = root_venv
    (site_packages / "clusterjob" / "node").chmod(0o775)
    prefix = root_tree / "slurm"
    err = refused(capsys, args(site, prefix, "--python", str(python)), prefix)
    assert f"{site_packages}/clusterjob/node is group/world-writable (mode 0775)" in err


def test_an_editable_install_whose_checkout_a_user_owns_is_refused_before_site_runs(
    site: Path, root_tree: Path, user: UnixUser, capsys: pytest.CaptureFixture[str]
) -> None:
    """A root-owned venv whose .pth (root's) names a checkout in a user's home: the checkout
    is on the import path, and a sitecustomize.py there would run as soon as site did."""
    python, site_packages = make_venv(root_tree / "venv", package=False)
    checkout = users_dir(root_tree, user, "src")
    copy_package(checkout)
    marker = root_tree / "ran-as"
    (checkout / "sitecustomize.py").write_text(PAYLOAD.format(marker=str(marker)))
    give_to(user, checkout)
    pth = site_packages / "_editable_impl_clusterjob.pth"
    pth.write_text(f"{checkout}\n")
    pth.chmod(0o644)
    prefix = root_tree / "slurm"
    err = refused(capsys, args(site, prefix, "--python", str(python)), prefix)
    assert f"directory {checkout} is owned by uid {user.uid}, not root" in err
    assert not marker.exists(), "the user's sitecustomize ran as root while being checked"


def test_an_editable_install_from_a_root_owned_checkout_is_accepted(
    site: Path, root_tree: Path
) -> None:
    python, site_packages = make_venv(root_tree / "venv", package=False)
    checkout = root_tree / "src"
    checkout.mkdir()
    copy_package(checkout)
    (site_packages / "_editable_impl_clusterjob.pth").write_text(f"{checkout}\n")
    install_wrappers(HookWrappers(root_tree / "slurm", python, site))
    # Made group-writable, the checkout is refused like a package installed there.
    (checkout / "clusterjob" / "__main__.py").chmod(0o664)
    with pytest.raises(UntrustedConfig, match=r"__main__\.py is group/world-writable"):
        install_wrappers(HookWrappers(root_tree / "slurm", python, site))


@pytest.mark.parametrize("whose", ["the link's directory", "the link's target"])
def test_a_symlinked_interpreter_counts_its_directory_and_its_target(
    whose: str,
    site: Path,
    root_tree: Path,
    root_venv: tuple[Path, Path],
    user: UnixUser,
    capsys: pytest.CaptureFixture[str],
) -> None:
    python, _ = root_venv
    if whose == "the link's directory":  # the user's own link to root's good interpreter
        link = users_dir(root_tree, user, "bin") / "python"
        done = user.run(["ln", "-s", str(python), str(link)])
        assert done.returncode == 0, done.stderr
        at_fault = f"directory {link.parent}"
    else:  # root's link, in root's directory, to an interpreter the user may rewrite
        (root_tree / "bin").mkdir(mode=0o755)
        link = root_tree / "bin" / "python"
        target = users_dir(root_tree, user, "theirs") / "python3"
        shutil.copy(BASE_PYTHON.resolve(), target)
        link.symlink_to(target)
        at_fault = f"directory {target.parent}"
    prefix = root_tree / "slurm"
    err = refused(capsys, args(site, prefix, "--python", str(link)), prefix)
    assert f"{at_fault} is owned by uid {user.uid}, not root" in err


def test_an_interpreter_below_a_sticky_world_writable_directory_is_refused(
    site: Path, root_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="clusterjob-test-", dir="/tmp"))
    try:
        scratch.chmod(0o755)
        python, _ = make_venv(scratch / "venv")
        prefix = root_tree / "slurm"
        err = refused(capsys, args(site, prefix, "--python", str(python)), prefix)
        assert "directory /tmp is group/world-writable (mode 1777)" in err
    finally:
        shutil.rmtree(scratch)


def test_a_source_tree_the_wrappers_put_first_must_be_roots_too(
    site: Path, root_tree: Path, root_venv: tuple[Path, Path], user: UnixUser
) -> None:
    """The sandbox's shape: a tree run from source, put first on sys.path by the wrapper."""
    python, _ = root_venv
    tree = users_dir(root_tree, user, "checkout")
    copy_package(tree)
    give_to(user, tree)
    wrappers = HookWrappers(root_tree / "slurm", python, site, package_root=tree)
    with pytest.raises(UntrustedConfig, match=f"{tree} is owned by uid {user.uid}"):
        install_wrappers(wrappers)
    assert not (root_tree / "slurm").exists()
    result = check_wrappers(wrappers)
    assert any(f"{tree} is owned by uid {user.uid}" in p for p in result.problems)


def test_without_python_the_running_interpreter_is_used_only_if_it_passes(
    site: Path,
    root_tree: Path,
    user: UnixUser,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """install-hooks run from a user's venv (its default is the interpreter running it)."""
    python, _ = make_venv(Path(user.home) / "venv")
    give_to(user, Path(user.home) / "venv")
    monkeypatch.setattr(sys, "executable", str(python))
    prefix = root_tree / "slurm"
    err = refused(capsys, args(site, prefix), prefix)
    assert f"the interpreter running this, {python}" in err
    assert f"directory {user.home} is owned by uid {user.uid}, not root" in err
    assert "--python" in err and "/opt/clusterjob" in err
    # --dry-run is refused the same way: it shows what would be written.
    refused(capsys, args(site, prefix, "--dry-run"), prefix)


def test_a_missing_import_path_entry_is_judged_by_the_directory_it_would_be_in(
    root_tree: Path, user: UnixUser
) -> None:
    """sys.path names files that need not exist (lib/python311.zip): whoever may write the
    directory they would be in could put one there."""
    from clusterjob.node.trust import check_trusted_path

    check_trusted_path(root_tree / "lib" / "python311.zip")  # root's: nobody else can add it
    theirs = users_dir(root_tree, user, "lib")
    with pytest.raises(UntrustedConfig, match=f"directory {theirs} is owned by uid {user.uid}"):
        check_trusted_path(theirs / "python311.zip")
    with pytest.raises(UntrustedConfig, match=f"directory {theirs} is owned by uid {user.uid}"):
        check_trusted_path(theirs / "missing" / "deeper")


def test_symlinks_inside_the_package_are_followed_to_what_they_name(
    root_tree: Path, user: UnixUser
) -> None:
    """A root-owned link in the package to a module, or a subpackage, another user may write."""
    from clusterjob.node.trust import check_trusted_tree

    package = copy_package(root_tree)
    check_trusted_tree(package)
    theirs = users_dir(root_tree, user, "theirs")
    (theirs / "mod.py").write_text("")
    (package / "extra.py").symlink_to(theirs / "mod.py")
    with pytest.raises(UntrustedConfig, match=f"directory {theirs} is owned by uid {user.uid}"):
        check_trusted_tree(package)
    (package / "extra.py").unlink()
    other = root_tree / "other"
    other.mkdir(mode=0o755)
    (other / "mod.py").write_text("")
    give_to(user, other / "mod.py")
    (package / "sub").symlink_to(other)
    with pytest.raises(UntrustedConfig, match=f"file {other}/mod.py is owned by uid {user.uid}"):
        check_trusted_tree(package)
