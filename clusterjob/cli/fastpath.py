"""A hot command's usual command line, run without importing Typer.

Importing Typer costs about half of what submitit takes to build a whole script, and on every
run Typer turns the command function's signature into a click command: it reads each
parameter's type hints and builds an option for it (``submit``'s 45). The options it builds
are the same every time, so scripts/gen_compiled.py writes them down once (``fast_commands``,
from the click command Typer builds), and a run whose command line is plain (long options
and their values, the short ones as separate words, the positional arguments, ``--``) is
read from that table and calls, with the values Typer would pass, the Typer-free function
the command's Typer declaration calls. ``clusterjob --help`` prints the command list Typer
printed when the table was written, where Typer would print that same text.

Anything else goes to Typer as before, which alone prints help, errors and completions:
a command's ``--help``, an unknown or misspelt option, a missing or unconvertible value, a
value that starts with ``-``, ``-N2``, shell completion, ``--debug``, or a table that no
longer matches the sources it was written from (their SHA-256 is in the table) or the Typer
that would run. tests/test_cli_fastpath.py compares both ways over many command lines.

A Typer other than the one the tables were written with (any release the pin allows, or
one the pin does not) is not trusted on its version: the first run of a command that Typer
makes under it builds that command's table from Typer's own click command and notes in
the user's private cache whether it is the very table shipped (``note_typer_agreement``);
where it is, the runs after it take the fast path, and where not, they go to Typer without
looking again. The listing is noted alike, by the text Typer printed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

# Command -> (the module and function that declare it for Typer, the files its options are
# declared in, relative to the package, and the Typer-free function that does it, which the
# declaring function calls with every option by name). Only commands run often enough for
# Typer's import and building to show.
FAST_COMMANDS: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    "submit": (
        "clusterjob.cli.submit",
        "submit",
        ("cli/submit.py", "cli/options.py", "cli/completion.py"),
        "clusterjob.cli.submitting:run_submit",
    ),
    "status": (
        "clusterjob.cli.jobs",
        "status",
        ("cli/jobs.py", "cli/options.py", "cli/completion.py"),
        "clusterjob.cli.status_report:run_status",
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


_CONVERT: dict[str, Callable[[str], object]] = {
    "int": int,
    "float": float,
    "str": str,
    "path": _path,
}
# The parameter types the reader converts as Typer does, by the type's class; a path type
# only with the settings `_path` reads as Typer does.
_KINDS = {
    "IntParamType": "int",
    "FloatParamType": "float",
    "StringParamType": "str",
    "TyperPath": "path",
}
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


def fast_main(argv: list[str]) -> int | None:
    """Run ``argv`` without Typer if the fast path reads it: the exit code; None where Typer
    must read it (and the caller runs ``clusterjob.cli.app.run``)."""
    if argv not in HELP_ARGV and (not argv or argv[0] not in FAST_COMMANDS):
        return None
    from clusterjob import envvars

    if "--debug" in argv or os.environ.get(envvars.DEBUG) == "1" or COMPLETION_VAR in os.environ:
        return None  # the debug log and shell completion are set up by the Typer app
    if argv in HELP_ARGV:
        return print_listing()
    call = fast_call(argv)
    if call is None:
        return None
    from clusterjob.cli.common import set_remote
    from clusterjob.cli.outcome import guarded

    set_remote(None, None, no_sync=False)  # as the app's callback does: no app option given
    return guarded(call, debug=False)


# The environment variable Typer's shell completion runs the program with.
COMPLETION_VAR = "_CLUSTERJOB_COMPLETE"

# `clusterjob --help` and `-h`: the list of commands, as Typer prints it where it wraps help
# at its widest (a terminal of LISTING_COLUMNS columns or more, or no terminal). Written by
# scripts/gen_compiled.py from the app's own output, printed as is while the CLI's sources
# and Typer's version are the ones it came from; any other width is Typer's to print.
HELP_ARGV: tuple[list[str], ...] = (["--help"], ["-h"])
LISTING_COLUMNS = 80


def listing_files() -> tuple[str, ...]:
    """The sources the listing is printed from: every module of the CLI but the tables."""
    names = sorted(p.name for p in (_PACKAGE / "cli").glob("*.py") if p.name != "fast_commands.py")
    return tuple(f"cli/{name}" for name in names)


def print_listing() -> int | None:
    """Print the generated listing and return 0; None where it may not be Typer's output."""
    from clusterjob.cli.fast_commands import LISTING

    if not _listing_current() or not typer_agrees(LISTING["typer"], "listing", listing_digest):
        return None
    import sys

    sys.stdout.write(LISTING["text"])
    return 0


