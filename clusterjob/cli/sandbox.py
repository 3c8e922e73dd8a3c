"""Commands: sandbox (registered on the app in clusterjob.cli)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from clusterjob import envvars
from clusterjob.cli.app import sandbox_app
from clusterjob.errors import UsageError, printable

if TYPE_CHECKING:  # imported where used: `clusterjob --help` need not load the sandbox
    from clusterjob.sandbox import cluster
    from clusterjob.sandbox.which import SandboxChoice

StateDir = Annotated[
    Optional[Path],  # noqa: UP045 (typer on Python 3.10 needs Optional here)
    typer.Option(
        "--state-dir",
        help="Where the sandbox keeps everything [env CLUSTERJOB_SANDBOX_DIR; "
        "default /var/lib/clusterjob-sandbox]",
        show_default=False,
    ),
]


Slurm = Annotated[
    Optional[str],  # noqa: UP045 (typer on Python 3.10 needs Optional here)
    typer.Option(
        "--slurm",
        help="Slurm release: 22.05, 24.11 or 26.05; one the host does not ship runs in a "
        "Debian root of its own [env CLUSTERJOB_SANDBOX_SLURM; default: the host's Slurm]",
        envvar=envvars.SANDBOX_SLURM,
        show_default=False,
    ),
]


Scheduler = Annotated[
    str,
    typer.Option(
        "--scheduler",
        help="slurm, or gridengine: a Grid Engine cluster (qmaster and three execution hosts "
        "with stand-in GPUs) in a Debian root and namespaces of its own [default: slurm; "
        "gridengine's state dir: /var/lib/clusterjob-sandbox-gridengine]",
        show_default=False,
    ),
]
SCHEDULERS = ("slurm", "gridengine")


def _grid_engine(scheduler: str, **refused: object) -> bool:
    """Whether ``--scheduler`` names Grid Engine; options of the Slurm sandbox only are
    refused with it."""
    if scheduler not in SCHEDULERS:
        raise UsageError(f"--scheduler {scheduler}: valid are {', '.join(SCHEDULERS)}")
    if scheduler != "gridengine":
        return False
    import os

    if refused.get("slurm") == os.environ.get(envvars.SANDBOX_SLURM):
        refused.pop("slurm", None)  # set by the variable, for the Slurm sandbox: not ours
    given = [name for name, value in refused.items() if value not in (None, False)]
    if given:
        raise UsageError(f"--scheduler gridengine takes no --{', --'.join(given)}")
    return True


def _choose(slurm: str | None, state_dir: Path | None, *, any_up: bool = False) -> SandboxChoice:
    """The sandbox the options (or their variables) name: one rule for every command."""
    from clusterjob.sandbox import which

    return which.choose(slurm, state_dir, any_up=any_up)


def _progress(message: str) -> None:
    print(f"sandbox: {message}", file=sys.stderr)


def _print_status(st: cluster.SandboxStatus) -> None:
    for d in st.daemons:
        state = f"running (pid {d.pid})" if d.alive else "stopped"
        print(f"{d.name:<14} {state}")
    if st.controller:
        print(st.controller)
    for node, state, reason in st.nodes:
        print(f"node {node:<6} {state}" + (f"  reason: {printable(reason)}" if reason else ""))


def _print_exports(state_dir: Path) -> None:
    from clusterjob.sandbox import cluster

    for name, value in cluster.client_env(state_dir).items():
        print(f"export {name}={shlex.quote(value)}")


@sandbox_app.command()
def up(
    state_dir: StateDir = None,
    slurm: Slurm = None,
    hooks: Annotated[
        bool, typer.Option(help="Wire clusterjob's Prolog, TaskProlog and Epilog into slurm.conf.")
    ] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the daemons.")] = 120,
    like: Annotated[
        Optional[str],  # noqa: UP045 (typer on Python 3.10 needs Optional here)
        typer.Option(
            "--like",
            help="A site file (PATH or NAME) whose shape the cluster takes: its node names, "
            "GPUs per the node map, GRES, features, partitions, accounts and QoS (one node per "
            "GPU configuration); kept until down --purge.",
            show_default=False,
        ),
    ] = None,
    nodes: Annotated[
        Optional[str],  # noqa: UP045 (typer on Python 3.10 needs Optional here)
        typer.Option(
            "--nodes",
            metavar="HOSTLIST",
            help="With --like: more of the site's own nodes to run beside one per GPU "
            "configuration (gpu[01-04]), for jobs of several nodes; 30 nodes at most.",
            show_default=False,
        ),
    ] = None,
    scheduler: Scheduler = "slurm",
) -> None:
    """Start the local Slurm cluster with stand-in GPUs (as root); a no-op when it runs."""
    import os

    from clusterjob.sandbox import cluster, releases, shape
    from clusterjob.site.discovery import find_site

    if _grid_engine(scheduler, slurm=slurm, like=like, nodes=nodes):
        from clusterjob.sandbox import gridengine

        ge = gridengine.up(state_dir, timeout=timeout, say=_progress)
        word = "already up" if ge.already_up else f"up in {ge.seconds:.1f}s"
        _progress(f"Grid Engine {word}; state in {ge.layout.state_dir}")
        print("\n".join(gridengine.describe(ge.status, ge.layout)))
        print("# clients reach it with:")
        print("\n".join(gridengine.exports(ge.layout)))
        return
    site_file = None if like is None else find_site(like, environ=os.environ)
    if nodes is not None and site_file is None:
        raise UsageError("--nodes names nodes of the site given with --like; give --like too")
    choice = _choose(slurm, state_dir)
    rel = choice.release
    if rel is not None:
        text = releases.up(
            rel, hooks=hooks, timeout=timeout, say=_progress, like=site_file, nodes=nodes
        )
        print(text, end="")
        print(f"# or from the host: clusterjob sandbox exec --slurm {rel.version} -- COMMAND")
        return
    path = choice.state_dir
    wanted = () if nodes is None else shape.node_names(nodes)
    result = cluster.up(
        path, hooks=hooks, timeout=timeout, say=_progress, like=site_file, nodes=wanted
    )
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
    slurm: Slurm = None,
    purge: Annotated[bool, typer.Option(help="Also delete the state directory.")] = False,
    scheduler: Scheduler = "slurm",
) -> None:
    """Stop the daemons `sandbox up` started (its jobs are cancelled first); for another
    release, also end what runs in its root and unmount it."""
    from clusterjob.sandbox import cluster, releases

    if _grid_engine(scheduler, slurm=slurm):
        from clusterjob.sandbox import gridengine

        ran = gridengine.down(state_dir, purge=purge, say=_progress)
        _progress("Grid Engine stopped; its namespace ended" if ran else "nothing was running")
        return
    choice = _choose(slurm, state_dir)
    rel = choice.release
    if rel is not None:
        stopped = releases.down(rel, purge=purge, say=_progress)
        _progress(f"stopped {len(stopped)} daemon(s); nothing mounted in {rel.root}")
        return
    stopped = cluster.down(choice.state_dir, purge=purge, say=_progress)
    _progress(f"stopped {len(stopped)} daemon(s)" if stopped else "nothing was running")


@sandbox_app.command()
def status(state_dir: StateDir = None, slurm: Slurm = None, scheduler: Scheduler = "slurm") -> None:
    """Which daemons run and what slurmctld says about the nodes; exit 1 unless all is up."""
    from clusterjob.sandbox import cluster, releases

    if _grid_engine(scheduler, slurm=slurm):
        from clusterjob.sandbox import gridengine

        lay = gridengine.layout(state_dir)
        ge = gridengine.status(lay)
        print("\n".join(gridengine.describe(ge, lay)))
        if not ge.up:
            raise typer.Exit(1)
        return
    choice = _choose(slurm, state_dir)
    print(choice.describe())
    rel = choice.release
    if rel is not None:
        ok, text = releases.status_text(rel)
        print(text, end="" if text.endswith("\n") else "\n")
        if not ok:
            raise typer.Exit(1)
        return
    path = choice.state_dir
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
    slurm: Slurm = None,
    site_path: Annotated[
        bool, typer.Option("--site-path", help="Print only the sandbox's site YAML path.")
    ] = False,
    scheduler: Scheduler = "slurm",
) -> None:
    """Print the shell exports that point clients at the sandbox (eval "$(... sandbox env)");
    another release's are for clients inside its root (`sandbox exec` sets them itself).
    Grid Engine's: its bin/ first on PATH (qsub, qstat, ... run inside its namespace)."""
    from clusterjob.sandbox.config import Layout

    if _grid_engine(scheduler, slurm=slurm, site_path=site_path):
        from clusterjob.sandbox import gridengine

        print("\n".join(gridengine.exports(gridengine.layout(state_dir))))
        return
    path = _choose(slurm, state_dir).state_dir
    if site_path:
        print(Layout(path).site_yaml)
        return
    _print_exports(path)


@sandbox_app.command(
    "exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def exec_(
    ctx: typer.Context,
    state_dir: StateDir = None,
    slurm: Slurm = None,
) -> None:
    """Run a command against the sandbox: `sandbox exec [--slurm 24.11] -- CMD ARGS...`.
    Another release's command runs inside its root (its Slurm clients, its clusterjob);
    the environment has SLURM_CONF and CLUSTERJOB_SITE set. Exits with the command's status."""
    import os
    import subprocess

    from clusterjob.errors import UsageError
    from clusterjob.sandbox import cluster, releases, which

    argv = list(ctx.args)
    if not argv:
        raise UsageError("sandbox exec: name a command, e.g. sandbox exec -- sinfo -V")
    choice = _choose(slurm, state_dir, any_up=True)
    which.require_up(choice)
    if choice.release is not None:
        raise typer.Exit(releases.exec_inside(choice.release, argv, Path.cwd()))
    env = dict(os.environ, **cluster.client_env(choice.state_dir))
    try:
        raise typer.Exit(subprocess.run(argv, env=env).returncode)
    except FileNotFoundError:
        raise UsageError(f"sandbox exec: {argv[0]}: command not found") from None
