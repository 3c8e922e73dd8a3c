"""The Slurm hooks' command line: ``clusterjob prolog`` and ``clusterjob task-prolog``.

Dispatched by ``clusterjob.__main__`` without Typer: the hooks run before every job (and
task) on every node, so this path is stdlib-only. The work is in ``clusterjob.node.prolog``
and ``clusterjob.node.task_prolog``; here only the arguments are read.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

# The hooks run before every job: typing is not imported at run time (~3 ms of each Prolog).
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from typing import NoReturn

__all__ = ["hook_main"]


# What `--help` says of each hook, in the words and layout of every other command's help.
_ABOUT = {
    "prolog": "Check this node's GPUs before a job starts on it (slurm.conf Prolog=, as root); "
    "a failed check drains the node and requeues the job. Slurm runs it before every job, "
    "so it takes its options without Typer: only these.",
    "task-prolog": "Print the CUDA variables for a task (slurm.conf TaskProlog=, as the job's "
    "user): CUDA_DEVICE_ORDER=PCI_BUS_ID and, where needed, CUDA_VISIBLE_DEVICES. Never "
    "fails the task.",
    "epilog": "Read the job's GPUs' error state after a job (slurm.conf Epilog=, as root): "
    "Xid events, uncorrectable ECC errors, row remapping, a GPU lost, and the kernel log's "
    "Xid lines; a fault that needs a GPU reset drains the node, naming the Xid, the GPU and "
    "the job.",
}


def _parser(command: str) -> argparse.ArgumentParser:
    import argparse  # not for the Prolog's usual command line: see _prolog_args

    from clusterjob.node.context import DEFAULT_CACHE_DIR, DEFAULT_SITE

    class _ArgParser(argparse.ArgumentParser):
        """argparse that reports a usage error in one line (exit 2) instead of a usage block,
        and whose help has the layout of the Typer commands' (click's): the hooks keep
        argparse only because Slurm starts them before every job, where Typer costs time."""

        def error(self, message: str) -> NoReturn:
            print(f"clusterjob {self.prog.split()[-1]}: {message}", file=sys.stderr)
            raise SystemExit(2)

        def format_help(self) -> str:
            import textwrap

            rows = []
            for action in self._actions:
                names = ", ".join(action.option_strings)
                if action.nargs != 0:
                    kind = "float" if action.type is float else "str"
                    names += f" <{kind}>"
                rows.append((names, action.help or ""))
            width = max(len(names) for names, _ in rows) + 2
            lines = [f"Usage: {self.prog} [OPTIONS]", ""]
            lines += textwrap.wrap(self.description or "", 78, initial_indent="  ",
                                   subsequent_indent="  ")  # fmt: skip
            lines += ["", "Options:"]
            for names, text in rows:
                wrapped = textwrap.wrap(text, 78 - 2 - width) or [""]
                lines.append(f"  {names:<{width}}{wrapped[0]}".rstrip())
                lines += [" " * (2 + width) + more for more in wrapped[1:]]
            return "\n".join(lines) + "\n"

    p = _ArgParser(
        prog=f"clusterjob {command}", description=_ABOUT.get(command), allow_abbrev=False,
        add_help=False,
    )  # fmt: skip
    if command == "task-prolog":
        p.add_argument("--site", help="Site config file (only for its NVML deadline).")
    else:
        p.add_argument("--site", help=f"Site config file (default {DEFAULT_SITE}; never from env).")
    if command == "prolog":
        p.add_argument("--cache-dir", help=f"Parsed-config cache (default {DEFAULT_CACHE_DIR}).")
        p.add_argument(
            "--deadline", type=float, help="Seconds (default: the site's prolog policy)."
        )
        p.add_argument("--log", help="JSON-lines log file (default: the site's prolog policy).")
    if command == "epilog":
        p.add_argument("--cache-dir", help=f"Parsed-config cache (default {DEFAULT_CACHE_DIR}).")
        p.add_argument(
            "--deadline", type=float, help="Seconds (default: the site's prolog policy)."
        )
        p.add_argument(
            "--log", help="JSON-lines log file (default: epilog.jsonl beside the Prolog's log)."
        )
        p.add_argument(
            "--kernel-log",
            help="Read the NVRM Xid lines from this file (default: /dev/kmsg, best effort).",
        )
    p.add_argument("-h", "--help", action="help", help="Show this message and exit.")
    return p


_PROLOG_OPTIONS = ("--site", "--cache-dir", "--deadline", "--log")


def _prolog_args(rest: list[str]) -> SimpleNamespace | None:
    """The Prolog's command line as slurm.conf writes it (``--site F --cache-dir D``), read
    without building the argparse parser (argparse, gettext, shutil, locale: ~8 ms of every
    job's start). None for anything else (``--help``, an unknown or abbreviated option, a
    missing or dash-led value, a bad number): argparse then reads it and says what is wrong.
    """
    values: dict[str, object] = {"site": None, "cache_dir": None, "deadline": None, "log": None}
    i = 0
    while i < len(rest):
        name, eq, value = rest[i].partition("=")
        if name not in _PROLOG_OPTIONS:
            return None
        if not eq:
            if i + 1 == len(rest) or rest[i + 1].startswith("-"):
                return None
            i += 1
            value = rest[i]
        i += 1
        values[name[2:].replace("-", "_")] = value
    if values["deadline"] is not None:
        try:
            values["deadline"] = float(str(values["deadline"]))
        except ValueError:
            return None
    return SimpleNamespace(**values)


def hook_main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    """``argv`` is ``["prolog", ...]``, ``["task-prolog", ...]`` or ``["epilog", ...]``;
    returns the exit code."""
    env = os.environ if environ is None else environ
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command not in ("prolog", "task-prolog", "epilog"):
        print(f"clusterjob: unknown hook {command!r}", file=sys.stderr)
        return 2
    try:
        args: SimpleNamespace | argparse.Namespace | None = None
        if command == "prolog":
            args = _prolog_args(rest)
        if args is None:
            args = _parser(command).parse_args(rest)
    except SystemExit as exc:
        if exc.code == 0:  # --help
            return 0
        if command == "task-prolog":  # never fail the task, even for a bad wrapper line
            print("print clusterjob: warning: task-prolog: bad arguments", flush=True)
            return 0
        return int(exc.code or 0)
    site: str | None = args.site
    if command == "epilog":
        try:
            from clusterjob.node.epilog import run_epilog

            return run_epilog(
                env,
                site=site,
                cache_dir=args.cache_dir,
                deadline=args.deadline,
                log=args.log,
                kernel_log=args.kernel_log,
            )
        except BaseException as exc:  # last resort: one line, drain
            print(f"clusterjob epilog: internal error: {type(exc).__name__}", file=sys.stderr)
            return 1
    if command == "prolog":
        try:
            from clusterjob.gpu.isolation import ChildRead, start_nvml_read

            # First of all: NVML loads in a child while the checks and the site load here
            # (pynvml and the driver's init cost about as much as clusterjob's own imports).
            reading: ChildRead | None = None
            # No process to spare now: run_prolog forks once the site's policy is known, and
            # follows that policy if it fails again.
            try:  # noqa: SIM105 (contextlib's import, with collections and functools: 4 ms)
                reading = start_nvml_read()
            except OSError:
                pass
            from clusterjob.node.prolog import run_prolog

            return run_prolog(
                env,
                site=site,
                cache_dir=args.cache_dir,
                deadline=args.deadline,
                log=args.log,
                reading=reading,
            )
        except BaseException as exc:  # last resort: one line, drain
            print(f"clusterjob prolog: internal error: {type(exc).__name__}", file=sys.stderr)
            return 1
    from clusterjob.node.task_prolog import run_task_prolog

    return run_task_prolog(env, sys.stdout, site)
