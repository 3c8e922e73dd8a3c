"""CLI latency: ``clusterjob --help`` and ``clusterjob submit ... --dry-run``, beside submitit.

submitit builds an sbatch script in-process; the comparison is the same job (8 H100 on one
node, partition, account, qos, CPUs and memory per GPU) built by ``submitit``'s own
``_make_sbatch_string`` in a fresh interpreter. submitit is installed in a separate virtual
environment (never a clusterjob dependency): $CLUSTERJOB_BENCH_SUBMITIT_PYTHON, else
~/.cache/clusterjob-bench/venv, created with pip on a full run when missing.
"""

from __future__ import annotations

import os
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

TARGET_HELP = 1.3  # clusterjob --help / python -c "import typer"
TARGET_DRY_RUN = 1.0  # clusterjob submit --dry-run / submitit building the same script
TYPER = "python -c 'import typer'"
SUBMITIT = "submitit: import + _make_sbatch_string"
HELP = "clusterjob --help"
DRY_RUN = "clusterjob submit --dry-run (10-node site)"

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
    given = os.environ.get("CLUSTERJOB_BENCH_SUBMITIT_PYTHON")
    if given:
        return given, f"submitit from {given}"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    venv = cache / "clusterjob-bench" / "venv"
    python = venv / "bin" / "python"
    ok = python.exists() and _has_submitit(str(python))
    if not ok and install:
        try:
            subprocess.run(["python3", "-m", "venv", str(venv)], check=True, capture_output=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "submitit"],
                check=True,
                capture_output=True,
                timeout=600,
            )
            ok = _has_submitit(str(python))
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"submitit could not be installed ({type(exc).__name__}): not measured"
    if not ok:
        return None, "submitit not installed (quick mode does not install it): not measured"
    version = subprocess.run(
        [str(python), "-c", "import submitit; print(submitit.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return str(python), f"submitit {version} in a separate venv ({venv})"


def _has_submitit(python: str) -> bool:
    done = subprocess.run([python, "-c", "import submitit"], capture_output=True, check=False)
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

    def submit(site: Path) -> list[str]:
        return [*cj, "submit", str(script), "--gpus", "8", "--model", "H100",
                "--site", str(site), "--dry-run"]  # fmt: skip

    commands = {
        REFERENCE_NAME: (list(REFERENCE), None),
        TYPER: ([PYTHON, "-c", "import typer"], None),
        HELP: ([*cj, "--help"], env),
        DRY_RUN: (submit(small), env),
    }
    if not quick:
        large, _ = write_site(work / "cli-sites", 10_000)
        commands["clusterjob submit --dry-run (10,000-node site)"] = (submit(large), env)
    python, how = submitit_python(install=not quick)
    result.notes.append(how)
    if python:
        commands[SUBMITIT] = ([python, "-c", SUBMITIT_CODE], None)
        commands["submitit venv: python -c pass"] = ([python, "-c", "pass"], None)
    times = interleaved(commands, repeats)
    ref = median(times[REFERENCE_NAME])
    result.add(REFERENCE_NAME, ref * 1000, "ms", note=f"median of {repeats}")
    # each command against what it competes with: Typer's own import, submitit's script
    targets = {HELP: (TYPER, TARGET_HELP), DRY_RUN: (SUBMITIT, TARGET_DRY_RUN)}
    for name, values in times.items():
        if name == REFERENCE_NAME:
            continue
        value = median(values)
        other, limit = targets.get(name, (REFERENCE_NAME, None))
        if other not in times:
            other, limit = REFERENCE_NAME, None
        ratio = value / median(times[other])
        result.add(
            name,
            value * 1000,
            "ms",
            ratio=ratio,
            reference=other,
            target=f"<= {limit}x" if limit else None,
            met=ratio <= limit if limit else None,
            note=f"median of {repeats}; {value / ref:.2f}x {REFERENCE_NAME}",
        )
    return result
