"""What `--help` says of a command's arguments matches what the command accepts."""

from __future__ import annotations

import pytest

import clusterjob.cli.app as cli


def test_submit_help_does_not_call_script_required(capsys: pytest.CaptureFixture[str]) -> None:
    """`submit -- CMD ARGS` takes a command in SCRIPT's place: the help names both forms and
    does not mark SCRIPT `[required]`; with neither, the error is one line, exit 2."""
    assert cli.run(["submit", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "SCRIPT | -- CMD" in shown.splitlines()[0]
    arguments = shown.split("Arguments:", 1)[1].split("Options:", 1)[0]
    assert "[required]" not in arguments
    assert cli.run(["submit", "--gpus", "1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SCRIPT, or -- and a command" in err
