"""A job's output: where Slurm writes it, and following it until the job ends."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from clusterjob.errors import UsageError
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.status import status
from clusterjob.slurm import parse
from clusterjob.slurm.commands import SlurmClient


def output_path(
    job: str,
    *,
    stderr: bool = False,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
) -> Path:
    """Where the job writes its stdout (or stderr): Slurm's expanded path while it remembers
    the job, else the one recorded, else ``slurm-<id>.out`` in the submission directory."""
    client = client or SlurmClient()
    registry = registry or Registry()
    job_id = registry.resolve_id(job)
    record = registry.get(job_id)
    recorded = None
    if record is not None:
        recorded = record.stderr_path if stderr else record.stdout_path
    if recorded is None or record is None or not parse.is_final(record.state):
        paths = client.job_output_paths(job_id)
        if paths is not None:
            chosen = paths[1] if stderr else paths[0]
            if chosen:
                return Path(chosen)
    if recorded:
        return Path(recorded)
    if record is None:
        raise UsageError(f"job {job_id}: Slurm no longer knows it and clusterjob did not submit it")
    return Path(record.work_dir) / f"slurm-{job_id}.out"


def follow(
    path: Path,
    *,
    finished: Callable[[], bool],
    poll: float = 0.5,
    check_every: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[str]:
    """Yield what is appended to ``path`` until ``finished()`` says the job ended (asked at
    most every ``check_every`` seconds, so following costs Slurm little) and all is read."""
    position = 0
    last_check = clock()
    done = False
    while True:
        if path.exists():
            with path.open("r", errors="replace") as f:
                f.seek(position)
                chunk = f.read()
                position = f.tell()
            if chunk:
                yield chunk
                continue
        if done:
            return
        if clock() - last_check >= check_every:
            last_check = clock()
            done = finished()
            continue
        sleep(poll)


def is_finished(job: str, *, client: SlurmClient | None = None) -> bool:
    rows = status([job], client=client)
    return all(parse.is_final(r.state) or r.state == "UNKNOWN" for r in rows)
