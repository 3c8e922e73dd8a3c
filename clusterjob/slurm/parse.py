"""Pure parsers for what Slurm 22.05 clients print. No I/O here.

Each parser is tested against output recorded from a real Slurm (tests/fixtures/slurm/).
The field lists the commands are asked for live here too, next to the parsers that read
them, so the two cannot drift apart.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

# What the parsers skip (a GRES item of a form not known here) is said at debug level only.
log = logging.getLogger("clusterjob.slurm")

# ASCII unit separator: cannot appear in a job name or comment typed by a person, unlike "|".
DELIMITER = "\x1f"

# squeue --Format fields, in order. ``Field:0<sep>``: no padding, the separator as suffix.
# JobArrayID is JobID for a plain job and ``ID_TASK`` / ``ID_[3-9%2]`` (the tasks not yet
# started) for an array; JobID would print each task's own internal job id instead.
SQUEUE_FIELDS = (
    ("job_id", "JobArrayID"),
    ("cluster", "Cluster"),
    ("state", "State"),
    # The job's wait status as one number (exit code x 256, or the signal): an ended job's
    # exit code before slurmdbd has recorded it, in the same call as its state.
    ("exit_code", "exit_code"),
    ("reason", "Reason"),
    ("partition", "Partition"),
    ("nodes", "NodeList"),
    ("elapsed", "TimeUsed"),
    ("time_limit", "TimeLimit"),
    ("start", "StartTime"),
    ("submit", "SubmitTime"),
    ("tres_per_node", "tres-per-node"),
    # A job that asked with --gpus or --gpus-per-task has its GPUs here, not per node.
    ("tres_per_job", "tres-per-job"),
    ("tres_per_task", "tres-per-task"),
    ("user", "UserName"),
    ("work_dir", "WorkDir"),
    ("stdout", "STDOUT"),
    ("stderr", "STDERR"),
    ("comment", "Comment"),
    ("name", "Name"),
)


def squeue_format() -> str:
    """The ``--Format`` argument matching ``parse_squeue``."""
    names = [f"{slurm}:0" for _, slurm in SQUEUE_FIELDS]
    return ",".join(n + DELIMITER for n in names[:-1]) + "," + names[-1]


# sacct --format fields (with --parsable2 --delimiter=DELIMITER --allocations).
SACCT_FIELDS = (
    ("job_id", "JobID"),
    ("cluster", "Cluster"),
    ("name", "JobName"),
    ("state", "State"),
    ("exit_code", "ExitCode"),
    ("elapsed", "Elapsed"),
    ("start", "Start"),
    ("end", "End"),
    ("nodes", "NodeList"),
    ("alloc_tres", "AllocTRES"),
    ("reason", "Reason"),
    ("partition", "Partition"),
    ("work_dir", "WorkDir"),
    ("submit", "Submit"),
)


def sacct_format() -> str:
    return ",".join(slurm for _, slurm in SACCT_FIELDS)


# Job states after which a job will not change again (without a requeue by an admin).
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "TIMEOUT",
    }
)


def is_final(state: str) -> bool:
    return normalise_state(state) in FINAL_STATES


def normalise_state(state: str) -> str:
    """``CANCELLED by 1000`` -> ``CANCELLED``; ``RUNNING+`` style suffixes dropped."""
    return state.split(" ", 1)[0].rstrip("+").upper() if state else ""


def parse_time(text: str) -> datetime | None:
    """A Slurm timestamp (``2026-11-29T16:18:15``); None for Unknown/N/A/None/out of range.

    ``sbatch --test-only`` prints years like 10194 when a job could never start.
    """
    match = _TIMESTAMP.fullmatch(text.strip())
    if match is None:  # Unknown, N/A, None, (null), a five-digit year
        return None
    try:  # not strptime: its first call in a process costs ~4 ms (a module, locale tables)
        year, month, day, hour, minute, second = map(int, match.groups())
        return datetime(year, month, day, hour, minute, second)
    except ValueError:  # a day or an hour out of range
        return None


_TIMESTAMP = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})")


def _stderr_path(stderr: str, stdout: str) -> str | None:
    """Where a job's stderr goes. Without ``--error`` it goes to the stdout file: 22.05 says
    so by repeating that path, squeue 24.11 and 26.05 print ``(null)`` and scontrol 26.05
    ``StdErr=`` (empty); the stdout path is then the answer."""
    return _null(stderr) or _null(stdout)


def _null(value: str) -> str | None:
    value = value.strip()
    return None if value in ("", "(null)", "N/A") else value


# --- sbatch -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmittedJobId:
    job_id: str
    cluster: str | None = None


_JOB_ID = re.compile(r"^(\d+)(?:;(\S+))?$")


def gpu_tres(text: str | None) -> str | None:
    """The GPU part of a TRES list: from sacct's AllocTRES ``cpu=2,gres/gpu:a100=2,gres/gpu=2``
    keep ``gres/gpu:a100=2,gres/gpu=2``; from squeue's ``gres:gpu:a100:2`` (21.08 on),
    ``gres/gpu:a100:1`` (24.11 on) or ``gpu:1`` (before 21.08), that."""
    if not text:
        return None
    parts = [p for p in _split_top(text) if _is_gpu_tres(p)]
    return ",".join(parts) or None


def _is_gpu_tres(item: str) -> bool:
    bare = item.removeprefix("gres:").removeprefix("gres/")
    return bare == "gpu" or bare.startswith(("gpu:", "gpu=", "gpu("))


def parse_job_id(stdout: str) -> SubmittedJobId:
    """``sbatch --parsable`` stdout: ``123`` or ``123;cluster``. Raises ValueError otherwise."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("sbatch printed no job id")
    m = _JOB_ID.match(lines[-1])
    if not m:
        raise ValueError(f"sbatch printed {lines[-1]!r}, not a job id")
    return SubmittedJobId(m.group(1), m.group(2))


