"""A job's request in qsub's words: the one table from clusterjob's generic request to Grid
Engine's options, and the checks that a value can stand on a ``#$`` line. Pure; no I/O.

The generic request keeps Slurm's spellings where it has them (an ``--array`` range, a
``--dependency``, ``%j`` in a log path, a ``--mail-type``); this module says what each is
for ``qsub``, or why it has no equivalent here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What may stand as one word on a "#$" line: qsub splits directive lines at white space and
# reads quotes, so a value is kept to these (``$JOB_ID`` in a log path included).
DIRECTIVE_WORD = re.compile(r"\A[A-Za-z0-9_.,:/@%$=+~-]+\Z")
# qsub refuses these in a job name (sge_types(1), "name").
_NAME_FORBIDDEN = set("\n\t\r/:@\\*?")
# sbatch's filename patterns and Grid Engine's pseudo variables for -o/-e (qsub(1)).
_LOG_FIELDS = {"%j": "$JOB_ID", "%A": "$JOB_ID", "%a": "$TASK_ID", "%x": "$JOB_NAME", "%%": "%"}
# sbatch --mail-type -> qsub -m letters (b begin, e end, a abort, n none).
_MAIL_EVENTS = {"BEGIN": "b", "END": "e", "FAIL": "a", "REQUEUE": "a", "ALL": "bea", "NONE": "n"}
_ARRAY = re.compile(
    r"\A(?P<first>[0-9]+)(?:-(?P<last>[0-9]+)(?::(?P<step>[0-9]+))?)?(?:%(?P<limit>[0-9]+))?\Z"
)


def word(value: str, what: str) -> str:
    """``value`` if it can stand on a ``#$`` line as one word; else ValueError naming it."""
    if not DIRECTIVE_WORD.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} cannot be written on a Grid Engine directive line: use letters, "
            "digits and _ . , : / @ % $ = + ~ - only"
        )
    return value


def job_name(name: str) -> str:
    bad = sorted(c for c in set(name) if c in _NAME_FORBIDDEN)
    if bad:
        raise ValueError(f"the job name {name!r} has {''.join(bad)!r}, which qsub refuses")
    return word(name, "the job name")


def log_path(pattern: str, what: str) -> str:
    """An ``--output``/``--error`` pattern in Grid Engine's pseudo variables: ``%j`` ->
    ``$JOB_ID``, ``%a`` -> ``$TASK_ID``, ``%x`` -> ``$JOB_NAME``; any other ``%`` field has
    none."""
    out = re.sub("%[jAax%]", lambda m: _LOG_FIELDS[m.group(0)], pattern)
    if "%" in out.replace("%%", ""):
        raise ValueError(
            f"{what} {pattern!r}: Grid Engine has only %j, %A, %a, %x of sbatch's fields"
        )
    return word(out, what)


@dataclass(frozen=True)
class ArrayTasks:
    """An array as qsub takes it: ``-t FIRST-LAST:STEP`` (ids from 1), ``-tc LIMIT``."""

    first: int
    last: int
    step: int
    limit: int | None


def array_tasks(spec: str) -> ArrayTasks:
    """A Slurm ``--array`` range (``0-9``, ``0-15:4%2``) as Grid Engine tasks. Grid Engine
    numbers tasks from 1, so task N is Slurm's index N-1 (the job script says so). A list
    (``1,3,5``) has no one ``-t`` range."""
    m = _ARRAY.fullmatch(spec.strip())
    if m is None:
        raise ValueError(
            f"--array {spec!r}: Grid Engine takes one range, FIRST[-LAST[:STEP]][%LIMIT]"
        )
    first = int(m.group("first"))
    last = int(m.group("last") or first)
    step = int(m.group("step") or 1)
    if last < first or step < 1:
        raise ValueError(f"--array {spec!r}: the range is empty")
    limit = int(m.group("limit")) if m.group("limit") else None
    return ArrayTasks(first + 1, last + 1, step, limit)


