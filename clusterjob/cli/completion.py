"""Shell completion of values that come from the site config: ``--model``, ``--partition``.

Typer's completion runs the program with the words typed so far; these callbacks find the
site the command would use (``--site`` if already typed, then the discovery order, with
Slurm's ClusterName asked under a short budget) and offer its names. A completion must
never print an error or hang the shell: anything that goes wrong offers nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from clusterjob.site.model import Site

__all__ = ["complete_model", "complete_partition"]

# Seconds Slurm may take to say its ClusterName while the user waits for a TAB.
SLURM_BUDGET = 2.0


def _site(ctx: typer.Context) -> Site | None:
    from clusterjob.cli.common import load_site

    spec = ctx.params.get("site")
    try:
        return load_site(spec if isinstance(spec, str) else None, slurm_budget=SLURM_BUDGET)
    except Exception:  # no site, a broken one, no Slurm: nothing to offer
        return None


def _matching(names: list[str], incomplete: str) -> list[str]:
    wanted = incomplete.casefold()
    return [n for n in dict.fromkeys(names) if n.casefold().startswith(wanted)]


def complete_model(ctx: typer.Context, incomplete: str) -> list[str]:
    """The site's model names; its aliases too once the typed prefix is one of theirs."""
    site = _site(ctx)
    if site is None:
        return []
    names = [m.name for m in site.models]
    found = _matching(names, incomplete)
    if incomplete and not found:
        found = _matching([a for m in site.models for a in m.aliases], incomplete)
    return found


def complete_partition(ctx: typer.Context, incomplete: str) -> list[str]:
    """The site's partition names."""
    site = _site(ctx)
    return [] if site is None else _matching([p.name for p in site.partitions], incomplete)