@dataclass(frozen=True)
class StartEstimate:
    """What ``sbatch --test-only`` says; ``start`` is None when Slurm's date means never."""

    job_id: str
    start_text: str
    start: datetime | None
    processors: int
    nodes: str
    partition: str


# 26.05 (and a 2026 report from another site) print a stray word before "using":
# "Job 143 to start at 2026-12-04T13:37:08 a using 1 processors on nodes gpu2 in partition gpu".
_TEST_ONLY = re.compile(
    r"Job (?P<job>\d+) to start at (?P<start>\S+)(?: +\S+)*? +using (?P<procs>\d+) "
    r"processors? +on nodes (?P<nodes>\S+) +in partition (?P<part>\S+)"
)


def parse_test_only(output: str) -> StartEstimate:
    """``sbatch --test-only`` prints its estimate on stderr (exit 0).

    Words Slurm adds between the known ones are skipped; anything else is a ValueError that
    quotes the line (the one naming a start, or all of the output).
    """
    m = _TEST_ONLY.search(output)
    if not m:
        said = [line.strip() for line in output.splitlines() if "to start at" in line]
        raw = said[0] if said else output.strip()
        raise ValueError(f"unexpected sbatch --test-only output: {raw!r}")
    return StartEstimate(
        job_id=m.group("job"),
        start_text=m.group("start"),
        start=parse_time(m.group("start")),
        processors=int(m.group("procs")),
        nodes=m.group("nodes"),
        partition=m.group("part"),
    )


_SUBMISSION_FAILED = "Batch job submission failed:"
_ALLOCATION_FAILURE = "allocation failure:"


def sbatch_error_messages(stderr: str) -> list[str]:
    """Every ``error:`` line of sbatch's stderr, without the ``sbatch: error:`` prefix, once
    each: what a job_submit plugin (or a wrapper) said first, Slurm's own
    ``Batch job submission failed: ...`` summary last. An indented line right after an error
    line continues it. No error line: the whole stderr, as one message.
    """
    found: list[str] = []
    for line in stderr.splitlines():
        if "error:" in line:
            found.append(line.split("error:", 1)[1].strip())
        elif line.startswith(_ALLOCATION_FAILURE):  # --test-only's summary line (22.05)
            found.append(_SUBMISSION_FAILED + line[len(_ALLOCATION_FAILURE) :])
        elif found and line[:1].isspace() and line.strip():
            found[-1] = f"{found[-1]} {line.strip()}"
    messages = list(dict.fromkeys(m for m in found if m))
    if not messages:
        return [stderr.strip()] if stderr.strip() else []
    own = [m for m in messages if _submission_failed(m)]
    return [m for m in messages if m not in own] + own


