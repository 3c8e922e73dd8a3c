"""CLI latency: ``clusterjob --help`` and ``clusterjob submit ... --dry-run``, beside submitit.

submitit builds an sbatch script in-process; the comparison is the same job (8 H100 on one
node, partition, account, qos, CPUs and memory per GPU) built by ``submitit``'s own
``_make_sbatch_string`` in a fresh interpreter. submitit is installed in a separate virtual
environment (never a clusterjob dependency): $CLUSTERJOB_BENCH_SUBMITIT_PYTHON, else
~/.cache/clusterjob-bench/venv, created with pip on a full run when missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from benchmarks.common import (
    PYTHON,
    REFERENCE,
    REFERENCE_NAME,
    Result,
    clusterjob_command,
    interleaved,
    median,
)
from benchmarks.sitegen import write_site

TARGET_HELP = 1.2  # clusterjob --help / python -c "import typer"
TARGET_DRY_RUN = 1.0  # clusterjob submit --dry-run / submitit building the same script
TYPER = "python -c 'import typer'"
SUBMITIT = "submitit: import + _make_sbatch_string"
HELP = "clusterjob --help"
DRY_RUN = "clusterjob submit --dry-run (10-node site)"
DRY_RUN_NAMED = "clusterjob submit --dry-run --python PYTHON (10-node site)"
NEWER_TYPER = "newest Typer: python -c 'import typer'"
# What a command run through Typer loads before clusterjob's own code: Typer (the app), and
# Jinja2 for a site's own templates. The usual command lines of `submit` and `status` load
# neither (the fast path's option table; the shipped template compiled to Python): this row
# is what they would add.
DEPS = "python -c 'import typer, jinja2'"
# Typer's other per-run cost: building the click command of `submit` (its 45 options) from
# the function's signature, timed as the CLI module with and without it. A plain command line
# pays neither that nor Typer's import (the option table of clusterjob/cli/fastpath.py).
CLI_MODULE = "python -c 'import the submit command module'"
CLI_BUILT = "python -c 'import the submit command module; build its command'"
_IMPORT_SUBMIT = "from clusterjob.cli.app import app; import clusterjob.cli.submit"

SUBMITIT_CODE = """\
import submitit
from submitit.slurm.slurm import _make_sbatch_string
print(_make_sbatch_string(
    command="python train.py --lr 3e-4", folder="logs", job_name="train", partition="h100",
    time=2880, nodes=1, ntasks_per_node=1, cpus_per_gpu=8, gpus_per_node=8, gres="gpu:h100:8",
    mem_per_gpu="64G", account="ml", qos="normal",
))
"""


def submitit_python(*, install: bool) -> tuple[str | None, str]:
    """A Python with submitit importable, and how it was found (or why there is none)."""
    return bench_python(
        "submitit", ["submitit"], "CLUSTERJOB_BENCH_SUBMITIT_PYTHON", "venv", install=install
    )


# clusterjob's dependencies with the newest Typer instead of the pinned one (pyproject.toml)
NEW_TYPER = ["typer>=0.29", "jinja2", "ruamel.yaml", "ruamel.yaml.clib", "python-hostlist"]


def new_typer_python(*, install: bool) -> tuple[str | None, str]:
    """A Python whose Typer is the newest release: what the pin below 0.29 keeps out."""
    return bench_python(
        "typer", NEW_TYPER, "CLUSTERJOB_BENCH_NEW_TYPER_PYTHON", "typer-latest", install=install
    )


def bench_python(
    module: str, requirements: list[str], variable: str, name: str, *, install: bool
) -> tuple[str | None, str]:
    """$``variable``, else a venv at ~/.cache/clusterjob-bench/``name`` where ``module``
    imports, created with pip on a full run when missing; and how it was found (or why not)."""
    given = os.environ.get(variable)
    if given:
        return given, f"{module} from {given}"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    venv = cache / "clusterjob-bench" / name
    python = venv / "bin" / "python"
    ok = python.exists() and _imports(str(python), module)
    if not ok and install:
        try:
            subprocess.run(["python3", "-m", "venv", str(venv)], check=True, capture_output=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", *requirements],
                check=True,
                capture_output=True,
                timeout=600,
            )
            ok = _imports(str(python), module)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"{module} could not be installed ({type(exc).__name__}): not measured"
    if not ok:
        return None, f"{module} not installed (quick mode does not install it): not measured"
    version = subprocess.run(
        [str(python), "-c", f"import {module}; print({module}.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return str(python), f"{module} {version} in a separate venv ({venv})"


def _is_script(path: str | None) -> bool:
    try:
        with open(path or "", "rb") as fh:
            return fh.read(2) == b"#!"
    except OSError:
        return False


def _imports(python: str, module: str) -> bool:
    done = subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False)
    return done.returncode == 0


def run(work: Path, *, quick: bool) -> Result:
    result = Result("cli", "CLI latency")
    repeats = 3 if quick else 15
    cj = clusterjob_command()
    small, _ = write_site(work / "cli-sites", 10)
    script = work / "train.py"
    script.write_text("print('training')\n")
    env = dict(os.environ)
    env["CLUSTERJOB_DATA_DIR"] = str(work / "cli-data")  # leave the user's registry alone
    env["XDG_CACHE_HOME"] = str(work / "xdg-cache")  # template, site caches

    def submit(site: Path) -> list[str]:
        return [*cj, "submit", str(script), "--gpus", "8", "--model", "H100",
                "--site", str(site), "--dry-run"]  # fmt: skip

    commands = {
        REFERENCE_NAME: (list(REFERENCE), None),
        TYPER: ([PYTHON, "-c", "import typer"], None),
        DEPS: ([PYTHON, "-c", "import typer, jinja2"], None),
        CLI_MODULE: ([PYTHON, "-c", _IMPORT_SUBMIT], None),
        CLI_BUILT: (
            [PYTHON, "-c", f"{_IMPORT_SUBMIT}; import typer.main; typer.main.get_command(app)"],
            None,
        ),
        HELP: ([*cj, "--help"], env),
        DRY_RUN: (submit(small), env),
    }
    # the same run with the interpreter named: no python3 shim on PATH to ask (pyenv's is a
    # bash program that forks ~20 processes; see the note)
    commands[DRY_RUN_NAMED] = ([*submit(small), "--python", PYTHON], env)
    if not quick:
        large, _ = write_site(work / "cli-sites", 10_000)
        commands["clusterjob submit --dry-run (10,000-node site)"] = (submit(large), env)
    python, how = submitit_python(install=not quick)
    result.notes.append(how)
    shim = shutil.which("python3")
    result.notes.append(
        f"python3 on PATH: {shim}"
        + (" (a shim: submit runs it to name the job's interpreter)" if _is_script(shim) else "")
    )
    if python:
        commands[SUBMITIT] = ([python, "-c", SUBMITIT_CODE], None)
        commands["submitit venv: python -c pass"] = ([python, "-c", "pass"], None)
    newer, how = new_typer_python(install=not quick)
    result.notes.append(how)
    if newer:  # the pin's reason, measured: the same commands on the newest Typer
        here = str(Path(__file__).resolve().parents[1])  # this checkout's clusterjob
        env_newer = dict(env, PYTHONPATH=here)
        cj_newer = [newer, "-P", "-m", "clusterjob"]
        commands[NEWER_TYPER] = ([newer, "-c", "import typer"], None)
        commands[f"{HELP}, newest Typer"] = ([*cj_newer, "--help"], env_newer)
        commands[f"{DRY_RUN_NAMED}, newest Typer"] = (
            [*cj_newer, *submit(small)[len(cj) :], "--python", PYTHON],
            env_newer,
        )
    times = interleaved(commands, repeats)
    ref = median(times[REFERENCE_NAME])
    result.add(REFERENCE_NAME, ref * 1000, "ms", note=f"median of {repeats}")
    # each command against what it competes with: Typer's own import, submitit's script
    targets = {
        HELP: (TYPER, TARGET_HELP),
        DRY_RUN: (SUBMITIT, TARGET_DRY_RUN),
        DRY_RUN_NAMED: (SUBMITIT, None),
        DEPS: (SUBMITIT, None),
        f"{HELP}, newest Typer": (NEWER_TYPER, TARGET_HELP),
        f"{DRY_RUN_NAMED}, newest Typer": (DRY_RUN_NAMED, None),
    }
    for name, values in times.items():
        if name == REFERENCE_NAME:
            continue
        value = median(values)
        other, limit = targets.get(name, (REFERENCE_NAME, None))
        if other not in times:
            other, limit = REFERENCE_NAME, None
        if name.endswith("(10,000-node site)") and SUBMITIT in times:
            other = SUBMITIT
        result.compared(
            name,
            value,
            other,
            median(times[other]),
            limit,
            note=f"median of {repeats}; {value / ref:.2f}x {REFERENCE_NAME}",
        )
    if SUBMITIT in times:
        _shares(result, times, ref)
    return result


def _shares(result: Result, times: dict[str, list[float]], ref: float) -> None:
    """Where the named dry run's time goes, against submitit's whole run: the interpreter, and
    what is left (clusterjob's own imports and work). Typer, its building of the command and
    Jinja2 are not on this path (the fast path's option table, the compiled template)."""
    dry = median(times[DRY_RUN_NAMED])
    submitit = median(times[SUBMITIT])
    for figure, seconds in (
        ("the dry run (--python named): interpreter start", ref),
        ("the dry run (--python named): clusterjob's own imports and work", dry - ref),
    ):
        result.add(
            figure,
            seconds * 1000,
            "ms",
            ratio=seconds / submitit,
            reference=SUBMITIT,
            note=f"{seconds / dry:.0%} of the dry run; medians of the same interleaved run",
        )
