"""Command: submit, its options as Typer declares them (registered on the app in
clusterjob.cli.app); what it does is ``clusterjob.cli.submitting``, which the fast path calls
directly.

clusterjob's options may stand before or after SCRIPT (``clusterjob submit train.py --gpus 2
--model A100``); arguments for SCRIPT that look like options go after ``--``
(``clusterjob submit train.py --gpus 2 -- --lr 3e-4``) and are passed on unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from clusterjob.cli.app import app
from clusterjob.cli.options import ModelOption, PartitionOption, SiteOption
from clusterjob.cli.submitting import run_submit


@app.command(
    no_args_is_help=True,
)
def submit(
    script: Annotated[
        str | None,
        typer.Argument(
            # Optional to click, needed by the command: `submit -- CMD ARGS` gives no SCRIPT
            # (CMD takes its place), and help should not say `[required]` of it.
            metavar="SCRIPT | -- CMD",
            help="A .py script (run with the job's Python), or after -- any command: "
            "an executable, bash run.sh, python -m pkg, accelerate launch ...",
            show_default=False,
        ),
    ] = None,
    args: Annotated[
        list[str] | None,
        typer.Argument(help="Arguments for SCRIPT, passed unchanged.", show_default=False),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(
            "--gpus", help="GPUs per node (0 or none: a CPU-only job).", show_default=False
        ),
    ] = None,
    model: ModelOption = None,
    nodes: Annotated[int, typer.Option("--nodes", "-N", help="Nodes, each with --gpus GPUs.")] = 1,
    partition: PartitionOption = None,
    time: Annotated[
        str | None, typer.Option("--time", "-t", help="Time limit, e.g. 1-00:00:00.")
    ] = None,
    account: Annotated[
        str | None, typer.Option("--account", "-A", help="Slurm account to charge.")
    ] = None,
    qos: Annotated[str | None, typer.Option("--qos", help="Slurm quality of service.")] = None,
    cpus_per_gpu: Annotated[
        int | None, typer.Option("--cpus-per-gpu", help="CPUs per GPU.")
    ] = None,
    mem_per_gpu: Annotated[str | None, typer.Option("--mem-per-gpu", help="e.g. 64G")] = None,
    job_name: Annotated[
        str | None, typer.Option("--job-name", "-J", help="Slurm job name.")
    ] = None,
    array: Annotated[str | None, typer.Option("--array", help="e.g. 0-9%2")] = None,
    dependency: Annotated[
        str | None,
        typer.Option("--dependency", "-d", help="Start after other jobs, e.g. afterok:123."),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="The job's stdout file (Slurm's %j patterns)."),
    ] = None,
    error: Annotated[
        str | None,
        typer.Option("--error", "-e", help="The job's stderr file (default: with stdout)."),
    ] = None,
    signal: Annotated[
        str | None,
        typer.Option("--signal", help="Warn the job before its time limit, e.g. B:USR1@90."),
    ] = None,
    requeue: Annotated[bool, typer.Option("--requeue", help="Let Slurm requeue the job.")] = False,
    max_requeues: Annotated[
        int | None,
        typer.Option(
            "--max-requeues",
            help="Requeues allowed (preemption, node failure, --requeue); an attempt past them "
            "stops at once and says so. Default: the site's, else 3.",
            show_default=False,
        ),
    ] = None,
    exclude: Annotated[
        str | None, typer.Option("--exclude", "-x", help="Nodes not to use, e.g. gpu[01-03].")
    ] = None,
    avoid: Annotated[
        bool,
        typer.Option(
            "--avoid/--no-avoid",
            help="Add the nodes of your avoid list (`clusterjob nodes`: a failed preflight, "
            "node failure or GPU fault there, within 24h) to --exclude.",
        ),
    ] = True,
    retry_bad_node: Annotated[
        int,
        typer.Option(
            "--retry-bad-node",
            help="When the job fails its preflight, its node fails or its GPU faults, submit "
            "it again without that node, at most N times (done by `clusterjob wait`).",
            metavar="N",
        ),
    ] = 0,
    nodelist: Annotated[
        str | None, typer.Option("--nodelist", "-w", help="Nodes the job must use.")
    ] = None,
    mail_type: Annotated[
        str | None, typer.Option("--mail-type", help="Mail on these events, e.g. END,FAIL.")
    ] = None,
    mail_user: Annotated[
        str | None, typer.Option("--mail-user", help="Mail address (default: the submitter).")
    ] = None,
    constraint: Annotated[
        str | None, typer.Option("--constraint", "-C", help="Node features, e.g. ib&nvme.")
    ] = None,
    gres: Annotated[
        list[str] | None,
        typer.Option(
            "--gres",
            help="Another GRES for the job, e.g. nvme:10 (repeatable); it joins the GPU "
            "request's one --gres.",
        ),
    ] = None,
    project: Annotated[
        str | None,
        typer.Option(
            "--project", help="Your project, where the site builds accounts from it ({project})."
        ),
    ] = None,
    sbatch_arg: Annotated[
        list[str] | None,
        typer.Option("--sbatch-arg", help="Extra sbatch option, e.g. --sbatch-arg=--exclusive."),
    ] = None,
    tasks_per_node: Annotated[
        int | None,
        typer.Option(
            "--tasks-per-node",
            help="Tasks per node, started by srun. Default: one, or one per GPU where the "
            "site's jobs run one task per GPU.",
            show_default=False,
        ),
    ] = None,
    launcher: Annotated[
        str | None,
        typer.Option(
            "--launcher",
            help="torchrun (one worker per GPU per node) | srun (--tasks-per-node tasks) | "
            "none. Default: srun with --tasks-per-node > 1, torchrun with --nodes > 1, else none.",
            show_default=False,
        ),
    ] = None,
    setup: Annotated[
        list[str] | None,
        typer.Option("--setup", help="A shell line run before the program (repeatable)."),
    ] = None,
    module: Annotated[
        list[str] | None,
        typer.Option("--module", help="module load NAME before the program (repeatable)."),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="KEY=VALUE exported in the job (repeatable)."),
    ] = None,
    container_image: Annotated[
        str | None,
        typer.Option(
            "--container-image", help="Run the program in this image (pyxis: an srun step)."
        ),
    ] = None,
    container_mounts: Annotated[
        str | None,
        typer.Option("--container-mounts", help="pyxis --container-mounts, passed through."),
    ] = None,
    apptainer: Annotated[
        str | None,
        typer.Option("--apptainer", help="Run the program under apptainer exec --nv IMAGE."),
    ] = None,
    launcher_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--launcher-arg",
            help="Your own torchrun/srun option, e.g. --launcher-arg=--max-restarts=3.",
        ),
    ] = None,
    python: Annotated[
        str | None,
        typer.Option(
            "--python",
            help="Interpreter the job runs (default: python3 on your PATH now).",
            show_default=False,
        ),
    ] = None,
    venv: Annotated[
        str | None,
        typer.Option("--venv", help="Run in this virtual environment (DIR/bin/python)."),
    ] = None,
    conda: Annotated[
        str | None,
        typer.Option("--conda", help="Activate this conda env in the job (name or prefix)."),
    ] = None,
    snapshot: Annotated[
        bool | None,
        typer.Option(
            "--snapshot/--no-snapshot",
            help="Run the job from a copy of its code taken now (the script and the project's "
            "files), so later edits do not reach it while it waits or when it is requeued. "
            "Default: off (Cluster(snapshot=True) in Python).",
            show_default=False,
        ),
    ] = None,
    site: SiteOption = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print the job script and the sbatch command; submit nothing."
        ),
    ] = False,
    test_only: Annotated[
        bool,
        typer.Option("--test-only", help="Ask Slurm to validate the job (sbatch --test-only)."),
    ] = False,
    sweep: Annotated[
        list[str] | None,
        typer.Option(
            "--sweep",
            help="NAME=V1,V2,...: one array task per value (repeat: every combination); "
            "task i gets --NAME=Vi appended.",
        ),
    ] = None,
    params: Annotated[
        Path | None,
        typer.Option(
            "--params", help="File: one array task per line of arguments (shell words or JSON)."
        ),
    ] = None,
    mkdir: Annotated[
        bool, typer.Option("--mkdir", help="Create the -o/-e directories if missing.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print id, cluster, script and sbatch command as JSON.")
    ] = False,
    parsable: Annotated[bool, typer.Option("--parsable", help="Print the job id only.")] = False,
) -> int | None:
    """Submit SCRIPT (or -- CMD ARGS) with GPUs of one model, in this site's own sbatch syntax."""
    return run_submit(**locals())
