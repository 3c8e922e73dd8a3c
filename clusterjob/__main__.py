"""Entry point of the ``clusterjob`` command and of ``python -m clusterjob``.

The Slurm hooks (``prolog``, ``task-prolog``) run before every job on every node, so they
are dispatched here to a stdlib-only path (``clusterjob.node.hooks``) without importing
Typer, Rich or Jinja2; so are the usual command lines of ``submit`` and ``status``
(``clusterjob.cli.fastpath``).
Everything else goes through the Typer app in ``clusterjob.cli.app``.
"""

import sys

HOOK_COMMANDS = ("prolog", "task-prolog", "epilog")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in HOOK_COMMANDS:
        from clusterjob.node.hooks import hook_main

        code = hook_main(args)
        return _end_process(code) if argv is None else code  # slurmd's process: end it here
    if args[:1] in (["bind-gpus"], ["release-gpus"]):  # a Grid Engine prolog/epilog: no Typer
        from clusterjob.gpubind.hook import bind_main, release_main

        return (bind_main if args[0] == "bind-gpus" else release_main)(args[1:])
    if args[:1] == ["sample-usage"]:  # started in every GPU job: no Typer either
        from clusterjob.node.usage import sample_usage_main

        return sample_usage_main(args[1:])
    if argv is None:  # a process of its own: its command may go to a command server
        from clusterjob.cli.client import run_served

        served = run_served(args)  # by a warm clusterjob of this user's, where one listens
        if served is not None:
            return _end_process(served)
    if args[:1] == ["submit"] and not _names_interpreter(args):  # python3 on PATH may be a
        # shim that runs a process to name its interpreter: start it now, while Typer and the
        # command load (see submit_python.py)
        import os

        from clusterjob.jobscript.submit_python import start_find_submit_python

        start_find_submit_python(os.environ, for_later=True)
    from clusterjob.cli.fastpath import fast_main

    fast = fast_main(args)  # the hot commands' usual command lines, without Typer
    if fast is not None:
        return _end_process(fast) if argv is None else fast
    from clusterjob.cli.app import run

    return run(args)


# Options with which `submit` never asks python3 on PATH (api/cluster.py's `prepare`). Read
# roughly: a word that only looks like one of them makes the command ask later (without the
# overlap), never answer differently.
_NO_SHIM_OPTIONS = ("--python", "--venv", "--conda", "--container-image", "--apptainer")


def _names_interpreter(args: list[str]) -> bool:
    words = args[: args.index("--")] if "--" in args else args
    return any(w.split("=", 1)[0] in _NO_SHIM_OPTIONS for w in words)


def _end_process(code: int) -> int:
    """End this process without the interpreter's teardown, or return ``code`` where it must
    run: unloading the modules a hook's checks or a submit imported (dataclasses, inspect,
    ...) costs 10-15 ms of every job's start and every submit, and buys nothing at the end of
    a process. Its exit handlers still run (a weakref finalizer reaping a child, ...) and its
    buffered output is flushed; while a thread of its own that is not a daemon still runs,
    the interpreter's exit waits for it as usual (a daemon thread stuck in NVML does not hold
    up a hook's end)."""
    threading = sys.modules.get("threading")
    if threading is not None and any(
        not t.daemon and t is not threading.main_thread() for t in threading.enumerate()
    ):
        return code
    import atexit
    import os

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib imports collections: 2 ms of a served command
            stream.flush()
        except Exception:  # the reader went away: nothing more to say
            pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
