"""Commands: sandbox (registered on the app in clusterjob.cli)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from clusterjob.cli import sandbox_app

if TYPE_CHECKING:  # imported where used: `clusterjob --help` need not load the sandbox
    from clusterjob.sandbox import cluster

StateDir = Annotated[
    Optional[Path],  # noqa: UP045 (typer on Python 3.10 needs Optional here)
    typer.Option(
        "--state-dir",
        help="Where the sandbox keeps everything [env CLUSTERJOB_SANDBOX_DIR; "
        "default /var/lib/clusterjob-sandbox]",
        show_default=False,
    ),
]


def _progress(message: str) -> None:
    print(f"sandbox: {message}", file=sys.stderr)


def _print_status(st: cluster.SandboxStatus) -> None:
    for d in st.daemons:
        state = f"running (pid {d.pid})" if d.alive else "stopped"
        print(f"{d.name:<14} {state}")
    if st.controller:
        print(st.controller)
    for node, state, reason in st.nodes:
        print(f"node {node:<6} {state}" + (f"  reason: {reason}" if reason else ""))


def _print_exports(state_dir: Path) -> None:
    from clusterjob.sandbox import cluster

    for name, value in cluster.client_env(state_dir).items():
        print(f"export {name}={shlex.quote(value)}")


@sandbox_app.command()
def up(
    state_dir: StateDir = None,
    hooks: Annotated[
        bool, typer.Option(help="Wire clusterjob's Prolog and TaskProlog into slurm.conf.")
    ] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the daemons.")] = 120,
) -> None:
    """Start the local Slurm cluster with stand-in GPUs (as root); a no-op when it runs."""
    from clusterjob.sandbox import cluster

    path = cluster.resolve_state_dir(state_dir)
    result = cluster.up(path, hooks=hooks, timeout=timeout, say=_progress)
    if result.already_up:
        _progress(f"already up in {path}")
    else:
        _progress(f"up in {result.seconds:.1f}s; state in {path}")
    _print_status(result.status)
    print("# clients reach the sandbox with:")
    _print_exports(path)


@sandbox_app.command()
def down(
    state_dir: StateDir = None,
    purge: Annotated[bool, typer.Option(help="Also delete the state directory.")] = False,
) -> None:
    """Stop the daemons `sandbox up` started (its jobs are cancelled first)."""
    from clusterjob.sandbox import cluster

    path = cluster.resolve_state_dir(state_dir)
    stopped = cluster.down(path, purge=purge, say=_progress)
    _progress(f"stopped {len(stopped)} daemon(s)" if stopped else "nothing was running")


@sandbox_app.command()
def status(state_dir: StateDir = None) -> None:
    """Which daemons run and what slurmctld says about the nodes; exit 1 unless all is up."""
    from clusterjob.sandbox import cluster

    path = cluster.resolve_state_dir(state_dir)
    st = cluster.status(path)
    _print_status(st)
    if st.up:
        print(f"sandbox up ({path})")
    else:
        print("sandbox stopped" if st.stopped else "sandbox partly up")
        raise typer.Exit(1)


@sandbox_app.command()
def env(
    state_dir: StateDir = None,
    site_path: Annotated[
        bool, typer.Option("--site-path", help="Print only the sandbox's site YAML path.")
    ] = False,
) -> None:
    """Print the shell exports that point clients at the sandbox (eval "$(... sandbox env)")."""
    from clusterjob.sandbox import cluster
    from clusterjob.sandbox.config import Layout

    path = cluster.resolve_state_dir(state_dir)
    if site_path:
        print(Layout(path).site_yaml)
        return
    _print_exports(path)
