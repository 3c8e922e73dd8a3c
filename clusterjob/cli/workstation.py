"""Command: run (registered on the app in clusterjob.cli): GPUs on a workstation without Slurm.

``clusterjob run --gpus 2 --model A100 -- python train.py`` claims two free A100s of this
machine and execs the command with CUDA_VISIBLE_DEVICES naming exactly them. (The module is
not called ``run``: ``clusterjob.cli.run`` is the app's entry function and would shadow it.)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from clusterjob.cli.app import app
from clusterjob.cli.common import load_named_site
from clusterjob.cli.options import SiteOption
from clusterjob.errors import UsageError

if TYPE_CHECKING:  # imported where used: `clusterjob --help` need not load the launcher
    from clusterjob.gpu.inventory import GpuInventory

# Options of `run` that take a value; `--wait` takes one only when one follows.
_VALUE_OPTIONS = ("--gpus", "--model", "-m", "--min-free-mem", "--site", "-s")
_FLAG_OPTIONS = ("--allow-shared", "--help", "-h")
WAIT_FOREVER = "forever"


def fill_wait_value(args: list[str]) -> list[str]:
    """Give a bare ``--wait`` the value ``forever`` so that ``--wait [TIMEOUT]`` parses.

    Click has no optional option values through Typer; the run's own options are walked up to
    ``--`` or the command's first word, and the command's own arguments are never touched.
    """
    out = list(args)
    i = 0
    while i < len(out):
        arg = out[i]
        if arg == "--" or not arg.startswith("-"):
            break
        if arg == "--wait":
            following = out[i + 1] if i + 1 < len(out) else None
            # Before a later '--' the next word can only be the timeout (checked when parsed);
            # without '--' it is the timeout only if it reads as one, else the command.
            is_value = following is not None and not following.startswith("-")
            if following is not None and is_value and "--" not in out[i + 2 :]:
                is_value = _looks_like_timeout(following)
            if not is_value:
                out.insert(i + 1, WAIT_FOREVER)
            i += 2
        elif arg in _VALUE_OPTIONS:
            i += 2
        else:
            i += 1  # a flag, --opt=value, or something click will reject itself
    return out


def _looks_like_timeout(text: str) -> bool:
    from clusterjob.workstation import launch

    try:
        launch.parse_timeout(text)
    except UsageError:
        return False
    return True


class _RunCommand(TyperCommand):
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, fill_wait_value(args))


def _node_names() -> tuple[str, ...]:
    import socket  # where used: `clusterjob --help` imports every command module

    full = socket.gethostname()
    return (full.split(".")[0], full)


@app.command(
    cls=_RunCommand,
    context_settings={"allow_interspersed_args": False},
    no_args_is_help=True,
)
def run(
    command: Annotated[
        list[str],
        typer.Argument(
            metavar="-- CMD [ARGS]...", help="The command to run, after '--'.", show_default=False
        ),
    ],
    gpus: Annotated[int, typer.Option("--gpus", help="How many GPUs.")] = 1,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="GPU model or alias, e.g. A100, 3090.")
    ] = None,
    min_free_mem: Annotated[
        str | None,
        typer.Option("--min-free-mem", help="Free memory each GPU needs, e.g. 20G."),
    ] = None,
    allow_shared: Annotated[
        bool,
        typer.Option("--allow-shared", help="Accept GPUs with running processes (fewest first)."),
    ] = False,
    wait: Annotated[
        str | None,
        typer.Option(
            "--wait",
            metavar="[TIMEOUT]",
            help="Queue until the GPUs are free (first come, first served); "
            "TIMEOUT e.g. 600, 10m, 2h.",
        ),
    ] = None,
    site: SiteOption = None,
) -> None:
    """Run COMMAND on free GPUs of one model of this machine (no Slurm needed)."""
    from clusterjob.gpu.inventory import read_inventory
    from clusterjob.workstation import claims, launch, selection

    request = selection.GpuRequest(
        count=gpus,
        model=model,
        min_free_mem=selection.parse_size(min_free_mem) if min_free_mem else None,
        allow_shared=allow_shared,
    )
    timeout = launch.parse_timeout(None if wait == WAIT_FOREVER else wait)
    the_site = load_named_site(site)
    node_names = _node_names()

    def catalog_for(inventory: GpuInventory) -> selection.ModelCatalog:
        if the_site is None:
            return selection.builtin_catalog()
        return selection.site_catalog(the_site, node_names, inventory)

    def read() -> GpuInventory:
        return read_inventory(timeout=launch.NVML_TIMEOUT)

    acquired = launch.acquire_gpus(
        request,
        command,
        catalog_for,
        read,
        lock_dir=claims.default_lock_dir(),
        wait=wait is not None,
        timeout=timeout,
    )
    env = launch.command_environment(acquired, os.environ)
    launch.exec_command(acquired, command, env)
