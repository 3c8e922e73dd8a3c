"""A hot command's usual command line, read without Typer building the command.

On every run Typer turns the command function's signature into a click command: it reads
each parameter's type hints and builds an option for it (``submit``'s 45: about a tenth of
what submitit takes to build a whole script). The options it builds are the same every time,
so scripts/gen_compiled.py writes them down once (``fast_commands``, from the click command
Typer builds), and a run whose command line is plain (long options and their values, the
short ones as separate words, the positional arguments, ``--``) is read from that table and
calls the very function Typer would call, with the values Typer would pass.

Anything else goes to Typer as before, which alone prints help, errors and completions:
``--help``, an unknown or misspelt option, a missing or unconvertible value, a value that
starts with ``-``, ``-N2``, shell completion, or a table that no longer matches the sources
the options are declared in (their SHA-256 is in the table) or the Typer that built it.
tests/test_cli_fastpath.py compares the two ways' calls over many command lines.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

# Command -> (module, function, the files its options are declared in, relative to the
# package). Only commands run often enough for Typer's building to show.
FAST_COMMANDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "submit": (
        "clusterjob.cli.submit",
        "submit",
        ("cli/submit.py", "cli/common.py", "cli/completion.py"),
    ),
}
_PACKAGE = Path(__file__).resolve().parents[1]

# A parameter in the table: (name, kind, options, secondary options, multiple, absent value).
# kind: "flag" (secondary options give False), "int", "str", "path", "argument" (one word),
# "arguments" (the rest).
Param = tuple[str, str, tuple[str, ...], tuple[str, ...], bool, object]


def _path(value: str) -> Path:
    """A path as Typer's path type takes it: any path, but one that exists must be readable."""
    if os.path.exists(value) and not os.access(value, os.R_OK):
        raise ValueError(value)  # Typer says "... is not readable."
    return Path(value)


_CONVERT: dict[str, Callable[[str], object]] = {"int": int, "str": str, "path": _path}
# The parameter types the reader converts as Typer does, by the type's class; a path type
# only with the settings `_path` reads as Typer does.
_KINDS = {"IntParamType": "int", "StringParamType": "str", "TyperPath": "path"}
_PATH_SETTINGS = {
    "exists": False,
    "file_okay": True,
    "dir_okay": True,
    "readable": True,
    "writable": False,
    "resolve_path": False,
    "allow_dash": False,
    "path_type": None,
}


def declared_digest(files: tuple[str, ...]) -> str:
    """SHA-256 over the sources a command's options are declared in."""
    import hashlib  # loaded already on the way to a submit (the site cache)

    digest = hashlib.sha256()
    for name in files:
        with open(_PACKAGE / name, "rb") as fh:
            digest.update(fh.read())
    return digest.hexdigest()


def fast_call(argv: list[str]) -> Callable[[], object] | None:
    """The call Typer would make for ``argv``, or None where Typer must read it."""
    if not argv or argv[0] not in FAST_COMMANDS:
        return None
    import importlib

    import typer

    from clusterjob.cli.fast_commands import COMMANDS

    module_name, function, files = FAST_COMMANDS[argv[0]]
    table = COMMANDS.get(argv[0])
    if table is None or table["typer"] != typer.__version__:
        return None
    kwargs = parse(table["params"], argv[1:])  # type: ignore[arg-type]
    if kwargs is None or table["declared"] != declared_digest(files):
        return None
    callback = getattr(importlib.import_module(module_name), function)
    return lambda: callback(**kwargs)