def _listing_current() -> bool:
    """Whether the generated listing is the one Typer prints here at all, whichever Typer:
    as wide as it was written, from the CLI's sources as they are now."""
    import shutil

    from clusterjob.cli.fast_commands import LISTING

    return shutil.get_terminal_size().columns >= LISTING_COLUMNS and LISTING[
        "declared"
    ] == declared_digest(listing_files())


def typer_listing(columns: int = LISTING_COLUMNS) -> str:
    """The app's ``--help`` as Typer prints it ``columns`` wide, in a new interpreter: the
    order of the commands is the order their modules were first imported, which in a process
    that has imported some already (a test run) is not the command's own."""
    import subprocess
    import sys

    from clusterjob import envvars

    env = {k: v for k, v in os.environ.items() if k not in (envvars.DEBUG, COMPLETION_VAR)}
    env["COLUMNS"] = str(columns)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_PACKAGE.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    code = "import sys; from clusterjob.cli.app import run; sys.exit(run(['--help']))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"clusterjob --help exited {done.returncode}: {done.stderr}")
    return done.stdout


def listing_module_lines() -> list[str]:
    """``LISTING`` for the generated module: the app's ``--help`` at LISTING_COLUMNS."""
    import typer

    text = typer_listing()
    return [
        "",
        "LISTING: dict[str, str] = {",
        f"    'typer': {typer.__version__!r},",
        f"    'declared': {declared_digest(listing_files())!r},",
        "    'text': (",
        *(f"        {line!r}" for line in text.splitlines(keepends=True)),
        "    ),",
        "}",
    ]


def fast_call(argv: list[str]) -> Callable[[], object] | None:
    """The call Typer would make for ``argv``, or None where Typer must read it."""
    if not argv or argv[0] not in FAST_COMMANDS:
        return None
    import importlib

    from clusterjob.cli.fast_commands import COMMANDS

    _, _, files, target = FAST_COMMANDS[argv[0]]
    table = COMMANDS.get(argv[0])
    if table is None or not typer_agrees(str(table["typer"]), argv[0], lambda: table_digest(table)):
        return None
    words = argv[1:]
    if not words and table["no_args_is_help"]:
        return None  # Typer shows the help
    kwargs = parse(table["params"], words)  # type: ignore[arg-type]
    if kwargs is None or table["declared"] != declared_digest(files):
        return None
    module_name, _, function = target.partition(":")
    callback = getattr(importlib.import_module(module_name), function)
    return lambda: callback(**kwargs)


def typer_version() -> str | None:
    """The version of the Typer ``import typer`` would load, read from its ``__init__.py``
    without importing it (~40 ms); None where it is not a plain package on ``sys.path``."""
    import sys

    loaded = sys.modules.get("typer")
    if loaded is not None:
        return getattr(loaded, "__version__", None)
    for entry in sys.path:
        try:
            with open(os.path.join(entry or ".", "typer", "__init__.py"), encoding="utf-8") as fh:
                source = fh.read()
        except OSError:
            continue
        for line in source.splitlines():
            name, equals, value = line.partition("=")
            if equals and name.strip() == "__version__":
                return value.strip().strip("\"'")
        return None
    return None


def typer_agrees(written_with: str, what: str, digest: Callable[[], str]) -> bool:
    """Whether the Typer ``import typer`` would load builds ``what`` (a command's table, or
    the listing) as shipped: it is the release the table was written with, or a run under it
    found it builds the very same (``note_typer_agreement``, ``note_listing_agreement``).
    ``digest`` (of what is shipped) is asked for only in the second case."""
    version = typer_version()
    if version is None:
        return False
    return version == written_with or _verdict(version, what, digest()) is True


def _verdict(version: str, what: str, digest: str) -> bool | None:
    """What a run under Typer ``version`` found ``what`` to be: the same as shipped (True),
    not (False), or None where no run has looked yet. False too where there is nowhere to
    note it: a look on every run would cost every run what the fast path saves."""
    same = _note_path(version, what, digest, same=True)
    if same is None:
        return False
    if same.exists():
        return True
    return False if same.with_name(same.name + _DIFFERS).exists() else None


_DIFFERS = ".differs"


