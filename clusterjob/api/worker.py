"""Runs a pickled Python function as a Slurm job (or one task of an array job).

This file is copied into the job's directory and started there by the job's own Python:
``python -u JOBDIR/clusterjob_worker.py JOBDIR``. It needs only the standard library and
``cloudpickle`` (not clusterjob), so any interpreter with the function's own packages runs it.

JOBDIR holds ``input.pkl``: ``(fn, [(args, kwargs), ...])``, one entry per array task (the
task is ``$SLURM_ARRAY_TASK_ID``, else 0). Task ``i`` leaves ``result-i.pkl``: the line
``result_header(TOKEN, i)`` (TOKEN is JOBDIR's name: the result is bound to its job and task,
and the submitter checks that before it unpickles anything), then the pickle of
``("ok", value)`` or ``("error", exception or None, traceback text, exception repr)``,
written whole and owner-only (a temporary 0600 file renamed), as the task's last act: the
submitter takes the file's appearance as the end of the task (its marker), so whatever the
task prints (a traceback too) is in its stdout/stderr files by then. It exits 0 when the function
returned, 1 when it raised, so Slurm's state says which.

Checkpointing (as submitit's ``checkpoint()``): when the callable has a ``checkpoint`` method,
the job is submitted with ``--signal=B:USR1@N --requeue``. On SIGUSR1 the worker calls
``fn.checkpoint(*args, **kwargs)``; a ``(fn, args, kwargs)`` tuple it returns is saved as
``checkpoint-i.pkl``, the job is requeued (``scontrol requeue``) and the next attempt calls
that instead of the original; ``None`` lets the job run on to its time limit. A job requeued
as often as its limit allows (``$CLUSTERJOB_MAX_REQUEUES``, ``--max-requeues``) is not
requeued again: the worker says so in ``error-i.txt`` and exits ``LIMIT_EXIT``.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import traceback
from collections.abc import Mapping
from typing import Any

PROTOCOL = 2  # what input.pkl and result-i.pkl hold (2: results bound to their job)
LIMIT_EXIT = 79  # clusterjob.jobscript.requeues.LIMIT_EXIT (this file runs without clusterjob)


def _task() -> int:
    text = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    return int(text) if text.isdigit() else 0


def requeue_limit_reached(environ: Mapping[str, str]) -> str | None:
    """Why the job must not requeue itself again (its restart count is at its limit), or None."""
    limit = environ.get("CLUSTERJOB_MAX_REQUEUES", "")
    restarts = environ.get("SLURM_RESTART_COUNT", "0")
    if not limit.isdigit() or int(restarts if restarts.isdigit() else 0) < int(limit):
        return None
    return (
        f"clusterjob: requeued {restarts} times, limit {limit} reached (--max-requeues): not "
        "requeued again"
    )


def result_header(token: str, task: int) -> bytes:
    """The first line of a result file: which job (its directory's token) and task it is."""
    return f"clusterjob-result {PROTOCOL} {token} {task}\n".encode()


def _dump(path: str, obj: object, pickler: Any, header: bytes = b"") -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(tmp, flags, 0o600), "wb") as f:
        f.write(header)
        pickler.dump(obj, f)
    os.replace(tmp, path)


def _error_record(exc: BaseException, pickler: Any) -> tuple[object, ...]:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickler.dumps(exc)
        kept: BaseException | None = exc
    except Exception:  # an exception that cannot travel: its text still does
        kept = None
    return ("error", kept, text, repr(exc))


