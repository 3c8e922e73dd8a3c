"""Asking the submitting shell's ``python3`` for its interpreter, begun as early as possible.

A shim on PATH (pyenv, asdf) takes a process of its own to name its interpreter (60 ms or
more, 200 ms on a busy machine). ``clusterjob submit`` starts that process as it starts
(``clusterjob.__main__``), before Typer, Jinja2 and the site model load, so this module
imports only what starting it needs (no dataclasses, no site model: ~40 ms that the shim
would otherwise wait for). ``clusterjob.jobscript.interpreter`` builds on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import weakref

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
    try:
        proc = subprocess.Popen(
            [found, "-c", _ASK_EXECUTABLE], env=dict(environ), text=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return lambda: found

    said: list[str] = []  # the answer, once read (a second call asks no process)

    def answer() -> str:
        if not said:
            try:
                out, _ = proc.communicate(timeout=20)
            except subprocess.SubprocessError:
                _reap(proc)
                out = ""
            text = out.strip()
            said.append(text if proc.returncode == 0 and os.path.isabs(text) else found)
        return said[0]

    weakref.finalize(answer, _reap, proc)  # a submit that failed before asking: no stray child
    return answer


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.returncode is None:
        proc.kill()
    if proc.stdout is not None and not proc.stdout.closed:
        proc.communicate()  # waits, and closes the pipe
