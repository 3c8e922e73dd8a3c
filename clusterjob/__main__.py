"""Entry point of the ``clusterjob`` command and of ``python -m clusterjob``.

The Slurm hooks (``prolog``, ``task-prolog``) run before every job on every node, so they
are dispatched here to a stdlib-only path (``clusterjob.node.hooks``) without importing
Typer, Rich or Jinja2. Everything else goes through the Typer app in ``clusterjob.cli``.
"""

from __future__ import annotations

import sys

HOOK_COMMANDS = ("prolog", "task-prolog")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in HOOK_COMMANDS:
        from clusterjob.node.hooks import hook_main

        return hook_main(args)
    if args[:1] == ["submit"]:  # python3 on PATH may be a shim that runs a process to name its
        # interpreter: start it now, while Typer and the command load (see submit_python.py)
        import os

        from clusterjob.jobscript.submit_python import start_find_submit_python

        start_find_submit_python(os.environ, for_later=True)
    from clusterjob.cli import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
