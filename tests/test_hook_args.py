"""The Prolog's usual command line is read without argparse, and reads as argparse reads it.

The Prolog starts before every job on every node; argparse and what it pulls in (gettext,
shutil, locale) were ~8 ms of each start. ``_prolog_args`` reads the forms slurm.conf uses
and leaves everything else (help, errors, odd forms) to the argparse parser.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir

from clusterjob.node.hooks import _parser, _prolog_args

REPO = Path(__file__).resolve().parents[1]

READ_WITHOUT_ARGPARSE = [
    [],
    ["--site", "/etc/clusterjob/site.yaml"],
    ["--site", "/etc/clusterjob/site.yaml", "--cache-dir", "/var/cache/clusterjob"],
    ["--site=/etc/s.yaml", "--cache-dir=/var/cache/c", "--deadline=12.5", "--log=/var/log/p"],
    ["--deadline", "3", "--site", "a", "--site", "b"],  # repeated: the last wins
    ["--site=a=b", "--log="],  # '=' inside a value; an empty value
    ["--site", "", "--deadline", " 7 "],
    ["--deadline=-1"],
    ["--deadline", "inf"],
]
LEFT_TO_ARGPARSE = [
    ["--help"],
    ["-h"],
    ["--sit", "x"],  # abbreviations are refused (allow_abbrev=False)
    ["--site"],
    ["--site", "--cache-dir", "x"],
    ["--site", "-x"],
    ["--deadline", "-1"],
    ["--deadline", "soon"],
    ["--deadline=soon"],
    ["--", "--site", "x"],
    ["extra"],
    ["--site", "a", "extra"],
]


@pytest.mark.parametrize("rest", READ_WITHOUT_ARGPARSE)
def test_read_as_argparse_reads_it(rest: list[str]) -> None:
    fast = _prolog_args(rest)
    assert fast is not None
    assert vars(fast) == vars(_parser("prolog").parse_args(rest))


@pytest.mark.parametrize("rest", LEFT_TO_ARGPARSE)
def test_everything_else_is_left_to_argparse(rest: list[str]) -> None:
    assert _prolog_args(rest) is None


@pytest.fixture
def trusted() -> Iterator[Path]:
    yield from trusted_tmp_dir()


def test_a_prolog_start_imports_neither_argparse_nor_socket(trusted: Path) -> None:
    site = trusted / "site.yaml"
    site.write_text("site: lab\n")  # not a valid site: the Prolog stops at the loader
    site.chmod(0o644)
    code = (
        "import sys\n"
        "from clusterjob.__main__ import main\n"
        f"main(['prolog', '--site', {str(site)!r}, '--cache-dir', {str(trusted / 'c')!r}, "
        f"'--log', {str(trusted / 'l')!r}])\n"
        "print(sorted(m for m in ('argparse', 'socket', 'gettext') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "SLURMD_NODENAME": "gpu1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.splitlines()[-1] == "[]", done.stderr


def _help(argv: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", *argv], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"}, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize("hook", ["prolog", "task-prolog"])
def test_a_hooks_help_reads_like_every_other_commands(hook: str) -> None:
    """argparse parses the hooks (Slurm starts them before every job, where Typer costs
    time), but their help has the layout of the Typer commands': `Usage:`, the command's
    purpose, `Options:` with `<type>` values, capitalised sentences, `-h, --help` last."""
    shown = _help([hook, "--help"])
    typer_help = _help(["preflight", "--help"])
    assert shown.startswith(f"Usage: clusterjob {hook} [OPTIONS]\n\n  ")
    assert typer_help.startswith("Usage: clusterjob preflight [OPTIONS]\n\n  ")
    assert "\nOptions:\n" in shown and "options:" not in shown
    assert "--site <str>" in shown
    assert shown.rstrip().endswith("Show this message and exit.")
    option_lines = shown.split("\nOptions:\n", 1)[1].splitlines()
    assert option_lines[-1].lstrip().startswith("-h, --help")
    helps = [action.help or "" for action in _parser(hook)._actions]
    assert all(h[:1].isupper() and h.endswith(".") for h in helps), helps
    assert max(len(line) for line in shown.splitlines()) <= 80
