"""The code blocks of README.md and docs/, read as the tests check them (docs/how-to/docs.md
says how to write each kind):

- ``console``: runnable. Each ``$ `` line (continued by a trailing backslash) is a command,
  run against the local cluster; a trailing ``# exit N`` says the exit status it must have
  (default 0). Other lines are output: compared for the commands scripts/gen_doc_outputs.py
  names (tests/e2e/test_docs_blocks.py), else a sample, not compared.
- ``sh`` / ``bash`` / ``shell``: illustrative, and say so on their first line (a comment
  beginning ``# illustrative``), or a file to copy (its first line ``#!``, its path in the
  block's ``title="..."``), which a test compares with what clusterjob writes.
- any other language with ``title="a/relative/path"``: a file the page's commands use,
  written there before they run.
- ``yaml``: a whole site file (a ``site:`` key: it must pass ``site validate``), or a
  fragment (first line ``# fragment``: it must parse, and name only keys the schema has).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHELLS = ("sh", "bash", "shell", "console")
ILLUSTRATIVE = "# illustrative"
FRAGMENT = "# fragment"
_FENCE = re.compile(
    r"^(?P<fence>```+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S
)
_EXIT = re.compile(r"\s+# exit (\d+)\s*$")


def documents() -> list[Path]:
    """README.md and every page under docs/ (the generated reference pages too)."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence
    lang: str
    attrs: str  # the rest of the info string, e.g. title="/etc/slurm/clusterjob-prolog"
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    @property
    def title(self) -> str | None:
        found = re.search(r'title="([^"]*)"', self.attrs)
        return found.group(1) if found else None

    @property
    def first_line(self) -> str:
        return self.text.split("\n", 1)[0]


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text(encoding="utf-8")
    found = []
    for m in _FENCE.finditer(text):
        info = m.group("info").strip()
        lang, _, attrs = info.partition(" ")
        line = text.count("\n", 0, m.start()) + 1
        found.append(Block(doc, line, lang.lower(), attrs.strip(), m.group("body")))
    return found


def all_blocks() -> list[Block]:
    return [b for doc in documents() for b in blocks(doc)]


@dataclass(frozen=True)
class Command:
    text: str  # as typed, continuation lines joined with their backslash-newlines
    expect: int  # the exit status the block says it has


def commands(block: Block) -> list[Command]:
    """The ``$ `` commands of a console block, in order."""
    out: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.startswith("$ "):
            continue
        parts = [line[2:]]
        while parts[-1].endswith("\\") and i < len(lines):
            parts.append(lines[i])
            i += 1
        text = "\n".join(parts)
        m = _EXIT.search(parts[-1])
        out.append(Command(text, int(m.group(1)) if m else 0))
    return out


def indented_commands(doc: Path) -> list[tuple[int, str]]:
    """Lines outside fences that an indented code block would show as a command: every
    command shown must be in a fenced block, so that it is run or marked illustrative."""
    text = doc.read_text(encoding="utf-8")
    spans = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    found = []
    offset = 0
    for n, line in enumerate(text.splitlines(keepends=True), start=1):
        inside = any(a <= offset < b for a, b in spans)
        offset += len(line)
        if inside or not line.startswith("    "):
            continue
        word = line.strip().split(" ", 1)[0]
        if word in ("clusterjob", "$", "bash", "pip", "pipx", "uv", "python", "python3", "eval"):
            found.append((n, line.rstrip()))
    return found