_SCANCEL_UNKNOWN = re.compile(r"Kill job error on job id (\S+): Invalid job id specified")


def parse_scancel_unknown(stderr: str) -> list[str]:
    """The job ids ``scancel --verbose`` said Slurm does not know, in its order. scancel
    22.05 exits 0 for them and prints nothing without ``--verbose``."""
    return list(dict.fromkeys(_SCANCEL_UNKNOWN.findall(stderr)))


def _submission_failed(message: str) -> bool:
    return message.casefold().startswith(_SUBMISSION_FAILED.casefold())


# sbatch's words for a GRES request it cannot read: 22.05 says the first; 24.11 and 26.05
# say the second for a malformed GPU request (`gpu:a100:two`), still the first for a GRES
# name the cluster does not have.
_INVALID_GRES = ("invalid generic resource", "invalid trackable resource")


def is_invalid_gres(message: str) -> bool:
    """Whether an sbatch error says the GRES/TRES request is malformed or unknown."""
    m = message.casefold()
    return any(words in m for words in _INVALID_GRES)


def sbatch_error_message(stderr: str) -> str:
    """sbatch's error lines as one line (``sbatch_error_messages`` joined by ``; ``), with
    Slurm's ``Batch job submission failed:`` prefix dropped: ``Unspecified error`` alone says
    nothing, the plugin's line before it does."""
    messages = sbatch_error_messages(stderr)
    cut = len(_SUBMISSION_FAILED)
    return "; ".join(m[cut:].strip() if _submission_failed(m) else m for m in messages)


# --- squeue -------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueuedJob:
    """One line of ``squeue --states=all`` in ``squeue_format()``."""

    job_id: str
    cluster: str
    state: str
    exit_code: int | None  # meaningful once the state is final (is_final)
    signal: int | None
    reason: str | None
    partition: str
    nodes: str | None
    elapsed: str
    time_limit: str
    start: datetime | None
    submit: datetime | None
    tres_per_node: str | None
    tres_per_job: str | None
    tres_per_task: str | None
    user: str
    work_dir: str | None
    stdout: str | None  # as given to sbatch: %j, %x... not expanded by squeue
    stderr: str | None
    comment: str | None
    name: str


def parse_squeue(stdout: str) -> list[QueuedJob]:
    jobs = []
    width = len(SQUEUE_FIELDS)
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split(DELIMITER)
        if len(parts) < width:
            raise ValueError(f"squeue line has {len(parts)} fields, expected {width}: {line!r}")
        # a name containing the separator stays whole: it is the last field
        parts = parts[: width - 1] + [DELIMITER.join(parts[width - 1 :])]
        v = dict(zip((name for name, _ in SQUEUE_FIELDS), parts, strict=True))
        code, sig = parse_queued_exit_code(v["exit_code"])
        jobs.append(
            QueuedJob(
                job_id=v["job_id"].strip(),
                cluster=v["cluster"].strip(),
                state=normalise_state(v["state"]),
                exit_code=code,
                signal=sig,
                reason=None if v["reason"] in ("None", "") else v["reason"],
                partition=v["partition"],
                nodes=_null(v["nodes"]),
                elapsed=v["elapsed"],
                time_limit=v["time_limit"],
                start=parse_time(v["start"]),
                submit=parse_time(v["submit"]),
                tres_per_node=_null(v["tres_per_node"]),
                tres_per_job=_null(v["tres_per_job"]),
                tres_per_task=_null(v["tres_per_task"]),
                user=v["user"],
                work_dir=_null(v["work_dir"]),
                stdout=_null(v["stdout"]),
                stderr=_stderr_path(v["stderr"], v["stdout"]),
                comment=_null(v["comment"]),
                name=v["name"],
            )
        )
    return jobs


