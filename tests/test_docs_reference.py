"""The generated reference pages (docs/reference/) against the code: they are what the
generator writes today, and every command, option, environment variable, exit code, node
check, site key and ``--json`` output has its entry. A new option without its page fails
here, whoever adds it."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from clusterjob import envvars
from clusterjob.cli.app import run
from clusterjob.envvars import ENV_VARS
from clusterjob.errors import ExitCode
from clusterjob.node.checks import REGISTRY

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "reference"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_reference", REPO / "scripts" / "gen_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_reference", module)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def _page(name: str) -> str:
    return (REFERENCE / name).read_text(encoding="utf-8")


def _sections(text: str) -> dict[str, str]:
    """`## title {#anchor}` -> the section's text, by title."""
    parts = re.split(r"^## (.+?)(?: \{#[^}]*\})?$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_reference_pages_are_what_the_generator_writes() -> None:
    for name, text in gen.render_all().items():
        path = REFERENCE / name
        assert path.exists(), (
            f"docs/reference/{name} is missing: run python scripts/gen_reference.py"
        )
        assert path.read_text(encoding="utf-8") == text, (
            f"docs/reference/{name} differs from the code: run python scripts/gen_reference.py"
        )
    listed = {p.name for p in REFERENCE.glob("*.md")}
    assert listed == set(gen.PAGES), f"pages no generator writes: {listed - set(gen.PAGES)}"


def test_the_readme_lists_every_node_check_with_its_severity_reads_and_action() -> None:
    """The README's node-check table is the generator's, and has a row per registered check
    with its default severity, what it reads and what to do (none of them empty)."""
    from clusterjob.node.checks import REGISTRY

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert gen.readme_with_checks(readme) == readme, (
        "README.md's node checks differ from the registry: run python scripts/gen_reference.py"
    )
    block = readme[readme.index(gen.README_CHECKS_BEGIN) : readme.index(gen.README_CHECKS_END)]
    rows = {
        cells[0].strip("` "): [c.strip() for c in cells[1:]]
        for cells in (line.strip("| ").split(" | ") for line in block.splitlines())
        if cells[0].startswith("`")
    }
    assert list(rows) == list(dict.fromkeys(c.id for c in REGISTRY.checks))
    firsts = {}
    for check in REGISTRY.checks:  # an id registered twice shows its first default
        firsts.setdefault(check.id, check)
    for check in firsts.values():
        severity, reads, action = rows[check.id]
        assert severity == check.severity.value, check.id
        assert reads and action, check.id


def test_the_check_mode_names_a_stale_page(tmp_path: Path) -> None:
    """`--check` (what a contributor runs) fails on a page that differs from the code."""
    copy = tmp_path / "docs" / "reference"
    copy.mkdir(parents=True)
    for name, text in gen.render_all().items():  # current pages, whatever is committed
        (copy / name).write_text(text, encoding="utf-8")
    (copy / "exit-codes.md").write_text("stale\n", encoding="utf-8")
    code = (
        "import sys, pathlib; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]);"
        "import gen_reference as g; g.REFERENCE = pathlib.Path(sys.argv[3]);"
        "sys.exit(g.main(['--check']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(REPO), str(REPO / "scripts"), str(copy)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "exit-codes.md" in done.stderr and "commands.md" not in done.stderr


def test_every_command_and_option_has_an_entry() -> None:
    sections = _sections(_page("commands.md"))
    commands = 0
    for path, cmd in gen.walk_commands(gen.cli_root()):
        title = " ".join(["clusterjob", *path])
        assert title in sections, f"no entry for `{title}` in docs/reference/commands.md"
        for param in cmd.params:
            if param.param_type_name == "argument":
                assert f"`{param.name.upper()}`" in sections[title], (title, param.name)
            elif not getattr(param, "hidden", False):
                for name in gen.option_names(param):
                    assert f"`{name}`" in sections[title], f"{title}: no entry for {name}"
        commands += 1
    assert commands > 20  # the walk reached the subcommands
    for hook in gen.hook_commands():  # the Slurm hooks: argparse, not the Typer app
        title = f"clusterjob {hook}"
        assert title in sections
        options = ["--site", *(["--cache-dir", "--deadline", "--log"] if hook == "prolog" else [])]
        for option in options:
            assert f"`{option}`" in sections[title], (title, option)


_ENV_NAME = re.compile(r"\b(?:CLUSTERJOB_[A-Z0-9_]+|FAKE_NVML_[A-Z0-9_]+)\b")
_ENV_CONSTANT = re.compile(r"\benvvars\.([A-Z][A-Z0-9_]*)\b")


def _env_names_in_code() -> set[str]:
    """Every variable the code names: a CLUSTERJOB_* (or the stand-in's FAKE_NVML_*) name
    written out in the package (but its table, envvars.py), its C stand-in or its templates,
    a constant of the table the code uses (``envvars.DATA_DIR``), and every envvar= of a
    command-line option."""
    names: set[str] = set()
    package = REPO / "clusterjob"
    files = [p for p in package.rglob("*.py") if p != package / "envvars.py"]
    files += [*package.rglob("*.c"), *(REPO / "templates").rglob("*.j2")]
    for path in files:
        text = path.read_text(encoding="utf-8")
        names |= set(_ENV_NAME.findall(text))
        names |= {getattr(envvars, c) for c in _ENV_CONSTANT.findall(text) if c.isupper()}
    for _, cmd in gen.walk_commands(gen.cli_root()):
        for param in cmd.params:
            envvar = param.envvar
            names |= {envvar} if isinstance(envvar, str) else set(envvar or ())
    return names


def test_every_environment_variable_has_an_entry() -> None:
    documented = {v.name for v in ENV_VARS}
    missing = _env_names_in_code() - documented
    assert not missing, f"add to clusterjob/envvars.py ENV_VARS: {sorted(missing)}"
    sections = _sections(_page("environment.md"))
    for var in ENV_VARS:
        assert var.name in sections, var.name
        assert var.meaning and var.read_by and var.default, var.name
    unused = documented - _env_names_in_code()
    assert not unused, f"documented but read nowhere: {sorted(unused)}"


def test_every_exit_code_has_an_entry() -> None:
    rows = re.findall(r"^\| (\d+) \| `([A-Z_]+)` \| ([^|]+) \|", _page("exit-codes.md"), re.M)
    assert [(int(code), name) for code, name, _ in rows] == [(int(c), c.name) for c in ExitCode]
    assert all(meaning.strip() for _, _, meaning in rows)


def test_every_node_check_has_an_entry() -> None:
    """Each registered check, with its default severity, what it reads and what a person
    should do when it fires."""
    page = _page("checks.md")
    cell = r"((?:[^|\\]|\\.)+)"  # a cell, pipes in it escaped
    rows = re.findall(rf"^\| `([a-z0-9-]+)` \| (\w+) \| {cell} \| {cell} \|", page, re.M)
    assert [r[0] for r in rows] == list(REGISTRY.ids)
    severity = {c.id: c.severity.value for c in reversed(REGISTRY.checks)}  # the first's
    for check_id, default, reads, action in rows:
        assert default == severity[check_id], check_id
        assert reads.strip() and action.strip(), check_id


def test_every_site_key_has_an_entry() -> None:
    page = _page("site-config.md")
    for path in gen.site_key_paths():
        key = path.rsplit(".", 1)[-1]
        assert f"`{key}`" in page, f"site key {path} has no entry in docs/reference/site-config.md"


def test_every_json_option_has_its_shape() -> None:
    with_json = {
        " ".join(path)
        for path, cmd in gen.walk_commands(gen.cli_root())
        if any("--json" in gen.option_names(p) for p in cmd.params if p.param_type_name == "option")
    }
    assert with_json == set(gen.json_outputs()), "commands with --json vs docs/reference/json.md"
    sections = _sections(_page("json.md"))
    for command in with_json:
        assert f"clusterjob {command} --json" in sections, command


def _documented_keys(command: str) -> list[str]:
    section = _sections(_page("json.md"))[f"clusterjob {command} --json"]
    first_table = section.split("\n\n`")[0]
    return re.findall(r"^\| `([a-z_]+)` \|", first_table, re.M)


MLLAB = str(REPO / "site_configs" / "mllab.yaml")


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["site", "validate", MLLAB, "--json"], "site validate"),
        (["site", "show", "--site", MLLAB, "--json"], "site show"),
    ],
)
def test_json_output_has_the_documented_keys(
    argv: list[str], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) == 0
    data: Any = json.loads(capsys.readouterr().out)
    obj = data[0] if isinstance(data, list) else data
    assert list(obj) == _documented_keys(command)


def test_every_option_says_what_it_means() -> None:
    """No row of the command reference has an empty meaning: an option without help text
    fails here (give it `help=` where it is declared)."""
    empty = [
        line
        for line in _page("commands.md").splitlines()
        if line.startswith("| `") and line.rstrip().endswith("|  |")
    ]
    assert not empty, "options without a help text:\n" + "\n".join(empty)
