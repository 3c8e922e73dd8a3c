"""README claims checked against the code: the example site YAML validates as copied, and the
commands the README says take `--json` do (and the ones it names as not, do not)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer.main

from clusterjob import cli
from clusterjob.cli import app, run

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _site_admin_section() -> str:
    text = _readme()
    start = text.index("## For site admins")
    return text[start : text.index("\n## ", start + 1)]


def test_readme_example_site_yaml_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = re.findall(r"^```yaml\n(.*?)^```$", _site_admin_section(), re.M | re.S)
    site = tmp_path / "site.yaml"
    site.write_text(blocks[0], encoding="utf-8")  # the first: the whole example site
    code = run(["site", "validate", str(site)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith(f"{site}: ok (site mllab:"), out


def _command(words: list[str]) -> tuple[list[str], Any]:
    """The longest prefix of words that names a command of the CLI, and that command."""
    cli._register_commands()  # every command module, as `clusterjob --help` does
    cmd: Any = typer.main.get_command(app)
    path: list[str] = []
    for word in words:
        sub = getattr(cmd, "commands", {}).get(word)  # a group's subcommands by name
        if sub is None:
            break
        cmd, path = sub, [*path, word]
    return path, cmd


def _takes_json(cmd: Any) -> bool:
    return any("--json" in getattr(p, "opts", ()) for p in cmd.params)


def test_readme_json_claim_for_site_admin_commands() -> None:
    section = _site_admin_section()
    claim = re.search(r"^(Every one of them|Each of them but (.*?)) takes `--json`", section, re.M)
    assert claim is not None, "the README says which of these commands take --json"
    before = section[: claim.start()]
    block = before[before.rindex("\n\n", 0, len(before.rstrip()) - 1) :]
    commands: dict[str, Any] = {}
    for line in block.splitlines():
        words = line.split()
        if words[:1] == ["clusterjob"]:
            path, cmd = _command(words[1:])
            assert path, line
            commands[" ".join(path)] = cmd
    assert {"site validate", "site gres-conf", "avail"} <= set(commands)
    excepted = set(re.findall(r"`([^`]+)`", claim.group(2) or ""))
    assert excepted <= set(commands)
    assert sorted(n for n, c in commands.items() if not _takes_json(c)) == sorted(excepted)


def test_no_documented_script_has_its_shebang_after_line_one() -> None:
    """A file block whose `#!` is not its first line fails as a Slurm Prolog (execv: Exec
    format error drains the node): the README once showed such a wrapper. Fenced blocks
    only; the hook wrappers themselves are written by `site install-hooks`."""
    docs = [README, *sorted((README.parent / "docs").glob("*.md"))]
    for doc in docs:
        blocks = re.findall(r"^```[^\n]*\n(.*?)^```$", doc.read_text(encoding="utf-8"), re.M | re.S)
        for block in blocks:
            lines = block.splitlines()
            late = [n for n, line in enumerate(lines) if line.startswith("#!") and n > 0]
            assert not late, f"{doc.name}: a block with #! on line {late[0] + 1}: {lines[0]!r}"
    assert "site install-hooks" in _readme()
