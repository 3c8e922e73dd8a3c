"""Asking the submitting shell's ``python3`` for its interpreter, begun as early as possible.

A shim on PATH (pyenv, asdf) takes a process of its own to name its interpreter (60 ms or
more, 200 ms on a busy machine). ``clusterjob submit`` starts that process as it starts
(``clusterjob.__main__``), before Typer, Jinja2 and the site model load, so this module
imports only what starting it needs (no dataclasses, no site model: ~40 ms that the shim
would otherwise wait for). ``clusterjob.jobscript.interpreter`` builds on it.

pyenv's shim is not run in the common case: which interpreter it would run is read from
pyenv's own files (``pyenv_interpreter``), as pyenv reads them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from clusterjob.process import answer_later

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from clusterjob.jobscript.interpreter import SubmitPython

_ASK_EXECUTABLE = "import sys; print(sys.executable)"


def start_find_submit_python(
    environ: Mapping[str, str], *, for_later: bool = False
) -> Callable[[], SubmitPython]:
    """``find_submit_python`` begun now, its answer given when the result is called.

    ``clusterjob submit`` starts it as the process starts (``for_later``: kept for the next
    caller with the same environment and working directory, who takes it) and asks for the
    answer only when it resolves the request, so the shim runs while the command imports its
    code and loads the site.
    """
    key = (os.getcwd(), tuple(sorted(environ.items())))
    pending = _STARTED.pop(key, None) or _start(environ)
    if for_later:
        _STARTED.clear()  # one kept at most
        _STARTED[key] = pending
    return pending


_STARTED: dict[tuple[str, tuple[tuple[str, str], ...]], Callable[[], SubmitPython]] = {}


def _submit_python(python: str | None, active: str | None) -> SubmitPython:
    from clusterjob.jobscript.interpreter import SubmitPython  # loaded by then: no cost

    return SubmitPython(python, active)


def _start(environ: Mapping[str, str]) -> Callable[[], SubmitPython]:
    path = environ.get("PATH", os.defpath)
    active = environ.get("VIRTUAL_ENV") or environ.get("CONDA_PREFIX") or None
    for name in ("python3", "python"):
        found = shutil.which(name, path=path)
        if found:
            real = _start_real_executable(os.path.abspath(found), environ)
            return lambda: _submit_python(real(), active)
    return lambda: _submit_python(None, active)


def _start_real_executable(found: str, environ: Mapping[str, str]) -> Callable[[], str]:
    """The interpreter a shim (pyenv, asdf) runs; a venv's own ``bin/python`` stays itself."""
    try:
        with open(found, "rb") as fh:
            first = fh.read(256)
    except OSError:
        return lambda: found
    if not first.startswith(b"#!"):  # a real interpreter (or a link to one): keep its path
        return lambda: found
    named = pyenv_interpreter(found, environ, os.getcwd())
    if named is not None:  # what the pyenv shim would run, read from pyenv's own files
        return lambda: named
    try:
        proc = subprocess.Popen(
            [found, "-c", _ASK_EXECUTABLE], env=dict(environ), text=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return lambda: found

    def said(out: str, code: int | None) -> str:
        text = out.strip()
        return text if code == 0 and os.path.isabs(text) else found

    return answer_later(proc, 20, said)  # a submit that failed before asking: no stray child


# pyenv (https://github.com/pyenv/pyenv): its shim runs `pyenv exec`, a bash program of ~20
# processes, only to pick `$PYENV_ROOT/versions/VERSION/bin/python3`. That choice is read
# here from the files pyenv reads, in the common case alone: one version, installed under
# that name, its python3 executable, no hook that picks the version. Anything else (several
# versions, "system", a prefix such as 3.12, a virtualenv, hooks) runs the shim as before.
_PYENV_EXEC = re.compile(r'^exec "(?P<root>/[^"]+)/libexec/pyenv" exec "\$program" "\$@"$', re.M)
_PYENV_ROOT_LINE = re.compile(r'^export PYENV_ROOT="(?P<root>/[^"]+)"$', re.M)
# Hook folders pyenv always searches besides $PYENV_HOOK_PATH, $PYENV_ROOT/pyenv.d and its
# plugins' etc/pyenv.d (libexec/pyenv).
_PYENV_SYSTEM_HOOKS = (
    "/usr/etc/pyenv.d",
    "/usr/local/etc/pyenv.d",
    "/etc/pyenv.d",
    "/usr/lib/pyenv/hooks",
)
# `which` hooks of pyenv-virtualenv that act only when the version's command is not an
# executable file (which this reader requires); any other `which` hook may change the answer.
_PYENV_KNOWN_WHICH_HOOKS = frozenset(
    {"conda.bash", "python-config.bash", "system-site-packages.bash"}
)


def pyenv_interpreter(shim: str, environ: Mapping[str, str], cwd: str) -> str | None:
    """The interpreter the pyenv shim ``shim`` runs here, or None where only running it can
    tell (then it is run)."""
    try:
        with open(shim, encoding="utf-8") as fh:
            text = fh.read(4096)
    except (OSError, UnicodeDecodeError):
        return None
    exec_line, root_line = _PYENV_EXEC.search(text), _PYENV_ROOT_LINE.search(text)
    if exec_line is None or root_line is None or exec_line["root"] != root_line["root"]:
        return None
    root = root_line["root"]
    version = _pyenv_version(root, environ, cwd)
    if version is None or _pyenv_hooked(
        root, environ, picks_version="PYENV_VERSION" not in environ
    ):
        return None
    home = os.path.join(root, "versions", version)
    python = os.path.join(home, "bin", os.path.basename(shim))
    if os.path.islink(home) or any(
        os.path.exists(os.path.join(home, marker)) for marker in ("pyvenv.cfg", "conda-meta")
    ):
        return None  # a virtualenv or conda env: its interpreter path is the shim's to say
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return None
    return python


def _pyenv_version(root: str, environ: Mapping[str, str], cwd: str) -> str | None:
    """The one version pyenv picks (pyenv-version-name, pyenv-version-file): $PYENV_VERSION,
    else the nearest .python-version from $PYENV_DIR (else the working directory) up, else
    $PYENV_ROOT/version. None: several, "system", none, or a name not installed as is."""
    words = environ.get("PYENV_VERSION", "")
    if not words:
        start = environ.get("PYENV_DIR") or cwd
        words = _version_file_words(_nearest_version_file(start, root))
    names = [w for w in words.replace(":", " ").split() if w]
    if len(names) != 1:
        return None
    name = names[0]
    if name in ("system", ".", "..") or "/" in name or name.startswith("."):
        return None
    return name if os.path.isdir(os.path.join(root, "versions", name)) else None


def _nearest_version_file(start: str, root: str) -> str:
    directory = os.path.abspath(start)
    while True:
        candidate = os.path.join(directory, ".python-version")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return os.path.join(root, "version")
        directory = parent


def _version_file_words(path: str) -> str:
    """The first word of each line that is neither empty nor a comment (pyenv-version-file-read)."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read(65536).splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    firsts = [line.split()[0] for line in lines if line.split()]
    return " ".join(w for w in firsts if not w.startswith("#"))


def _pyenv_hooked(root: str, environ: Mapping[str, str], *, picks_version: bool) -> bool:
    """Whether a hook may change what pyenv runs: a `version-name` hook (consulted only when
    $PYENV_VERSION is unset), a `which` hook other than pyenv-virtualenv's, any `exec` hook
    other than pyenv's own pip-rehash (which acts on pip alone)."""
    folders = [p for p in environ.get("PYENV_HOOK_PATH", "").split(":") if p]
    folders += [os.path.join(root, "pyenv.d"), *_PYENV_SYSTEM_HOOKS]
    plugins = os.path.join(root, "plugins")
    try:  # $PYENV_ROOT/plugins/*/etc/pyenv.d, as pyenv's own glob reads it (no hidden names)
        names = sorted(n for n in os.listdir(plugins) if not n.startswith("."))
    except OSError:
        names = []
    folders += [os.path.join(plugins, n, "etc", "pyenv.d") for n in names]
    for folder in folders:
        try:  # one call for a folder that is not there (most are not), not one for each kind
            kinds = os.listdir(folder)
        except OSError:
            continue
        for kind in ("version-name", "which", "exec"):
            if kind not in kinds:
                continue
            try:
                hooks = [n for n in os.listdir(os.path.join(folder, kind)) if n.endswith(".bash")]
            except OSError:
                continue
            if kind == "version-name" and hooks and picks_version:
                return True
            if kind == "which" and set(hooks) - _PYENV_KNOWN_WHICH_HOOKS:
                return True
            if kind == "exec" and set(hooks) - {"pip-rehash.bash"}:
                return True
    return False
