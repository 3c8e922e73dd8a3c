"""Entry point of the ``clusterjob`` command and of ``python -m clusterjob``.

The Slurm hooks (``prolog``, ``task-prolog``) run before every job on every node, so they
are dispatched here to a stdlib-only path (``clusterjob.node.hooks``) without importing
Typer, Rich or Jinja2. Everything else goes through the Typer app in ``clusterjob.cli``.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # the hooks run before every job: typing is not imported at run time
    from typing import NoReturn

HOOK_COMMANDS = ("prolog", "task-prolog", "epilog")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in HOOK_COMMANDS:
        from clusterjob.node.hooks import hook_main

        code = hook_main(args)
        if argv is None:  # this process is the hook slurmd started: end it here
            _end_hook_process(code)
        return code
    if args[:1] in (["bind-gpus"], ["release-gpus"]):  # a Grid Engine prolog/epilog: no Typer
        from clusterjob.gpubind.hook import bind_main, release_main

        return (bind_main if args[0] == "bind-gpus" else release_main)(args[1:])
    if args[:1] == ["sample-usage"]:  # started in every GPU job: no Typer either
        from clusterjob.node.usage import sample_usage_main

        return sample_usage_main(args[1:])
    if args[:1] == ["submit"] and not _names_interpreter(args):  # python3 on PATH may be a
        # shim that runs a process to name its interpreter: start it now, while Typer and the
        # command load (see submit_python.py)
        import os

        from clusterjob.jobscript.submit_python import start_find_submit_python

        start_find_submit_python(os.environ, for_later=True)
    from clusterjob.cli import run

    return run(args)


# Options with which `submit` never asks python3 on PATH (api/cluster.py's `prepare`). Read
# roughly: a word that only looks like one of them makes the command ask later (without the
# overlap), never answer differently.
_NO_SHIM_OPTIONS = ("--python", "--venv", "--conda", "--container-image", "--apptainer")


def _names_interpreter(args: list[str]) -> bool:
    words = args[: args.index("--")] if "--" in args else args
    return any(w.split("=", 1)[0] in _NO_SHIM_OPTIONS for w in words)


def _end_hook_process(code: int) -> NoReturn:
    """End a hook's process without the interpreter's teardown: unloading the modules the
    checks imported (dataclasses, inspect, ...) costs ~15 ms of every job's start, and a hook
    has nothing left to clean up: its files are closed, its NVML reader reaped or killed, and
    nothing on its path registers exit handlers. Only the buffered output is flushed."""
    import contextlib  # loaded already by the hooks
    import os

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # slurmd stopped reading: nothing more to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
