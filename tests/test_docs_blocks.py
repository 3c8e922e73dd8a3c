"""Every code block of README.md and docs/ is one of the kinds tests/doc_blocks.py names, and
holds what it says: shell blocks are run (tests/e2e/test_docs_blocks.py) or visibly
illustrative, every option a shown command uses exists on that command, site files
validate, fragments name only real keys, and a wrapper file shown is byte for byte what
`site install-hooks` writes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main
from doc_blocks import (
    FRAGMENT,
    ILLUSTRATIVE,
    REPO,
    SHELLS,
    Block,
    all_blocks,
    commands,
    documents,
)
from doc_blocks import indented_commands as indented
from ruamel.yaml import YAML

from clusterjob.cli import app as cli
from clusterjob.cli.app import run
from clusterjob.node.checks import REGISTRY
from clusterjob.node.wrappers import HookWrappers

# The installation the docs describe: what a file block with one of these titles must be.
DOCUMENTED_HOOKS = HookWrappers(
    prefix=Path("/etc/slurm"),
    python=Path("/opt/clusterjob/bin/python"),
    site=Path("/etc/clusterjob/site.yaml"),
)


def _shell_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang in SHELLS]


def test_every_shell_block_is_run_illustrative_or_a_known_file() -> None:
    files = {str(path) for path in DOCUMENTED_HOOKS.files()}
    kinds = {"console": 0, "illustrative": 0, "file": 0}
    for block in _shell_blocks():
        if block.lang == "console":
            assert commands(block), f"{block.where}: a console block with no `$ ` command"
            kinds["console"] += 1
        elif block.first_line.lower().startswith(ILLUSTRATIVE):
            kinds["illustrative"] += 1
        else:
            assert block.first_line.startswith("#!") and block.title in files, (
                f"{block.where}: a {block.lang} block must start with `{ILLUSTRATIVE}` "
                "(or be a ```console block, which the tests run)"
            )
            kinds["file"] += 1
    assert all(kinds.values()), kinds  # each kind is used, so each rule is exercised


def test_no_command_is_shown_in_an_indented_block() -> None:
    for doc in documents():
        found = indented(doc)
        assert not found, f"{doc.name}:{found[0][0]}: put {found[0][1].strip()!r} in a fence"


def test_a_wrapper_file_shown_is_what_install_hooks_writes() -> None:
    files = {str(path): text for path, text in DOCUMENTED_HOOKS.files().items()}
    shown = [b for b in _shell_blocks() if b.title in files]
    assert {b.title for b in shown} == set(files), "the docs show both wrappers"
    for block in shown:
        assert block.text == files[str(block.title)], (
            f"{block.where}: not what install-hooks writes"
        )


def _command_lines(block: Block) -> list[str]:
    if block.lang == "console":
        return [c.text.replace("\\\n", " ") for c in commands(block)]
    lines, joined = [], ""
    for line in block.text.splitlines():
        joined += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            lines.append(joined.strip())
            joined = ""
    return lines


def _words(line: str) -> list[str]:
    """The words after `clusterjob` when a command of the line is clusterjob (the first word,
    or the first after `&&`, `||`, `|` or `;`); else none."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    starts = True
    for i, word in enumerate(words):
        if starts and (word == "clusterjob" or word.endswith("/clusterjob")):
            return words[i + 1 :]
        starts = word in ("&&", "||", "|", ";")
    return []


def _command(words: list[str]) -> tuple[list[str], Any]:
    cli._register_commands()
    cmd: Any = typer.main.get_command(cli.app)
    path: list[str] = []
    for word in words:
        sub = (getattr(cmd, "commands", None) or {}).get(word)
        if sub is None:
            break
        cmd, path = sub, [*path, word]
    return path, cmd


def test_every_option_a_shown_command_uses_exists() -> None:
    """`clusterjob CMD --opt` in any shell block: CMD has --opt (up to a `--`, after which the
    words are the job's). The Slurm hooks are argparse commands, checked by their help."""
    checked = 0
    for block in _shell_blocks():
        for line in _command_lines(block):
            words = _words(line)
            if not words or words[0] in ("prolog", "task-prolog"):
                continue
            path, cmd = _command(words)
            assert path or words[0].startswith("-"), f"{block.where}: no command {words[0]!r}"
            names = {
                n
                for p in cmd.params
                for n in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]
            }
            names |= {"--help", "-h", "--debug"}
            for word in words[len(path) :]:
                if word == "--" or word in ("|", ">", "&&", ";"):
                    break
                option = word.split("=", 1)[0]
                if option.startswith("-") and len(option) > 1 and not option[1:].isdigit():
                    assert option in names, (
                        f"{block.where}: `clusterjob {' '.join(path)}` has no {option}"
                    )
            checked += 1
    assert checked > 30


def _known_keys() -> set[str]:
    from test_docs_reference import gen

    return {p.rsplit(".", 1)[-1] for p in gen.site_key_paths()} | set(REGISTRY.ids)


def _keys_known(node: Any, known: set[str], parent: str, where: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if parent not in ("models", "partitions"):  # their keys are the site's names
                assert key in known, f"{where}: {key!r} is not a site config key"
            _keys_known(value, known, str(key), where)
    elif isinstance(node, list):
        for item in node:
            _keys_known(item, known, parent, where)


def test_every_yaml_block_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    yaml_blocks = [b for b in all_blocks() if b.lang in ("yaml", "yml")]
    known = _known_keys()
    sites = 0
    for n, block in enumerate(yaml_blocks):
        if block.first_line.startswith(FRAGMENT):
            data = YAML(typ="safe").load(block.text)
            _keys_known(data, known, "", block.where)
            continue
        site = tmp_path / f"site{n}.yaml"
        site.write_text(block.text, encoding="utf-8")
        code = run(["site", "validate", str(site)])
        out = capsys.readouterr()
        assert code == 0, f"{block.where}: {out.out}{out.err}"
        sites += 1
    assert sites >= 1


def test_the_node_checks_how_to_points_at_the_generated_table() -> None:
    """What each check reads and what to do when it fires is registered with the check and
    tabled in the generated reference (test_docs_reference.py checks each row); the how-to
    keeps no hand-written copy of it."""
    page = (REPO / "docs" / "how-to" / "wire-node-checks.md").read_text(encoding="utf-8")
    assert "](../reference/checks.md)" in page
    rows = re.findall(r"^\| `([a-z0-9-]+)`", page, re.M)
    assert not set(rows) & set(REGISTRY.ids), "a hand-written check table is back"
