"""``clusterjob bind-gpus`` and ``clusterjob release-gpus``: the command lines.

``bind-gpus`` as a Grid Engine root prolog (``prolog root@/opt/clusterjob/bin/clusterjob
bind-gpus --site FILE``) reads the job's booking from ``qstat -j $JOB_ID`` and answers in
the prolog's exit codes: 0 run, 99 requeue (its GPUs are held by others, or qstat failed),
100 job in error (this host cannot give it what it booked: the reason is on stderr and in
``qstat -j``). With ``--job-step`` it is the job script's first step: it prints the
``export`` lines of the prolog's binding, or claims the GPUs itself where no prolog is
installed. ``release-gpus`` is the epilog: it frees the job's GPUs now.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from clusterjob.errors import ClusterjobError, PreflightFailed
from clusterjob.gpubind import binding as gb
from clusterjob.gridengine.prolog import SHEPHERD, PrologExit, gpu_booking, job_key
from clusterjob.node.context import DEFAULT_SITE

__all__ = ["bind_main", "release_main"]


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"clusterjob {prog}", allow_abbrev=False)
    p.add_argument(
        "--site", help=f"Site config file (prolog default {DEFAULT_SITE}; never from env)."
    )
    if prog == "bind-gpus":
        p.add_argument(
            "--job-step", action="store_true", help="As the job's first step: print exports."
        )
        p.add_argument("--gpus", type=int, default=0, help="GPUs the job booked (--job-step).")
        p.add_argument("--model", help="The job's GPU model (--job-step).")
        p.add_argument("--watch-pid", type=int, help="Free the GPUs when this process ends.")
    return p


def _job(environ: Mapping[str, str]) -> str:
    job_id = environ.get("JOB_ID", "").strip()
    if not job_id.isdigit():
        raise ClusterjobError("JOB_ID is not set: run this in a Grid Engine prolog or job")
    return job_key(job_id, environ.get("SGE_TASK_ID"))


def bind_main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    args = _parser("bind-gpus").parse_args(list(argv))
    if args.job_step:
        return _job_step(args, env)
    return _prolog(args, env)


def _prolog(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """As root, before the job: its exit status is Grid Engine's verdict on the job."""
    from clusterjob.gridengine.commands import GridEngineClient

    try:
        job = _job(env)
        detail = GridEngineClient().job_detail(env["JOB_ID"].strip())
        if detail is None:
            raise ClusterjobError(f"qstat -j {env['JOB_ID']} does not know the job")
        booking = gpu_booking(detail)
    except (ClusterjobError, ValueError) as exc:
        print(f"clusterjob bind-gpus: cannot read the job's GPU request: {exc}", file=sys.stderr)
        return PrologExit.REQUEUE
    if booking.count == 0:
        return PrologExit.RUN
    shepherd = gb.ancestor_named(SHEPHERD) or os.getppid()
    # Root reads nothing the job's owner could set (a -v CLUSTERJOB_SITE or
    # CLUSTERJOB_LOCK_DIR would choose the GPUs or where root writes): the site file named
    # here or the default one, the lock dir this machine's, the host name the kernel's.
    trusted: dict[str, str] = {}
    checked: list[str] = []  # the preflight's table, for the job's output after the binding
    try:
        view = gb.node_view(args.site or str(DEFAULT_SITE), trusted)
        found = gb.bind(
            view, trusted, job=job, count=booking.count, model_spec=booking.gpu_type,
            watch_pid=shepherd, say=checked.append,
        )  # fmt: skip
    except PreflightFailed as exc:
        print(f"clusterjob bind-gpus: {exc}", file=sys.stderr)
        return PrologExit.JOB_ERROR
    except gb.NotEnoughFreeGpus as exc:
        print(f"clusterjob bind-gpus: job {job}: {exc}; requeued", file=sys.stderr)
        return PrologExit.REQUEUE
    except Exception as exc:  # the job must not run unbound; the queue stays usable
        print(f"clusterjob bind-gpus: job {job}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return PrologExit.JOB_ERROR
    # the prolog's standard output is the job's: the binding, then the table that proves it
    print(f"clusterjob: job {job} on {view.node}: CUDA_VISIBLE_DEVICES={found.devices}")
    print(*checked, sep="\n")
    return PrologExit.RUN


def _job_step(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """In the job, as its owner: the prolog's binding, or a claim of our own."""
    try:
        job = _job(env)
        found = gb.current_binding(job, env)
        if found is None:
            if args.gpus <= 0:
                return 0
            watch = args.watch_pid if args.watch_pid is not None else os.getppid()
            view = gb.node_view(args.site, env)
            found = gb.bind(
                view, env, job=job, count=args.gpus, model_spec=args.model, watch_pid=watch,
                say=lambda table: print(table, file=sys.stderr),  # stdout is the exports
            )  # fmt: skip
    except ClusterjobError as exc:
        print(f"clusterjob bind-gpus: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(found.exports())
    return 0


def release_main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """The epilog: free the job's GPUs. Always 0: the job is over, whatever happens here."""
    env = os.environ if environ is None else environ
    _parser("release-gpus").parse_args(list(argv))
    try:
        gb.release(_job(env), env)
    except (ClusterjobError, OSError) as exc:
        print(f"clusterjob release-gpus: {exc}", file=sys.stderr)
    return 0
