"""Which Python a job runs: the user's, not clusterjob's own.

By default the job gets the interpreter the user's shell would run at submit time (``python3``,
else ``python``, on the submitting ``PATH``), recorded as an absolute path. ``--python``,
``--venv`` and ``--conda`` name one; a site or partition ``job:`` entry gives the default for
users with no venv or conda env active. Each choice carries why it was made, for ``--dry-run``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from clusterjob.errors import UsageError
from clusterjob.jobscript.shell import check_no_nul
from clusterjob.jobscript.submit_python import start_find_submit_python
from clusterjob.site.model import JobEnvironment


@dataclass(frozen=True)
class SubmitPython:
    """What the submitting shell would run as ``python3``: an absolute path (a shim such as
    pyenv's resolved to the interpreter it runs), and the venv or conda env active then."""

    python: str | None
    active_env: str | None = None


@dataclass(frozen=True)
class Interpreter:
    """The job's interpreter. ``python`` is None only for a conda env, whose interpreter is
    found in the job after activation; ``bin_dir`` goes first on the job's PATH so that
    ``python``, ``torchrun`` or ``accelerate`` there are the chosen env's."""

    python: str | None
    why: str
    venv: str | None = None
    conda: str | None = None
    conda_exe: str | None = None  # conda or micromamba, whose shell hook activates ``conda``
    bin_dir: str | None = None


def find_submit_python(environ: Mapping[str, str]) -> SubmitPython:
    """``python3`` (else ``python``) on ``environ``'s PATH, as an absolute path."""
    return start_find_submit_python(environ)()


def check_python(path: str, option: str) -> str:
    """An interpreter path that exists and is executable, made absolute (links kept: a venv's
    ``bin/python`` is a link whose location is what makes it the venv's)."""
    check_no_nul(path, option)
    absolute = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(absolute):
        raise UsageError(f"{option} {path}: no such file")
    if os.path.isdir(absolute):
        raise UsageError(f"{option} {path}: is a directory, not an interpreter")
    if not os.access(absolute, os.X_OK):
        raise UsageError(f"{option} {path}: not executable")
    return absolute


def venv_interpreter(directory: str, option: str = "--venv") -> tuple[str, str]:
    """A virtual environment's directory (absolute) and its ``bin/python``."""
    check_no_nul(directory, option)
    venv = os.path.abspath(os.path.expanduser(directory))
    if not os.path.isdir(venv):
        raise UsageError(f"{option} {directory}: no such directory")
    for name in ("python", "python3"):
        candidate = os.path.join(venv, "bin", name)
        if os.path.exists(candidate):
            return venv, check_python(candidate, option)
    raise UsageError(f"{option} {directory}: no bin/python in it (not a virtual environment?)")


def find_conda(environ: Mapping[str, str], option: str = "--conda") -> str:
    """conda (``$CONDA_EXE`` or on PATH), else micromamba: whose shell hook activates the env."""
    path = environ.get("PATH", os.defpath)
    candidates = [environ.get("CONDA_EXE"), shutil.which("conda", path=path)]
    candidates += [environ.get("MAMBA_EXE"), shutil.which("micromamba", path=path)]
    for exe in candidates:
        if exe and os.path.isfile(exe) and os.access(exe, os.X_OK):
            return os.path.abspath(exe)
    raise UsageError(
        f"{option}: neither conda nor micromamba found ($CONDA_EXE, $MAMBA_EXE, PATH); "
        "activate conda in this shell first, or give --python ENV/bin/python"
    )


def _from_environment(
    entry: JobEnvironment, where: str, environ: Mapping[str, str]
) -> Interpreter | None:
    if entry.python is not None:
        python = check_python(entry.python, f"{where} python")
        return Interpreter(python, f"{where} python", bin_dir=os.path.dirname(python))
    if entry.venv is not None:
        venv, python = venv_interpreter(entry.venv, f"{where} venv")
        return Interpreter(python, f"{where} venv", venv=venv, bin_dir=os.path.dirname(python))
    if entry.conda is not None:
        check_no_nul(entry.conda, f"{where} conda")
        exe = find_conda(environ, f"{where} conda")
        return Interpreter(None, f"{where} conda", conda=entry.conda, conda_exe=exe)
    return None


def choose(
    *,
    python: str | None,
    venv: str | None,
    conda: str | None,
    submitted: SubmitPython | None,
    site_job: JobEnvironment,
    partition_job: JobEnvironment,
    site_file: str,
    partition: str,
    environ: Mapping[str, str],
) -> Interpreter | None:
    """The job's interpreter, in this order: ``--python``/``--venv``/``--conda``; the user's
    active venv or conda env at submit; the partition's, then the site's ``job:`` entry;
    ``python3`` on the submitting PATH. None when nothing names one (no PATH given)."""
    given = [(o, v) for o, v in (("--python", python), ("--venv", venv), ("--conda", conda)) if v]
    if len(given) > 1:
        raise UsageError(f"{given[0][0]} and {given[1][0]} exclude each other: give one")
    if python is not None:
        path = check_python(python, "--python")
        return Interpreter(path, "--python", bin_dir=os.path.dirname(path))
    if venv is not None:
        directory, path = venv_interpreter(venv)
        return Interpreter(path, "--venv", venv=directory, bin_dir=os.path.dirname(path))
    if conda is not None:
        check_no_nul(conda, "--conda")
        if not conda.strip():
            raise UsageError("--conda must not be empty")
        return Interpreter(None, "--conda", conda=conda, conda_exe=find_conda(environ))
    found = submitted.python if submitted is not None else None
    if found is not None and submitted is not None and submitted.active_env:
        path = check_python(found, "python3 on PATH")
        return Interpreter(
            path, f"python3 on the submitting PATH, env {submitted.active_env} active"
        )
    for entry, where in (
        (partition_job, f"{site_file}: partitions.{partition}.job"),
        (site_job, f"{site_file}: job"),
    ):
        chosen = _from_environment(entry, where, environ)
        if chosen is not None:
            return chosen
    if found is not None:
        return Interpreter(check_python(found, "python3 on PATH"), "python3 on the submitting PATH")
    return None
