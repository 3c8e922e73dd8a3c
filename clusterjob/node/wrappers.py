"""The root-owned wrappers that slurm.conf's ``Prolog=`` and ``TaskProlog=`` name.

Slurm runs both as a bare path, with no arguments and no ``PATH``, so a wrapper supplies
them: a fixed working directory, an absolute interpreter run isolated (``-I``: no
``PYTHON*`` variables, no user site-packages, no working directory on ``sys.path``), the
site file and the Prolog's cache. ``clusterjob site install-hooks`` and the sandbox both
write them here, so there is one way of writing them; ``check_wrappers`` verifies an
installation (owners, modes, text, the interpreter, NVML) the way the Prolog would see it.

slurmd runs what the interpreter imports as root, so the interpreter is held to the Prolog's
trust rule for its own files (``trust_import_path``): the executable (a symlink's directory
and its target), its venv's ``pyvenv.cfg``, every ``sys.path`` entry, every ``.pth`` file and
what it adds, and the whole ``clusterjob`` package must be root's alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterjob import __version__
from clusterjob.errors import UntrustedConfig, UsageError
from clusterjob.node.context import DEFAULT_CACHE_DIR
from clusterjob.node.trust import (
    check_trusted,
    check_trusted_path,
    check_trusted_tree,
    open_trusted,
    open_trusted_dir,
)

__all__ = [
    "EPILOG_NAME",
    "PROLOG_NAME",
    "TASK_PROLOG_NAME",
    "HookWrappers",
    "check_wrappers",
    "install_wrappers",
    "trust_import_path",
]

PROLOG_NAME = "clusterjob-prolog"
TASK_PROLOG_NAME = "clusterjob-task-prolog"
EPILOG_NAME = "clusterjob-epilog"
MODE = 0o755
# slurm.conf takes Prolog= unquoted: a path with blanks, quotes or `#` would be misread.
_CONF_SAFE = re.compile(r"^/[A-Za-z0-9_./+-]+$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SLURM_BUDGET = 5.0  # seconds `--check` gives `scontrol show config`
PROBE_TIMEOUT = 60.0  # seconds for `clusterjob --version` / `gpus` through the wrapper's Python


@dataclass(frozen=True)
class HookWrappers:
    """The two wrappers of one installation: where they go and what they run."""

    prefix: Path  # the directory of both wrappers (e.g. /etc/slurm)
    python: Path  # absolute interpreter of the clusterjob installation the nodes run
    site: Path
    cache_dir: Path = Path(DEFAULT_CACHE_DIR)
    # (NAME, VALUE): exported before clusterjob runs, and passed on to the job's tasks by
    # the TaskProlog (a driver library outside the loader's path; the sandbox's stand-in
    # NVML). VALUE stands in double quotes: $NAME and ${NAME} expand when the hook runs.
    environment: tuple[tuple[str, str], ...] = ()
    # Put first on sys.path: a clusterjob run from a source tree, not installed (the sandbox).
    package_root: Path | None = None

    def __post_init__(self) -> None:
        for what, path in (
            ("--prefix", self.prefix),
            ("--python", self.python),
            ("--site", self.site),
            ("--cache-dir", self.cache_dir),
        ):
            if not path.is_absolute():
                raise UsageError(f"{what} {path}: give an absolute path (slurmd has no cwd)")
            if "\n" in str(path) or "\0" in str(path):
                raise UsageError(f"{what} {path!r}: a path with a newline or NUL")
        if not _CONF_SAFE.match(str(self.prefix)):
            raise UsageError(
                f"--prefix {self.prefix}: use only letters, digits and ./_+- "
                "(slurm.conf takes Prolog= unquoted)"
            )
        for name, value in self.environment:
            if not _NAME.match(name):
                raise UsageError(f"--env {name}=...: not a variable name")
            if any(c in value for c in "\n\0`") or "$(" in value:
                raise UsageError(f"--env {name}={value!r}: only text and $NAME expansions")

    @property
    def prolog(self) -> Path:
        return self.prefix / PROLOG_NAME

    @property
    def task_prolog(self) -> Path:
        return self.prefix / TASK_PROLOG_NAME

    @property
    def epilog(self) -> Path:
        return self.prefix / EPILOG_NAME

    def _command(self, *args: str) -> str:
        """The interpreter's command line, isolated, for ``clusterjob ARGS``."""
        py = [shlex.quote(str(self.python)), "-I"]
        if self.package_root is None:
            py += ["-m", "clusterjob"]
        else:
            boot = (
                "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                "import clusterjob.__main__ as m; sys.exit(m.main())"
            )
            py += ["-c", shlex.quote(boot), shlex.quote(str(self.package_root))]
        return " ".join([*py, *(shlex.quote(a) for a in args)])

    def _exports(self) -> list[str]:
        lines = []
        for name, value in self.environment:
            quoted = value.replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'export {name}="{quoted}"')
        return lines

    def _prelude(self, hook: str) -> list[str]:
        path = {"Prolog": self.prolog, "Epilog": self.epilog}.get(hook, self.task_prolog)
        return [
            "#!/bin/sh",
            f"# The Slurm {hook} of clusterjob (slurm.conf: {hook}={path}).",
            "# Written by `clusterjob site install-hooks`: run it again with other options",
            "# rather than editing this file (its --check compares the two).",
            "cd / || exit 1",
            *self._exports(),
        ]

    def prolog_text(self) -> str:
        run = self._command("prolog", "--site", str(self.site), "--cache-dir", str(self.cache_dir))
        return "\n".join([*self._prelude("Prolog"), f"exec {run}", ""])

    def task_prolog_text(self) -> str:
        """Never fails the task: the command itself returns 0 whatever it finds, and where it
        cannot run at all (an interpreter or package the job's user cannot reach) the job's
        output says so and the task starts; slurmd kills a task whose TaskProlog fails."""
        passed = [f'echo "export {name}=${name}"' for name, _ in self.environment]
        run = self._command("task-prolog", "--site", str(self.site))
        failed = (
            'echo "print clusterjob task-prolog could not run (exit $?) as $(id -un): this '
            "task's GPUs were not checked and CUDA_DEVICE_ORDER is not set; tell the site's "
            'admins"'
        )
        return "\n".join(
            [*self._prelude("TaskProlog"), *passed, f"{run} || {failed}", "exit 0", ""]
        )

    def epilog_text(self) -> str:
        """As the Prolog's: exit 1 (a fatal GPU fault found after the job) drains the node."""
        run = self._command("epilog", "--site", str(self.site), "--cache-dir", str(self.cache_dir))
        return "\n".join([*self._prelude("Epilog"), f"exec {run}", ""])

    def files(self) -> dict[Path, str]:
        return {
            self.prolog: self.prolog_text(),
            self.task_prolog: self.task_prolog_text(),
            self.epilog: self.epilog_text(),
        }

    def slurm_conf_lines(self) -> list[str]:
        """What slurm.conf needs; PrologFlags=Alloc runs the Prolog at allocation, on every
        node of the job, before any step (the GPUs are checked before the batch script)."""
        return [
            f"Prolog={self.prolog}",
            "PrologFlags=Alloc",
            "PrologEpilogTimeout=60",
            f"TaskProlog={self.task_prolog}",
            f"Epilog={self.epilog}",
        ]

    def probe_command(self, *args: str) -> list[str]:
        """``clusterjob ARGS`` as the wrappers run it (same cwd, environment, interpreter)."""
        script = "\n".join(["cd / || exit 1", *self._exports(), f"exec {self._command(*args)}"])
        return ["/bin/sh", "-c", script]


