"""Bad nodes stay out of retries: the avoid list (jobs/badnodes.py), what a job's end says of
its nodes, `submit`'s --exclude from it, and `wait`'s --retry-bad-node over the fake Slurm,
one job per retry whoever waits."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob.api.cluster import WORKER_NAME, Cluster
from clusterjob.cli.app import run
from clusterjob.jobs.badnodes import AvoidList, findings, merged_exclude, retry_token
from clusterjob.slurm.runner import SlurmResult

SANDBOX_SITE = Path(__file__).parent / "fixtures" / "slurm" / "sandbox_site.yaml"

# What a job whose required preflight failed on gpu1 leaves in its log (as in the sandbox).
FAILED_LOG = """\
SLOT  BUS ID        EXPECTED  FOUND  STATUS
0*    0000:07:00.0  A100      V100   MISMATCH
error: gpu-model: slot 0 at 0000:07:00.0: the map says A100, NVML says Tesla V100
clusterjob: error: preflight gpu1: FAILED (1 error(s), 0 warning(s))
clusterjob: preflight failed (exit 1): the program was not started
"""
WARNED_LOG = FAILED_LOG.replace(
    "clusterjob: preflight failed (exit 1): the program was not started",
    "clusterjob: preflight failed (exit 1); going on: this site's preflight is warn\ntraining",
)

FINDINGS = [
    # (state, exit code, nodes, hardware, log) -> (node, finding) pairs
    (("FAILED", 78, "gpu1", None, FAILED_LOG),
     [("gpu1", "preflight failed: gpu-model: slot 0 at 0000:07:00.0: the map says A100, "
               "NVML says Tesla V100")]),
    (("COMPLETED", 0, "gpu1", None, WARNED_LOG),
     [("gpu1", "preflight failed: gpu-model: slot 0 at 0000:07:00.0: the map says A100, "
               "NVML says Tesla V100")]),
    (("FAILED", 78, "gpu1", None,
      "clusterjob: error: NVML: driver not loaded\nclusterjob: preflight failed (exit 5): x\n"),
     [("gpu1", "preflight failed: NVML could not read the node's GPUs")]),
    (("FAILED", 78, "gpu1", None, "clusterjob: preflight failed (exit 2): x\n"), []),
    (("FAILED", 1, "gpu1", None, "Traceback: ValueError\n"), []),
    (("NODE_FAIL", None, "gpu3", None, None),
     [("gpu3", "NODE_FAIL: Slurm lost the node during the job")]),
    (("NODE_FAIL", None, "gpu[1-2]", None, None), []),
    (("FAILED", 1, "gpu[1-2]", "Xid 79 (GPU fell off the bus) on gpu0 0000:07:00.0 on node gpu2",
      None),
     [("gpu2", "hardware: Xid 79 (GPU fell off the bus) on gpu0 0000:07:00.0")]),
    (("COMPLETED", 0, "gpu1", None, None), []),
]  # fmt: skip


@pytest.mark.parametrize(("end", "expected"), FINDINGS)
def test_what_a_jobs_end_says_of_its_nodes(end: tuple, expected: list) -> None:
    assert findings(*end) == expected


def test_the_avoid_list_expires_clears_and_is_private(tmp_path: Path) -> None:
    avoid = AvoidList(tmp_path / "data" / "bad-nodes.json")
    avoid.add([("gpu1", "NODE_FAIL: x")], cluster="c1", job_id="5", now=1000.0, hours=1)
    avoid.add([("gpu2", "hardware: Xid 79")], cluster="c2", job_id="6", now=1000.0)
    assert stat.S_IMODE(os.stat(avoid.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(avoid.path.parent).st_mode) == 0o700
    assert [e.node for e in avoid.entries("c1", now=1001.0)] == ["gpu1"]
    assert [e.node for e in avoid.entries(None, now=1001.0)] == ["gpu1", "gpu2"]
    assert [e.node for e in avoid.entries(None, now=1000.0 + 3601)] == ["gpu2"]  # gpu1 expired
    # the same job's finding seen again (a second `wait`) keeps its time; another job's renews
    assert avoid.add([("gpu2", "hardware: Xid 79")], cluster="c2", job_id="6", now=5000.0) == []
    (renewed,) = avoid.add([("gpu2", "NODE_FAIL: y")], cluster="c2", job_id="9", now=5000.0)
    assert [(e.job_id, e.since) for e in avoid.entries(None, now=5000.0)] == [("9", 5000.0)]
    assert renewed.line(5000.0 + 7200) == "gpu2 (NODE_FAIL 2h ago: y, job 9)"
    assert [e.node for e in avoid.clear("gpu2")] == ["gpu2"]
    assert avoid.entries(None, now=5000.0) == []


def test_merged_exclude_keeps_the_users_nodes_first() -> None:
    assert merged_exclude(None, ["gpu1"]) == ("gpu1", ["gpu1"])
    assert merged_exclude("gpu[3-4]", ["gpu4", "gpu1"]) == ("gpu[3-4],gpu1", ["gpu1"])
    assert merged_exclude(None, ["gpu1"], nodelist="gpu1") == (None, [])


# --- submit and wait over the fake Slurm ------------------------------------------------------


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


class NodeThatFails(FakeSlurm):
    """The first job fails its preflight on gpu1 (exit 78, its log says so); every job
    submitted after it completes on gpu2."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__("sandbox")
        self.log_dir = log_dir

    def _sbatch(self, cmd: list[str], timeout: float) -> SlurmResult:
        result = super()._sbatch(cmd, timeout)
        job_id = result.stdout.strip()
        log = str(self.log_dir / "slurm-%j.out")
        if len(self.commands("sbatch")) == 1:
            (self.log_dir / f"slurm-{job_id}.out").write_text(FAILED_LOG)
            self.jobs[job_id].update(state="FAILED", exit_code="78:0", nodes="gpu1", reason="None")
        else:
            self.jobs[job_id].update(state="COMPLETED", exit_code="0:0", nodes="gpu2")
        self.jobs[job_id].update(stdout=log, stderr=log)
        return result


