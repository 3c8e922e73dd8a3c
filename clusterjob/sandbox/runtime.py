"""This clusterjob, and what it imports, where every user of the machine can run it.

The local cluster's node side (the TaskProlog, ``node_command``) runs as the job's user, and
the tests that play a second user run clusterjob as that user. Both run the clusterjob that
is running here, from where it is, when every user can reach it. Root's clone lands in root's
home (mode 0700) by default, and a venv there is just as far out of reach: every other user's
job failed. Then the package tree (with the templates and site files beside it) and the
installed distributions it depends on are copied into a root-owned, world-readable directory,
``CopiedRuntime``, made again whenever what it copies has changed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import sys
import sysconfig
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "clusterjob-slurm"
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # clusterjob/
# A checkout keeps the templates and the shipped sites beside the package (clusterjob.resources).
_CHECKOUT_DATA = ("templates", "site_configs")
# Shipped beside the package in the same wheel (pyproject.toml): the Hydra launcher, alone of
# the `hydra_plugins` namespace other distributions share.
_BESIDE = ("hydra_plugins/hydra_clusterjob_launcher",)
_STAMP = ".clusterjob-runtime"


def reachable_by_all(path: Path) -> bool:
    """Whether every user can reach ``path``: it and each directory above it are world-x."""
    try:
        real = path.resolve(strict=True)
        return all(os.stat(p).st_mode & 0o001 for p in (real, *real.parents))
    except OSError:
        return False


def imported_roots() -> list[Path]:
    """Where this interpreter imports clusterjob and its dependencies from."""
    paths = sysconfig.get_paths()
    return [PACKAGE_DIR, Path(paths["purelib"]), Path(paths["platlib"])]


def reachable_here() -> bool:
    """Whether another user could run this clusterjob as it is: the interpreter, the package
    and the site-packages it imports from."""
    return all(reachable_by_all(p) for p in (Path(sys.executable), *imported_roots()))


def world_python() -> Path | None:
    """An interpreter of this Python version that every user can run (the system's)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        Path(getattr(sys, "_base_executable", sys.executable)),
        *(Path(d) / version for d in ("/usr/bin", "/usr/local/bin")),
    ):
        if candidate.name.startswith("python") and reachable_by_all(candidate):
            return candidate
    return None


def _requirement_name(requirement: str) -> str | None:
    """The distribution a ``Requires-Dist`` line names; None for an extra's requirement."""
    if re.search(r"\bextra\s*==", requirement):
        return None
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return match.group(1) if match else None


def distribution_closure(names: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions ``names`` need, theirs included (extras left out); a
    requirement not installed here (another platform's) is skipped."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[key] = dist
        todo.extend(n for r in dist.requires or () if (n := _requirement_name(r)))
    return list(seen.values())


def _distribution_files(dist: metadata.Distribution) -> Iterator[tuple[Path, Path]]:
    """(source, path relative to site-packages) of each file a distribution installed there
    (its scripts in bin/ and an editable install's .pth are left out)."""
    for file in dist.files or ():
        relative = Path(str(file))
        if relative.parts and relative.parts[0] == ".." or relative.suffix == ".pth":
            continue
        if "__pycache__" in relative.parts:
            continue
        source = Path(str(dist.locate_file(file)))
        if source.is_file():
            yield source, relative


def _package_files(root: Path) -> Iterator[tuple[Path, Path]]:
    """This clusterjob's package tree (the packages its wheel ships beside it, and a
    checkout's data folders), laid out as in the checkout, relative to ``root``'s parent."""
    trees = [PACKAGE_DIR, *(PACKAGE_DIR.parent / d for d in (*_BESIDE, *_CHECKOUT_DATA))]
    for tree in trees:
        if not tree.is_dir():
            continue
        for source in sorted(tree.rglob("*")):
            if source.is_file() and "__pycache__" not in source.parts:
                yield source, source.relative_to(root)


@dataclass(frozen=True)
class CopiedRuntime:
    """A copy under ``directory``: ``src/`` holds clusterjob as laid out in its tree,
    ``site-packages/`` the distributions it (and ``extra``) depend on."""

    directory: Path

    @property
    def src(self) -> Path:
        return self.directory / "src"

    @property
    def site_packages(self) -> Path:
        return self.directory / "site-packages"

    def pythonpath(self) -> list[Path]:
        return [self.src, self.site_packages]


def _plan(extra: Iterable[str]) -> list[tuple[Path, Path]]:
    """(source, destination relative to the runtime directory) of every file to copy."""
    plan = [(s, Path("src") / r) for s, r in _package_files(PACKAGE_DIR.parent)]
    for dist in distribution_closure([DISTRIBUTION, *extra]):
        if re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower() == DISTRIBUTION:
            continue  # the package itself is src/ (an editable install has only a .pth)
        plan.extend((s, Path("site-packages") / r) for s, r in _distribution_files(dist))
    return plan


def _digest(plan: list[tuple[Path, Path]]) -> str:
    h = hashlib.sha256()
    for source, dest in plan:
        st = source.stat()
        h.update(f"{dest}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def copy_runtime(directory: Path, *, extra: Iterable[str] = ()) -> CopiedRuntime:
    """Copy clusterjob and its dependencies (and ``extra`` distributions') into ``directory``,
    root-owned, directories 0755 and files 0644; a no-op when the copy is up to date."""
    runtime = CopiedRuntime(directory)
    plan = _plan(extra)
    digest = _digest(plan)
    stamp = directory / _STAMP
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return runtime
    fresh = directory.with_name(directory.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    for source, dest in plan:
        target = fresh / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(0o644)
    for d in (fresh, *(p for p in fresh.rglob("*") if p.is_dir())):
        d.chmod(0o755)
    (fresh / _STAMP).write_text(digest + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    fresh.rename(directory)
    return runtime


def is_checkout() -> bool:
    """Whether this clusterjob runs from a source tree (a checkout, editable or not)."""
    return (PACKAGE_DIR.parent / "pyproject.toml").is_file()


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def wheel_of_running(directory: Path) -> Path:
    """A wheel of the clusterjob running here, made from its installed files (a wheel, pipx
    or `uv tool` install): what another Python (a release root's) installs to run the same
    version. A checkout builds its own; ask ``is_checkout`` first."""
    dist = metadata.distribution(DISTRIBUTION)
    version = dist.version
    info = f"clusterjob_slurm-{version}.dist-info"
    entries = [(r.as_posix(), s.read_bytes()) for s, r in _package_files(PACKAGE_DIR.parent)]
    for name in ("METADATA", "entry_points.txt"):
        text = dist.read_text(name)
        if text is not None:
            entries.append((f"{info}/{name}", text.encode()))
    wheel_meta = (
        "Wheel-Version: 1.0\nGenerator: clusterjob\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    entries.append((f"{info}/WHEEL", wheel_meta.encode()))
    record = [_record_line(name, data) for name, data in entries] + [f"{info}/RECORD,,"]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"clusterjob_slurm-{version}-py3-none-any.whl"
    partial = path.with_name(path.name + ".part")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in entries:
            wheel.writestr(name, data)
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    partial.replace(path)
    return path
