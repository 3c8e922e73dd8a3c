"""Before/after of a fix in one run: CLI latency of two git revisions, interleaved.

``python -m benchmarks.compare REV [REV ...] [--repeats N]``: each revision's
``clusterjob`` package is exported with ``git archive`` (``WORKTREE``: copied from this
checkout, uncommitted changes included) into a temporary directory and run
as ``python -m clusterjob`` from there, interleaved with ``python3 -c pass``, so both sides
see the same machine load.

``--prolog`` times ``clusterjob prolog`` instead (root only: the Prolog trusts root-owned
site files alone), warm cache, on an 8x H100 HGX stand-in node (18 NVLinks per GPU, NVSwitch
fabric registered) of a 10-node site. Every revision loads the same stand-in library, built
from this checkout (the driver is not what is compared). A revision is given the site with
every check turned on (each slot's ``nvlinks``, ``checks.driver_min``) when it accepts it,
else the same site without those keys; the output says which.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.cli import SUBMITIT, SUBMITIT_CODE, TYPER, submitit_python
from benchmarks.common import PYTHON, REFERENCE, REFERENCE_NAME, as_installed, interleaved, median
from benchmarks.prolog import NVML_CODE
from benchmarks.prolog import NVML_NAME as NVML
from benchmarks.sitegen import write_site

ROOT = Path(__file__).resolve().parents[1]


WORKTREE = "WORKTREE"  # a revision name: this checkout's files as they are now, uncommitted


def export(rev: str, dest: Path) -> Path:
    if rev == WORKTREE:  # a change measured before it is committed
        for name in ("clusterjob", "templates", "site_configs"):
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(ROOT / name, dest / name, ignore=ignore)
        as_installed(dest / "clusterjob")
        return dest
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "clusterjob", "templates", "site_configs"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    as_installed(dest / "clusterjob")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare")
    parser.add_argument("revisions", nargs="+", help="git revisions, oldest first")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--prolog", action="store_true", help="time `clusterjob prolog`")
    args = parser.parse_args(argv)
    if args.prolog:
        return compare_prolog(args.revisions, args.repeats)
    with tempfile.TemporaryDirectory(prefix="clusterjob-compare-") as tmp:
        work = Path(tmp)
        site, _ = write_site(work / "sites", 10)
        script = work / "train.py"
        script.write_text("")
        commands: dict[str, tuple[list[str], dict[str, str] | None]] = {
            REFERENCE_NAME: (list(REFERENCE), None),
            TYPER: ([PYTHON, "-c", "import typer"], None),
        }
        submitit, _how = submitit_python(install=False)
        if submitit:
            commands[SUBMITIT] = ([submitit, "-c", SUBMITIT_CODE], None)
        for label in args.revisions:
            rev = label
            env = dict(os.environ, PYTHONPATH=str(export(rev, work / label)))
            env["CLUSTERJOB_SERVER"] = "0"  # each revision in a process of its own per run
            env["CLUSTERJOB_DATA_DIR"] = str(work / "data")
            env["XDG_CACHE_HOME"] = str(work / "xdg-cache")  # template, site caches
            cj = [PYTHON, "-P", "-m", "clusterjob"]  # -P: not the checkout in the cwd
            commands[f"{label}: --help"] = ([*cj, "--help"], env)
            submit = [*cj, "submit", str(script), "--gpus", "8", "--model", "H100",
                      "--site", str(site), "--dry-run"]  # fmt: skip
            commands[f"{label}: submit --dry-run"] = (submit, env)
            # the interpreter named: no python3 shim on PATH to ask (see benchmarks/cli.py)
            commands[f"{label}: submit --dry-run --python"] = ([*submit, "--python", PYTHON], env)
        times = interleaved(commands, args.repeats)
    _print(times, args.repeats, {": --help": TYPER, ": submit --dry-run": SUBMITIT})
    return 0


def _print(times: dict[str, list[float]], repeats: int, references: dict[str, str]) -> None:
    """Each median, its ratio to ``python3 -c pass`` and to its own reference (by suffix)."""
    ref = median(times[REFERENCE_NAME])
    print(f"median of {repeats}, load average {os.getloadavg()}")
    for name, values in times.items():
        value = median(values)
        line = f"  {name:<70} {value * 1000:7.1f} ms  {value / ref:5.2f}x"
        for suffix, other in references.items():
            if suffix in name and other in times:
                line += f"  {value / median(times[other]):5.2f}x {other}"
        print(line)


def compare_prolog(revisions: list[str], repeats: int) -> int:
    from benchmarks.common import run_timed
    from benchmarks.prolog import prolog_env, standin_lib, trusted_work
    from benchmarks.sitegen import BUS_IDS
    from clusterjob.sandbox.standin import StandinScenario, gpus_on_buses, h100, write_scenario

    if os.geteuid() != 0:
        print("--prolog: run as root (the Prolog only trusts root-owned site files)")
        return 2
    with tempfile.TemporaryDirectory(prefix="clusterjob-compare-") as tmp:
        work = trusted_work(Path(tmp))
        lib = standin_lib(work)
        plain, node = write_site(work / "sites", 10)
        full = plain.with_name("site-10-all-checks.yaml")
        text = plain.read_text()
        for bus in BUS_IDS["H100"]:
            text = text.replace(
                f'{{model: H100, bus_id: "{bus}"}}',
                f'{{model: H100, bus_id: "{bus}", nvlinks: 18}}',
            )
        full.write_text(text + 'checks:\n  driver_min: "535.104.05"\n')
        full.chmod(0o644)
        scenario = write_scenario(
            work / "scenario.txt",
            StandinScenario(gpus=gpus_on_buses(h100, BUS_IDS["H100"], node=node)),
        )
        commands: dict[str, tuple[list[str], dict[str, str] | None]] = {
            REFERENCE_NAME: (list(REFERENCE), None)
        }
        for label in revisions:
            env = prolog_env(lib, scenario, node)
            env["PYTHONPATH"] = str(export(label, Path(tmp) / label))
            cache = work / f"cache-{label}"
            cache.mkdir(mode=0o755)
            site, note = full, "all checks"
            base = [PYTHON, "-P", "-m", "clusterjob", "prolog", "--cache-dir", str(cache)]
            try:  # also fills the cache: what follows is the warm Prolog
                run_timed([*base, "--site", str(full)], env)
            except RuntimeError:
                site, note = plain, "without nvlinks/checks keys (refused by this revision)"
                run_timed([*base, "--site", str(site)], env)
            commands[f"{label}: prolog ({note})"] = ([*base, "--site", str(site)], env)
            commands.setdefault(NVML, ([PYTHON, "-c", NVML_CODE], env))
        times = interleaved(commands, repeats)
    _print(times, repeats, {": prolog": NVML})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
