"""Commands: status, logs, cancel, resubmit (registered on the app in clusterjob.cli)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from clusterjob.cli.app import app
from clusterjob.cli.common import the_cluster
from clusterjob.cli.options import SiteOption
from clusterjob.cli.status_report import run_status
from clusterjob.errors import UsageError, printable

if TYPE_CHECKING:  # imported where used: `clusterjob --help` need not load sqlite and Slurm
    pass


@app.command()
def status(
    job: Annotated[
        list[str] | None,
        typer.Argument(help="Job ids (or `last`, `last~N`, ID_TASK); default: tracked jobs."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list, for scripts.")] = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="Every job clusterjob ever submitted.")
    ] = False,
    tasks: Annotated[
        bool, typer.Option("--tasks", help="List each task of an array (and its parameters).")
    ] = False,
    state: Annotated[
        str | None, typer.Option("--state", help="Only jobs in these states, e.g. FAILED,RUNNING.")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Only jobs whose name matches (glob, e.g. 'lr*').")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help="Only jobs submitted since: 30m, 2h, 3d or 2026-12-01[T10:00]."
        ),
    ] = None,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch", "-w", help="Refresh in place every --interval seconds (Ctrl-C ends)."
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between --watch refreshes.")
    ] = 10.0,
    fix_registry: Annotated[
        bool,
        typer.Option("--repair", help="Move an unreadable job registry aside, start a new one."),
    ] = False,
) -> None:
    """State of the jobs clusterjob submitted: one squeue (and sacct) call for all of them."""
    return run_status(**locals())


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="Job id (ID_TASK for an array task) or `last`.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
    err: Annotated[bool, typer.Option("--err", help="The job's stderr file, not stdout.")] = False,
    task: Annotated[
        int | None, typer.Option("--task", help="The array task whose output to print.")
    ] = None,
    rank: Annotated[
        int | None,
        typer.Option("--rank", help="Only this rank's lines (torchrun worker or srun task)."),
    ] = None,
    node: Annotated[str | None, typer.Option("--node", help="Only this node's lines.")] = None,
) -> None:
    """Print a job's output file (Slurm's own path for it)."""
    from clusterjob.jobs import logs as job_logs

    cluster = the_cluster()
    path = cluster.output_path(job, stderr=err, task=task)
    name = job if task is None else f"{job}_{task}"
    if rank is not None or node is not None:
        if follow:
            raise UsageError("--rank/--node print what is there: drop --follow")
        layout = job_logs.rank_layout(name, registry=cluster.registry(), client=cluster.client())
        text = cluster.read_log(path)
        if text is None:
            raise UsageError(f"{path} does not exist (yet): the job may not have started")
        sys.stdout.write(job_logs.select_lines(text, layout, rank=rank, node=node))
        return
    if not follow:
        text = cluster.read_log(path)
        if text is None:
            raise UsageError(f"{path} does not exist (yet): the job may not have started")
        sys.stdout.write(text)
        return
    print(printable(f"==> {path} <=="), file=sys.stderr)
    for chunk in cluster.follow(job, stderr=err, task=task):
        sys.stdout.write(chunk)
        sys.stdout.flush()


@app.command()
def wait(
    job: Annotated[list[str], typer.Argument(help="Job ids (or `last`).")],
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="Give up after this many seconds (exit 124)."),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between looks at Slurm.")
    ] = 10.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing.")] = False,
) -> None:
    """Wait until the jobs end; exit with the job's exit code (an array: non-zero if any task
    failed; several jobs: the first non-zero), 125 when a job will never start (a dependency
    that failed)."""
    result = the_cluster().wait(job, timeout=timeout, interval=interval)
    if not quiet:
        shown = printable(str(result), lines=True)
        print(shown, file=sys.stdout if result.ended else sys.stderr)
    raise typer.Exit(result.exit_code)


@app.command()
def cancel(job: Annotated[list[str], typer.Argument(help="Job ids (or `last`).")]) -> None:
    """Cancel jobs (one scancel call)."""
    ids = the_cluster().cancel(job)
    print(f"cancel requested for {', '.join(ids)}")


@app.command(context_settings={"allow_interspersed_args": True})
def resubmit(
    job: Annotated[
        str, typer.Argument(help="Job id, `last`, or ID_TASK: that task of an array alone.")
    ],
    args: Annotated[
        list[str] | None,
        typer.Argument(help="New arguments for the script (after --), replacing the old ones."),
    ] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs per node.")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="GPU model.")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", "-t", help="Time limit.")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", "-N", help="Nodes.")] = None,
    partition: Annotated[
        str | None, typer.Option("--partition", "-p", help="Slurm partition.")
    ] = None,
    array: Annotated[
        str | None, typer.Option("--array", help="Other array tasks, e.g. 0-9%2 (or %N).")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="KEY=VALUE exported in the job, over the recorded one."),
    ] = None,
    venv: Annotated[
        str | None,
        typer.Option("--venv", help="Run in this virtual environment instead (DIR/bin/python)."),
    ] = None,
    failed: Annotated[
        bool,
        typer.Option(
            "--failed",
            help="Only an array's tasks that failed, were cancelled or timed out (one new array).",
        ),
    ] = False,
    same_script: Annotated[
        bool,
        typer.Option("--same-script", help="Replay the recorded script byte for byte (new token)."),
    ] = False,
    site: SiteOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the new job as JSON.")] = False,
    parsable: Annotated[bool, typer.Option("--parsable", help="Print the job id only.")] = False,
) -> None:
    """Submit a recorded job again from its directory: re-rendered from the recorded request
    with today's site and templates (and any changes), or --same-script."""
    from clusterjob.jobs import submit as job_submit

    changes = job_submit.Changes(
        tuple(args or ()), gpus, model, time_limit, nodes, partition, array, tuple(env or ()), venv
    )
    result = the_cluster(site).resubmit(
        job, changes=changes, same_script=same_script, failed=failed
    )
    if as_json:
        print(json.dumps(result.to_dict()))
    elif parsable:
        print(result.job_id)
    else:
        print(result)


