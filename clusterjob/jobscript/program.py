"""What the job runs: a ``.py`` script with the job's Python, or any command as given.

``clusterjob submit train.py`` runs ``"$python" train.py``; ``clusterjob submit -- CMD ARGS``
runs CMD itself when it is not a ``.py`` file: an executable script through its own ``#!``
line, ``bash run.sh``, ``accelerate launch ...``. ``python``/``python3`` as CMD means the job's
chosen interpreter (``python -m pkg``). Checked at submit, in the submitting directory.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterjob.errors import UsageError

_PYTHON_NAME = re.compile(r"python[0-9.]*")
PYTHON_COMMANDS = frozenset({"python", "python3"})  # CMD words that mean the job's Python


@dataclass(frozen=True)
class Program:
    """How the job starts SCRIPT: ``command`` False runs it with the job's Python; True runs
    it as given (``script`` made ``./NAME`` for a file here, which PATH would not find)."""

    script: str
    command: bool


def _shebang(path: Path) -> str | None:
    """The interpreter word of ``path``'s ``#!`` line (``env python3`` gives ``python3``)."""
    try:
        with path.open("rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    name = os.path.basename(words[0])
    if name == "env":
        rest = [w for w in words[1:] if not w.startswith("-")]
        return rest[0] if rest else name
    return name


def classify(script: str, cwd: Path) -> Program:
    """How SCRIPT runs, or a one-line ``UsageError`` saying why it cannot."""
    path = Path(script) if os.path.isabs(script) else cwd / script
    if script.endswith(".py"):
        if not path.is_file():
            raise UsageError(f"script not found: {script!r}")
        return Program(script, command=False)
    if "/" not in script and not path.is_file():
        return Program(script, command=True)  # a command, found on the job's PATH
    if path.is_dir():
        raise UsageError(f"{script}: is a directory, not a program")
    if not path.is_file():
        raise UsageError(f"script not found: {script!r}")
    runnable = script if "/" in script else f"./{script}"
    if os.access(path, os.X_OK):
        return Program(runnable, command=True)  # through its own #! line
    interpreter = _shebang(path)
    if interpreter is not None and _PYTHON_NAME.fullmatch(interpreter):
        return Program(script, command=False)
    if interpreter is not None:
        raise UsageError(
            f"{script} is not executable and its #! line names {interpreter}: "
            f"chmod +x {script}, or submit it as: -- {interpreter} {script}"
        )
    raise UsageError(
        f"{script} is not executable and has no #! line: chmod +x it, or name its "
        f"interpreter: -- bash {script}"
    )


def _in_submit_dir(word: str) -> bool:
    """A relative path that stays inside the submitting directory (``src/train.py``)."""
    norm = posixpath.normpath(word)
    return not word.startswith(("/", "~", "-")) and norm != ".." and not norm.startswith("../")


def snapshot_word(script: str, args: Sequence[str], *, command: bool) -> int | None:
    """Which word of ``SCRIPT ARGS`` names the program's own file, the one a job run from a
    snapshot of the submitting directory starts from there (``--snapshot``): a script; an
    executable given as a path (``./run.sh``); else a command's first ``.py`` argument
    (``torchrun --nproc-per-node=2 train.py``, ``python train.py``). None when there is
    none, or it lies outside the submitting directory (it then runs where it is)."""
    if not command or "/" in script:
        return 0 if _in_submit_dir(script) else None
    for i, word in enumerate(args, 1):
        if word.endswith(".py") and not word.startswith("-"):
            return i if _in_submit_dir(word) else None
    return None
