"""The documentation's diagrams (docs/assets/diagrams/*.svg) are what scripts/gen_diagrams.py
writes from the code today, well-formed SVG, and each is shown on some page."""

from __future__ import annotations

import importlib.util
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_diagrams", REPO / "scripts" / "gen_diagrams.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_diagrams", module)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_the_diagrams_are_what_the_generator_writes() -> None:
    for name, text in gen.render_all().items():
        path = gen.OUT / name
        assert path.exists(), f"{path} is missing: run python scripts/gen_diagrams.py"
        assert path.read_text(encoding="utf-8") == text, (
            f"docs/assets/diagrams/{name} differs from the code: run python scripts/gen_diagrams.py"
        )
        root = ET.fromstring(text)
        assert root.tag == "{http://www.w3.org/2000/svg}svg", name
    listed = {p.name for p in gen.OUT.glob("*.svg")}
    assert listed == set(gen.DIAGRAMS), (
        f"diagrams no generator writes: {listed - set(gen.DIAGRAMS)}"
    )


def test_every_diagram_is_shown_on_a_page() -> None:
    pages = "".join(p.read_text(encoding="utf-8") for p in (REPO / "docs").rglob("*.md"))
    for name in gen.DIAGRAMS:
        assert f"assets/diagrams/{name})" in pages, f"no page shows {name}"


def test_the_layers_diagram_is_the_architecture_tests_rule() -> None:
    """Every unit the import rule places (tests/test_architecture.py's FLOORS) is a box of
    layers.svg, floor by floor: a package added to the rule appears, or the generator
    fails for want of its words."""
    floors, package = gen._architecture_rules()
    svg = gen.layers()
    for floor in floors:
        for unit in floor:
            name = f"{unit}/" if (package / unit).is_dir() else f"{unit}.py"
            assert f">{name}</text>" in svg, name
    assert "gpu/nvml.py" in svg and "slurm/runner.py" in svg  # found in the code
    tops = [svg.index(f">{u}/</text>") for u in ("cli", "jobs", "site", "slurm")]
    assert tops == sorted(tops)  # drawn top down: the commands above, Slurm below