# --- sacct --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccountedJob:
    """One allocation line of ``sacct --allocations`` in ``sacct_format()``."""

    job_id: str
    cluster: str
    name: str
    state: str
    exit_code: int | None
    signal: int | None
    elapsed: str
    start: datetime | None
    end: datetime | None
    nodes: str | None
    alloc_tres: str | None
    reason: str | None
    partition: str
    work_dir: str | None
    submit: datetime | None


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """``2:0`` -> (2, 0): exit status and the signal that ended it."""
    code, _, sig = text.partition(":")
    try:
        return int(code), (int(sig) if sig else None)
    except ValueError:
        return None, None


def parse_queued_exit_code(text: str) -> tuple[int | None, int | None]:
    """squeue's ``exit_code`` column as (exit code, signal), as sacct's ``ExitCode``.

    22.05 prints the wait status as one number (``768``: exited with 3; ``9``: killed by
    signal 9); 24.11 on print sacct's form (``3:0``, ``0:9``). A number that is no 16-bit
    status (Slurm's NO_VAL) -> (None, None)."""
    if ":" in text:
        return parse_exit_code(text)
    try:
        status = int(text)
    except ValueError:
        return None, None
    if not 0 <= status <= 0xFFFF:
        return None, None
    signal = status & 0x7F
    return (0, signal) if signal else (status >> 8, 0)


def parse_sacct(stdout: str) -> list[AccountedJob]:
    """Allocation lines only: job steps (``123.batch``, ``123.0``) are dropped."""
    jobs = []
    width = len(SACCT_FIELDS)
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split(DELIMITER)
        if len(parts) != width:
            raise ValueError(f"sacct line has {len(parts)} fields, expected {width}: {line!r}")
        v = dict(zip((name for name, _ in SACCT_FIELDS), parts, strict=True))
        if "." in v["job_id"]:
            continue
        code, sig = parse_exit_code(v["exit_code"])
        jobs.append(
            AccountedJob(
                job_id=v["job_id"],
                cluster=v["cluster"],
                name=v["name"],
                state=normalise_state(v["state"]),
                exit_code=code,
                signal=sig,
                elapsed=v["elapsed"],
                start=parse_time(v["start"]),
                end=parse_time(v["end"]),
                nodes=None if v["nodes"] in ("None assigned", "") else v["nodes"],
                alloc_tres=_null(v["alloc_tres"]),
                reason=None if v["reason"] in ("None", "") else v["reason"],
                partition=v["partition"],
                work_dir=_null(v["work_dir"]),
                submit=parse_time(v["submit"]),
            )
        )
    return jobs


# --- scontrol -----------------------------------------------------------------------------

# A key starts after whitespace and ends at "=": JobId, AllocNode:Sid, CPUs/Task, ReqB:S:C:T.
_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_:/.]*)=")
# Fields printed as ``Key:value`` instead of ``Key=value`` (``scontrol show job``, 20.11 on).
_COLON_FIELD = re.compile(r"(?:(?<=\s)|^)(NtasksPerTRES):(\S*)(?=\s|$)")


def scontrol_records(stdout: str, first_key: str) -> list[str]:
    """``scontrol show ...`` output as one string per record, with or without ``-o``: a record
    starts at a line beginning ``first_key=``; indented lines after it continue it (kept as
    lines, so a rest-of-line value such as a node's Reason ends with its own line)."""
    records: list[str] = []
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith(first_key + "="):
            current = [line.strip()]
            records.append("")
        elif not line.strip():
            continue  # records are printed with blank lines between them (and pasted so)
        elif current is not None and line[:1].isspace():
            current.append(line.strip())
        else:
            current = None
            continue
        records[-1] = "\n".join(current)
    return records


