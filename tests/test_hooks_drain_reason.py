"""The Prolog's drain-reason helper: detached, bounded, and it only replaces Slurm's own
"Prolog error" reason. Driven with a stand-in scontrol that records its calls."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clusterjob.node import drain
from clusterjob.node.prolog import PrologRun


def _fake_scontrol(tmp_path: Path, reason: str) -> tuple[Path, Path]:
    calls = tmp_path / "calls"
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        f'[ "$1" = show ] && echo "NodeName=gpu3 State=IDLE+DRAIN Reason={reason} [root@x]"\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return script, calls


def _wait_for(path: Path, lines: int, timeout: float = 10) -> list[str]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and len(got := path.read_text().splitlines()) >= lines:
            return got
        time.sleep(0.1)
    return path.read_text().splitlines() if path.exists() else []


def test_replaces_slurms_prolog_error_reason(tmp_path: Path) -> None:
    scontrol, calls = _fake_scontrol(tmp_path, "Prolog error")
    started = time.monotonic()
    reason = "clusterjob: model-mismatch: slot 0"
    drain.set_drain_reason_later("gpu3", reason, scontrol=str(scontrol))
    assert time.monotonic() - started < 1.0  # the Prolog does not wait for it
    got = _wait_for(calls, 2)
    assert got == [
        "show node -o gpu3",
        "update NodeName=gpu3 Reason=clusterjob: model-mismatch: slot 0",
    ]


def test_leaves_an_admins_reason_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain, "DRAIN_REASON_WAIT_S", 2.5)
    scontrol, calls = _fake_scontrol(tmp_path, "bad fan, ticket 1234")
    drain.set_drain_reason_later("gpu3", "clusterjob: gpu-missing", scontrol=str(scontrol))
    time.sleep(4)
    got = calls.read_text().splitlines()
    assert got and all(line == "show node -o gpu3" for line in got)


def test_only_under_slurmd(monkeypatch: pytest.MonkeyPatch) -> None:
    """By hand (no SLURM_SCRIPT_CONTEXT=prolog_slurmd) the Prolog never touches Slurm."""
    called: list[tuple[str, str]] = []
    monkeypatch.setattr(drain, "set_drain_reason_later", lambda n, r: called.append((n, r)))
    for under_slurmd in (False, True):
        run = PrologRun("gpu3", None, None, None, under_slurmd=under_slurmd)
        run.leave_drain_reason("gpu-missing: slot 3")
    assert called == [("gpu3", "clusterjob: gpu-missing: slot 3")]
