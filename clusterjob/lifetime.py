"""What a command may leave until after its answer: releasing what only its own process used.

A command server's worker (``clusterjob.cli.server``) tells its client the command's exit
status and only then ends; whatever the command still has to release but that changes
nothing anyone can see, it can release between the two, while the client goes on. The job
registry is the case in point: the close of a database's last SQLite connection copies the
write-ahead log into the database and syncs both to disk, ~0.8 ms of every submit
(``Registry._connect``). Only a release nobody else waits for may be left: a connection
whose use failed (a write transaction rolled back with it, its lock held until then) is
closed at once. Anywhere else (a command in a process of its own, the Python API) a
release runs at once, as before. Imports nothing: the server's worker calls it before the
command's modules are in use.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Callable

# The releases left for after the answer; None where no answer comes before the process's end.
_pending: list[Callable[[], None]] | None = None
# Left for later at most: beyond this the oldest runs at once (a command that loops, such as
# ``status --watch``, keeps no more open). Releasing the oldest while later ones still wait
# is the cheap case: a connection that is not a database's last one closes without copying.
MOST_PENDING = 4


def answer_first() -> None:
    """This process answers before it ends: leave releases until ``answered``."""
    global _pending
    _pending = []


def after_answer(release: Callable[[], None]) -> None:
    """Run ``release`` once the command's answer is given, or now where none comes first."""
    if _pending is None:
        release()
        return
    _pending.append(release)
    if len(_pending) > MOST_PENDING:
        _pending.pop(0)()


def answered() -> None:
    """The answer is given: run what was left for it, oldest first. One that fails is
    passed over (no one is left to tell, and the rest still runs)."""
    global _pending
    pending, _pending = _pending or [], None
    for release in pending:
        try:  # noqa: SIM105 - this module imports nothing
            release()
        except Exception:
            pass
