"""The requeue limit (``--max-requeues``): how often a job may be requeued, and how a job
that stopped itself past it reads.

Slurm requeues a job after a preemption, a node failure or a ``scontrol requeue`` (and, with
``--requeue``, at its time limit when asked to) and starts it again with
``SLURM_RESTART_COUNT`` one higher, with no limit of its own (seen: six times). The job script
compares that count with the limit and stops an attempt past it with ``LIMIT_EXIT``; a
function job's worker does not requeue itself past it. ``status``, ``show``, ``wait`` and the
API read that exit as the limit reached, not as a bare failure.
"""

from __future__ import annotations

import re

from clusterjob.envvars import MAX_REQUEUES
from clusterjob.errors import UsageError

DEFAULT_MAX_REQUEUES = 3  # as submitit's max_num_timeout
# What an attempt past its limit exits with: no sysexits meaning, not bash's own (1, 2, 126+),
# so that it is told apart from the program's failures.
LIMIT_EXIT = 79
# What a job script exits with when its required preflight failed on a node: EX_CONFIG of
# sysexits, again neither bash's own nor the program's usual codes (jobs/badnodes.py reads it).
PREFLIGHT_EXIT = 78

_RECORDED = re.compile(rf"^export {MAX_REQUEUES}=([0-9]+)$", re.MULTILINE)


def check_max_requeues(value: object, option: str = "--max-requeues") -> int:
    """A requeue limit as given: a whole number, 0 or more (0: never run again once requeued)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"{option} {value!r}: give a whole number of requeues, 0 or more")
    return value


def recorded_limit(script: str) -> int | None:
    """The limit a recorded job script enforces (its ``export CLUSTERJOB_MAX_REQUEUES=N``);
    None for a script written before there was one (or a template that dropped it)."""
    m = _RECORDED.search(script)
    return int(m.group(1)) if m else None


def stopped_at_limit(exit_code: int | None, script: str) -> int | None:
    """The limit a job ended at, when it stopped itself past it (exit ``LIMIT_EXIT`` from a
    script that enforces one); None otherwise."""
    if exit_code != LIMIT_EXIT:
        return None
    return recorded_limit(script)


def limit_text(limit: int, restarts: int | None) -> str:
    """How a job stopped at its limit is told: ``requeued 4 times, limit 3 reached``."""
    if restarts is None or restarts < max(limit, 1):  # the count is not known (any more)
        times = f"at least {_times(max(limit, 1))}"
    else:
        times = _times(restarts)
    return f"requeued {times}, limit {limit} reached: the job stopped itself (--max-requeues)"


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"
