"""Commands: status, logs, cancel, resubmit (registered on the app in clusterjob.cli)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from clusterjob.cli import app
from clusterjob.errors import UsageError

if TYPE_CHECKING:  # imported where used: `clusterjob --help` need not load sqlite and Slurm
    from clusterjob.jobs.status import JobStatus


def _table(rows: list[JobStatus]) -> str:
    headers = ("JOBID", "STATE", "NAME", "NODES", "GPUS", "TIME", "SITE", "REASON")
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
        for r in rows
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *lines, strict=False)]
    out = []
    for cells in (headers, *lines):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    notes = [f"{r.job_id}: {r.explanation}" for r in rows if r.explanation]
    return "\n".join(out + notes)


@app.command()
def status(
    job: Annotated[
        list[str] | None, typer.Argument(help="Job ids (or `last`); default: tracked jobs.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list, for scripts.")] = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="Every job clusterjob ever submitted.")
    ] = False,
    fix_registry: Annotated[
        bool,
        typer.Option("--repair", help="Move an unreadable job registry aside, start a new one."),
    ] = False,
) -> None:
    """State of the jobs clusterjob submitted: one squeue (and sacct) call for all of them."""
    from clusterjob.jobs import status as job_status
    from clusterjob.jobs.registry import repair

    if fix_registry:
        moved = repair()
        print(f"job registry moved aside to {moved}" if moved else "job registry is fine")
        return
    rows = job_status.status(job or (), show_all=show_all)
    if as_json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    elif rows:
        print(_table(rows))
    else:
        print("no tracked jobs (see --all for finished ones)", file=sys.stderr)


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="Job id or `last`.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
    err: Annotated[bool, typer.Option("--err", help="The job's stderr file, not stdout.")] = False,
) -> None:
    """Print a job's output file (Slurm's own path for it)."""
    from clusterjob.jobs import logs as job_logs

    path = job_logs.output_path(job, stderr=err)
    if not follow:
        if not path.exists():
            raise UsageError(f"{path} does not exist (yet): the job may not have started")
        sys.stdout.write(path.read_text(errors="replace"))
        return
    print(f"==> {path} <==", file=sys.stderr)
    for chunk in job_logs.follow(path, finished=lambda: job_logs.is_finished(job)):
        sys.stdout.write(chunk)
        sys.stdout.flush()


@app.command()
def cancel(job: Annotated[list[str], typer.Argument(help="Job ids (or `last`).")]) -> None:
    """Cancel jobs (one scancel call)."""
    from clusterjob.jobs import cancel as job_cancel

    ids = job_cancel.cancel(job)
    print(f"cancel requested for {', '.join(ids)}")


@app.command()
def resubmit(job: Annotated[str, typer.Argument(help="Job id or `last`.")]) -> None:
    """Submit a recorded job's script again, from the directory it was first submitted in."""
    from clusterjob.jobs import submit as job_submit

    print(job_submit.resubmit(job))
