"""Quoting for the two languages a job script speaks: bash, and sbatch's ``#SBATCH`` lines.

Every value that reaches the shell goes through ``shell_quote`` (the template filter ``q``);
every value that reaches an ``#SBATCH`` line goes through ``sbatch_value``. Both refuse what
cannot be written safely (NUL anywhere; newlines in directives) with a ``UsageError``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from clusterjob.errors import UsageError

# Characters that need no quoting on an #SBATCH line. sbatch splits the line on whitespace,
# takes '"' and "'" as quotes, '\\' as an escape and an unquoted '#' as the start of a comment
# (src/sbatch/opt.c, _get_argument); everything else is taken literally.
_SBATCH_SAFE = re.compile(r"[A-Za-z0-9_@%:,./=+\-\[\]*&|!^~?]+")
# Control characters bash would keep verbatim inside '...' but that break a script's lines.
_CONTROL = re.compile(r"[\x01-\x1f\x7f]")


def _describe(what: str) -> str:
    return f" in {what}" if what else ""


def check_no_nul(value: str, what: str = "") -> str:
    """A NUL byte cannot be passed through argv or the environment: refuse it early."""
    if "\x00" in value:
        raise UsageError(f"NUL character{_describe(what)} is not allowed: {value!r}")
    return value


def shell_quote(value: object) -> str:
    """Quote ``value`` as one bash word (lists: one word each, space separated).

    Plain text is quoted as ``shlex.quote`` does. Text with control characters (newline, tab,
    escape...) is written as ``$'...'`` with escapes, so every quoted value stays on one line
    of the script and cannot hide a line from a reader or a line-based tool.
    """
    if isinstance(value, (list, tuple)):
        return " ".join(shell_quote(v) for v in value)
    if isinstance(value, bool) or value is None:
        raise TypeError(f"refusing to shell-quote {value!r}: say what it means as text first")
    text = check_no_nul(str(value))
    if not _CONTROL.search(text):
        return shlex.quote(text)
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif _CONTROL.match(ch):
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def shell_join(words: Iterable[object]) -> str:
    """A command line that bash splits back into exactly ``words``."""
    return " ".join(shell_quote(w) for w in words)


def check_directive_value(value: str, what: str = "") -> str:
    """Refuse what cannot be written on one ``#SBATCH`` line (newline, CR, NUL)."""
    check_no_nul(value, what)
    if "\n" in value or "\r" in value:
        raise UsageError(
            f"line break{_describe(what)} is not allowed: {value!r} "
            "(an #SBATCH directive must fit on one line)"
        )
    return value


def sbatch_value(value: object, what: str = "") -> str:
    """``value`` written so that sbatch's #SBATCH parser reads it back as one argument."""
    text = check_directive_value(str(value), what)
    if text and _SBATCH_SAFE.fullmatch(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def sbatch_option(option: str, what: str = "") -> str:
    """An option ``--name`` or ``--name=value`` for an #SBATCH line, its value quoted as needed."""
    check_directive_value(option, what or option)
    name, sep, value = option.partition("=")
    if not name.startswith("-") or not _SBATCH_SAFE.fullmatch(name):
        raise UsageError(f"not an sbatch option: {option!r} (expected --name or --name=value)")
    if not sep:
        return name
    return f"{name}={sbatch_value(value, what or name)}"
