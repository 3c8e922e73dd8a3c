"""Text a node, a process, a job or Slurm chose never reaches a terminal, a log or a drain
reason raw: a GPU process's name (its owner's choice) with ESC, BEL, a carriage return or a
bidi override comes out escaped, on its own line, through the one ``printable``.

The first test drives the real Prolog (``python -m clusterjob prolog`` over the stand-in
NVML, under slurmd's context, with a recording ``scontrol`` on PATH); the others run every
output path that prints such text with the same hostile field."""

from __future__ import annotations

import io
import os
import time
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_hooks_nvml import Node, mixed
from trusted_tree import trusted_tmp_dir

from clusterjob.errors import printable
from clusterjob.gpu.inventory import Gpu, GpuInventory, GpuProcess
from clusterjob.jobs.avail import Availability, SkippedNode, format_availability
from clusterjob.jobs.status import JobStatus
from clusterjob.node import drain, report
from clusterjob.node.checks import Finding, PreflightReport, Severity, SlotRow
from clusterjob.node.prolog import PrologRun
from clusterjob.node.task_prolog import run_task_prolog
from clusterjob.sandbox.cluster import SandboxStatus
from clusterjob.site.drift import DrainedNode, DriftReport, format_report

# ESC sequences (clear line, OSC title, CSI in its C1 form), BEL, a carriage return that would
# forge a second line, a newline, DEL and a right-to-left override; then plain UTF-8 text.
HOSTILE = "x\x1b[2K\x1b]0;t\x07\rgpu1 OK (all checks passed)\x9b2J\x7f\u202etxt.exe é"
# What the stand-in's scenario file can carry in a process name (one line, trimmed).
PROCESS_NAME = "x\x1b[2K\x07\rgpu1 OK (all checks passed)\u202eé"


def raw_controls(text: str) -> list[str]:
    """Every character of ``text`` but the newline that a terminal or log would act on."""
    return [
        c
        for c in text
        if c != "\n" and (unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") or c == "\x7f")
    ]


@pytest.fixture
def trusted_tmp() -> Iterator[Path]:
    yield from trusted_tmp_dir()


def _recording_scontrol(bin_dir: Path, calls: Path) -> None:
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' \"$*\" >> {calls}\n"
        '[ "$1" = show ] && echo "NodeName=gpu2 State=IDLE+DRAIN Reason=Prolog error [root@x]"\n'
        "exit 0\n"
    )
    script.chmod(0o755)