def _check_dir(path: Path) -> None:
    os.close(open_trusted_dir(path)[0])


def _refuse_untrusted(wrappers: HookWrappers) -> None:
    """The Prolog's own rules for what it reads: the site, and the cache when there is one."""
    try:
        check_trusted(wrappers.site)
    except UntrustedConfig as exc:
        raise UntrustedConfig(f"--site: {exc} (the Prolog would refuse it, and drain)") from exc
    if wrappers.cache_dir.exists():
        try:
            _check_dir(wrappers.cache_dir)
        except UntrustedConfig as exc:
            raise UntrustedConfig(f"--cache-dir: {exc} (the Prolog would refuse it)") from exc


def _open_prefix(prefix: Path, *, create: bool) -> int:
    """The wrappers' directory, only where root alone can write (the trust rules of the
    Prolog's own files: slurmd runs as root whatever is there). With ``create``, missing
    directories are made root-owned 0755."""
    try:
        return open_trusted_dir(prefix, create=create)[0]
    except UntrustedConfig as exc:
        raise UntrustedConfig(
            f"--prefix: {exc} (slurmd would run, as root, what someone else wrote there)"
        ) from exc


def _write_root_file(dir_fd: int, name: str, text: str, mode: int) -> None:
    """Atomically, inside the checked directory: a new root-owned file, renamed over ``name``."""
    tmp = f".{name}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchown(f.fileno(), 0, 0)
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


