"""Claims of README.md and docs/ checked against the code: which commands take `--json`
(where a page says so), the README's summary of exit codes, and no documented script with
its `#!` after the first line. (Every block of the pages is checked by test_docs_blocks.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer.main

from clusterjob.cli import app as cli
from clusterjob.cli.app import app
from clusterjob.errors import ExitCode

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SITE_ADMIN = REPO / "docs" / "getting-started" / "site-admin.md"
JSON_HOWTO = REPO / "docs" / "how-to" / "json-in-scripts.md"


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


def test_site_admin_json_claim() -> None:
    """'Each of them but X takes --json' about the block of site commands above it."""
    page = SITE_ADMIN.read_text(encoding="utf-8")
    claim = re.search(r"^(Every one of them|Each of them but (.*?)) takes `--json`", page, re.M)
    assert claim is not None, "the site admin page says which of these commands take --json"
    before = page[: claim.start()]
    block = before[before.rindex("```sh") :]
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


def test_json_howto_lists_exactly_the_commands_that_take_json() -> None:
    page = JSON_HOWTO.read_text(encoding="utf-8")
    claim = re.search(r"^The commands that take `--json`: (.*?)\.$", page, re.M | re.S)
    assert claim is not None
    listed = re.findall(r"`([^`]+)`", claim.group(1))
    cli._register_commands()
    root: Any = typer.main.get_command(app)
    with_json = []
    stack: list[tuple[list[str], Any]] = [([], root)]
    while stack:
        path, cmd = stack.pop()
        if _takes_json(cmd):
            with_json.append(" ".join(path))
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            stack.append(([*path, name], sub))
    assert sorted(listed) == sorted(with_json)


def test_readme_exit_code_summary_names_every_code() -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Exit codes") :]
    summary = section[: section.index("\n\n", section.index("\n\n") + 2)]
    said = [int(n) for n in re.findall(r"(?:^|; |\n)(\d+) ", summary)]
    assert said == [int(c) for c in ExitCode], summary


def test_no_documented_script_has_its_shebang_after_line_one() -> None:
    """A file block whose `#!` is not its first line fails as a Slurm Prolog (execv: Exec
    format error drains the node): the README once showed such a wrapper. Fenced blocks
    only, but a console block's (what a command printed, such as a job script shown by
    `submit --dry-run`); the hook wrappers themselves are written by `site install-hooks`."""
    docs = [README, *sorted((REPO / "docs").rglob("*.md"))]
    for doc in docs:
        text = doc.read_text(encoding="utf-8")
        blocks = re.findall(r"^```(?!console)[^\n]*\n(.*?)^```$", text, re.M | re.S)
        for block in blocks:
            lines = block.splitlines()
            late = [n for n, line in enumerate(lines) if line.startswith("#!") and n > 0]
            assert not late, f"{doc.name}: a block with #! on line {late[0] + 1}: {lines[0]!r}"
    assert "site install-hooks" in (REPO / "docs" / "how-to" / "wire-node-checks.md").read_text()


def test_job_output_files_are_ignored_in_a_checkout() -> None:
    """quickstart.sh (and a reader following the README) submit from the checkout: Slurm's
    slurm-JOBID.out files land there and must not show up as changes."""
    import shutil
    import subprocess

    git = shutil.which("git")
    assert git is not None and (REPO / ".git").exists()
    done = subprocess.run(
        [git, "check-ignore", "--no-index", "slurm-4242.out", "examples/slurm-7_3.out"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.stdout.split() == ["slurm-4242.out", "examples/slurm-7_3.out"], done.stderr
