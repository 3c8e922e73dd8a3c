"""What ``clusterjob status`` does with its options, and the table it prints, without Typer.

The options are declared once, for Typer, in ``clusterjob.cli.jobs``, whose ``status``
passes them all here by name; the fast path (``clusterjob.cli.fastpath``) calls
``run_status`` the same way for the usual command lines.
"""

from __future__ import annotations

import json
import sys
import time

from clusterjob.cli.common import the_cluster
from clusterjob.errors import UsageError, printable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from clusterjob.jobs.status import JobStatus


def run_status(
    *,
    job: list[str] | None,
    as_json: bool,
    show_all: bool,
    tasks: bool,
    state: str | None,
    name: str | None,
    since: str | None,
    watch: bool,
    interval: float,
    fix_registry: bool,
) -> None:
    """State of the jobs clusterjob submitted: one squeue (and sacct) call for all of them."""
    from clusterjob.jobs import status as job_status
    from clusterjob.jobs.registry import repair

    if fix_registry:
        moved = repair()
        print(f"job registry moved aside to {moved}" if moved else "job registry is fine")
        return
    wanted = job_status.StatusFilter.parse(state=state, name=name, since=since)
    if watch and interval <= 0:
        raise UsageError("--interval must be a positive number of seconds")
    cluster = the_cluster()

    def show() -> None:
        rows = wanted.apply(
            cluster.status(job or (), show_all=show_all or wanted.since is not None, tasks=tasks)
        )
        if as_json:
            print(json.dumps([r.to_dict() for r in rows], indent=2))
        elif rows:
            print(_table(rows))
        else:
            print("no tracked jobs (see --all for finished ones)", file=sys.stderr)

    if not watch:
        show()
        return
    clear = "\033[H\033[2J" if sys.stdout.isatty() else ""
    while True:  # ends with Ctrl-C (exit 130)
        sys.stdout.write(clear + time.strftime("%H:%M:%S") + f"  every {interval:g}s\n")
        show()
        sys.stdout.flush()
        time.sleep(interval)


def _table(rows: list[JobStatus]) -> str:
    shown: list[JobStatus] = []
    for r in rows:
        shown.append(r)
        shown.extend(r.tasks)
    params = any(r.params for r in shown)
    headers: tuple[str, ...] = ("JOBID", "STATE", "NAME", "NODES", "GPUS", "TIME", "SITE", "REASON")
    headers += ("PARAMS",) if params else ()
    lines = [
        (
            r.job_id,
            r.state + (f" ({r.exit_code})" if r.exit_code not in (None, 0) else ""),
            r.name,
            r.nodes or "-",
            r.gpus or "-",
            r.elapsed or "-",
            r.site or "-",
            r.reason or "",
        )
        + ((r.params or "",) if params else ())
        for r in shown
    ]
    # Names, reasons and comments are Slurm's text, the job owner's or an admin's words.
    lines = [tuple(printable(str(c)) for c in cells) for cells in lines]
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *lines, strict=False)]
    out = []
    for cells in (headers, *lines):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    notes = [printable(f"{r.job_id}: {r.explanation}") for r in shown if r.explanation]
    notes += [printable(f"{r.job_id}: {n}") for r in rows if (n := _idle_note(r))]
    return "\n".join(out + notes)


def _idle_note(row: JobStatus) -> str | None:
    from clusterjob.jobs.usage import idle_note

    return idle_note(row.gpu_usage)
