"""Write the documentation's diagrams (docs/assets/diagrams/*.svg) from the code.

    python scripts/gen_diagrams.py           # rewrite the SVG files
    python scripts/gen_diagrams.py --check   # exit 1 and name the files that differ

Plain SVG written by this script: no Graphviz, no network, the same bytes on every machine.
What the diagrams say comes from the code where the code has it: the node checks and their
stages from the check registry, the node map from a shipped site file read by the site
loader, the hooks' names from the wrappers `site install-hooks` writes, the layers of the
code from tests/test_architecture.py's import rule and the package folders. The committed files
are compared with this script's output by `--check` (scripts/test.sh) and by
tests/test_docs_diagrams.py.
"""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "assets" / "diagrams"

SANS = "-apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
MONO = "SFMono-Regular, Consolas, Menlo, 'DejaVu Sans Mono', monospace"
INK = "#1f2430"
MUTED = "#5a6270"
ACCENT = "#3f51b5"  # Material's indigo, the site's primary colour
FAIL = "#b3261e"
GOOD = "#1b6e3a"
PAPER = "#ffffff"
CARD = "#f5f6fb"
HIGHLIGHT = "#e8ecfb"

WIDTH = 680
CHARS_PER_LINE = 78  # of 13 px sans text in a card of WIDTH - 2 * 28 px: room to spare


def _text(x: float, y: float, text: str, size: int = 13, **style: str) -> str:
    family = MONO if style.pop("mono", "") else SANS
    fill = style.pop("fill", INK)
    attrs = " ".join(f'{k.replace("_", "-")}="{v}"' for k, v in style.items())
    return (
        f'<text x="{x:g}" y="{y:g}" font-family="{family}" font-size="{size}" '
        f'fill="{fill}" {attrs}>{escape(text)}</text>'
    ).replace(" >", ">")


def _svg(width: int, height: int, title: str, body: list[str]) -> str:
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-labelledby="title">',
            f'<title id="title">{escape(title)}</title>',
            f'<rect width="{width}" height="{height}" fill="{PAPER}"/>',
            *body,
            "</svg>",
            "",
        ]
    )


def _arrow(x: float, y1: float, y2: float) -> list[str]:
    return [
        f'<line x1="{x:g}" y1="{y1:g}" x2="{x:g}" y2="{y2 - 7:g}" stroke="{MUTED}" '
        'stroke-width="1.5"/>',
        f'<path d="M{x - 5:g},{y2 - 8:g} L{x + 5:g},{y2 - 8:g} L{x:g},{y2:g} Z" fill="{MUTED}"/>',
    ]


@dataclass(frozen=True)
class Step:
    name: str  # a command or a Slurm hook: set in monospace
    where: str  # on which machine, as whom
    does: str
    ok: str = ""  # what happens when it passes (green)
    fails: str = ""  # what a failure does (red)


def _cards(steps: list[Step], title: str) -> str:
    """Steps one under another, each a card, joined by arrows."""
    body: list[str] = []
    y = 16.0
    pad = 28
    for n, step in enumerate(steps):
        lines = textwrap.wrap(step.does, CHARS_PER_LINE)
        extra = [(f"✓ {step.ok}", GOOD)] if step.ok else []
        extra += [(f"✗ {step.fails}", FAIL)] if step.fails else []
        wrapped = [(line, color) for text, color in extra for line in _wrap(text)]
        height = 30 + 19 * len(lines) + 19 * len(wrapped) + 14
        body.append(
            f'<rect x="12" y="{y:g}" width="{WIDTH - 24}" height="{height}" rx="8" '
            f'fill="{CARD}" stroke="{ACCENT}" stroke-width="1.2"/>'
        )
        body.append(f'<rect x="12" y="{y:g}" width="6" height="{height}" rx="3" fill="{ACCENT}"/>')
        body.append(_text(pad, y + 24, step.name, 15, mono="1", font_weight="bold"))
        name_width = 9.2 * len(step.name)  # 15 px monospace, with room to spare
        body.append(_text(pad + name_width + 14, y + 24, step.where, 13, fill=MUTED))
        ty = y + 24
        for line in lines:
            ty += 19
            body.append(_text(pad, ty, line))
        for line, color in wrapped:
            ty += 19
            body.append(_text(pad, ty, line, fill=color))
        y += height
        if n < len(steps) - 1:
            body += _arrow(WIDTH / 2, y + 2, y + 26)
            y += 28
    return _svg(WIDTH, int(y + 16), title, body)


def _wrap(text: str) -> list[str]:
    first, *rest = textwrap.wrap(text, CHARS_PER_LINE)
    return [first, *("   " + line for line in rest)]