@app.command()
def show(
    job: Annotated[str, typer.Argument(help="Job id or `last`.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for scripts.")] = False,
) -> None:
    """Where a job came from: command line, directory, git commit, site, token, script."""
    info = the_cluster().provenance(job)
    if as_json:
        print(json.dumps(info, indent=2))
        return
    commit = info["git_commit"] or "-"
    if info["git_dirty"]:
        commit = f"{commit} (dirty: uncommitted changes)"
    rows = [
        ("job", f"{info['job_id']} on cluster {info['cluster'] or '?'} ({info['state']})"),
        ("submitted", info["submitted"]),
        ("command line", info["command_line"]),
        ("working dir", info["work_dir"]),
        ("git commit", commit),
        ("site", info["site"]),
        ("token", info["token"]),
        ("script", info["script_path"]),
        (_submit_label(str(info["sbatch_command"])), info["sbatch_command"]),
    ]
    if info["python"]:
        rows.append(("python", f"{info['python']} ({info['python_why']})"))
    if info["resubmit_of"]:
        rows.append(("resubmit of", info["resubmit_of"]))
    if info["requeue_limit_reached"]:
        rows.append(("requeues", info["requeue_limit_reached"]))
    elif info["max_requeues"] is not None:
        rows.append(("requeues", f"{info['restarts'] or 0} so far, at most {info['max_requeues']}"))
    if info["hardware"]:
        rows.append(("hardware", f"{info['hardware']} during the job, not your program"))
    rows += [("gpu usage" if i == 0 else "", line) for i, line in enumerate(_usage(info))]
    print("\n".join(f"{k + ':' if k else '':<16}{printable(str(v))}" for k, v in rows))


def _submit_label(command: str) -> str:
    """``sbatch command`` or ``qsub command``: the row named by the program it runs."""
    return f"{command.split(' ', 1)[0]} command"


def _usage(info: dict[str, object]) -> list[str]:
    """``show``'s GPU usage lines: figures, idle flag and sparkline per GPU (jobs.usage)."""
    from clusterjob.jobs.usage import GpuUsage, usage_lines

    raw = info.get("gpu_usage")
    usage = [GpuUsage(**u) for u in raw if isinstance(u, dict)] if isinstance(raw, list) else []
    return usage_lines(usage)
