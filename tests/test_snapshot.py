"""``--snapshot``: the job's code copied at submit, so that a queued or requeued job runs the
code as it was then. Which files are copied (git's list, else the ``*.py`` files), owner-only
modes, the program and ``PYTHONPATH`` pointed at the copy, a refused job leaving no copy,
and which copies are removed once no recorded job needs them. The jobs go through the whole
submission path to a stateful stand-in for Slurm; the end-to-end test is in
``tests/e2e/test_snapshot.py``."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob.api.cluster import Cluster
from clusterjob.cli.app import run
from clusterjob.errors import SlurmError, UsageError
from clusterjob.jobs import snapshot as snapshots
from clusterjob.jobs.registry import JobRecord
from clusterjob.jobscript.program import snapshot_word
from clusterjob.jobscript.request import JobRequest, program_argv

SANDBOX_SITE = Path(__file__).parent / "fixtures" / "slurm" / "sandbox_site.yaml"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small project (not in git) as cwd: a script, a module, a package, and what is no
    code: a virtual environment, caches, a hidden directory, data."""
    work = tmp_path / "proj"
    (work / "pkg").mkdir(parents=True)
    (work / "train.py").write_text("import helper\nprint(helper.VALUE)\n")
    (work / "helper.py").write_text("VALUE = 1\n")
    (work / "pkg" / "__init__.py").write_text("")
    (work / "pkg" / "model.py").write_text("LAYERS = 2\n")
    (work / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (work / "run.sh").chmod(0o755)
    (work / "data.csv").write_text("1,2\n")
    for skipped in (".venv/lib", "__pycache__", ".git-like", "venv", "node_modules"):
        (work / skipped).mkdir(parents=True)
        (work / skipped / "x.py").write_text("SKIPPED = True\n")
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(work)
    return work


def cluster_for(slurm: FakeSlurm, **kwargs: object) -> Cluster:
    return Cluster(str(SANDBOX_SITE), host="", exec=slurm, poll_interval=3600, **kwargs)  # type: ignore[arg-type]


def test_outside_git_the_python_files_are_copied(project: Path) -> None:
    files, in_git = snapshots.code_files(project, ["run.sh"])
    assert not in_git
    assert sorted(name for name, _ in files) == [
        "helper.py", "pkg/__init__.py", "pkg/model.py", "run.sh", "train.py",
    ]  # fmt: skip


def test_clusterjobs_own_data_dir_is_never_copied(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(project / "cjdata"))
    snapshots.take(project, "first")
    assert (project / "cjdata" / "snapshots" / "first" / "train.py").is_file()
    names = [name for name, _ in snapshots.code_files(project)[0]]
    assert not any(n.startswith("cjdata") for n in names) and "train.py" in names
    subprocess.run(["git", "init", "-q", "."], check=True)
    names = [name for name, _ in snapshots.code_files(project)[0]]
    assert not any(n.startswith("cjdata") for n in names) and "train.py" in names


def test_in_git_the_files_git_lists_are_copied_untracked_ones_too(project: Path) -> None:
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q", "."], check=True)
    (project / ".gitignore").write_text(".venv/\n__pycache__/\nvenv/\nnode_modules/\n*.csv\n")
    subprocess.run([*git, "add", "train.py", "helper.py", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    (project / "new_module.py").write_text("NEW = 1\n")  # not added yet: still imported
    files, in_git = snapshots.code_files(project)
    names = sorted(name for name, _ in files)
    assert in_git
    assert "new_module.py" in names and "pkg/model.py" in names and "run.sh" in names
    assert "data.csv" not in names and not any(n.startswith((".venv", "venv/")) for n in names)
    assert ".git-like/x.py" in names  # git's list decides, hidden or not


def test_a_big_file_is_left_out_and_too_much_is_refused(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "weights.py").write_text("#" * 200)
    monkeypatch.setattr(snapshots, "MAX_FILE_BYTES", 100)
    names = [name for name, _ in snapshots.code_files(project)[0]]
    assert "weights.py" not in names and "train.py" in names
    monkeypatch.setattr(snapshots, "MAX_FILES", 3)
    with pytest.raises(UsageError, match=r"too big to copy for each job .*--no-snapshot"):
        snapshots.code_files(project)


def test_the_copy_is_the_code_as_it_was_and_only_its_owner_reads_it(project: Path) -> None:
    copy = snapshots.take(project, "tok1", ["run.sh"])
    (project / "helper.py").write_text("VALUE = 2\n")  # edited after submit
    assert (copy / "helper.py").read_text() == "VALUE = 1\n"
    assert copy == snapshots.snapshot_path("tok1")
    assert stat.S_IMODE(copy.stat().st_mode) == 0o700
    assert stat.S_IMODE((copy / "pkg").stat().st_mode) == 0o700
    assert stat.S_IMODE((copy / "helper.py").stat().st_mode) == 0o600
    assert stat.S_IMODE((copy / "run.sh").stat().st_mode) == 0o700  # still runs
    assert stat.S_IMODE(copy.parent.stat().st_mode) == 0o700
    assert not (copy / ".venv").exists() and not (copy / "data.csv").exists()
    assert [p.name for p in copy.parent.iterdir()] == ["tok1"]  # nothing half-built left


@pytest.mark.parametrize(
    ("script", "args", "command", "word"),
    [
        ("train.py", (), False, 0),
        ("src/train.py", ("--lr", "1"), False, 0),
        ("/elsewhere/train.py", (), False, None),
        ("../other/train.py", (), False, None),
        ("./run.sh", (), True, 0),
        ("torchrun", ("--nproc-per-node=2", "train.py", "--out", "x.py"), True, 2),
        ("python", ("-m", "pkg.main"), True, None),
        ("python", ("train.py",), True, 1),
        ("accelerate", ("launch", "/abs/train.py"), True, None),
        ("nvidia-smi", (), True, None),
    ],
)
def test_the_program_file_a_snapshot_starts_from(
    script: str, args: tuple[str, ...], command: bool, word: int | None
) -> None:
    assert snapshot_word(script, args, command=command) == word


def test_the_program_runs_from_the_copy_and_imports_find_it_first(project: Path) -> None:
    request = JobRequest(script="src/../train.py", args=("--x",), snapshot="/d/snapshots/t")
    assert program_argv(request) == (True, ("/d/snapshots/t/train.py", "--x"))
    cmd = JobRequest(script="torchrun", args=("train.py",), command=True, snapshot=".cj/t")
    assert program_argv(cmd) == (False, ("torchrun", ".cj/t/train.py"))
    slurm = FakeSlurm("sandbox")
    script = cluster_for(slurm, snapshot=True).prepare("train.py", token="abc").script
    (name,) = re.findall(r"snapshots/([0-9a-f]+)\n", script)
    assert name != "abc"  # not the job's token, which resubmit --same-script replaces
    copy = snapshots.snapshot_path(name)
    assert f"export CLUSTERJOB_SNAPSHOT={copy}\n" in script
    assert 'export PYTHONPATH="$CLUSTERJOB_SNAPSHOT${PYTHONPATH:+:$PYTHONPATH}"' in script
    assert f'exec "$python" {copy}/train.py\n' in script
    assert "SNAPSHOT" not in cluster_for(slurm).prepare("train.py").script  # off by default
    assert (
        "SNAPSHOT"
        not in cluster_for(slurm, snapshot=True).prepare("train.py", snapshot=False).script
    )
    assert not copy.exists()  # prepare (--dry-run) copies nothing


def test_submit_copies_the_code_and_a_refused_job_leaves_no_copy(project: Path) -> None:
    slurm = FakeSlurm("sandbox")
    cluster = cluster_for(slurm, snapshot=True)
    job = cluster.submit("train.py")
    record = cluster.registry().get(job.id)
    assert record is not None
    copy = Path(json.loads(record.request or "")["snapshot"])
    assert copy.parent == snapshots.snapshots_dir()
    assert (copy / "helper.py").read_text() == "VALUE = 1\n"
    assert f"{copy}/train.py" in record.script
    slurm.sbatch_plan = ["sbatch: error: Batch job submission failed: Invalid account"]
    with pytest.raises(SlurmError):
        cluster.submit("train.py")
    assert [p.name for p in snapshots.snapshots_dir().iterdir()] == [copy.name]


def test_the_command_line_option(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["submit", "--site", str(SANDBOX_SITE), "--dry-run", "train.py"]
    assert run([*base, "--snapshot"]) == 0
    assert "export CLUSTERJOB_SNAPSHOT=" in capsys.readouterr().out
    assert run([*base, "--no-snapshot"]) == 0
    assert "CLUSTERJOB_SNAPSHOT" not in capsys.readouterr().out


def test_a_host_without_sync_refuses_a_snapshot(project: Path) -> None:
    cluster = Cluster(str(SANDBOX_SITE), host="login1", sync=False, snapshot=True)
    with pytest.raises(UsageError, match=r"--snapshot with --host .*\(sync: false"):
        cluster._snapshot_dir("t", None)
    synced = Cluster(str(SANDBOX_SITE), host="login1", snapshot=True)
    assert synced._snapshot_dir("t", None) == ".clusterjob/snapshots/t"  # under the job's dir


def record(
    token: str, state: str, snapshot: str | None, *, at: float, job_id: str = "7"
) -> JobRecord:
    request = asdict(JobRequest(script="train.py", snapshot=snapshot))
    return JobRecord(
        job_id=job_id, cluster="c", site="s", token=token, job_name="n", script="", script_path="",
        command_line="", work_dir="", git_commit=None, submitted_at=at, state=state,
        state_checked_at=at, request=json.dumps(request),
    )  # fmt: skip


DAY = 86400.0


@pytest.mark.parametrize(
    ("records", "made", "gone"),
    [
        ([], -0.5 * DAY, False),  # no record yet: a submission may be under way
        ([], -2 * DAY, True),  # no record names it (registry repaired, job refused long ago)
        ([("PENDING", -30 * DAY)], -30 * DAY, False),  # queued for a month: still needed
        ([("RUNNING", -30 * DAY)], -30 * DAY, False),
        ([("COMPLETED", -2 * DAY)], -3 * DAY, False),  # resubmit may run it again
        ([("COMPLETED", -8 * DAY)], -9 * DAY, True),
        ([("FAILED", -8 * DAY), ("PENDING", -1 * DAY)], -9 * DAY, False),  # resubmitted
        ([("PREEMPTED", -8 * DAY)], -9 * DAY, True),
    ],
)
def test_a_snapshot_is_removed_once_no_recorded_job_needs_it(
    records: list[tuple[str, float]], made: float, gone: bool
) -> None:
    now = 1_000_000_000.0
    rows = [
        record(f"t{i}", st, "/d/snapshots/snap", at=now + at) for i, (st, at) in enumerate(records)
    ]
    rows.append(record("other", "RUNNING", "/d/snapshots/else", at=now))
    rows.append(record("none", "COMPLETED", None, at=now - 99 * DAY))
    assert snapshots.stale([("snap", now + made)], rows, now) == (["snap"] if gone else [])


def test_submitting_removes_the_snapshots_no_job_needs(project: Path) -> None:
    slurm = FakeSlurm("sandbox")
    cluster = cluster_for(slurm, snapshot=True)
    old = snapshots.take(project, "0ld")
    building = snapshots.snapshots_dir() / ".1ate.99.tmp"
    building.mkdir()
    past = time.time() - 3 * DAY
    for path in (old, building):
        os.utime(path, (past, past))
    job = cluster.submit("train.py")
    names = sorted(p.name for p in snapshots.snapshots_dir().iterdir())
    record_ = cluster.registry().get(job.id)
    assert record_ is not None
    kept = Path(json.loads(record_.request or "")["snapshot"]).name
    assert names == sorted([".1ate.99.tmp", kept])
    shutil.rmtree(building)


def test_resubmit_runs_the_same_copy_again(project: Path) -> None:
    slurm = FakeSlurm("sandbox")
    cluster = cluster_for(slurm, snapshot=True)
    job = cluster.submit("train.py")
    first = cluster.registry().get(job.id)
    assert first is not None
    copy = json.loads(first.request or "")["snapshot"]
    for same_script in (True, False):
        again = cluster.resubmit(job.id, same_script=same_script)
        record_ = cluster.registry().get(again.job_id)
        assert record_ is not None and record_.token != first.token
        assert f'exec "$python" {copy}/train.py' in record_.script
    assert [p.name for p in snapshots.snapshots_dir().iterdir()] == [Path(copy).name]
    shutil.rmtree(copy)  # pruned: a week after the job ended
    with pytest.raises(UsageError, match=f"code snapshot {copy} is gone .* submit the job again"):
        cluster.resubmit(job.id)
