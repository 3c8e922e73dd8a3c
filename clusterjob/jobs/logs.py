"""A job's output: where Slurm writes it, and following it until the job ends."""

from __future__ import annotations

import codecs
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import hostlist

from clusterjob.errors import UsageError
from clusterjob.jobs.followup import follow_up
from clusterjob.jobs.registry import JobRecord, Registry
from clusterjob.jobs.status import StatusCache, array_spec, status
from clusterjob.slurm import parse
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.runner import LocalTransport
from clusterjob.slurm.syntax import array_task_ids, split_array_id

NO_VAL = "4294967294"  # Slurm's "no value": the task id it prints for an array's own record


def output_path(
    job: str,
    *,
    stderr: bool = False,
    task: int | None = None,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
) -> Path:
    """Where the job writes its stdout (or stderr): Slurm's expanded path while it remembers
    the job, else the one recorded, else ``slurm-<id>.out`` in the submission directory.

    An array task is ``ID_N`` (or ``task=N``); an array itself has no one file, so naming
    one without a task is refused with the tasks it has.
    """
    client = client or SlurmClient()
    registry = registry or Registry(host=client.runner.transport.label)
    job_id = registry.resolve_id(job)
    base, task_text = split_array_id(job_id)
    if task is not None:
        if task_text is not None and task_text != str(task):
            raise UsageError(f"job {job_id} and --task {task} name different tasks")
        task_text = str(task)
    record = registry.get(base)
    elsewhere = _controlled_output(record, task_text)
    if elsewhere is not None:
        return elsewhere
    spec = array_spec(record.script) if record is not None else None
    if task_text is not None:
        return _task_output(base, task_text, spec, record, stderr, client)
    if record is not None and spec is not None:
        ids = array_task_ids(spec) if spec else []
        first = ids[0] if ids else 0
        host = client.runner.transport.label
        raise UsageError(
            f"job {base} is an array of {len(ids)} tasks ({spec.split('%')[0]}); name one: "
            f"{follow_up('logs', f'{base}_{first}', host=host)} (or --task {first}); "
            f"`{follow_up('status', base, '--tasks', host=host)}` lists them"
        )
    recorded = None
    if record is not None:
        recorded = record.stderr_path if stderr else record.stdout_path
    if recorded is None or record is None or not parse.is_final(record.state):
        paths = client.job_output_paths(job_id)
        if paths is not None:
            chosen = paths[1] if stderr else paths[0]
            if chosen and NO_VAL in chosen and record is None:
                typed = follow_up("logs", f"{job_id}_0", host=client.runner.transport.label)
                raise UsageError(
                    f"job {job_id} is an array: name one task, e.g. {typed} (or --task 0)"
                )
            if chosen and NO_VAL not in chosen:
                return Path(chosen)
    if recorded and NO_VAL not in recorded:
        return Path(recorded)
    if record is None:
        raise UsageError(f"job {job_id}: Slurm no longer knows it and clusterjob did not submit it")
    return Path(record.work_dir) / f"slurm-{job_id}.out"


def _controlled_output(record: JobRecord | None, task: str | None) -> Path | None:
    """The output file of a job of a scheduler other than Slurm (its backend's
    ``JobControl`` says where); None for Slurm's jobs."""
    from clusterjob.jobs.controlled import control_of, output_path

    control = control_of(record) if record is not None else None
    if record is None or control is None:
        return None
    return output_path(record, task, control)


_OUTPUT_LINE = re.compile(r"^#SBATCH\s+(?:--output[= ]|-o\s*)\"?([^\"\n]+?)\"?\s*$", re.MULTILINE)
_ERROR_LINE = re.compile(r"^#SBATCH\s+(?:--error[= ]|-e\s*)\"?([^\"\n]+?)\"?\s*$", re.MULTILINE)


def _task_output(
    base: str,
    task: str,
    spec: str | None,
    record: JobRecord | None,
    stderr: bool,
    client: SlurmClient,
) -> Path:
    """A task's file: scontrol's path while Slurm remembers the task, else the script's
    ``--output`` pattern (default ``slurm-%A_%a.out``) expanded for it."""
    if not task.isdigit():
        raise UsageError(f"not a task id: {task!r} (expected digits, e.g. {base}_3)")
    if record is not None and spec is not None and int(task) not in array_task_ids(spec):
        raise UsageError(f"job {base} has no task {task} (its tasks: {spec.split('%')[0]})")
    if record is None or not parse.is_final(record.state):
        paths = client.job_output_paths(f"{base}_{task}")
        if paths is not None:
            chosen = paths[1] if stderr else paths[0]
            if chosen and NO_VAL not in chosen:
                return Path(chosen)
    if record is None:
        raise UsageError(
            f"job {base}_{task}: Slurm no longer knows it and clusterjob did not submit it"
        )
    pattern = None
    if stderr:
        m = _ERROR_LINE.search(record.script)
        pattern = m.group(1) if m else None
    if pattern is None:
        m = _OUTPUT_LINE.search(record.script)
        pattern = m.group(1) if m else "slurm-%A_%a.out"
    pattern = re.sub(r"%(\d*)a", lambda m: task.zfill(int(m.group(1) or 0)), pattern)
    path = parse.expand_output_pattern(
        pattern, job_id=base, name=record.job_name, user=_user(), first_node=None
    )
    return Path(path) if os.path.isabs(path) else Path(record.work_dir) / path


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


