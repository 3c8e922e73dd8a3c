"""The command line.

``app`` is the Typer app: every command's options, help and completion, and ``run``, where
an outcome becomes an exit code. ``fastpath`` runs the hot commands' usual command lines
without importing Typer, through the same command code; ``outcome`` maps errors to a
one-line message and an exit code for both. This package's ``__init__`` imports nothing, so
the fast path pays for no more than it uses.
"""
