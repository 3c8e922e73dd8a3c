"""SlurmClient over the stateful fake: one intended job is one Slurm job; errors get hints."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob import resources
from clusterjob.errors import SlurmError, SlurmTransientError, SlurmUnavailable
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from clusterjob.slurm.commands import sbatch_hint, token_in_script, with_sbatch_hint

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
TOKEN = "0123456789abcdef"


@pytest.fixture(scope="module")
def mllab() -> Site:
    return load_site(resources.site_configs_dir() / "mllab.yaml")


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


def test_permanent_sbatch_error_is_not_retried_and_names_the_sites_partitions(
    script: Path, tmp_path: Path, mllab: Site
) -> None:
    slurm = FakeSlurm()
    slurm.sbatch_plan = [(FIXTURES / "sbatch_err_partition.stderr.txt").read_text()]
    with pytest.raises(SlurmError) as info:
        slurm.client().sbatch(script, token=TOKEN, workdir=tmp_path, site=mllab)
    assert not isinstance(info.value, SlurmTransientError)
    message = str(info.value)
    assert "Invalid partition name specified" in message
    assert "gpu (default)" in message and "debug" in message
    assert len(slurm.calls) == 1


@pytest.mark.parametrize(
    ("fixture", "words"),
    [
        ("sbatch_err_invalid_gres.stderr.txt", ["a100 (A100)", "v100 (V100)", "--model"]),
        ("sbatch_err_bad_gres_type.stderr.txt", ["a100 (A100)", "can ever satisfy"]),
        ("sbatch_err_partition.stderr.txt", ["gpu (default)", "debug"]),
        ("sbatch_err_missing_script.stderr.txt", ["missing or unreadable"]),
    ],
)
def test_recorded_sbatch_errors_get_site_hints(fixture: str, words: list[str], mllab) -> None:
    error = SlurmError(["sbatch"], 1, (FIXTURES / fixture).read_text())
    hinted = with_sbatch_hint(error, mllab)
    for word in words:
        assert word in str(hinted)
    assert str(hinted).count("\n") == 0  # one line


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ("You must always specify a type for GPU requests", ["--model", "a100 (A100)"]),
        ("Invalid account or account/partition combination specified", ["sacctmgr"]),
        ("Invalid qos specification", ["sacctmgr"]),
        ("Requested time limit is invalid (missing or exceeds some limit)", ["gpu: 3-00:00:00"]),
        ("something else entirely", []),
    ],
)
def test_sbatch_hints(message: str, words: list[str], mllab: Site) -> None:
    hint = sbatch_hint(message, mllab)
    assert all(w in hint for w in words)
    assert bool(hint) is bool(words)


def test_sbatch_hint_without_a_site_is_generic() -> None:
    assert "sinfo" in sbatch_hint("Invalid partition name specified", None)


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