# --- the diagrams -----------------------------------------------------------------------------


def submit_flow() -> str:
    from clusterjob.node.checks import REGISTRY

    checks = len(REGISTRY.ids)
    steps = [
        Step(
            "clusterjob submit",
            "on the login node, as you",
            "Checks the request against the site file (model, partition, capacity), renders "
            "the job script in this site's own GPU syntax and records the job.",
            fails="a request the site cannot meet: one line, exit 2, nothing reaches Slurm",
        ),
        Step(
            "sbatch",
            "the Slurm controller",
            "Queues the job and, when it starts, gives it GPUs by their GRES indices on "
            "each node it allocates.",
        ),
        Step(
            "Prolog",
            "on each node of the job, as root",
            f"clusterjob prolog: the node checks ({checks} in the registry) compare the "
            "node's GPUs, read through NVML, with the node map, before any job step runs.",
            ok="exit 0: the job starts",
            fails="exit 1: Slurm drains the node and requeues the job, held",
        ),
        Step(
            "TaskProlog",
            "on each node, as you, before each task",
            "clusterjob task-prolog: exports CUDA_DEVICE_ORDER=PCI_BUS_ID (and "
            "CUDA_VISIBLE_DEVICES where needed), so CUDA's device i is the i-th GPU Slurm "
            "gave. Never fails the task.",
        ),
        Step(
            "clusterjob preflight",
            "the job's first step, on every node",
            "Checks the GPUs the job was given against what it asked for "
            "(CLUSTERJOB_EXPECT_MODEL, CLUSTERJOB_EXPECT_COUNT) and prints a table: slot, "
            "bus ID, expected, found, status.",
            fails="wrong GPUs: the job ends at once, the report in its output",
        ),
        Step(
            "your training",
            "your Python, your program",
            "Runs on the GPUs it asked for, in PCI bus order, under torchrun, srun or directly.",
        ),
    ]
    return _cards(steps, "From clusterjob submit to training: what runs where, in order")


def node_hooks() -> str:
    from clusterjob.node.checks import REGISTRY
    from clusterjob.node.checks.facts import Need

    ids = list(REGISTRY.ids)
    in_job = [c.id for c in REGISTRY.checks if Need.JOB in c.needs]
    in_job = list(dict.fromkeys(in_job))
    steps = [
        Step(
            "clusterjob prolog",
            "slurm.conf Prolog=, as root, before every job",
            f"The node checks ({len(ids)} in the registry; {', '.join(in_job)} needs the job, "
            "and a check whose input is missing is skipped): the node against its map entry, "
            "each slot's GPU (bus ID, model, MIG), the GPUs the job was given, device files, "
            "health. It reads the site file only from the command line or "
            "/etc/clusterjob/site.yaml, and only if root alone could have written it.",
            ok="exit 0: the job starts on the node",
            fails="exit 1: one line on stderr, Slurm drains the node (the reason replaced by "
            "the failed check's own line) and requeues the job, held",
        ),
        Step(
            "clusterjob task-prolog",
            "slurm.conf TaskProlog=, as the job's user, before every task",
            "Prints export CUDA_DEVICE_ORDER=PCI_BUS_ID (and CUDA_VISIBLE_DEVICES where "
            "needed): slurmd sets them in the task, so CUDA index i is the i-th GPU of the "
            "job. Problems become lines in the job's output.",
            ok="never fails the task",
        ),
        Step(
            "clusterjob preflight",
            "the job script's first step, on every node",
            "The same checks again, now with the job's request (model, count) and its "
            "environment: the code the Prolog runs, from inside the job.",
            ok="a table of the job's GPUs in its output; the program starts",
            fails="the job fails at once (site setting preflight: required; warn goes on)",
        ),
    ]
    return _cards(steps, "The node-side hooks: who runs them, when, and what each does")


