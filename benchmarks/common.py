"""Shared helpers: interleaved timing against a reference, the machine line, result rows."""

from __future__ import annotations

import functools
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

PYTHON = sys.executable
REFERENCE = (PYTHON, "-c", "pass")  # the floor: starting the same interpreter, doing nothing
REFERENCE_NAME = "python3 -c pass"


def clusterjob_command() -> list[str]:
    """The installed ``clusterjob`` console script (what slurm.conf and users run).

    A pyenv-style shim on PATH is skipped: it is a shell wrapper, not part of clusterjob.
    """
    beside = Path(PYTHON).with_name("clusterjob")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("clusterjob")
    return [found] if found else [PYTHON, "-m", "clusterjob"]


def as_installed(*package_dirs: Path) -> None:
    """Run every child from bytecode, as an installed wheel does (pip compiles each module at
    install time). A shell with PYTHONDONTWRITEBYTECODE=1 would otherwise make each measured
    run compile clusterjob's ~60 modules from source again: about 50 ms no installed copy pays,
    charged to clusterjob alone (its dependencies in the virtualenv are compiled)."""
    import compileall

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    if not package_dirs:
        import clusterjob

        package_dirs = (Path(clusterjob.__file__).parent,)
    for directory in package_dirs:
        compileall.compile_dir(str(directory), quiet=1)


@dataclass
class Row:
    """One figure: what was measured, its value, and the ratio against the run's reference."""

    benchmark: str
    figure: str
    value: float
    unit: str
    ratio: float | None = None  # value / reference value (None: a count, not a time)
    reference: str | None = None
    target: str | None = None
    met: bool | None = None
    note: str = ""


@dataclass
class Result:
    """What one benchmark produced."""

    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, figure: str, value: float, unit: str, **kw: object) -> Row:
        row = Row(self.name, figure, value, unit, **kw)  # type: ignore[arg-type]
        self.rows.append(row)
        return row

    def compared(
        self,
        figure: str,
        seconds: float,
        reference: str,
        reference_seconds: float,
        limit: float | None = None,
        note: str = "",
    ) -> Row:
        """A time in ms, its ratio to ``reference`` and, with ``limit``, the target it meets."""
        ratio = seconds / reference_seconds
        return self.add(
            figure,
            seconds * 1000,
            "ms",
            ratio=ratio,
            reference=reference,
            target=f"<= {limit}x" if limit is not None else None,
            met=ratio <= limit if limit is not None else None,
            note=note,
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "title": self.title,
            "rows": [asdict(r) for r in self.rows],
            "notes": self.notes,
        }


def run_timed(
    cmd: Sequence[str], env: Mapping[str, str] | None = None, *, check: bool = True
) -> float:
    """Wall seconds of one run of ``cmd``; output discarded. Raises on a non-zero exit."""
    start = time.perf_counter()
    done = subprocess.run(
        list(cmd),
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.decode(errors='replace')}"
        )
    return elapsed


def interleaved(
    commands: Mapping[str, tuple[Sequence[str], Mapping[str, str] | None]],
    repeats: int,
    *,
    warmup: int = 1,
) -> dict[str, list[float]]:
    """Run every command ``repeats`` times, in a shuffled order each round.

    Interleaving spreads the noise of a shared machine (another process taking a core for a
    second) over every command alike instead of charging it to whichever ran then.
    """
    for _ in range(warmup):  # page cache, .pyc files
        for cmd, env in commands.values():
            run_timed(cmd, env)
    runs = {name: functools.partial(run_timed, cmd, env) for name, (cmd, env) in commands.items()}
    return interleaved_runs(runs, repeats, random.Random(1))


def interleaved_runs(
    runs: Mapping[str, Callable[[], float]], repeats: int, rng: random.Random
) -> dict[str, list[float]]:
    """``interleaved`` of anything timed (a label and what times one run of it: several
    commands summed, ...): ``repeats`` rounds, each in a new order drawn from ``rng``."""
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(repeats):
        order = list(runs)
        rng.shuffle(order)
        for label in order:
            times[label].append(runs[label]())
    return times


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def machine_line() -> dict[str, object]:
    """What the figures were measured on (they are ratios, but load still matters)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "load_average": load,
    }


def controller_jobs(env: Mapping[str, str] | None = None) -> int | None:
    """How many jobs the local Slurm controller holds (a pending array counts once); None
    where squeue does not answer. ``squeue`` and ``sbatch`` take longer the more it holds
    (``squeue --jobs`` reads the whole job table), so a ratio against them is read with it."""
    try:
        done = subprocess.run(
            ["squeue", "--noheader", "--states=all", "--format=%i"],
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return len(done.stdout.splitlines()) if done.returncode == 0 else None


def within(value: float, limit: float) -> bool:
    return value <= limit


class CommandServer:
    """A command server of its own for the served rows (``clusterjob.cli.server``): an
    environment whose ``submit`` and ``status`` go to it, in a private runtime directory with
    a short path (a socket's path has at most 107 bytes), and what it ran, from its log. Every
    other row runs with ``CLUSTERJOB_SERVER=0`` (``python -m benchmarks`` sets it): a fresh
    process per command, as before the server."""

    def __init__(self, env: Mapping[str, str]) -> None:
        import tempfile

        self.directory = Path(tempfile.mkdtemp(prefix="cjb-", dir="/tmp"))
        self.env = dict(env, CLUSTERJOB_SERVER="1", CLUSTERJOB_RUNTIME_DIR=str(self.directory))

    def __enter__(self) -> CommandServer:
        """Start it (the command that does runs alone) and wait until it listens."""
        subprocess.run([*clusterjob_command(), "status", "--help"], env=self.env,
                       capture_output=True, check=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while not list(self.directory.glob("server-????????")):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no command server started in {self.directory}")
            time.sleep(0.05)
        return self

    def served(self, command: str, expected: int) -> int:
        """How many ``command`` runs the server ran to an exit status of 0 (waiting a moment
        for ``expected``: it logs a command once it has reaped its worker)."""
        deadline = time.monotonic() + 2
        while True:
            logs = "".join(p.read_text() for p in self.directory.glob("server-*.log"))
            count = logs.count(f": {command}, exit 0\n")
            if count >= expected or time.monotonic() > deadline:
                return count
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)  # its socket gone, the server ends


def time_round(
    order: Sequence[tuple[str, Sequence[str], Mapping[str, str]]], times: dict[str, list[float]]
) -> None:
    """Run each ``(label, command, environment)`` once, in this order, adding its wall seconds
    to ``times[label]``; output captured, a non-zero exit raised with its stderr."""
    for label, cmd, env in order:
        start = time.perf_counter()
        done = subprocess.run(list(cmd), env=dict(env), capture_output=True, text=True, check=False)
        times[label].append(time.perf_counter() - start)
        if done.returncode != 0:
            raise RuntimeError(f"{label} failed ({done.returncode}): {done.stderr}")
