"""The shipped example sites (site_configs/*.yaml) by the scheduler they run.

Tests that build a Slurm cluster shaped like each example, or run sbatch against it, loop
over the Slurm ones only: a Grid Engine example (scheduler: gridengine) has no Slurm
sandbox to stand for it.
"""

from __future__ import annotations

from pathlib import Path

from clusterjob import resources
from clusterjob.site.loader import load_site


def site_files() -> list[Path]:
    return sorted(resources.site_configs_dir().glob("*.yaml"))


def slurm_site_names() -> list[str]:
    """The stems of the shipped sites whose ``scheduler`` is Slurm (the default)."""
    return [p.stem for p in site_files() if load_site(p).scheduler == "slurm"]