def node_map() -> str:
    """One node of a shipped site whose map is not in model order: its GPUs in PCI bus
    order, the GRES index and device file each gets, and what a job for two A100s sees."""
    from clusterjob.site.loader import load_site

    site_file = ROOT / "site_configs" / "mllab.yaml"
    site = load_site(str(site_file))
    node = "ml-gpu05"
    gpus = sorted(site.node_map.nodes[node], key=lambda g: g.slot)
    model = "A100"
    given = [g for g in gpus if g.model == model][:2]
    columns = [
        ("PCI bus ID", 150),
        ("model", 90),
        ("GRES index", 100),
        ("device file", 120),
        ("in the job", 150),
    ]
    x0, row_h, top = 40, 34, 70
    width = x0 * 2 + sum(w for _, w in columns)
    body = [
        _text(
            x0,
            28,
            f"{node} in site_configs/{site_file.name}: the node map lists its GPUs in "
            "PCI bus order",
            14,
            font_weight="bold",
        ),  # fmt: skip
        _text(
            x0,
            50,
            f"A job asking for --gpus 2 --model {model} is given GRES indices "
            f"{','.join(str(g.slot) for g in given)} on this node.",
            13,
            fill=MUTED,
        ),  # fmt: skip
    ]
    x = x0
    for name, w in columns:
        body.append(_text(x + 10, top + 22, name, 13, fill=MUTED, font_weight="bold"))
        x += w
    body.append(
        f'<line x1="{x0}" y1="{top + row_h}" x2="{width - x0}" y2="{top + row_h}" '
        f'stroke="{MUTED}" stroke-width="1"/>'
    )
    for n, gpu in enumerate(gpus):
        y = top + row_h * (n + 1)
        mine = gpu in given
        if mine:
            body.append(
                f'<rect x="{x0}" y="{y}" width="{width - 2 * x0}" height="{row_h}" '
                f'fill="{HIGHLIGHT}"/>'
            )
        cuda = f"cuda:{given.index(gpu)}" if mine else "not visible"
        cells = [gpu.bus_id, gpu.model, str(gpu.slot), f"/dev/nvidia{gpu.slot}", cuda]
        x = x0
        for (_, w), cell in zip(columns, cells, strict=True):
            mono = "1" if cell not in (gpu.model, "not visible") else ""
            fill = ACCENT if (mine and cell == cuda) else (MUTED if cell == "not visible" else INK)
            body.append(_text(x + 10, y + 22, cell, 13, mono=mono, fill=fill))
            x += w
        body.append(
            f'<line x1="{x0}" y1="{y + row_h}" x2="{width - x0}" y2="{y + row_h}" '
            f'stroke="#d5d9e3" stroke-width="1"/>'
        )
    y = top + row_h * (len(gpus) + 1) + 30
    notes = [
        f"The job's GPUs are GRES indices {','.join(str(g.slot) for g in given)} "
        "(SLURM_JOB_GPUS). With CUDA_DEVICE_ORDER=PCI_BUS_ID (the TaskProlog's) cuda:0 is "
        f"{given[0].bus_id}, the first GPU Slurm gave, and cuda:1 the next.",
        "Without it CUDA numbers a job's GPUs of mixed models fastest first (its default, "
        "FASTEST_FIRST), not in bus order: cuda:i is then not the i-th GPU Slurm gave "
        "(the check cuda-order).",
    ]
    for note in notes:
        for line in textwrap.wrap(note, 88):
            body.append(_text(x0, y, line, 13))
            y += 19
        y += 6
    return _svg(width, int(y + 8), f"The node map of {node} against PCI bus order", body)


# What each layer unit is for, in a few words (the boxes are small; docs/architecture.md
# says more). Which units there are, and on which floor, is read from the code:
# tests/test_architecture.py's FLOORS (the rule its test enforces), a folder or a module;
# the file making every pynvml call is found in the code. A unit without words here fails
# the generator, and so its test.
LAYER_WORDS = {
    "__main__": "dispatch: the Slurm hooks (stdlib only) or the Typer app",
    "cli": "Typer commands: parse, call the core, print; errors become exit codes; the command "
    "server that runs submit and status warm",
    "api": "Cluster and Job, the Python API; the job commands call it",
    "jobs": "submit, status, logs, cancel, wait, explain, the registry, avail",
    "sandbox": "the local Slurm and Grid Engine clusters and their stand-in NVML",
    "gpubind": "GPUs claimed per job where the scheduler binds none (Grid Engine's prolog)",
    "jobscript": "the request in this site's sbatch options; the job script",
    "node": "the Slurm hooks and preflight: the node checks",
    "workstation": "clusterjob run: GPUs of one machine, no Slurm",
    "site": "site YAML to frozen dataclasses; discovery; the GPU syntaxes",
    "gpu": "NVML behind one interface",
    "slurm": "the one place Slurm commands run",
    "gridengine": "the one place Grid Engine commands run: gridengine/runner.py (qsub, qstat, "
    "qacct, qdel, qhost, qconf) and pure parsers of their output",
    "record": "frozen values for what the hooks import, without dataclasses",
    "errors": "one exception hierarchy, ExitCode",
    "envvars": "the environment variables",
    "lifetime": "what a served command releases after its answer",
    "pci": "PCI bus IDs",
    "process": "a scheduler client run in its own process group, C locale",
    "resources": "templates, example sites",
    "runtime_dir": "the private directory of the ssh connection's and the command server's sockets",
}


