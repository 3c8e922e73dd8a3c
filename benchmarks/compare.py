"""Before/after of a fix in one run: CLI latency of two git revisions, interleaved.

``python -m benchmarks.compare REV [REV ...] [--repeats N]``: each revision's
``clusterjob`` package is exported with ``git archive`` into a temporary directory and run
as ``python -m clusterjob`` from there, interleaved with ``python3 -c pass``, so both sides
see the same machine load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import PYTHON, REFERENCE, REFERENCE_NAME, interleaved, median
from benchmarks.sitegen import write_site

ROOT = Path(__file__).resolve().parents[1]


def export(rev: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "clusterjob", "templates", "site_configs"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare")
    parser.add_argument("revisions", nargs="+", help="git revisions, oldest first")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="clusterjob-compare-") as tmp:
        work = Path(tmp)
        site, _ = write_site(work / "sites", 10)
        script = work / "train.py"
        script.write_text("")
        commands: dict[str, tuple[list[str], dict[str, str] | None]] = {
            REFERENCE_NAME: (list(REFERENCE), None)
        }
        for label in args.revisions:
            rev = label
            env = dict(os.environ, PYTHONPATH=str(export(rev, work / label)))
            env["CLUSTERJOB_DATA_DIR"] = str(work / "data")
            cj = [PYTHON, "-P", "-m", "clusterjob"]  # -P: not the checkout in the cwd
            commands[f"{label}: --help"] = ([*cj, "--help"], env)
            commands[f"{label}: submit --dry-run"] = (
                [*cj, "submit", str(script), "--gpus", "8", "--model", "H100",
                 "--site", str(site), "--dry-run"],
                env,
            )  # fmt: skip
        times = interleaved(commands, args.repeats)
    ref = median(times[REFERENCE_NAME])
    print(f"median of {args.repeats}, load average {os.getloadavg()}")
    for name, values in times.items():
        print(f"  {name:<34} {median(values) * 1000:7.0f} ms  {median(values) / ref:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
