"""The Typer app: parses arguments, calls the core, prints. No business logic here.

Command groups live in sibling modules (jobs, node, site, sandbox) and register
themselves on ``app`` when imported below. ``run`` maps every outcome to an exit code
through ``clusterjob.cli.outcome``, as the fast path does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Annotated

import typer
from typer.exceptions import TyperException

from clusterjob import __version__, envvars
from clusterjob.cli import fastpath
from clusterjob.cli.fastpath import COMPLETION_VAR
from clusterjob.cli.outcome import err, guarded
from clusterjob.errors import ExitCode, UsageError

app = typer.Typer(
    name="clusterjob",
    help="Get GPU jobs onto the right GPUs of a Slurm cluster, and prove it before training "
    "starts.\n\nSlurm hooks (`clusterjob site install-hooks` writes their wrappers for "
    "slurm.conf): `clusterjob prolog`, `clusterjob task-prolog`.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=True,  # --install-completion / --show-completion: bash, zsh, fish
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,  # plain click help: Rich's help renderer costs ~170 ms per --help
)


def _print_version(value: bool) -> None:
    if value:
        print(f"clusterjob {__version__}")
        raise typer.Exit()


# Commands that work on a remote cluster with --host; the others run on this machine (the
# node-side hooks and checks, the site and sandbox tools, workstation runs).
REMOTE_COMMANDS = frozenset(
    {"submit", "status", "logs", "cancel", "wait", "show", "resubmit", "shell", "nodes"}
)


@app.callback()
def _options(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            help="Use the cluster behind this login node over ssh: [USER@]HOST[:PORT] or a "
            "profile of ~/.config/clusterjob/hosts.yaml (default: $CLUSTERJOB_HOST).",
            show_default=False,
        ),
    ] = None,
    remote_dir: Annotated[
        str | None,
        typer.Option(
            "--remote-dir",
            help="With --host: the job directory there (default: the profile's, else "
            "~/clusterjob/NAME of this directory).",
            show_default=False,
        ),
    ] = None,
    no_sync: Annotated[
        bool,
        typer.Option("--no-sync", help="With --host: the remote dir already holds the code."),
    ] = False,
) -> None:
    """The app's own options; every command is a subcommand."""
    if host is not None and ctx.invoked_subcommand not in REMOTE_COMMANDS:
        raise UsageError(
            f"--host: `{ctx.invoked_subcommand}` runs on this machine; run it on the cluster "
            f"(--host works with: {', '.join(sorted(REMOTE_COMMANDS))})"
        )
    from clusterjob.cli.common import set_remote

    set_remote(host, remote_dir, no_sync=no_sync)