def not_own(jobdir: str, name: str) -> str | None:
    """Why ``JOBDIR/name`` must not be unpickled here, or None: the rule of clusterjob's
    ``private_files.check_own`` (this file runs without clusterjob): the file, JOBDIR and the
    two directories above it are this user's, writable by no one else, no symlink below."""
    top = os.path.dirname(os.path.dirname(os.path.normpath(jobdir)))
    steps = [top, os.path.dirname(os.path.normpath(jobdir)), jobdir, os.path.join(jobdir, name)]
    for i, path in enumerate(steps):
        try:
            st = os.stat(path) if i == 0 else os.lstat(path)
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        is_file = i == len(steps) - 1
        if not (stat.S_ISREG if is_file else stat.S_ISDIR)(st.st_mode):
            return f"{path}: not a {'regular file' if is_file else 'directory'}"
        if st.st_uid != os.geteuid():
            return f"{path}: owned by uid {st.st_uid}, not by this job's user ({os.geteuid()})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{path}: group/world-writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: clusterjob_worker.py JOBDIR", file=sys.stderr)
        return 2
    jobdir = argv[1]
    task = _task()
    result_path = os.path.join(jobdir, f"result-{task}.pkl")
    header = result_header(os.path.basename(os.path.normpath(jobdir)), task)
    try:
        import cloudpickle
    except ImportError:
        message = (
            f"clusterjob worker: cloudpickle is not installed for {sys.executable} (the job's "
            "Python): pip install cloudpickle there"
        )
        print(message, file=sys.stderr)
        with open(os.path.join(jobdir, f"error-{task}.txt"), "w") as f:
            f.write(message + "\n")
        return 2
    sys.path.insert(0, os.getcwd())  # the project's own modules, as `python script.py` would
    snapshot = os.environ.get("CLUSTERJOB_SNAPSHOT")
    if snapshot:  # --snapshot: those modules as they were at submit come first
        sys.path.insert(0, snapshot)
    checkpoint_path = os.path.join(jobdir, f"checkpoint-{task}.pkl")
    resumes = os.path.exists(checkpoint_path)
    problem = not_own(jobdir, os.path.basename(checkpoint_path) if resumes else "input.pkl")
    if problem:  # another user could have put it there: never unpickled, no file written
        print(f"clusterjob worker: refusing to unpickle {problem}", file=sys.stderr)
        return 2
    try:
        if resumes:
            with open(checkpoint_path, "rb") as saved:
                fn, args, kwargs = cloudpickle.load(saved)
            print(f"clusterjob worker: task {task} resumes from its checkpoint", flush=True)
        else:
            with open(os.path.join(jobdir, "input.pkl"), "rb") as given:
                version, fn, calls = cloudpickle.load(given)
            if version != PROTOCOL:
                raise RuntimeError(f"input.pkl protocol {version}, this worker reads {PROTOCOL}")
            args, kwargs = calls[task]
    except BaseException as exc:  # the input cannot be read here: a missing module, ...
        traceback.print_exc()  # the traceback in the job's stderr before the result marks its end
        _dump(result_path, _error_record(exc, cloudpickle), cloudpickle, header)
        return 1
    if callable(getattr(fn, "checkpoint", None)):

        def on_signal(signum: int, frame: object) -> None:
            print(f"clusterjob worker: signal {signum}: checkpointing", flush=True)
            again = fn.checkpoint(*args, **kwargs)
            if again is None:
                return
            stop = requeue_limit_reached(os.environ)
            if stop is not None:
                print(stop, file=sys.stderr, flush=True)
                with open(os.path.join(jobdir, f"error-{task}.txt"), "w") as f:
                    f.write(stop + "\n")
                os._exit(LIMIT_EXIT)
            _dump(checkpoint_path, tuple(again), cloudpickle)
            job = os.environ.get("SLURM_ARRAY_JOB_ID")
            job = f"{job}_{task}" if job else os.environ.get("SLURM_JOB_ID", "")
            subprocess.run(["scontrol", "requeue", job], check=False)
            print(f"clusterjob worker: job {job} requeued", flush=True)
            os._exit(0)

        signal.signal(signal.SIGUSR1, on_signal)
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        traceback.print_exc()  # the traceback in the job's stderr before the result marks its end
        _dump(result_path, _error_record(exc, cloudpickle), cloudpickle, header)
        return 1
    try:
        _dump(result_path, ("ok", value), cloudpickle, header)
    except Exception as exc:  # the value cannot be pickled: say so as the job's error
        traceback.print_exc()  # the traceback in the job's stderr before the result marks its end
        _dump(result_path, _error_record(exc, cloudpickle), cloudpickle, header)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