def parse_scontrol_record(line: str, *, rest_of_line: tuple[str, ...] = ()) -> dict[str, str]:
    """One ``scontrol show ...`` record (a ``-o`` line, or ``scontrol_records``' lines joined
    by newlines) into key -> value.

    Values may contain spaces (``OS=Linux 6.1 #1 SMP``, a drain Reason), so a value runs to
    the next `` Key=``. Keys in ``rest_of_line`` take everything to the end of their line (a
    node's ``Reason=`` is free text a person typed and may itself contain ``=``).
    ``NtasksPerTRES:0`` is read as ``NtasksPerTRES=0``.
    """
    record: dict[str, str] = {}
    line = _COLON_FIELD.sub(r"\1=\2", line)
    matches = list(_KEY.finditer(line))
    skip_to = 0
    for i, m in enumerate(matches):
        if m.start() < skip_to:
            continue  # a "Key=" inside a rest-of-line value
        key = m.group(1)
        if key in rest_of_line:
            eol = line.find("\n", m.end())
            skip_to = len(line) if eol < 0 else eol
            record[key] = line[m.end() : skip_to].strip()
            continue
        if key in record:
            continue
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        record[key] = line[m.end() : end].strip()
    return record


@dataclass(frozen=True)
class ControlJob:
    """``scontrol show job -o``: the live view, with output paths already expanded."""

    job_id: str
    name: str
    state: str
    reason: str | None
    exit_code: int | None
    signal: int | None
    partition: str
    nodes: str | None
    start: datetime | None
    end: datetime | None
    run_time: str
    work_dir: str | None
    stdout: str | None
    stderr: str | None
    comment: str | None
    tres_per_node: str | None
    tres_per_job: str | None = None
    tres_per_task: str | None = None
    raw: dict[str, str] = field(repr=False, compare=False, default_factory=dict)

    @property
    def gpus(self) -> dict[str | None, int]:
        """GPU type -> GPUs of the whole job (``job_gpu_counts``)."""
        return job_gpu_counts(self.raw)


def parse_scontrol_jobs(stdout: str) -> list[ControlJob]:
    """``scontrol show job`` records, one line each (``-o``) or as printed for people."""
    jobs = []
    for line in scontrol_records(stdout, "JobId"):
        r = parse_scontrol_record(line)
        code, sig = parse_exit_code(r.get("ExitCode", ""))
        jobs.append(
            ControlJob(
                job_id=r["JobId"],
                name=r.get("JobName", ""),
                state=normalise_state(r.get("JobState", "")),
                reason=None if r.get("Reason") in (None, "None") else r.get("Reason"),
                exit_code=code,
                signal=sig,
                partition=r.get("Partition", ""),
                nodes=_null(r.get("NodeList", "")),
                start=parse_time(r.get("StartTime", "")),
                end=parse_time(r.get("EndTime", "")),
                run_time=r.get("RunTime", ""),
                work_dir=_null(r.get("WorkDir", "")),
                stdout=_null(r.get("StdOut", "")),
                stderr=_stderr_path(r.get("StdErr", ""), r.get("StdOut", "")),
                comment=_null(r.get("Comment", "")),
                tres_per_node=_null(r.get("TresPerNode", "")),
                tres_per_job=_null(r.get("TresPerJob", "")),
                tres_per_task=_null(r.get("TresPerTask", "")),
                raw=r,
            )
        )
    return jobs


_LIST_ITEM = re.compile(r"^(?P<name>\w+)\[(?P<index>\d+)\]$")


def parse_scontrol_config(stdout: str) -> dict[str, str]:
    """``scontrol show config``: ``Name = value`` lines. From 24.11 a key that takes a list
    prints one line per item (``Prolog[0] = /a``, ``Prolog[1] = /b``): they come back as one
    key, comma-joined as slurm.conf writes them (``Prolog=/a,/b``)."""
    config: dict[str, str] = {}
    items: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key or " " in key:
            continue
        m = _LIST_ITEM.match(key)
        if m:
            items.setdefault(m.group("name"), []).append(value.strip())
        else:
            config[key] = value.strip()
    for name, values in items.items():
        config.setdefault(name, ",".join(values))
    return config


