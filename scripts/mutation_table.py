"""Rewrite the "Latest score per target" table of benchmarks/results/mutation.md from its
"Runs" table: the last run of each target, as mutmut counted it (scripts/mutation.sh runs
this after each target; nothing here is computed by hand).

Usage: python scripts/mutation_table.py benchmarks/results/mutation.md [TARGET ...]

With targets named (scripts/mutation.sh names all of its own), the table has those only: a
target split or removed keeps its runs in the "Runs" table, not a row among the latest.
"""

from __future__ import annotations

import sys
from pathlib import Path

HEAD = "## Latest score per target"


def latest_table(text: str, targets: list[str] | None = None) -> str:
    runs = text[text.index("## Runs") :]
    latest: dict[str, list[str]] = {}
    for line in runs.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 10 or not cells[0][:1].isdigit():
            continue
        if targets is None or cells[1] in targets:
            latest[cells[1]] = cells  # dict order: each target where it first ran
    rows = [
        "| target | mutants | killed | survived | no tests | timeout | score | run (UTC) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for target, c in latest.items():
        when, _, _, mutants, killed, survived, no_tests, timeout, score, _ = c
        rows.append(
            f"| {target} | {mutants} | {killed} | {survived} | {no_tests} | {timeout} "
            f"| {score} | {when} |"
        )
    return "\n".join(rows)


def main(path: Path, targets: list[str] | None = None) -> None:
    text = path.read_text()
    if HEAD not in text:
        return
    start = text.index(HEAD) + len(HEAD)
    end = text.index("\n## ", start)
    text = text[:start] + "\n\n" + latest_table(text, targets) + "\n" + text[end:]
    path.write_text(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:] or None)