# read(path, offset) -> the file's bytes from offset, None while it does not exist: this
# machine's files, or a remote cluster's through the transport (clusterjob.slurm.runner).
Reader = Callable[[str, int], "bytes | None"]


def read_text(path: Path, read: Reader | None = None) -> str | None:
    """The whole of a job's file as text (None: it does not exist yet)."""
    data = (read or LocalTransport().read_bytes)(str(path), 0)
    return None if data is None else data.decode("utf-8", "replace")


def follow(
    path: Path,
    *,
    finished: Callable[[], bool],
    poll: float = 0.5,
    check_every: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    read: Reader | None = None,
) -> Iterator[str]:
    """Yield what is appended to ``path`` until ``finished()`` says the job ended (asked at
    most every ``check_every`` seconds, so following costs Slurm little) and all is read.
    ``read``: how to read it (default: here; a remote cluster's over its ssh connection)."""
    read = read or LocalTransport().read_bytes
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    position = 0
    last_check = clock()
    done = False
    while True:
        data = read(str(path), position)
        if data:
            position += len(data)
            chunk = decoder.decode(data)
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


def is_finished(
    job: str,
    *,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
    cache: StatusCache | None = None,
) -> bool:
    rows = status([job], client=client, registry=registry, cache=cache)
    return all(parse.is_final(r.state) or r.state == "UNKNOWN" for r in rows)


# -- one rank's or one node's lines -------------------------------------------------------------

_SRUN_LABEL = re.compile(r"^ *(\d+): ")  # srun --label: the task id, padded to one width
_TORCH_RANK = re.compile(r"\[rank(\d+)\]: ")  # torchrun --tee with the job's line prefix


@dataclass(frozen=True)
class RankLayout:
    """How a job labels its lines: ``torchrun`` (``[rankN]:`` per worker, and the node's
    index first when several nodes), ``srun`` (the task id first), or ``none``."""

    launcher: str
    nodes: tuple[str, ...]  # the job's nodes, in Slurm's order (node index i)
    tasks_per_node: int = 1


def select_lines(text: str, layout: RankLayout, *, rank: int | None, node: str | None) -> str:
    """The lines of one rank (``--rank``) and/or one node (``--node``)."""
    node_index: int | None = None
    if node is not None:
        if node not in layout.nodes:
            ran = ", ".join(layout.nodes) or "no node yet"
            raise UsageError(f"--node {node}: the job ran on {ran}")
        node_index = layout.nodes.index(node)
    if rank is not None and layout.launcher == "none":
        raise UsageError(
            "--rank: this job started one process (no launcher), whose output is all there is"
        )
    kept = []
    for line in text.splitlines(keepends=True):
        label = _SRUN_LABEL.match(line)
        task = int(label.group(1)) if label else None
        worker = _TORCH_RANK.search(line)
        if rank is not None:
            own = int(worker.group(1)) if worker else None
            if layout.launcher == "srun":
                own = task
            if own != rank:
                continue
        if node_index is not None and len(layout.nodes) > 1:
            if task is None:
                continue
            on = task // layout.tasks_per_node if layout.launcher == "srun" else task
            if on != node_index:
                continue
        kept.append(line)
    return "".join(kept)


def rank_layout(
    job: str, *, registry: Registry | None = None, client: SlurmClient | None = None
) -> RankLayout:
    """The job's launcher and nodes, from its recorded request and Slurm (or the registry)."""
    from clusterjob.jobs.submit import recorded_request
    from clusterjob.jobscript.request import choose_launcher

    client = client or SlurmClient()
    registry = registry or Registry(host=client.runner.transport.label)
    job_id = registry.resolve_id(job)
    base, _ = split_array_id(job_id)
    record = registry.get(base)
    if record is None:
        raise UsageError(f"job {job_id}: --rank/--node need a job clusterjob submitted")
    request = recorded_request(record)
    nodes = record.nodes
    if nodes is None:
        live = client.scontrol_job(job_id)
        nodes = live.nodes if live is not None else None
    names = tuple(hostlist.expand_hostlist(nodes)) if nodes else ()
    launcher = choose_launcher(request)
    tasks = request.tasks_per_node or 1
    if launcher == "srun":  # the launcher starts the batch's tasks per node, as its script says
        tasks = batch_tasks_per_node(record.script) or tasks
    return RankLayout(launcher, names, tasks)


_BATCH_TASKS_PER_NODE = re.compile(r"^#SBATCH --ntasks-per-node=(\d+)$", re.MULTILINE)


def batch_tasks_per_node(script: str) -> int | None:
    """The job script's own ``#SBATCH --ntasks-per-node``: one task per GPU on a site whose jobs
    run so (cpus-per-task, gpus-per-task), whatever ``--tasks-per-node`` said."""
    match = _BATCH_TASKS_PER_NODE.search(script)
    return int(match.group(1)) if match else None