@dataclass(frozen=True)
class NodeRecord:
    """``scontrol show node -o [-d]``: what admin tooling needs about a node's GPUs."""

    name: str
    state: str  # base state, e.g. IDLE, MIXED, ALLOCATED, DOWN
    flags: tuple[str, ...]  # e.g. ("DRAIN", "NOT_RESPONDING")
    gres: str | None  # gpu:a100:2,gpu:v100:1
    gres_used: str | None  # with -d: gpu:a100:2(IDX:0-1),gpu:v100:0(IDX:N/A)
    reason: str | None
    partitions: tuple[str, ...]
    raw: dict[str, str] = field(repr=False, compare=False, default_factory=dict)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state == "DRAINED"


def parse_scontrol_nodes(stdout: str) -> list[NodeRecord]:
    nodes = []
    for line in scontrol_records(stdout, "NodeName"):
        r = parse_scontrol_record(line, rest_of_line=("Reason",))
        state, *flags = r.get("State", "").split("+")
        nodes.append(
            NodeRecord(
                name=r["NodeName"],
                state=state,
                flags=tuple(f for f in flags if f),
                gres=_null(r.get("Gres", "")),
                gres_used=_null(r.get("GresUsed", "")),
                reason=_null(r.get("Reason", "")),
                partitions=tuple(p for p in r.get("Partitions", "").split(",") if p),
                raw=r,
            )
        )
    return nodes


# --- GRES and partitions (site admin tooling) ------------------------------------------------

# Node states in which a node takes no new jobs (base state or a +FLAG).
UNAVAILABLE_STATES = frozenset(
    {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "FUTURE", "MAINT",
     "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN", "REBOOT_ISSUED",
     "REBOOT_REQUESTED", "RESERVED", "UNKNOWN"}
)  # fmt: skip


def node_unavailable(node: NodeRecord) -> bool:
    """Whether the node takes no new jobs now (down, drained, not responding, ...)."""
    states = (node.state, *node.flags)  # older releases mark "not responding" as DOWN*
    return any(s.rstrip("*") in UNAVAILABLE_STATES or s.endswith("*") for s in states)


@dataclass(frozen=True)
class GresEntry:
    """One ``name[:type][:flags]:count[(S:..)][(IDX:..)]`` item of a node's Gres= or GresUsed=
    value (or of a job's TRES per node/job/task, ``gres:`` prefix removed)."""

    name: str  # "gpu"
    type: str | None  # "a100"; None when untyped
    count: int
    indices: str | None = None  # GresUsed's IDX part ("0-1"); None for N/A or not printed
    flags: tuple[str, ...] = ()  # e.g. ("no_consume",)


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses: ``gpu:a40:1(S:0,2),gpu:v100:1`` has two items."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


_COUNT = re.compile(r"^(\d+)([KMGTP]?)$")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
# Flags Slurm prints inside an item (slurm.conf Gres=NAME[:TYPE][:no_consume]:COUNT; sharing
# flags of gres.conf).
GRES_FLAGS = frozenset({"no_consume", "shared", "one_sharing", "all_sharing", "explicit"})
_GRES_NAME = re.compile(r"\A[A-Za-z][A-Za-z0-9_.-]*\Z")
_GRES_TYPE = re.compile(r"\A[A-Za-z0-9_.+-]+\Z")


def parse_gres_item(item: str) -> GresEntry | None:
    """One item, e.g. ``gpu:a100:4(S:0-3)``, ``gpu:a100:2(IDX:0,3)``, ``gpu:2080:2`` (numeric
    type), ``gpu:a100_3g.20gb:1`` (MIG), ``pfsdir:scratch:no_consume:1``, ``nsight:no_consume:1``,
    ``gpu:(null):0(IDX:N/A)``, ``tmp:844G``, ``gpu`` (count 1). None when it is none of these."""
    indices = None
    for extra in re.findall(r"\(([^()]*)\)", item):
        if extra.startswith("IDX:"):
            value = extra[4:]
            indices = None if value in ("N/A", "") else value
    base = re.sub(r"\([^()]*\)", "", item).strip()
    if not base or "(" in base or ")" in base:
        return None
    name, *rest = base.split(":")
    if not _GRES_NAME.match(name):
        return None
    count = 1
    if rest:
        m = _COUNT.match(rest[-1])
        if m is None:
            if len(rest) != 1:  # name:type with the count left out is read as 1
                return None
        else:
            count = int(m.group(1)) * _UNITS[m.group(2)]
            rest = rest[:-1]
    flags = tuple(p for p in rest if p.casefold() in GRES_FLAGS)
    types = [p for p in rest if p.casefold() not in GRES_FLAGS]
    if len(types) > 1:
        return None
    gres_type = types[0] if types and types[0] not in ("", "(null)") else None
    if gres_type is not None and not _GRES_TYPE.match(gres_type):
        return None
    return GresEntry(name, gres_type, count, indices, flags)