# Asked of the interpreter with -I -S (no site: nothing a .pth names runs): the path site
# would make, by site's own functions, with a .pth's `import` lines listed instead of run.
_SITE_PROBE = """\
import json, os, site, sys
pth, imports = [], []
read = site.addpackage
def addpackage(sitedir, name, known_paths):
    pth.append(os.path.join(sitedir, name))
    return read(sitedir, name, known_paths)
site.addpackage = addpackage
site.exec = imports.append
site.addsitepackages(site.venv(site.removeduppaths()))
print(json.dumps({"path": sys.path, "pth": pth, "imports": imports}))
"""
# Then as the hooks run it (-I, site on), the tree first when the wrappers name one: where
# `import clusterjob` finds the package (found, not imported: none of its code runs).
_PACKAGE_PROBE = """\
import importlib.util, json, sys
if sys.argv[1:]:
    sys.path.insert(0, sys.argv[1])
spec = importlib.util.find_spec("clusterjob")
where = list(spec.submodule_search_locations or []) if spec else []
print(json.dumps({"path": sys.path, "package": where, "origin": spec and spec.origin}))
"""
ROOT_VENV_HINT = (
    "python3 -m venv /opt/clusterjob && /opt/clusterjob/bin/pip install clusterjob-slurm"
)


def _trusted(role: str, check: Callable[[Path], None], path: str | Path) -> None:
    try:
        check(Path(path))
    except UntrustedConfig as exc:
        raise UntrustedConfig(f"{role}: {exc}") from None


