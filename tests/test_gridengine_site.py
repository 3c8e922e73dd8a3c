"""The site's ``scheduler:`` key: Slurm by default, Grid Engine where it says so, and what a
Grid Engine site may leave out (gpu_request) or must give (each model's gpu_type)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterjob import resources
from clusterjob.site.loader import load_site, validate_site_file

GELAB = resources.site_configs_dir() / "gelab.yaml"
SITE = """\
site: t
{scheduler}{request}models:
  A100: {{gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}}
  V100: {{nvml_names: ["Tesla V100-SXM2-32GB"]}}
node_map:
  - nodes: "n1"
    gpus: [{{model: A100}}]
  - nodes: "n2"
    gpus: [{{model: V100}}]
"""


def _issues(tmp_path: Path, *, scheduler: str = "", request: str = "") -> list[str]:
    path = tmp_path / "site.yaml"
    path.write_text(SITE.format(scheduler=scheduler, request=request))
    _, issues = validate_site_file(path)
    return [str(i).removeprefix(f"{path}:") for i in issues]


def test_slurm_is_the_default() -> None:
    assert load_site(resources.site_configs_dir() / "mllab.yaml").scheduler == "slurm"
    assert load_site(GELAB).scheduler == "gridengine"


def test_a_slurm_site_needs_its_gpu_request(tmp_path: Path) -> None:
    assert _issues(tmp_path) == ["1: gpu_request: required key missing"]
    assert _issues(tmp_path, scheduler="scheduler: slurm\n") == [
        "1: gpu_request: required key missing"
    ]


def test_a_grid_engine_site_needs_each_models_gpu_type(tmp_path: Path) -> None:
    assert _issues(tmp_path, scheduler="scheduler: gridengine\n") == [
        "5: models.V100.gres_type: required on a Grid Engine site (scheduler: gridengine): "
        "the hosts' gpu_type value, asked for as -l gpu_type=NAME"
    ]


def test_a_grid_engine_site_may_write_its_gpu_request(tmp_path: Path) -> None:
    request = "gpu_request: {syntax: gres, type_required: false}\n"
    assert _issues(tmp_path, scheduler="scheduler: gridengine\n", request=request) == []


@pytest.mark.parametrize("value", ["pbs", "Slurm", "grid-engine"])
def test_a_bad_scheduler_is_named_with_its_line(tmp_path: Path, value: str) -> None:
    request = "gpu_request: {syntax: gres, type_required: false}\n"
    assert _issues(tmp_path, scheduler=f"scheduler: {value}\n", request=request) == [
        f"2: scheduler: expected one of slurm, gridengine, got {value!r}"
    ]