def parse(params: tuple[Param, ...], words: list[str]) -> dict[str, Any] | None:
    """``words`` read as click reads them, for the plain forms only; None otherwise."""
    if not words:  # no_args_is_help: Typer shows the help
        return None
    by_option: dict[str, tuple[Param, bool]] = {}
    for param in params:
        for option in param[2]:
            by_option[option] = (param, True)
        for option in param[3]:
            by_option[option] = (param, False)
    values: dict[str, Any] = {}
    positional: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            positional += words[i:]
            break
        if not word.startswith("-") or word == "-":
            if word == "-":
                return None
            positional.append(word)
            continue
        name, equals, attached = word.partition("=")
        if equals and not name.startswith("--"):
            return None
        found = by_option.get(name)
        if found is None:
            return None  # --help, a typo, -N2, ...: Typer says what it is
        (key, kind, _, _, multiple, _), primary = found
        if kind == "flag":
            if equals:
                return None
            values[key] = primary
            continue
        if equals:
            value = attached
        else:
            if i >= len(words) or words[i].startswith("-"):
                return None
            value = words[i]
            i += 1
        try:
            converted = _CONVERT[kind](value)
        except (KeyError, ValueError):
            return None
        if multiple:
            values.setdefault(key, []).append(converted)
        else:
            values[key] = converted
    arguments = [p for p in params if p[1] in ("argument", "arguments")]
    for key, kind, _, _, _, _ in arguments:
        if kind == "argument":
            if positional:
                values[key] = positional.pop(0)
        elif positional:
            values[key], positional = positional, []
    if positional:  # more words than arguments: Typer's error
        return None
    for key, _, _, _, _, absent in params:
        values.setdefault(key, absent)
    return values


def commands_module(generator: str) -> str:
    """The source of ``fast_commands``: each fast command's table, from Typer's click command.
    Build time only (scripts/gen_compiled.py): imports every command and builds the app."""
    import typer

    lines = [
        f"# Generated by {generator} from the Typer app: do not edit by hand.",
        '"""The options of the commands ``clusterjob.cli.fastpath`` reads without Typer',
        'building them: as Typer builds them, with the value each takes when not given."""',
        "",
        "from __future__ import annotations",
        "",
        "COMMANDS: dict[str, dict[str, object]] = {",
    ]
    for command, (module, function, files) in FAST_COMMANDS.items():
        params = command_table(module, function)
        lines += [
            f"    {command!r}: {{",
            f"        'typer': {typer.__version__!r},",
            f"        'declared': {declared_digest(files)!r},",
            "        'params': (",
            *(f"            {p!r}," for p in params),
            "        ),",
            "    },",
        ]
    lines.append("}")
    return "\n".join(lines) + "\n"


def typer_command(callback: Callable[..., object]) -> Any:
    """The click command Typer builds for ``callback`` alone (no app, no help on no args)."""
    import typer
    import typer.main

    alone = typer.Typer(add_completion=False, rich_markup_mode=None)
    alone.command(no_args_is_help=False)(callback)
    return typer.main.get_command(alone)


def typer_call(callback: Callable[..., object], words: list[str]) -> dict[str, Any]:
    """The keyword arguments Typer calls ``callback`` with for ``words`` (raises as click)."""
    import functools

    seen: dict[str, Any] = {}

    @functools.wraps(callback)
    def capture(**kwargs: Any) -> None:
        seen.update(kwargs)

    typer_command(capture).main(args=words, standalone_mode=False)
    return seen


def command_table(module: str, function: str) -> list[Param]:
    """The parameters of ``module.function`` as Typer builds them; refuses any this module's
    reader does not read as click does (an environment variable, a callback, a choice...)."""
    import importlib

    callback = getattr(importlib.import_module(module), function)
    command = typer_command(callback)
    absent = typer_call(callback, [])
    table: list[Param] = []
    for param in command.params:
        name = param.name
        if param.envvar or param.callback is not None or name not in absent:
            raise ValueError(f"{module}.{function}: {name}: not read by the fast path")
        if param.param_type_name == "argument":
            if param.nargs not in (1, -1):
                raise ValueError(f"{name}: nargs {param.nargs}")
            kind = "argument" if param.nargs == 1 else "arguments"
            table.append((name, kind, (), (), False, absent[name]))
            continue
        if param.is_flag:
            if not param.is_bool_flag or param.count or param.multiple:
                raise ValueError(f"{name}: a flag that is not a plain boolean")
            kind = "flag"
        else:
            kind = _KINDS.get(type(param.type).__name__, "")
            if kind == "path" and any(
                getattr(param.type, k, v) != v for k, v in _PATH_SETTINGS.items()
            ):
                raise ValueError(f"{name}: a path type with other settings")
            if not kind or param.nargs != 1:
                raise ValueError(f"{name}: type {param.type!r}, nargs {param.nargs}")
        table.append(
            (
                name,
                kind,
                tuple(param.opts),
                tuple(param.secondary_opts),
                bool(param.multiple),
                absent[name],
            )
        )
    return table