site_app = typer.Typer(
    help="Site: validate, show, gres-conf, schema, probe, init, diff, install-hooks.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(site_app, name="site")
sandbox_app = typer.Typer(
    help="A local Slurm cluster with stand-in GPUs, for trying clusterjob and for its tests.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(sandbox_app, name="sandbox")


_DEBUG_LINES = "clusterjob-debug-lines"  # the handler's name: added once per process


def _show_debug_log() -> None:
    """clusterjob's debug log (what the parsers skipped, ...), one ``debug:`` line each, on
    the sys.stderr of the moment."""
    import logging  # only with --debug: a plain `clusterjob --help` does without it (~7 ms)

    class DebugLines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            err(f"debug: {self.format(record)}")

    logger = logging.getLogger("clusterjob")
    if not any(h.get_name() == _DEBUG_LINES for h in logger.handlers):
        handler = DebugLines()
        handler.set_name(_DEBUG_LINES)
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)


COMPLETION_SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _show_completion(shell: str) -> int:
    """``--show-completion SHELL``: that shell's script. Typer's own option reads no value
    under Click 8.2+ and guesses the shell from the parent processes instead: `--show-completion
    zsh` run from bash printed bash's, and from a script with no shell above it, "Shell  not
    supported"."""
    from typer._completion_shared import get_completion_script

    print(get_completion_script(prog_name="clusterjob", complete_var=COMPLETION_VAR, shell=shell))
    return 0


def run(argv: list[str]) -> int:
    """Run the app on ``argv``; map every outcome to an exit code. ``--debug`` shows tracebacks."""
    debug = "--debug" in argv or os.environ.get(envvars.DEBUG) == "1"
    argv = [a for a in argv if a != "--debug"]
    if debug:  # a bug report then says which clusterjob and Python it came from
        err(f"debug: clusterjob {__version__}, Python {sys.version.split()[0]}, {sys.executable}")
    if debug:
        _show_debug_log()
    if len(argv) == 2 and argv[0] == "--show-completion" and argv[1] in COMPLETION_SHELLS:
        return _show_completion(argv[1])
    _register_commands(argv[0] if argv else None)
    shown = app
    completing = COMPLETION_VAR in os.environ  # shell completion: the whole app, nothing else
    if argv in LISTING_ARGV and not completing:
        shown = _listing(app)
    elif argv and argv[0] in fastpath.FAST_COMMANDS and not completing:
        fastpath.note_typer_agreement(argv[0])  # this Typer may read it without building

    def parsed_and_called() -> object:
        """Typer reads ``argv`` and calls the command; its own outcomes mapped here."""
        try:
            return shown(args=argv, prog_name="clusterjob", standalone_mode=False)
        except typer.Abort:
            err("aborted")
            return ExitCode.INTERRUPTED
        except typer.Exit as exc:
            return exc.exit_code
        except TyperException as exc:  # the argument parser's usage errors (Typer's own click)
            message = exc.format_message()
            if type(exc).__name__ == "NoSuchOption" and _takes_script(exc):
                message += " (arguments for SCRIPT that look like options go after --)"
            err(f"error: {message}")
            return int(getattr(exc, "exit_code", ExitCode.USAGE))

    if argv in fastpath.HELP_ARGV and not completing:
        return _listed(lambda: guarded(parsed_and_called, debug=debug))
    return guarded(parsed_and_called, debug=debug)


def _listed(print_listing: Callable[[], int]) -> int:
    """``print_listing``'s exit code; where the listing it prints is one this Typer may be
    found to print as shipped (``fastpath.listing_to_check``), it is compared and noted,
    printed all the same once it is complete."""
    if not fastpath.listing_to_check():
        return print_listing()
    import io

    shown, printed = sys.stdout, io.StringIO()
    sys.stdout = printed
    try:
        code = print_listing()
    finally:
        sys.stdout = shown
        shown.write(printed.getvalue())
    if code == 0:
        fastpath.note_listing_agreement(printed.getvalue())
    return code


# `clusterjob`, `--help`, `-h` and `--version` show the command list at most: each command's
# name and help. Typer would still read every command's signature and type hints to build its
# options (~35 ms, as long as importing the command modules); shell completion (which sets
# COMPLETION_VAR) needs them, and gets the whole app.
LISTING_ARGV: tuple[list[str], ...] = ([], ["--help"], ["-h"], ["--version"])


def _listing(full: typer.Typer) -> typer.Typer:
    """``full`` with every command's parameters left out, each command (and group) still
    named, helped, hidden and ordered as in ``full``, so its help reads the same."""
    import copy
    import inspect

    from typer.main import get_command_name

    listing = copy.copy(full)
    listing.registered_commands = []
    for info in full.registered_commands:
        shown = copy.copy(info)
        if info.callback is not None:
            shown.name = info.name or get_command_name(info.callback.__name__)
            shown.help = info.help if info.help is not None else inspect.getdoc(info.callback)
        shown.callback = _only_listed
        listing.registered_commands.append(shown)
    listing.registered_groups = []
    for group in full.registered_groups:
        shown_group = copy.copy(group)
        if group.typer_instance is not None:
            shown_group.typer_instance = _listing(group.typer_instance)
        listing.registered_groups.append(shown_group)
    return listing


def _only_listed() -> None:
    """A listed command's stand-in: the listing only shows commands, never runs one."""


_registered = False

# Command (or group) name -> the module that defines it. A run that names one of these
# imports only that module: `clusterjob submit` need not import the sandbox, the job
# registry or the workstation launcher (about half of its start-up time).
COMMAND_MODULES = {
    "submit": "submit",
    "status": "jobs",
    "logs": "jobs",
    "cancel": "jobs",
    "resubmit": "jobs",
    "wait": "jobs",
    "show": "jobs",
    "avail": "avail",
    "nodes": "avail",
    "shell": "interactive",
    "run": "workstation",
    "preflight": "node",
    "gpus": "node",
    "site": "site",
    "sandbox": "sandbox",
}


def _register_commands(command: str | None = None) -> None:
    """Import the command modules; each adds its commands to app, site_app or sandbox_app.

    With a known ``command``, only its module; otherwise (--help, a typo) all of them.
    """
    global _registered
    if _registered:
        return
    import importlib

    module = COMMAND_MODULES.get(command or "")
    if module is not None:
        importlib.import_module(f"clusterjob.cli.{module}")
        return
    # Import order is the order of `clusterjob --help`: the researcher's commands first.
    # isort: off
    from clusterjob.cli import submit, interactive, jobs, avail, workstation, node, site, sandbox  # noqa: F401
    # isort: on

    _registered = True


def _takes_script(exc: Exception) -> bool:
    """Whether the command the parser refused an option of takes a SCRIPT (`submit`, `shell`):
    only there can an option be meant for the script."""
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "command", None)
    return any(getattr(p, "name", None) == "script" for p in getattr(command, "params", ()))