def test_wait_resubmits_once_without_the_bad_node_and_never_twice(here: Path) -> None:
    slurm = NodeThatFails(here)
    cluster = Cluster(str(SANDBOX_SITE), host="", exec=slurm, poll_interval=3600)
    first = cluster.submit(["nvidia-smi"], gpus=1, model="A100", retry_bad_node=1).submitted
    assert first is not None  # its Job's poller may follow it too: still one retry
    first_id = first.job_id
    result = cluster.wait([first_id], timeout=60, interval=0.01)
    (row,) = result.rows
    assert (row.state, row.nodes) == ("COMPLETED", "gpu2"), result
    retry = row.job_id
    assert retry != first_id and len(slurm.commands("sbatch")) == 2
    (note, *_) = result.notes
    assert note.startswith(f"{first_id}: gpu1: preflight failed: gpu-model: slot 0"), note
    done = f"submitted again as job {retry} without gpu1 (--retry-bad-node: 0 more left)"
    assert note.endswith((done, f"its retry is job {retry}")), note
    record = cluster.registry().get(retry)
    assert record is not None and record.resubmit_of == first_id
    assert "#SBATCH --exclude=gpu1" in record.script.splitlines()
    assert (
        f"#SBATCH --comment=clusterjob:{retry_token(cluster.registry().get(first_id).token)}"
        in (  # type: ignore[union-attr]
            record.script
        )
    )
    assert json.loads(record.request or "{}")["retry_bad_node"] == 0
    assert [e.node for e in cluster.avoid_list().entries()] == ["gpu1"]
    # a second waiter on the first job finds the retry, and submits nothing
    again = cluster.wait([first_id], timeout=60, interval=0.01)
    assert [r.job_id for r in again.rows] == [retry]
    assert len(slurm.commands("sbatch")) == 2
    # the next submission stays off gpu1 and says so in one line
    notes = cluster.prepare(["nvidia-smi"], gpus=1, model="A100").notes
    assert re.match(r"avoiding gpu1 \(preflight failed \d+s ago: gpu-model: ", notes[-1]), notes


def test_a_retry_already_in_slurm_is_followed_not_submitted_again(here: Path) -> None:
    """The retry's token is the job's, derived: a retry another machine submitted (or one
    whose record was lost) is found by squeue before anything is sent."""
    slurm = NodeThatFails(here)
    cluster = Cluster(str(SANDBOX_SITE), host="", exec=slurm, poll_interval=3600)
    first = cluster.submit(["nvidia-smi"], gpus=1, model="A100", retry_bad_node=2).id
    token = cluster.registry().get(first).token  # type: ignore[union-attr]
    other = slurm.add_job(state="COMPLETED", reason="None", exit_code="0:0",
                          comment=f"clusterjob:{retry_token(token)}")  # fmt: skip
    result = cluster.wait([first], timeout=60, interval=0.01)
    assert len(slurm.commands("sbatch")) == 1
    assert result.notes[0].endswith(f"its retry is job {other}"), result.notes


def test_without_retry_the_node_is_only_recorded(here: Path) -> None:
    slurm = NodeThatFails(here)
    cluster = Cluster(str(SANDBOX_SITE), host="", exec=slurm, poll_interval=3600)
    first = cluster.submit(["nvidia-smi"], gpus=1, model="A100").id
    result = cluster.wait([first], timeout=60, interval=0.01)
    assert [(r.job_id, r.state, r.exit_code) for r in result.rows] == [(first, "FAILED", 78)]
    assert len(slurm.commands("sbatch")) == 1
    assert result.notes[0].endswith("your submissions avoid it for 24h"), result.notes


def test_retry_bad_node_is_refused_for_arrays_and_negative_counts(here: Path) -> None:
    cluster = Cluster(str(SANDBOX_SITE), host="", exec=FakeSlurm("sandbox"))
    with pytest.raises(Exception, match="works on one job, not an array"):
        cluster.prepare(["nvidia-smi"], array="0-3", retry_bad_node=1)
    with pytest.raises(Exception, match="give a whole number of retries"):
        cluster.prepare(["nvidia-smi"], retry_bad_node=-1)