@pytest.mark.nvml
def test_prolog_escapes_a_hostile_process_name_in_stderr_and_drain_reason(
    trusted_tmp: Path, standin_lib: Path
) -> None:
    node = Node(trusted_tmp, standin_lib.parent)
    node.setup(mixed(**{"0": {"processes": ((31337, 2**30, PROCESS_NAME),)}}))
    calls = trusted_tmp / "scontrol-calls"
    _recording_scontrol(trusted_tmp / "bin", calls)
    done = node.prolog(
        env={
            "SLURM_JOB_GPUS": "0",
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
            "PATH": f"{trusted_tmp / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
    )
    assert done.returncode == 1, done.stderr
    assert raw_controls(done.stderr) == [], repr(done.stderr)
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("clusterjob prolog: gpu-busy: gpu2: ")
    assert printable(PROCESS_NAME) in done.stderr
    update = _wait_for_update(calls)
    assert raw_controls(update) == [], repr(update)
    assert update.startswith("update NodeName=gpu2 Reason=clusterjob: gpu-busy: gpu2: ")
    assert "\\x1b[2K\\x07\\rgpu1 OK (all checks passed)\\u202eé" in update
    # The JSON log keeps the name as NVML gave it: JSON escapes it itself.
    assert PROCESS_NAME in node.log_records()[-1]["reason"]


def _wait_for_update(calls: Path) -> str:
    """The one `scontrol update` line the drain-reason helper ran (it waits a second first)."""
    end = time.monotonic() + 15
    while time.monotonic() < end:
        got = calls.read_text().splitlines() if calls.exists() else []
        update = [line for line in got if line.startswith("update ")]
        if update:
            assert len(update) == 1, got
            return update[0]
        time.sleep(0.2)
    raise AssertionError(f"no scontrol update within 15 s: {calls}")


# -- every output path, with the same hostile field -------------------------------------------


def _finding() -> Finding:
    return Finding("gpu-busy", Severity.ERROR, "gpu2", f"gpu2: process {HOSTILE}", slot=0)


def _preflight_table(text: str) -> str:
    rows = (SlotRow(0, "0000:07:00.0", "A100", text, "gpu-busy", allocated=True),)
    return report.render_table(PreflightReport("gpu2", (_finding(),), rows))


def _gpus_table(text: str) -> str:
    gpu = Gpu(
        index=0,
        bus_id="0000:07:00.0",
        name=text,
        uuid="GPU-1",
        processes=(GpuProcess(pid=7, used_memory=2**30, name=text, user=text),),
    )
    return report.render_inventory(GpuInventory((gpu,), text, None), {"GPU-1": text})


def _prolog_stderr(text: str) -> str:
    run = PrologRun("gpu2", "7", None, None, err=io.StringIO())
    run.say(f"gpu-busy: {text}")
    return run.err.getvalue()


def _task_prolog(text: str) -> str:
    out = io.StringIO()
    run_task_prolog({"SLURM_JOB_GPUS": text, "SLURMD_NODENAME": "gpu2"}, out)
    return out.getvalue()


def _status_table(text: str) -> str:
    from clusterjob.cli.status_report import _table

    row = JobStatus(
        job_id="7",
        cluster="c",
        name=text,
        state="PENDING",
        reason=text,
        explanation=text,
        nodes=text,
        elapsed=None,
        exit_code=None,
        submitted=None,
        site="lab",
        source="squeue",
        params=text,
    )
    return _table([row])


def _site_diff(text: str) -> str:
    drained = (DrainedNode("gpu2", "IDLE+DRAIN", text),)
    return "\n".join(
        format_report(DriftReport("lab", (), (), (), (), drained, other_drained=drained))
    )


def _avail(text: str) -> str:
    skipped = (SkippedNode("gpu2", "DRAINED", text),)
    return "\n".join(format_availability(Availability("lab", (), skipped)))


def _sandbox_status(text: str, capsys: pytest.CaptureFixture[str]) -> str:
    from clusterjob.cli.sandbox import _print_status

    _print_status(SandboxStatus(Path("."), [], nodes=[("gpu2", "drained", text)]))
    return capsys.readouterr().out


def _cli_error_line(text: str, capsys: pytest.CaptureFixture[str]) -> str:
    from clusterjob.cli.outcome import err

    err(f"error: sbatch: {text}")
    return capsys.readouterr().err


OUTPUT_PATHS: dict[str, Callable[..., str]] = {
    "preflight-table": _preflight_table,
    "gpus-table": _gpus_table,
    "prolog-stderr": _prolog_stderr,
    "task-prolog": _task_prolog,
    "status-table": _status_table,
    "site-diff": _site_diff,
    "avail": _avail,
    "sandbox-status": _sandbox_status,
    "cli-error": _cli_error_line,
}


@pytest.mark.parametrize("path", list(OUTPUT_PATHS))
def test_every_output_path_escapes_foreign_text(
    path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    show = OUTPUT_PATHS[path]
    wants_capsys = show.__code__.co_argcount == 2
    text = show(HOSTILE, capsys) if wants_capsys else show(HOSTILE)
    assert raw_controls(text) == [], repr(text)
    assert "gpu1 OK" in text
    for line in text.splitlines():  # the forged verdict never starts a line of its own
        assert not line.lstrip().startswith("gpu1 OK"), repr(text)
    assert "é" in text  # ordinary UTF-8 stays readable


def test_drain_reason_is_escaped(tmp_path: Path) -> None:
    """The detached helper hands `scontrol update` the reason escaped, on one line."""
    calls = tmp_path / "calls"
    _recording_scontrol(tmp_path / "bin", calls)
    drain.set_drain_reason_later(
        "gpu2", f"clusterjob: {HOSTILE}", scontrol=str(tmp_path / "bin/scontrol")
    )
    update = _wait_for_update(calls)
    assert raw_controls(update) == [], repr(update)
    assert update == f"update NodeName=gpu2 Reason=clusterjob: {printable(HOSTILE)}"


@pytest.mark.parametrize(
    ("text", "field", "lines"),
    [
        ("plain text, é, 日本語", "plain text, é, 日本語", "plain text, é, 日本語"),
        ("a\tb\nc", "a\\tb\\nc", "a\tb\nc"),
        ("\x1b[31m\x07\r\x00\x7f\x9b", "\\x1b[31m\\x07\\r\\x00\\x7f\\x9b", None),
        ("\u202e\u2066\u200f\u061c\u2028", "\\u202e\\u2066\\u200f\\u061c\\u2028", None),
    ],
)
def test_printable(text: str, field: str, lines: str | None) -> None:
    assert printable(text) == field
    assert printable(text, lines=True) == (field if lines is None else lines)