def _architecture_rules() -> tuple[tuple[frozenset[str], ...], Path]:
    import importlib.util

    path = ROOT / "tests" / "test_architecture.py"
    spec = importlib.util.spec_from_file_location("_architecture_rules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FLOORS, module.PACKAGE


BOXES_PER_ROW = 4  # the most boxes side by side whose file names fit (runtime_dir.py)


def _floor_row(
    body: list[str],
    units: list[str],
    label: Callable[[str], tuple[str, str]],
    left: float,
    right: float,
    y: float,
) -> float:
    """One row of a floor's boxes, side by side from ``left`` to ``right`` at ``y``; its
    height."""
    gap = 10
    box_w = (right - left - gap * (len(units) - 1)) / len(units)
    chars = max(12, int((box_w - 20) / 6.6))
    wrapped = {u: textwrap.wrap(label(u)[1], chars, break_on_hyphens=False) for u in units}
    height = 30 + 17 * max(len(w) for w in wrapped.values()) + 12
    for i, unit in enumerate(units):
        x = left + i * (box_w + gap)
        name, _ = label(unit)
        owner = unit in ("gpu", "slurm", "gridengine")
        body.append(
            f'<rect x="{x:g}" y="{y:g}" width="{box_w:g}" height="{height}" rx="8" '
            f'fill="{HIGHLIGHT if owner else CARD}" stroke="{ACCENT}" '
            f'stroke-width="{1.8 if owner else 1.2}"/>'
        )
        body.append(_text(x + 10, y + 22, name, 14, mono="1", font_weight="bold"))
        ty = y + 22
        for line in wrapped[unit]:
            ty += 17
            body.append(_text(x + 10, ty, line, 12))
    return height


def layers() -> str:
    """The floors of the package, top (the commands) to bottom (Slurm, NVML, the ground
    floor), each unit a box; imports only go down. (No module counts: they would change with
    every module added, and the picture with them.)"""
    floors, package = _architecture_rules()
    ground = ("errors", "envvars", "pci", "resources")  # the ground floor's own order
    order = {u: n for n, u in enumerate(ground)}
    pynvml = sorted(
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if "import pynvml" in p.read_text(encoding="utf-8")
        or "from pynvml" in p.read_text(encoding="utf-8")
    )
    runner = package / "slurm" / "runner.py"

    def label(unit: str) -> tuple[str, str]:
        name = f"{unit}/" if (package / unit).is_dir() else f"{unit}.py"
        words = LAYER_WORDS[unit]
        if unit == "gpu":
            words += ": " + ", ".join(pynvml) + " makes every pynvml call"
        if unit == "slurm" and runner.exists():
            words += ": slurm/runner.py runs each one (timeouts, retries, typed errors)"
        return name, words

    body: list[str] = []
    left, right = 112, WIDTH - 12
    y = 16.0
    rows = list(reversed(floors))
    for n, floor in enumerate(rows):
        units = sorted(floor, key=lambda u: (order.get(u, 0), u))
        last = n == len(rows) - 1
        floor_name = "ground floor" if last else f"floor {len(rows) - 1 - n}"
        body.append(_text(12, y + 22, floor_name, 13, fill=MUTED, font_weight="bold"))
        # a floor of many units in rows of BOXES_PER_ROW: a narrower box cuts its file name
        row_count = math.ceil(len(units) / BOXES_PER_ROW)
        per_row = math.ceil(len(units) / row_count)  # rows as even as they can be
        for start in range(0, len(units), per_row):
            if start:
                y += 10
            y += _floor_row(body, units[start : start + per_row], label, left, right, y)
        if n < len(rows) - 1:
            body += _arrow((left + right) / 2, y + 2, y + 20)
            y += 22
    y += 24
    note = (
        "Each box imports only from the floors below it, never from a box beside it: "
        "tests/test_architecture.py reads every import and fails on one that goes up or "
        "sideways. The CLI is a thin layer over the core; only slurm/ starts a Slurm "
        "command, only gridengine/ a Grid Engine one, and only the GPU layer calls NVML."
    )
    for line in textwrap.wrap(note, 96):
        body.append(_text(12, y, line, 13))
        y += 19
    return _svg(WIDTH, int(y + 4), "The layers of the code: who may import whom", body)


DIAGRAMS: dict[str, Callable[[], str]] = {
    "layers.svg": layers,
    "submit-flow.svg": submit_flow,
    "node-hooks.svg": node_hooks,
    "node-map.svg": node_map,
}


def render_all() -> dict[str, str]:
    return {name: build() for name, build in DIAGRAMS.items()}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, text in render_all().items():
        path = OUT / name
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(
            "docs/assets/diagrams is out of date: " + ", ".join(stale) + " (run python "
            "scripts/gen_diagrams.py)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