def test_nodes_lists_and_clears_the_avoid_list(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["nodes"]) == 0
    assert capsys.readouterr().out == "no nodes avoided\n"
    AvoidList().add([("gpu3", "preflight failed: gpu-model: wrong")], cluster="sandbox",
                    job_id="12")  # fmt: skip
    assert run(["nodes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NODE", "CLUSTER", "JOB", "SINCE", "UNTIL", "FINDING"]
    assert lines[1].split()[:3] == ["gpu3", "sandbox", "12"], lines
    assert lines[1].endswith("preflight failed: gpu-model: wrong"), lines
    assert run(["nodes", "--json"]) == 0
    assert [e["node"] for e in json.loads(capsys.readouterr().out)] == ["gpu3"]
    assert run(["nodes", "--clear", "gpu9"]) == 2
    assert "gpu9 is not on your avoid list" in capsys.readouterr().err
    assert run(["nodes", "--clear"]) == 0
    assert capsys.readouterr().out == "forgot: gpu3\n"
    assert AvoidList().entries() == []


def test_a_job_future_becomes_its_retry(here: Path) -> None:
    """The API's Job (a Future settled by the poller) waits on as the retry, and says so."""
    slurm = NodeThatFails(here)
    cluster = Cluster(str(SANDBOX_SITE), host="", exec=slurm, poll_interval=0.05)
    job = cluster.submit(["nvidia-smi"], gpus=1, model="A100", retry_bad_node=1)
    first = job.id
    row = job.result(timeout=60)
    assert (row.state, row.nodes) == ("COMPLETED", "gpu2")
    assert job.id == row.job_id != first and len(slurm.commands("sbatch")) == 2
    assert job.retries[0].endswith(f"submitted again as job {job.id} without gpu1 "
                                   "(--retry-bad-node: 0 more left)"), job.retries  # fmt: skip


class NodeThatFailsThenRuns(NodeThatFails):
    """As NodeThatFails; a retry runs the function job's worker, as the node would."""

    jobdir = ""

    def _sbatch(self, cmd: list[str], timeout: float) -> SlurmResult:
        result = super()._sbatch(cmd, timeout)
        if len(self.commands("sbatch")) > 1:
            worker = Path(self.jobdir) / WORKER_NAME
            subprocess.run([sys.executable, str(worker), self.jobdir], check=True, timeout=60)
        return result


def test_a_function_job_future_becomes_its_retry_and_returns_its_value(here: Path) -> None:
    """retry_bad_node on a function job: its Job follows the retry (same input, same
    directory) to the function's value, not to 'no result' from the bad node's job."""
    pytest.importorskip("cloudpickle")
    slurm = NodeThatFailsThenRuns(here)
    cluster = Cluster(str(SANDBOX_SITE), host="", exec=slurm, poll_interval=0.05)
    job = cluster.options(gpus=1, model="A100", retry_bad_node=1).submit_function(pow, 2, 10)
    assert job.jobdir is not None
    slurm.jobdir = job.jobdir
    first = job.id
    assert job.result(timeout=60) == 1024
    assert job.id != first and len(slurm.commands("sbatch")) == 2
    assert job.retries[0].endswith(f"submitted again as job {job.id} without gpu1 "
                                   "(--retry-bad-node: 0 more left)"), job.retries  # fmt: skip


def test_a_failed_preflight_ends_the_job_with_78_before_the_program(
    here: Path, tmp_path: Path
) -> None:
    """The rendered script, run by bash with a node command whose preflight fails: exit 78,
    the line that says so, and the program never started."""
    import subprocess

    from clusterjob.jobscript.requeues import PREFLIGHT_EXIT

    fake = tmp_path / "fake-clusterjob"
    verdict = "clusterjob: error: preflight gpu1: FAILED (1 error(s))"
    fake.write_text(f'#!/bin/sh\n[ "$1" = preflight ] || exit 0\necho "{verdict}" >&2\nexit 1\n')
    fake.chmod(0o755)
    cluster = Cluster(str(SANDBOX_SITE), host="", exec=FakeSlurm("sandbox"))
    prepared = cluster.prepare(["bash", "-c", "echo program-ran"], gpus=1, model="A100")
    node_command = "/var/lib/clusterjob-sandbox/bin/clusterjob"
    assert node_command in prepared.script
    script = tmp_path / "job.sh"
    script.write_text(prepared.script.replace(node_command, str(fake)))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert done.returncode == PREFLIGHT_EXIT == 78, done
    assert "program-ran" not in done.stdout
    said = "clusterjob: preflight failed (exit 1): the program was not started"
    assert said in done.stderr.splitlines(), done.stderr
    assert findings("FAILED", done.returncode, "gpu1", None, done.stderr) == [
        ("gpu1", "preflight failed: FAILED (1 error(s))")
    ]