def _venv_homes(python: Path) -> list[Path]:
    """The pyvenv.cfg files Python reads beside ``python`` (or one directory up), checked, and
    the ``home`` each names: the interpreter and standard library the venv runs."""
    homes = []
    for cfg in (python.parent / "pyvenv.cfg", python.parent.parent / "pyvenv.cfg"):
        if not os.path.lexists(cfg):
            continue
        try:
            opened = open_trusted(cfg)
        except UntrustedConfig as exc:
            raise UntrustedConfig(f"its venv's configuration: {exc}") from None
        with os.fdopen(opened.fd, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() == "home" and value.strip().startswith("/"):
                    homes.append(Path(value.strip()))
    return homes


def _ask(
    wrappers: HookWrappers, python: Path, argv: tuple[str, ...], keys: tuple[str, ...]
) -> dict[str, Any]:
    """Run ``python ARGV`` as the wrappers do (cwd /, their exports); its JSON answer, whose
    ``keys`` are lists of strings."""
    script = "\n".join(["cd / || exit 1", *wrappers._exports(), 'exec "$@"'])
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", script, "sh", str(python), *argv],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    else:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        with contextlib.suppress(ValueError):
            answer = json.loads(done.stdout) if done.returncode == 0 else None
            if isinstance(answer, dict) and all(
                isinstance(answer.get(key), list)
                and all(isinstance(item, str) for item in answer[key])
                for key in keys
            ):
                return answer
        why = why if done.returncode else f"not an answer: {done.stdout[:200]!r}"
    raise UsageError(f"interpreter {python}: cannot tell its import path: {why}")


def trust_import_path(wrappers: HookWrappers) -> None:
    """Refuse (UntrustedConfig, naming the path at fault) an interpreter whose import path as
    the hooks run it is not root's alone: the executable, its venv's pyvenv.cfg and home,
    every sys.path entry and ``.pth`` file, and the whole clusterjob package (with the tree the
    wrappers put first). Nothing is run before what it runs from is checked: the executable
    and its venv before it starts, site's directories and ``.pth`` files before site runs."""
    python = wrappers.python
    _trusted("the interpreter", check_trusted, python)
    for home in _venv_homes(python):
        _trusted("its venv's home", check_trusted_path, home)
    site = _ask(wrappers, python, ("-I", "-S", "-c", _SITE_PROBE), ("path", "pth", "imports"))
    for entry in site["path"]:
        _trusted("a sys.path entry", check_trusted_path, os.path.join("/", entry))
    for pth in dict.fromkeys(site["pth"]):
        _trusted("a .pth file", check_trusted, pth)
    tree = [] if wrappers.package_root is None else [str(wrappers.package_root)]
    found = _ask(wrappers, python, ("-I", "-c", _PACKAGE_PROBE, *tree), ("path", "package"))
    for entry in dict.fromkeys(found["path"]):
        if entry not in site["path"]:
            _trusted("a sys.path entry", check_trusted_path, os.path.join("/", entry))
    for package in found["package"]:
        _trusted("the clusterjob package", check_trusted_tree, package)
    origin = found.get("origin")
    if isinstance(origin, str) and origin.startswith("/"):  # not "frozen", "built-in"
        _trusted("the clusterjob package", check_trusted_path, origin)


def _refuse_untrusted_python(wrappers: HookWrappers, *, default_python: bool) -> None:
    try:
        trust_import_path(wrappers)
    except UntrustedConfig as exc:
        if default_python:
            raise UntrustedConfig(
                f"the interpreter running this, {wrappers.python}: {exc}; give --python one "
                f"only root can change, e.g. {ROOT_VENV_HINT}"
            ) from None
        raise UntrustedConfig(
            f"--python {wrappers.python}: {exc} (slurmd would run it as root before every job)"
        ) from None


def install_wrappers(
    wrappers: HookWrappers, *, dry_run: bool = False, default_python: bool = False
) -> list[Path]:
    """Write both wrappers (root-owned, 0755), making ``prefix`` if missing; refuse a prefix,
    site or cache the Prolog's trust rules reject, or an interpreter whose import path is not
    root's alone (``default_python``: it was not asked for, say how to give one). The paths
    (not written with ``dry_run``)."""
    _refuse_untrusted(wrappers)
    _refuse_untrusted_python(wrappers, default_python=default_python)
    if dry_run:
        existing = wrappers.prefix
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent  # what would be created must be made in trusted ground
        os.close(_open_prefix(existing, create=False))
        return list(wrappers.files())
    if os.geteuid() != 0:
        raise UsageError("writing the hook wrappers needs root (they must be root-owned)")
    dir_fd = _open_prefix(wrappers.prefix, create=True)
    try:
        for path, text in wrappers.files().items():
            _write_root_file(dir_fd, path.name, text, MODE)
    finally:
        os.close(dir_fd)
    return list(wrappers.files())


@dataclass(frozen=True)
class CheckResult:
    """``--check``: problems fail it; notes are said (NVML on a node without GPUs)."""

    problems: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def _interpreter(text: str) -> str | None:
    """The interpreter a wrapper runs: the first word of its command line, the last line
    that starts with an absolute path (the TaskProlog's) or with ``exec`` and one (the
    Prolog's)."""
    for line in reversed(text.splitlines()):
        command = line.removeprefix("exec ")
        if not command.startswith(("/", "'/")):
            continue
        try:
            words = shlex.split(command)
        except ValueError:
            return None
        return words[0] if words else None
    return None


def _check_file(path: Path, want: str, wrappers: HookWrappers) -> list[str]:
    try:
        st = os.lstat(path)
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return [f"{path}: {exc.strerror or exc}"]
    problems = []
    try:
        check_trusted(path)
    except UntrustedConfig as exc:
        problems.append(f"{path}: {exc}")
    if stat.S_ISLNK(st.st_mode):
        problems.append(f"{path}: a symbolic link (install-hooks writes a file)")
    elif stat.S_IMODE(st.st_mode) != MODE:
        problems.append(f"{path}: mode {stat.S_IMODE(st.st_mode):04o}, want {MODE:04o}")
    lines = text.splitlines()
    if not lines or not lines[0].startswith("#!/"):
        problems.append(f"{path}: line 1 is not a #! line (execve would refuse to run it)")
    python = _interpreter(text)
    if python is None:
        problems.append(f"{path}: no `INTERPRETER -I ...` command line")
    elif python != str(wrappers.python):
        problems.append(f"{path}: runs interpreter {python}, want {wrappers.python}")
    if python is not None:
        problems += [f"{path}: {p}" for p in _check_interpreter(Path(python))]
    if text != want:
        wanted = want.splitlines()
        n = next(
            (i for i, (a, b) in enumerate(zip(lines, wanted, strict=False)) if a != b),
            min(len(lines), len(wanted)),
        )
        have = lines[n] if n < len(lines) else "(end of file)"
        expected = wanted[n] if n < len(wanted) else "(end of file)"
        problems.append(
            f"{path}: line {n + 1} differs from what install-hooks writes: {have!r}, "
            f"want {expected!r}"
        )
    return problems


def _check_interpreter(python: Path) -> list[str]:
    if not python.is_absolute():
        return [f"interpreter {python} is not an absolute path (slurmd has no PATH)"]
    if not python.exists():
        return [f"interpreter {python}: no such file"]
    if not os.access(python, os.X_OK):
        return [f"interpreter {python}: not executable"]
    return []


def _probe(wrappers: HookWrappers, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        wrappers.probe_command(*args),
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT,
        check=False,
    )


def check_wrappers(wrappers: HookWrappers) -> CheckResult:
    """An installed pair of wrappers as slurmd will meet them: trust, mode, text, the
    interpreter (it runs, this clusterjob's version) and whether NVML answers there."""
    problems: list[str] = []
    notes: list[str] = []
    try:
        _refuse_untrusted(wrappers)
    except UntrustedConfig as exc:
        problems.append(str(exc))
    for path, want in wrappers.files().items():
        problems += _check_file(path, want, wrappers)
    if _check_interpreter(wrappers.python):
        problems += _check_interpreter(wrappers.python)
        return CheckResult(tuple(dict.fromkeys(problems)), tuple(notes))
    try:
        trust_import_path(wrappers)
    except UsageError as exc:
        problems.append(str(exc))
        return CheckResult(tuple(dict.fromkeys(problems)), tuple(notes))
    except UntrustedConfig as exc:
        # Not run to ask its version: its code may be anyone's, and this runs as root.
        problems.append(f"interpreter {wrappers.python}: {exc} (slurmd runs it as root)")
        return CheckResult(tuple(dict.fromkeys(problems)), tuple(notes))
    try:
        version = _probe(wrappers, "--version")
    except (OSError, subprocess.TimeoutExpired) as exc:
        problems.append(f"{wrappers.python} -I -m clusterjob --version: {exc}")
        return CheckResult(tuple(dict.fromkeys(problems)), tuple(notes))
    said = version.stdout.strip()
    if version.returncode != 0:
        why = (version.stderr.strip().splitlines() or ["no output"])[-1]
        problems.append(f"{wrappers.python} does not run clusterjob: {why}")
    elif said != f"clusterjob {__version__}":
        problems.append(f"the wrappers run {said}, this is clusterjob {__version__}")
    else:
        notes.append(f"interpreter {wrappers.python} runs {said}")
        notes.append(_nvml_note(wrappers))
    notes.append(_slurm_conf_note(wrappers))
    return CheckResult(tuple(dict.fromkeys(problems)), tuple(notes))


def _slurm_conf_note(wrappers: HookWrappers) -> str:
    """Whether the running Slurm names these wrappers (a note: this machine's Slurm may not
    be the one the wrappers are for, or may not be reachable from here)."""
    from clusterjob.errors import SlurmError
    from clusterjob.slurm.parse import parse_scontrol_config
    from clusterjob.slurm.runner import Runner

    cmd = ["scontrol", "show", "config"]
    try:
        config = parse_scontrol_config(Runner(budget=SLURM_BUDGET).run(cmd).stdout)
    except (SlurmError, OSError) as exc:
        return f"slurm.conf: not checked ({str(exc).splitlines()[0] if str(exc) else exc!r})"
    found = {key: config.get(key, "(none)") for key in ("Prolog", "TaskProlog", "Epilog")}
    want = {
        "Prolog": str(wrappers.prolog),
        "TaskProlog": str(wrappers.task_prolog),
        "Epilog": str(wrappers.epilog),
    }
    if found == want:
        return "slurm.conf: Prolog=, TaskProlog= and Epilog= name these wrappers"
    said = ", ".join(f"{k}={v}" for k, v in found.items())
    return f"slurm.conf: {said}, not these wrappers (slurmd runs what it names)"


def _nvml_note(wrappers: HookWrappers) -> str:
    """Whether NVML answers through the wrappers' interpreter and environment, or why not."""
    try:
        gpus = _probe(wrappers, "gpus", "--json")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"NVML: not checked: {exc}"
    if gpus.returncode == 0:
        try:
            count = len(json.loads(gpus.stdout).get("gpus", []))
        except (ValueError, AttributeError):
            return "NVML: answered, but not with an inventory"
        return f"NVML: {count} GPU(s) on this machine"
    why = (gpus.stderr.strip().splitlines() or ["no output"])[-1]
    return f"NVML: not usable here (exit {gpus.returncode}): {why}"
