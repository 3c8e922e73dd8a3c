"""``clusterjob``, ``--help``, ``-h`` and ``--version`` are answered from a listing of the
app (each command's name and help, none of its options): the output must be the full app's,
to the byte, and shell completion must still see every option."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import clusterjob.cli.app as cli

REPO = Path(__file__).resolve().parents[1]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.run(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", cli.LISTING_ARGV)
def test_the_listing_reads_as_the_full_app(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = _run(argv, capsys)
    monkeypatch.setattr(cli, "LISTING_ARGV", ())
    full = _run(argv, capsys)
    assert listed == full
    assert "submit" in listed[1] + listed[2] or argv == ["--version"]


def test_each_group_reads_as_its_full_self() -> None:
    """The site and sandbox groups in the listing carry their full help and commands."""
    import typer.main

    cli._register_commands(None)
    listed = typer.main.get_command(cli._listing(cli.app))
    full = typer.main.get_command(cli.app)
    assert list(listed.commands) == list(full.commands)  # type: ignore[attr-defined]
    for name, command in full.commands.items():  # type: ignore[attr-defined]
        shown = listed.commands[name]  # type: ignore[attr-defined]
        assert (shown.get_short_help_str(), shown.hidden) == (
            command.get_short_help_str(),
            command.hidden,
        )


def test_completion_still_sees_every_option() -> None:
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        _CLUSTERJOB_COMPLETE="complete_bash",
        COMP_WORDS="clusterjob submit --gp",
        COMP_CWORD="2",
    )
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["--gpus"], done.stderr


def test_debug_lines_are_added_once(capsys: pytest.CaptureFixture[str]) -> None:
    """--debug shows clusterjob's debug log on stderr (logging is imported only then)."""
    import logging

    logger = logging.getLogger("clusterjob")
    before = list(logger.handlers), logger.level
    try:
        for _ in range(2):
            assert cli.run(["--debug", "--version"]) == 0
        logging.getLogger("clusterjob.slurm").debug("skipped a row")
        named = [h for h in logger.handlers if h.get_name() == "clusterjob-debug-lines"]
        assert len(named) == 1
        assert capsys.readouterr().err.splitlines()[-1] == "clusterjob: debug: skipped a row"
    finally:
        logger.handlers[:] = before[0]
        logger.setLevel(before[1])