def parse_gres_items(text: str | None) -> tuple[list[GresEntry], list[str]]:
    """A ``Gres=``/``GresUsed=`` value as entries, and the items it could not read."""
    entries: list[GresEntry] = []
    unknown: list[str] = []
    if text is None or text.strip() in ("", "(null)", "N/A"):
        return entries, unknown
    for item in _split_top(text.strip()):
        entry = parse_gres_item(item)
        if entry is None:
            unknown.append(item)
        else:
            entries.append(entry)
    return entries, unknown


def parse_gres(text: str | None) -> list[GresEntry]:
    """A node's ``Gres=`` or ``GresUsed=`` value as entries, every GRES name kept.

    Every form of ``parse_gres_item``; never raises: an item of an unknown form is left out
    (it is not counted as a GPU) and named at debug level.
    """
    entries, unknown = parse_gres_items(text)
    for item in unknown:
        log.debug("ignored GRES item %r (in %r)", item, text)
    return entries


def gpu_counts(text: str | None) -> dict[str | None, int]:
    """GPU type -> count from a Gres=/GresUsed= value (other GRES, e.g. mps, left out)."""
    counts: dict[str | None, int] = {}
    for entry in parse_gres(text):
        if entry.name == "gpu":
            counts[entry.type] = counts.get(entry.type, 0) + entry.count
    return counts


def gpu_gres(text: str | None) -> str | None:
    """The GPU items of a Gres=/GresUsed= value as Slurm printed them (``gpu:a100:2,gpu:v100:2``
    of ``gpu:a100:2,gpu:v100:2,pfsdir:scratch:1``); None when there are none."""
    items = []
    for item in _split_top(text or ""):
        entry = parse_gres_item(item)
        if entry is not None and entry.name == "gpu":
            items.append(item)
    return ",".join(items) or None


def tres_gpu_counts(text: str | None) -> dict[str | None, int]:
    """GPU type -> count in any TRES spelling Slurm prints.

    ``key=value`` lists (AllocTRES, TRES, CfgTRES, ReqTRES: ``cpu=2,gres/gpu=2,gres/gpu:a100=2``):
    typed entries win, an untyped ``gres/gpu=N`` counts only where no type is listed. Colon
    lists (TresPerNode/Job/Task and squeue's tres-per-*: ``gres:gpu:a100:2`` from 21.08,
    ``gres/gpu:a100:1`` from 24.11, ``gpu:1`` before 21.08, ``gres:gpu:rtx2080`` for 1).
    """
    typed: dict[str | None, int] = {}
    total: int | None = None
    listed: dict[str | None, int] = {}
    for item in _split_top(text or ""):
        key, sep, value = item.partition("=")
        if sep:
            if not value.isdigit():
                continue
            if key == "gres/gpu":
                total = int(value)
            elif key.startswith("gres/gpu:"):
                typed[key[len("gres/gpu:") :]] = int(value)
            continue
        entry = parse_gres_item(item.removeprefix("gres:").removeprefix("gres/"))
        if entry is None:
            log.debug("ignored TRES item %r (in %r)", item, text)
        elif entry.name == "gpu":
            listed[entry.type] = listed.get(entry.type, 0) + entry.count
    if listed:
        return listed
    if typed:
        return typed
    return {None: total} if total else {}


def alloc_tres_gpu_counts(text: str | None) -> dict[str | None, int]:
    """GPU type -> count in use from a node's AllocTRES (``cpu=2,gres/gpu=2,gres/gpu:a100=2``),
    for releases whose ``scontrol show node -d`` prints no GresUsed."""
    return tres_gpu_counts(text)


