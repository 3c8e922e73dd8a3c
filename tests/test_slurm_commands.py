"""SlurmClient over the stateful fake: one intended job is one Slurm job, whatever sbatch does."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob.errors import SlurmError, SlurmTransientError, SlurmUnavailable
from clusterjob.slurm.commands import token_in_script

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
TOKEN = "0123456789abcdef"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.sh"
    path.write_text(f"#!/bin/bash\n#SBATCH --comment=clusterjob:{TOKEN}\necho hi\n")
    return path


def test_sbatch_returns_the_job_id(script: Path, tmp_path: Path) -> None:
    slurm = FakeSlurm()
    submitted = slurm.client().sbatch(script, token=TOKEN, workdir=tmp_path)
    assert submitted.job_id == "100"
    assert slurm.commands("sbatch") == [
        ["sbatch", "--parsable", f"--chdir={tmp_path}", str(script)]
    ]
    assert len(slurm.calls) == 1


def test_timed_out_sbatch_that_created_the_job_is_not_resubmitted(
    script: Path, tmp_path: Path
) -> None:
    slurm = FakeSlurm()
    slurm.sbatch_plan = ["timeout_created"]
    submitted = slurm.client().sbatch(script, token=TOKEN, workdir=tmp_path)
    assert list(slurm.jobs) == [submitted.job_id]  # exactly one job
    assert submitted.cluster == "fake"
    assert len(slurm.commands("sbatch")) == 1
    assert len(slurm.commands("squeue")) == 1


def test_timed_out_sbatch_without_a_job_is_retried_once_looked_up(
    script: Path, tmp_path: Path
) -> None:
    slurm = FakeSlurm()
    slurm.sbatch_plan = ["timeout", "ok"]
    submitted = slurm.client().sbatch(script, token=TOKEN, workdir=tmp_path)
    assert list(slurm.jobs) == [submitted.job_id]
    names = [c[0] for c in slurm.calls]
    assert names == ["sbatch", "squeue", "squeue", "sbatch"]  # two look-ups, then retry


def test_unreachable_controller_after_a_timeout_never_resubmits(
    script: Path, tmp_path: Path
) -> None:
    slurm = FakeSlurm()
    slurm.sbatch_plan = ["timeout"]
    slurm.down_calls = 10_000
    with pytest.raises(SlurmUnavailable) as info:
        slurm.client().sbatch(script, token=TOKEN, workdir=tmp_path, window=60)
    assert "may or may not have created the job" in str(info.value)
    assert TOKEN in str(info.value)
    assert len(slurm.commands("sbatch")) == 1
    assert slurm.now <= 1000 + 60 + 30 + 1  # within the window (plus one attempt)


def test_sbatch_gives_up_at_the_window_and_says_no_job_exists(script: Path, tmp_path: Path) -> None:
    slurm = FakeSlurm()
    slurm.sbatch_plan = ["timeout"] * 100
    with pytest.raises(SlurmUnavailable) as info:
        slurm.client().sbatch(script, token=TOKEN, workdir=tmp_path, window=100)
    assert "safe to submit again" in str(info.value)
    assert slurm.jobs == {}


def test_permanent_sbatch_error_is_not_retried_and_comes_as_sbatch_said_it(
    script: Path, tmp_path: Path
) -> None:
    """The site's words are added by the jobs layer (tests/test_jobs.py)."""
    slurm = FakeSlurm()
    stderr = (FIXTURES / "sbatch_err_partition.stderr.txt").read_text()
    slurm.sbatch_plan = [stderr]
    with pytest.raises(SlurmError) as info:
        slurm.client().sbatch(script, token=TOKEN, workdir=tmp_path)
    assert not isinstance(info.value, SlurmTransientError)
    assert info.value.stderr == stderr.strip()
    assert info.value.hint == ""
    assert len(slurm.calls) == 1


def test_test_only_reads_the_estimate_from_stderr(script: Path, tmp_path: Path) -> None:
    slurm = FakeSlurm()
    estimate = slurm.client().sbatch_test_only(script, workdir=tmp_path)
    assert (estimate.nodes, estimate.partition) == ("gpu1", "gpu")
    assert slurm.jobs == {}


def test_squeue_jobs_is_one_call_and_a_lone_unknown_id_is_empty() -> None:
    slurm = FakeSlurm()
    ids = [slurm.add_job() for _ in range(50)]
    client = slurm.client()
    assert {j.job_id for j in client.squeue_jobs(ids)} == set(ids)
    assert len(slurm.calls) == 1
    assert client.squeue_jobs(["99999"]) == []
    assert client.squeue_jobs([]) == []
    assert len(slurm.calls) == 2


def test_sacct_without_accounting_is_none() -> None:
    slurm = FakeSlurm(accounting=False)
    assert slurm.client().sacct_jobs(["1"]) is None


def test_find_jobs_by_comment_and_cluster_name() -> None:
    slurm = FakeSlurm(cluster="lab")
    slurm.add_job(comment="clusterjob:other")
    wanted = slurm.add_job(comment=f"clusterjob:{TOKEN}")
    client = slurm.client()
    assert [j.job_id for j in client.find_jobs_by_comment(TOKEN)] == [wanted]
    assert client.find_job_by_comment("nothing") is None
    assert client.cluster_name() == "lab"
    assert any("--me" in c for c in slurm.commands("squeue"))


def test_scontrol_job_and_output_paths() -> None:
    slurm = FakeSlurm()
    job_id = slurm.add_job(state="RUNNING", reason="None")
    client = slurm.client()
    assert client.job_output_paths(job_id) == (
        f"/home/ana/run/slurm-{job_id}.out",
        f"/home/ana/run/slurm-{job_id}.out",
    )
    assert client.scontrol_job("424242") is None


def test_token_in_script() -> None:
    assert token_in_script(f"#!/bin/bash\n#SBATCH --comment=clusterjob:{TOKEN}\n") == TOKEN
    assert token_in_script("#!/bin/bash\n# #SBATCH --comment=clusterjob:x\n") is None
