"""``clusterjob show`` of a Grid Engine job: the registry's record, with the qsub command that
submits its script (not an sbatch line), and no Slurm command run for it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from clusterjob.cli.app import run
from clusterjob.jobs.registry import JobRecord, Registry
from clusterjob.jobs.submit import provenance
from clusterjob.resources import site_configs_dir


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))

    def no_command(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a command was run: {args}")

    monkeypatch.setattr(subprocess, "run", no_command)
    monkeypatch.setattr(subprocess, "Popen", no_command)
    return tmp_path / "data"


def ge_record(job_id: str, **fields: object) -> JobRecord:
    values: dict[str, object] = {
        "job_id": job_id,
        "cluster": "",
        "site": "gelab",
        "token": f"tok{job_id}",
        "job_name": "train",
        "script": "#!/bin/bash\n#$ -l gpu=2,gpu_type=a100\n",
        "script_path": "/s/a b.sh",
        "command_line": "clusterjob submit train.py",
        "work_dir": "/home/ana/run",
        "git_commit": "abc",
        "submitted_at": time.time(),
        "state": "COMPLETED",
        "exit_code": 0,
        "nodes": "host1",
        "scheduler": "gridengine",
        **fields,
    }
    return JobRecord(**values)  # type: ignore[arg-type]


def test_provenance_names_the_qsub_command(data: Path) -> None:
    Registry().add(ge_record("31"))
    shown = provenance("31")
    assert shown["sbatch_command"] == "qsub -wd /home/ana/run '/s/a b.sh'"
    assert (shown["state"], shown["site"], shown["script_path"]) == (
        "COMPLETED",
        "gelab",
        "/s/a b.sh",
    )


def test_show_prints_a_qsub_row(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Registry().add(ge_record("32"))
    assert run(["show", "32"]) == 0
    out = capsys.readouterr().out
    assert "qsub command:   qsub -wd /home/ana/run '/s/a b.sh'" in out
    assert "sbatch" not in out
    assert "job:            32 on cluster ? (COMPLETED)" in out
    assert run(["show", "32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job_id"] == "32"


def test_a_slurm_jobs_show_is_unchanged(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Registry().add(ge_record("33", scheduler=None, site="mllab"))
    assert run(["show", "33"]) == 0
    out = capsys.readouterr().out
    assert "sbatch command: sbatch --parsable --chdir=/home/ana/run '/s/a b.sh'" in out


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["resubmit", "34", "--same-script"], "--same-script not yet"),
        (["resubmit", "34_2"], "a task id not yet"),
        (["resubmit", "34", "--failed"], "--failed not yet"),
    ],
)
def test_resubmit_refuses_what_would_go_to_sbatch(
    data: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    said: str,
) -> None:
    """Replaying a Grid Engine job's script, or some of its tasks, is Slurm's path (#SBATCH
    lines, sbatch): refused in one line, nothing run."""
    monkeypatch.setenv("CLUSTERJOB_SITE", str(site_configs_dir() / "gelab.yaml"))
    Registry().add(ge_record("34", script="#!/bin/bash\n#$ -t 1-4:1\n"))
    assert run(args) == 2
    err = capsys.readouterr().err
    assert f"job 34 ran on Grid Engine, where resubmit renders the job again: {said}" in err
    assert len(err.strip().splitlines()) == 1, err
