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
