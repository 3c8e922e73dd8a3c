"""How a command's outcome reaches the person who ran it: one line on stderr and an exit code.

The one place where clusterjob's errors become a message and an exit code, for the Typer app
(``clusterjob.cli.app.run``) and for the fast path (``clusterjob.cli.fastpath``) alike. It
imports neither Typer nor anything the fast path would not load anyway.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from clusterjob.errors import (
    ClusterjobError,
    ConfigError,
    ExitCode,
    SubmitInterrupted,
    exit_code,
    printable,
)


def err(message: str) -> None:
    """Print one line to stderr, prefixed so it is clear who is speaking; control characters
    (from Slurm's stderr, another user's claim text) are escaped, never sent to the tty."""
    print(f"clusterjob: {printable(message, lines=True)}", file=sys.stderr)


def guarded(command: Callable[[], object], *, debug: bool) -> int:
    """Run ``command``; map what it returns or raises to an exit code, saying why in one line.
    ``debug`` lets clusterjob's own errors and its bugs raise, with their tracebacks."""
    try:
        result = command()
    except ConfigError as exc:
        if debug:
            raise
        for issue in exc.issues:  # one line each: file:line: key.path: message
            print(printable(str(issue), lines=True), file=sys.stderr)
        errors = sum(1 for i in exc.issues if not i.warning)
        if len(exc.issues) > 1:
            err(f"error: {errors} problems in site config")
        return exit_code(exc)
    except ClusterjobError as exc:
        if debug:
            raise
        err(f"error: {exc}")
        return exit_code(exc)
    except SubmitInterrupted as exc:  # Ctrl-C in a submission: what became of the job
        err(str(exc))
        return ExitCode.INTERRUPTED
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Exception as exc:  # a bug in clusterjob: say so in one line, keep the stack for --debug
        if debug:
            raise
        err(f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)")
        return exit_code(exc)
    return result if isinstance(result, int) else ExitCode.OK