def hold_jids(dependency: str) -> tuple[str, ...]:
    """The jobs a ``--dependency`` waits for, as ``-hold_jid`` takes them. Grid Engine waits
    for their end, whatever their exit: ``afterany:ID[:ID...]`` (or bare ids) is what it can
    say; ``afterok`` and the other kinds are refused rather than weakened."""
    ids: list[str] = []
    for part in dependency.split(","):
        kind, _, rest = part.partition(":")
        if kind.isdigit():
            ids += [kind, *filter(None, rest.split(":"))]
            continue
        if kind != "afterany":
            raise ValueError(
                f"--dependency {part!r}: Grid Engine's -hold_jid waits for a job's end, "
                "whatever its exit status; give afterany:ID"
            )
        ids += [i for i in rest.split(":") if i]
    if not ids or not all(i.isdigit() for i in ids):
        raise ValueError(f"--dependency {dependency!r}: expected afterany:ID[:ID...]")
    return tuple(ids)


def mail_events(mail_type: str) -> str:
    letters = ""
    for item in mail_type.split(","):
        found = _MAIL_EVENTS.get(item.strip().upper())
        if found is None:
            raise ValueError(
                f"--mail-type {item!r}: Grid Engine mails at {', '.join(_MAIL_EVENTS)} only"
            )
        letters += "".join(c for c in found if c not in letters)
    return letters


def runtime(seconds: int) -> str:
    """``h_rt`` as qsub prints it back (H:MM:SS)."""
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@dataclass(frozen=True)
class QsubRequest:
    """A job in Grid Engine's terms, every value already in its spelling."""

    name: str
    queue: str | None = None
    gpus: int = 0
    gpu_type: str | None = None
    runtime_s: int | None = None
    tasks: ArrayTasks | None = None
    hold: tuple[str, ...] = ()
    output: str | None = None
    error: str | None = None
    account: str | None = None
    mail_events: str | None = None
    mail_user: str | None = None
    rerunnable: bool = False
    token: str | None = None


def directives(job: QsubRequest) -> tuple[str, ...]:
    """The ``#$`` lines' options for ``job``, one option and its value each. Values are
    checked words (``word``); the order is fixed, so that a rendered script is stable."""
    lines = [
        f"-N {job_name(job.name)}",
        "-S /bin/bash",
        "-cwd",
        "-V",  # the submitting environment, as sbatch's default --export=ALL
    ]
    if job.error is None:
        lines.append("-j y")  # stderr into the output file, as sbatch without --error
    if job.queue is not None:
        lines.append(f"-q {word(job.queue, 'the queue')}")
    resources: list[str] = []
    if job.gpus:
        resources.append(f"gpu={job.gpus}")
        if job.gpu_type is not None:
            resources.append(f"gpu_type={word(job.gpu_type, 'the gpu_type')}")
    if job.runtime_s is not None:
        resources.append(f"h_rt={runtime(job.runtime_s)}")
    if resources:
        lines.append("-l " + ",".join(resources))
    if job.tasks is not None:
        t = job.tasks
        lines.append(f"-t {t.first}-{t.last}:{t.step}")
        if t.limit is not None:
            lines.append(f"-tc {t.limit}")
    if job.hold:
        lines.append("-hold_jid " + ",".join(word(j, "a job id") for j in job.hold))
    if job.output is not None:
        lines.append(f"-o {word(job.output, '--output')}")
    if job.error is not None:
        lines.append(f"-e {word(job.error, '--error')}")
    if job.account is not None:
        lines.append(f"-A {word(job.account, 'the account')}")
    if job.mail_events is not None:
        lines.append(f"-m {job.mail_events}")
    if job.mail_user is not None:
        lines.append(f"-M {word(job.mail_user, '--mail-user')}")
    lines.append(f"-r {'y' if job.rerunnable else 'n'}")
    if job.token is not None:
        lines.append(f"-ac clusterjob={word(job.token, 'the token')}")
    return tuple(lines)


def submit_argv(script_path: str, *, verify: bool = False) -> list[str]:
    """The qsub command for a written job script (its directives carry the request);
    ``verify``: ``-w v``, checked against the cluster, nothing submitted."""
    return ["qsub", *(("-w", "v") if verify else ()), script_path]
