"""What Slurm accepts as a time, a memory size and a GRES type name: one definition each.

The site loader (partition limits, per-partition defaults, model GRES types) and the job
request (``--time``, ``--mem-per-gpu``) check values against these same patterns, so a value
one accepts the other cannot refuse. Pure; no I/O.
"""

from __future__ import annotations

import re

# What sbatch accepts for --mem / --mem-per-gpu: a number with an optional unit.
MEMORY_SIZE = re.compile(r"\A[0-9]+[KMGT]?\Z")

# What Slurm accepts as a GRES type name in gres.conf (Type=) and requests (gpu:TYPE:N).
GRES_TYPE_NAME = re.compile(r"\A[A-Za-z0-9_.-]+\Z")

_SHORT_WITH_VALUE = re.compile(r"-[A-Za-z].+")


def sbatch_option_name(arg: str) -> str:
    """The option an sbatch argument sets: ``--gres=nvme:10`` -> ``--gres``, ``-C gpu`` and
    ``-Cgpu`` -> ``-C``, ``--exclusive`` -> itself (two arguments naming one option replace
    each other in sbatch: the last wins)."""
    head = arg.split("=", 1)[0].split(" ", 1)[0]
    return head[:2] if _SHORT_WITH_VALUE.fullmatch(head) else head


# sbatch --time (Slurm's time_str2secs): every field any number of ASCII digits.
_TIME_FORMS = (
    re.compile(r"(?P<m>[0-9]+)"),  # minutes
    re.compile(r"(?P<m>[0-9]+):(?P<s>[0-9]+)"),  # minutes:seconds
    re.compile(r"(?P<h>[0-9]+):(?P<m>[0-9]+):(?P<s>[0-9]+)"),  # hours:minutes:seconds
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+)"),  # days-hours
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]+):(?P<m>[0-9]+)"),  # days-hours:minutes
    re.compile(
        r"(?P<d>[0-9]+)-(?P<h>[0-9]+):(?P<m>[0-9]+):(?P<s>[0-9]+)"
    ),  # days-hours:minutes:seconds
)
# No limit, as partitions print it and as a limit may be written (any case, as Slurm reads it).
UNLIMITED_TIMES = frozenset({"UNLIMITED", "INFINITE"})

_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def time_seconds(text: str) -> int | None:
    """Seconds in a Slurm time string (``90``, ``1:30:00``, ``2-00:00:00``); None when it is
    ``UNLIMITED`` or ``INFINITE``.

    Raises ValueError for anything sbatch would not accept (whitespace included).
    """
    if text.isascii() and text.upper() in UNLIMITED_TIMES:
        return None
    for form in _TIME_FORMS:
        m = form.fullmatch(text)
        if m:
            return sum(
                _SECONDS[unit] * int(value)
                for unit, value in m.groupdict().items()
                if value is not None
            )
    raise ValueError(f"not a Slurm time: {text!r} (expected minutes, HH:MM:SS or D-HH:MM:SS)")


def is_time(text: str) -> bool:
    """Whether ``text`` is a Slurm time string (``UNLIMITED``/``INFINITE`` included)."""
    try:
        time_seconds(text)
    except ValueError:
        return False
    return True


# --- job arrays -------------------------------------------------------------------------------

ARRAY_SPEC = re.compile(r"\A[0-9]+(?:-[0-9]+(?::[0-9]+)?)?(?:,[0-9]+(?:-[0-9]+(?::[0-9]+)?)?)*")
MAX_ARRAY_TASKS = 1_000_000


def array_task_ids(spec: str) -> list[int]:
    """The task ids of an ``--array`` value (``0-9%2``, ``1,3,8-15:4``), or of what squeue and
    sacct print for tasks not yet started (``[2-5%2]``); the ``%N`` limit is dropped.

    Raises ValueError for anything sbatch would not accept.
    """
    body = spec.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    body, _, limit = body.partition("%")
    if limit and not limit.isdigit():
        raise ValueError(f"{spec!r}: the %N task limit must be a number")
    if not ARRAY_SPEC.fullmatch(body):
        raise ValueError(f"{spec!r} is not an array spec (e.g. 0-9, 0-9%2, 1,3,5, 0-15:4)")
    ids: set[int] = set()
    for part in body.split(","):
        first, _, rest = part.partition("-")
        last, _, step = rest.partition(":")
        lo, hi, by = int(first), int(last or first), int(step or 1)
        if hi < lo or by < 1:
            raise ValueError(f"{spec!r}: range {part!r} is empty")
        if len(ids) + (hi - lo) // by + 1 > MAX_ARRAY_TASKS:
            raise ValueError(f"{spec!r}: more than {MAX_ARRAY_TASKS} tasks")
        ids.update(range(lo, hi + 1, by))
    return sorted(ids)


def split_array_id(job_id: str) -> tuple[str, str | None]:
    """``123_4`` -> (``123``, ``4``); ``123_[5-9%2]`` -> (``123``, ``[5-9%2]``); ``123`` ->
    (``123``, None)."""
    base, sep, task = job_id.partition("_")
    return base, (task if sep else None)