def _note_path(version: str, what: str, digest: str, *, same: bool) -> Path | None:
    """The note that Typer ``version`` builds ``what`` with ``digest`` (or, not ``same``,
    that it builds another): in the user's private cache (only this user writes there),
    named by all three; None where there is no such cache, or the version is not a plain
    release name."""
    if not version or not all(c.isalnum() or c in ".+-_" for c in version):
        return None
    from clusterjob.resources import private_cache_dir

    directory = private_cache_dir("fastpath")
    if directory is None:
        return None
    return directory / f"typer-{version}-{what}-{digest[:32]}{'' if same else _DIFFERS}"


def _note(version: str, what: str, digest: str, *, same: bool) -> None:
    path = _note_path(version, what, digest, same=same)
    if path is not None:
        try:  # noqa: SIM105 - contextlib is not loaded on the way here
            path.touch(mode=0o600)
        except OSError:
            pass  # looked at again next time


def _digest(*parts: object) -> str:
    import hashlib

    return hashlib.sha256(repr(parts).encode()).hexdigest()


def table_digest(table: dict[str, object]) -> str:
    """What a command's table says, but the Typer release it was written with."""
    return _digest(table["no_args_is_help"], table["declared"], table["params"])


def listing_digest() -> str:
    from clusterjob.cli.fast_commands import LISTING

    return _digest(LISTING["declared"], LISTING["text"])


def note_typer_agreement(command: str) -> None:
    """Typer is running ``command`` (its module imported, the command registered on the
    app): where this Typer is not the one the command's table was written with and no run
    under it has looked yet, build the table from its click command and note whether it is
    the very table shipped. Once noted, it is not looked at again: a Typer that builds
    another table (or one this reader refuses) pays for the look once, not on every run."""
    from clusterjob.cli.fast_commands import COMMANDS

    table = COMMANDS.get(command)
    version = typer_version()
    if table is None or version is None or table["typer"] == version:
        return
    digest = table_digest(table)
    files = FAST_COMMANDS[command][2]
    if (
        _verdict(version, command, digest) is not None
        or declared_digest(files) != table["declared"]
    ):
        return  # looked at already; or a table older than its sources, which no Typer reads
    try:
        built = built_table(command)
    except Exception:  # a parameter this reader does not read, a Typer that builds otherwise
        _note(version, command, digest, same=False)
        return
    _note(version, command, digest, same=table_digest(built) == digest)


def listing_to_check() -> bool:
    """Whether the listing Typer is about to print is worth comparing with the shipped one:
    printed as wide as it was written, by a Typer no run under it has compared yet."""
    from clusterjob.cli.fast_commands import LISTING

    version = typer_version()
    return (
        version is not None
        and version != LISTING["typer"]
        and _listing_current()
        and _verdict(version, "listing", listing_digest()) is None
    )


def note_listing_agreement(printed: str) -> None:
    """Typer printed ``printed`` for ``--help`` (``listing_to_check`` said to compare it):
    note whether it is the shipped listing."""
    from clusterjob.cli.fast_commands import LISTING

    version = typer_version()
    if version is not None:
        _note(version, "listing", listing_digest(), same=printed == LISTING["text"])


def parse(params: tuple[Param, ...], words: list[str]) -> dict[str, Any] | None:
    """``words`` read as click reads them, for the plain forms only; None otherwise."""
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
    for command in FAST_COMMANDS:
        table = built_table(command)
        lines += [
            f"    {command!r}: {{",
            f"        'typer': {typer.__version__!r},",
            f"        'no_args_is_help': {table['no_args_is_help']!r},",
            f"        'declared': {table['declared']!r},",
            "        'params': (",
            *(f"            {p!r}," for p in table["params"]),  # type: ignore[attr-defined]
            "        ),",
            "    },",
        ]
    lines.append("}")
    lines += listing_module_lines()
    return "\n".join(lines) + "\n"


def built_table(command: str) -> dict[str, object]:
    """A fast command's table, but the Typer release, as the Typer installed builds it: what
    the generator writes, and what ``note_typer_agreement`` compares with what it wrote."""
    module, function, files, _ = FAST_COMMANDS[command]
    return {
        "no_args_is_help": registered_settings(module, function),
        "declared": declared_digest(files),
        "params": tuple(command_table(module, function)),
    }


def registered_settings(module: str, function: str) -> bool:
    """Whether the app shows the command's help when it is given no words (its
    ``no_args_is_help``); refuses a command registered with settings the reader ignores."""
    import importlib

    from clusterjob.cli.app import app

    callback = getattr(importlib.import_module(module), function)
    info = next(i for i in app.registered_commands if i.callback is callback)
    if info.context_settings:
        raise ValueError(f"{module}.{function}: context settings {info.context_settings}")
    return bool(info.no_args_is_help)


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
