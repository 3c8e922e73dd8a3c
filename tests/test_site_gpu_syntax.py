"""The GPU request syntaxes: one registered object each, chosen by the site file's name.

Tables: each syntax's spelling of N GPUs on M nodes, what it needs of a model, and the
GPU lines of every golden job script (tests/golden) derived from the registry alone.
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import pytest

from clusterjob import resources
from clusterjob.site import gpu_syntax
from clusterjob.site.gpu_syntax import GpuOptions, ModelGap, syntax_named, syntax_names
from clusterjob.site.gpu_syntax.base import GpuRequestSyntax, register, registered
from clusterjob.site.loader import load_site, validate_site_file
from clusterjob.site.model import GpuModel

GOLDEN_DIR = Path(__file__).parent / "golden"

A100 = GpuModel("A100", (), "a100", ("NVIDIA A100-SXM4-80GB",), 80)
UNTYPED = replace(A100, gres_type=None)
FEATURE = replace(A100, constraint="a100_80g")
UNTYPED_FEATURE = replace(A100, gres_type=None, constraint="a100_80g")


def test_names_in_listing_order() -> None:
    assert syntax_names() == (
        "gres",
        "gres+constraint",
        "gpus-per-node",
        "gpus-per-task",
        "gpus",
        "none",
    )
    assert [s.name for s in registered()] == list(syntax_names())


def test_every_module_of_the_package_registers_one_syntax() -> None:
    """A new syntax is a new module: the package imports it, nothing else names it."""
    modules = {
        f"{gpu_syntax.__name__}.{m.name}"
        for m in pkgutil.iter_modules(gpu_syntax.__path__)
        if m.name != "base"
    }
    assert sorted(type(s).__module__ for s in registered()) == sorted(modules)


@pytest.mark.parametrize(
    ("name", "usage"),
    [
        ("gres", "--gres=gpu:TYPE:N"),
        ("gres+constraint", "--gres=gpu:N --constraint=FEATURE"),
        ("gpus-per-node", "--gpus-per-node=TYPE:N"),
        ("gpus", "--gpus=TYPE:N"),
    ],
)
def test_usage_text(name: str, usage: str) -> None:
    syntax = syntax_named(name)
    assert syntax.usage == usage
    assert str(syntax) == name  # as a template printing site.gpu_syntax shows it


@pytest.mark.parametrize(
    ("name", "model", "gpus", "nodes", "type_required", "options", "gres_type"),
    [
        ("gres", A100, 2, 1, True, ("--gres=gpu:a100:2",), "a100"),
        ("gres", A100, 2, 3, True, ("--gres=gpu:a100:2",), "a100"),  # per node
        ("gres", UNTYPED, 2, 1, False, ("--gres=gpu:2",), None),
        ("gres", A100, 1, 1, False, ("--gres=gpu:a100:1",), "a100"),  # a type is always used
        # the type is written only where the site requires types
        ("gres+constraint", FEATURE, 2, 1, False, ("--gres=gpu:2",), None),
        ("gres+constraint", FEATURE, 2, 1, True, ("--gres=gpu:a100:2",), "a100"),
        ("gres+constraint", UNTYPED_FEATURE, 8, 4, True, ("--gres=gpu:8",), None),
        ("gpus-per-node", A100, 4, 2, True, ("--gpus-per-node=a100:4",), "a100"),
        ("gpus-per-node", UNTYPED, 2, 2, False, ("--gpus-per-node=2",), None),
        # --gpus is the job's total
        ("gpus", A100, 2, 3, True, ("--gpus=a100:6",), "a100"),
        ("gpus", UNTYPED, 4, 1, False, ("--gpus=4",), None),
    ],
)
def test_spelling(
    name: str,
    model: GpuModel,
    gpus: int,
    nodes: int,
    type_required: bool,
    options: tuple[str, ...],
    gres_type: str | None,
) -> None:
    syntax = syntax_named(name)
    assert syntax.gaps(model, type_required) == ()
    assert syntax.options(model, gpus, nodes, type_required) == GpuOptions(options, gres_type)


GRES_TYPE_GAP = "no GRES type given, but gpu_request.type_required is true"


@pytest.mark.parametrize(
    ("name", "model", "type_required", "gaps"),
    [
        (
            "gres",
            UNTYPED,
            True,
            [
                ModelGap(
                    "gres_type",
                    "required when gpu_request.syntax is gres and type_required is true",
                    GRES_TYPE_GAP,
                )
            ],
        ),
        ("gres", UNTYPED, False, []),
        (
            "gpus-per-node",
            UNTYPED_FEATURE,
            True,
            [
                ModelGap(
                    "gres_type",
                    "required when gpu_request.syntax is gpus-per-node and type_required is true",
                    GRES_TYPE_GAP,
                )
            ],
        ),
        (
            "gpus",
            UNTYPED,
            True,
            [
                ModelGap(
                    "gres_type",
                    "required when gpu_request.syntax is gpus and type_required is true",
                    GRES_TYPE_GAP,
                )
            ],
        ),
        # gres+constraint needs the node feature, never the type
        (
            "gres+constraint",
            A100,
            True,
            [
                ModelGap(
                    "constraint",
                    "required when gpu_request.syntax is gres+constraint",
                    "no node feature given, but gpu_request.syntax is gres+constraint",
                )
            ],
        ),
        ("gres+constraint", UNTYPED_FEATURE, True, []),
    ],
)
def test_what_a_syntax_needs_of_a_model(
    name: str, model: GpuModel, type_required: bool, gaps: list[ModelGap]
) -> None:
    assert list(syntax_named(name).gaps(model, type_required)) == gaps


# golden script -> (site, model, GPUs per node, nodes); the cases of test_render_golden.py
GOLDEN_GPU_CASES = {
    "mllab-a100x2": ("mllab", "A100", 2, 1),
    "mllab-v100x2-2nodes-options": ("mllab", "V100", 2, 2),
    "hpccentre-a100x4": ("hpccentre", "A100", 4, 1),
    "hpccentre-a100x8-2nodes": ("hpccentre", "A100", 8, 2),
    "h100farm-h100x8-4nodes": ("h100farm", "H100", 8, 4),
    "h100farm-a100x1-dev": ("h100farm", "A100", 1, 1),
}


@pytest.mark.parametrize("golden", sorted(GOLDEN_GPU_CASES))
def test_golden_scripts_ask_for_gpus_as_the_registry_spells_it(golden: str) -> None:
    site_name, model_name, gpus, nodes = GOLDEN_GPU_CASES[golden]
    site = load_site(resources.site_configs_dir() / f"{site_name}.yaml")
    model = site.model(model_name)
    assert model is not None
    spelled = site.gpu_syntax.options(model, gpus, nodes, site.type_required)
    expected = [f"#SBATCH {option}" for option in spelled.options]
    if model.constraint:
        expected.append(f"#SBATCH --constraint={model.constraint}")
    script = (GOLDEN_DIR / f"{golden}.sh").read_text().splitlines()
    gpu_lines = [
        line
        for line in script
        if line.startswith(("#SBATCH --gres", "#SBATCH --gpus", "#SBATCH --constraint"))
    ]
    user_constraint = [line for line in gpu_lines if line == "#SBATCH --constraint=ib"]
    assert [line for line in gpu_lines if line not in user_constraint] == expected


def test_golden_cases_cover_every_shipped_syntax_but_gpus() -> None:
    shipped = {load_site(p).gpu_syntax.name for p in resources.site_configs_dir().glob("*.yaml")}
    assert shipped == {  # gpus: test_spelling
        "gres",
        "gres+constraint",
        "gpus-per-node",
        "gpus-per-task",
        "none",
    }


def test_unknown_name_is_rejected_with_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        syntax_named("gress")
    path = tmp_path / "s.yaml"
    path.write_text(
        "site: t\n"
        "gpu_request: {syntax: gress}\n"
        "models:\n"
        '  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}\n'
        "node_map: []\n"
    )
    site, issues = validate_site_file(path)
    assert site is None
    assert [str(i) for i in issues] == [
        f"{path}:2: gpu_request.syntax: expected one of gres, gres+constraint, gpus-per-node, "
        "gpus-per-task, gpus, none, got 'gress'"
    ]


def test_a_name_is_registered_once() -> None:
    @dataclass(frozen=True)
    class Again(GpuRequestSyntax):
        name: ClassVar[str] = "gres"
        usage: ClassVar[str] = "--gres=gpu:N"
        position: ClassVar[int] = 99

        def gaps(self, model: GpuModel, type_required: bool) -> tuple[ModelGap, ...]:
            return ()

        def options(
            self, model: GpuModel, gpus: int, nodes: int, type_required: bool
        ) -> GpuOptions:
            return GpuOptions((), None)

    with pytest.raises(ValueError, match="'gres' is registered twice"):
        register(Again)
    assert type(syntax_named("gres")).__module__ == "clusterjob.site.gpu_syntax.gres"
