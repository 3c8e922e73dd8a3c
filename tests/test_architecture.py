"""The folder tree is the picture of the layers, and this test keeps it so.

Every ``clusterjob`` import in the package (at the top of a module or inside a function,
under TYPE_CHECKING or not) is read from the source with ``ast``: a module may import its
own package and the floors below its own, never a floor above, never a sibling on its own
floor. The package-level graph must have no cycle. Adding a package means adding it to
``FLOORS`` here, which is the place to decide where it stands.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "clusterjob"

# Lowest first. A top-level module (errors.py, envvars.py, pci.py, ...) is its own "package"
# on the ground floor; packages on one floor are independent of each other.
FLOORS: tuple[frozenset[str], ...] = (
    frozenset(
        {"record", "errors", "envvars", "lifetime", "pci", "process", "resources", "runtime_dir"}
    ),
    # The schedulers' own packages: the only code that runs or reads their commands.
    frozenset({"gpu", "gridengine", "slurm"}),
    frozenset({"site"}),
    frozenset({"jobscript", "node", "workstation"}),
    # The sandbox wires the node hooks in as a site does (node.wrappers), so it stands above.
    # gpubind claims (workstation) and checks (node) a job's GPUs where the scheduler names none.
    frozenset({"jobs", "sandbox", "gpubind"}),
    # The Python API (Cluster, Job): over the jobs layer; the CLI is a thin layer over it.
    frozenset({"api"}),
    frozenset({"cli"}),
    frozenset({"__main__"}),  # dispatches the Slurm hooks (stdlib only) or the CLI
)
# The ground floor's own order: record (the hooks' frozen values, errors' ConfigIssue among
# them) first, then errors; the others may use both.
GROUND_ORDER = (
    "record",
    "errors",
    "envvars",
    "lifetime",
    "pci",
    "process",
    "resources",
    "runtime_dir",
)
FLOOR = {unit: level for level, units in enumerate(FLOORS) for unit in units}


def _unit(module: str) -> str:
    """The layer unit of a dotted module name under clusterjob ('' for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported clusterjob module) for every import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("clusterjob")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith("clusterjob"):
                continue
            if module == "clusterjob":  # from clusterjob import resources
                found += [(node.lineno, f"clusterjob.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, module))
    return found


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _edges() -> list[tuple[str, int, str, str]]:
    """(file, line, importing unit, imported unit) across units."""
    edges = []
    for path in _sources():
        me = _unit(_module_name(path))
        for line, module in _imports(path):
            other = _unit(module)
            if other and other != me:
                edges.append((str(path.relative_to(PACKAGE.parent)), line, me, other))
    return edges


def test_every_unit_has_a_floor() -> None:
    units = {_unit(_module_name(p)) for p in _sources()} - {""}
    assert units <= set(FLOOR), f"place these in FLOORS: {sorted(units - set(FLOOR))}"


def test_imports_only_go_down() -> None:
    wrong = []
    for file, line, me, other in _edges():
        if me not in FLOOR or other not in FLOOR:
            continue
        if FLOOR[other] < FLOOR[me]:
            continue
        if FLOOR[me] == 0 and GROUND_ORDER.index(other) < GROUND_ORDER.index(me):
            continue
        where = "above" if FLOOR[other] > FLOOR[me] else "beside"
        wrong.append(f"{file}:{line}: {me} imports {other}, a floor {where} it")
    assert not wrong, "\n".join(wrong)


def test_no_package_level_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for _, _, me, other in _edges():
        graph.setdefault(me, set()).add(other)
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(unit: str, path: list[str]) -> None:
        seen[unit] = 1
        for nxt in sorted(graph.get(unit, ())):
            if seen.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt] if nxt in path else [unit, nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in seen:
                visit(nxt, [*path, nxt])
        seen[unit] = 2

    for unit in sorted(graph):
        if unit not in seen:
            visit(unit, [unit])


def test_the_rule_is_read_from_real_imports(tmp_path: Path) -> None:
    """The reader finds imports in functions, relative ones and `from clusterjob import x`."""
    src = tmp_path / "clusterjob" / "slurm" / "m.py"
    src.parent.mkdir(parents=True)
    src.write_text(
        "from clusterjob import errors\n"
        "def f():\n"
        "    from clusterjob.site.model import Site\n"
        "    from ..jobs import status\n"
        "import clusterjob.cli\n"
    )
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "clusterjob"
    try:
        found = [m for _, m in _imports(src)]
    finally:
        PACKAGE = saved
    assert sorted(found) == [
        "clusterjob.cli",
        "clusterjob.errors",
        "clusterjob.jobs",
        "clusterjob.site.model",
    ]


# -- scheduler names in code ---------------------------------------------------------------------

SCHEDULER_NAMES = frozenset({"slurm", "gridengine"})
# Where a scheduler's name may be compared in code: its own package, and the site loader, which
# reads the ``scheduler:`` key and picks the backend by that name.
# The sandbox builds a local cluster of either kind (``sandbox up --scheduler``): which one is
# its own command-line choice, not a site's backend.
NAMES_ALLOWED = (
    "clusterjob/slurm/",
    "clusterjob/gridengine/",
    "clusterjob/site/loader.py",
    "clusterjob/sandbox/",
    "clusterjob/cli/sandbox.py",
)


def _names_in(node: ast.AST) -> list[str]:
    """The scheduler names a comparison's operand spells as string constants: a constant, or
    the items of a literal tuple, list or set ("x in ('slurm', 'gridengine')")."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [
        i.value
        for i in items
        if isinstance(i, ast.Constant)
        and isinstance(i.value, str)
        and i.value.casefold() in SCHEDULER_NAMES
    ]


def scheduler_comparisons(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, name) for each comparison with a scheduler's name in ``source``: ``==``, ``!=``,
    ``in`` against a literal, and ``case "slurm":``. Docstrings, comments and other strings
    (a command line, a log message) are not comparisons and are not reported."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += [(node.lineno, n) for n in _names_in(operand)]
        elif isinstance(node, ast.MatchValue):
            found += [(node.lineno, n) for n in _names_in(node.value)]
    return found


def test_only_the_schedulers_packages_compare_scheduler_names() -> None:
    """Which scheduler a site uses is decided once (the backend the site loader picks); code
    elsewhere asks the backend, never ``if scheduler == "gridengine"``."""
    wrong = []
    for path in _sources():
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel.startswith(NAMES_ALLOWED):
            continue
        for line, name in scheduler_comparisons(path.read_text(), rel):
            wrong.append(f"{rel}:{line}: compares with the scheduler name {name!r}")
    assert not wrong, "\n".join(wrong)


def test_the_name_rule_reads_comparisons_only() -> None:
    source = (
        '"""Runs on slurm or gridengine."""\n'
        "# if scheduler == 'slurm'\n"
        'LOG = "slurm"\n'
        "def f(s, t):\n"
        '    if s == "gridengine":\n'
        "        pass\n"
        '    if t in ("a", "Slurm"):\n'
        "        pass\n"
        "    match s:\n"
        '        case "slurm":\n'
        "            pass\n"
    )
    assert scheduler_comparisons(source) == [(5, "gridengine"), (7, "Slurm"), (10, "slurm")]