def _first_int(text: str | None) -> int:
    m = re.match(r"\d+", text or "")
    return int(m.group()) if m else 1


def job_gpu_counts(record: Mapping[str, str]) -> dict[str | None, int]:
    """GPU type -> GPUs of a whole job, from an ``scontrol show job`` record.

    What it was given (``AllocTRES``, or ``TRES`` before 23.02) when that names GPUs;
    otherwise what it asked for: ``TresPerJob`` (``--gpus``), ``TresPerNode`` (``--gres``,
    ``--gpus-per-node``) times ``NumNodes``, ``TresPerTask`` (``--gpus-per-task``) times
    ``NumTasks``. Empty when the job has no GPUs.
    """
    for key in ("AllocTRES", "TRES"):
        counts = tres_gpu_counts(record.get(key))
        if counts:
            return counts
    return requested_gpu_counts(
        record.get("TresPerJob"),
        (record.get("TresPerNode"), _first_int(record.get("NumNodes"))),
        (record.get("TresPerTask"), _first_int(record.get("NumTasks"))),
    )


def requested_gpu_counts(
    per_job: str | None, *per_unit: tuple[str | None, int]
) -> dict[str | None, int]:
    """GPU type -> GPUs a whole job asked for: its per-job TRES (``--gpus``), else the first
    per-unit TRES that names GPUs (per node, per task) times how many units it has."""
    counts = tres_gpu_counts(per_job)
    if counts:
        return counts
    for text, units in per_unit:
        counts = tres_gpu_counts(text)
        if counts:
            return {t: c * units for t, c in counts.items()}
    return {}


def alloc_tres_spelling(counts: Mapping[str | None, int]) -> str | None:
    """GPU counts spelled as sacct's AllocTRES lists them: each type, then the total
    (``gres/gpu:a100=2,gres/gpu=2``); ``gres/gpu=N`` alone when untyped; None for none."""
    typed = [f"gres/gpu:{t}={c}" for t, c in counts.items() if t is not None]
    total = sum(counts.values())
    return ",".join([*typed, f"gres/gpu={total}"]) if total else None


@dataclass(frozen=True)
class PartitionRecord:
    """``scontrol show partition -o``: a partition's name, node hostlist and state."""

    name: str
    nodes: str | None  # hostlist as Slurm prints it, e.g. "gpu[1-2]"; None when empty
    state: str
    default: bool
    max_time: str | None
    raw: dict[str, str] = field(repr=False, compare=False, default_factory=dict)


def parse_scontrol_partitions(stdout: str) -> list[PartitionRecord]:
    partitions = []
    for line in scontrol_records(stdout, "PartitionName"):
        r = parse_scontrol_record(line)
        partitions.append(
            PartitionRecord(
                name=r["PartitionName"],
                nodes=_null(r.get("Nodes", "")),
                state=r.get("State", ""),
                default=r.get("Default", "NO").upper() == "YES",
                max_time=_null(r.get("MaxTime", "")),
                raw=r,
            )
        )
    return partitions


# --- output paths -------------------------------------------------------------------------

_PATTERN = re.compile(r"%(%|\d*[AJjNux])")


def expand_output_pattern(
    pattern: str, *, job_id: str, name: str, user: str, first_node: str | None
) -> str:
    """Expand sbatch's ``--output`` pattern the way Slurm does for a (non-array) batch job:
    ``%j %J %A %x %u %N %%`` and zero padding like ``%5j``. squeue and the registry hold
    the pattern; only scontrol (while Slurm remembers the job) gives the expanded path.
    """

    def one(m: re.Match[str]) -> str:
        spec = m.group(1)
        if spec == "%":
            return "%"
        width, letter = spec[:-1], spec[-1]
        values = {"j": job_id, "J": job_id, "A": job_id, "x": name, "u": user}
        values["N"] = first_node or ""
        value = values[letter]
        return value.zfill(int(width)) if width and value.isdigit() else value

    return _PATTERN.sub(one, pattern)
