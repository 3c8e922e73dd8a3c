"""The parsers on what Slurm 22.05, 24.11 and 26.05 printed for the same jobs and commands
(tests/fixtures/slurm/<release>/, recorded by record.py on each release's sandbox).

One expectation for all three wherever clusterjob must read them alike; where the releases
differ, the test names the release that shows it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterjob.jobs.explain import sbatch_hint
from clusterjob.sandbox.config import RELEASE_SUITES
from clusterjob.site.loader import load_site
from clusterjob.slurm import parse

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
RELEASES = tuple(RELEASE_SUITES)


def read(release: str, name: str) -> str:
    return (FIXTURES / release / name).read_text()


def by_name(release: str) -> dict[str, parse.QueuedJob]:
    return {j.name: j for j in parse.parse_squeue(read(release, "squeue_jobs.txt"))}


def one_job(release: str, name: str) -> parse.ControlJob:
    (job,) = parse.parse_scontrol_jobs(read(release, f"scontrol_show_job_{name}.txt"))
    return job


def test_every_release_was_recorded_with_the_same_commands() -> None:
    names = {r: sorted(p.name for p in (FIXTURES / r).iterdir()) for r in RELEASES}
    assert names["24.11"] == names["22.05"] == names["26.05"]
    for release in RELEASES:
        assert f"slurm-wlm {release}." in read(release, "slurmd_version.txt")


# --- sbatch's refusals ------------------------------------------------------------------------

INVALID_GRES = {
    "22.05": "Invalid generic resource (gres) specification",
    "24.11": "Invalid Trackable RESource (TRES) specification",
    "26.05": "Invalid Trackable RESource (TRES) specification",
}


@pytest.mark.parametrize("release", RELEASES)
def test_a_malformed_gpu_request_is_named_so_on_every_release(release: str) -> None:
    message = parse.sbatch_error_message(read(release, "sbatch_err_invalid_gres.stderr.txt"))
    assert message == INVALID_GRES[release]  # the spelling changed in 24.11
    assert parse.is_invalid_gres(message)
    unknown = read(release, "sbatch_err_unknown_gres_name.stderr.txt")
    assert parse.sbatch_error_message(unknown) == "Invalid generic resource (gres) specification"
    assert parse.is_invalid_gres(parse.sbatch_error_message(unknown))


@pytest.mark.parametrize("release", RELEASES)
def test_the_site_aware_hint_survives_the_tres_spelling(release: str) -> None:
    site = load_site(FIXTURES / "sandbox_site.yaml")
    message = parse.sbatch_error_message(read(release, "sbatch_err_invalid_gres.stderr.txt"))
    hint = sbatch_hint(message, site)
    assert "types here: a100 (A100), v100 (V100), h100 (H100)" in hint
    assert "--model" in hint


@pytest.mark.parametrize("release", RELEASES)
def test_the_other_refusals_read_alike(release: str) -> None:
    said = {
        name: parse.sbatch_error_messages(read(release, f"sbatch_err_{name}.stderr.txt"))
        for name in ("bad_gres_type", "partition", "job_submit_lua")
    }
    assert said["bad_gres_type"] == [
        "Batch job submission failed: Requested node configuration is not available"
    ]
    assert said["partition"][-1] == "Batch job submission failed: Invalid partition name specified"
    assert said["job_submit_lua"][0] == "You must always specify a type when requesting gpu GRES"


@pytest.mark.parametrize("release", RELEASES)
def test_test_only_estimates_are_read_on_every_release(release: str) -> None:
    now = parse.parse_test_only(read(release, "sbatch_test_only.stderr.txt"))
    assert (now.partition, now.nodes, now.processors) == ("gpu", "gpu1", 1)
    assert now.start is not None
    busy = parse.parse_test_only(read(release, "sbatch_test_only_h100_busy.stderr.txt"))
    assert (busy.partition, busy.nodes) == ("h100", "h1")


def test_26_05_puts_a_stray_word_in_the_test_only_sentence() -> None:
    assert " a using 1 processors" in read("26.05", "sbatch_test_only.stderr.txt")
    assert " a using " not in read("24.11", "sbatch_test_only.stderr.txt")


# --- squeue, scontrol, sacct ------------------------------------------------------------------


@pytest.mark.parametrize("release", RELEASES)
def test_squeue_states_reasons_and_gpus_read_alike(release: str) -> None:
    jobs = by_name(release)
    expect = {
        "rec-done": ("COMPLETED", None, {"a100": 1}),
        "rec-failed": ("FAILED", "NonZeroExitCode", {"v100": 1}),
        "rec-busy": ("RUNNING", None, {"h100": 8}),  # 22.05 gres:gpu:..., later gres/gpu:...
        "rec-resources": ("PENDING", "Resources", {"h100": 1}),
        "rec-begin": ("PENDING", "BeginTime", {"a100": 1}),
        "rec-dep": ("PENDING", "Dependency", {"a100": 1}),
        "rec-held": ("PENDING", "JobHeldUser", {"a100": 1}),
    }
    got = {
        n: (jobs[n].state, jobs[n].reason, parse.tres_gpu_counts(jobs[n].tres_per_node))
        for n in expect
    }
    assert got == expect
    assert jobs["rec-busy"].nodes == "h1"


SQUEUE_EXIT_CODE = {"22.05": "768", "24.11": "3:0", "26.05": "3:0"}


@pytest.mark.parametrize("release", RELEASES)
def test_squeue_gives_an_ended_jobs_exit_code_on_every_release(release: str) -> None:
    """The exit code comes with the state in the batched squeue call (no call per job before
    slurmdbd has the end): 22.05 prints the wait status, 24.11 on sacct's ``code:signal``."""
    jobs = by_name(release)
    fields = [name for name, _ in parse.SQUEUE_FIELDS]
    failed = next(
        line.split(parse.DELIMITER)
        for line in read(release, "squeue_jobs.txt").splitlines()
        if line.endswith(parse.DELIMITER + "rec-failed")
    )
    assert failed[fields.index("exit_code")] == SQUEUE_EXIT_CODE[release]
    assert (jobs["rec-failed"].exit_code, jobs["rec-failed"].signal) == (3, 0)
    assert (jobs["rec-done"].exit_code, jobs["rec-done"].signal) == (0, 0)
    accounted = {j.name: j for j in parse.parse_sacct(read(release, "sacct_jobs.txt"))}
    for name in ("rec-done", "rec-both", "rec-failed"):
        assert jobs[name].exit_code == accounted[name].exit_code


@pytest.mark.parametrize("release", RELEASES)
def test_without_error_the_stderr_path_is_the_stdout_path(release: str) -> None:
    """squeue 24.11 and 26.05 print (null), scontrol 26.05 an empty StdErr=: the parsers
    answer with the stdout path, where Slurm writes stderr then."""
    done = by_name(release)["rec-done"]
    assert done.stdout is not None and done.stdout.endswith("/out-%j.txt")
    assert done.stderr == done.stdout
    both = by_name(release)["rec-both"]
    assert both.stderr is not None and both.stderr.endswith("/e-%j.txt")
    job = one_job(release, "completed_no_error")
    assert job.stdout is not None and job.stdout.endswith(f"/out-{job.job_id}.txt")
    assert job.stderr == job.stdout
    job = one_job(release, "completed_error")
    assert job.stderr is not None and job.stderr.endswith(f"/e-{job.job_id}.txt")


def test_what_each_release_prints_for_a_stderr_path_it_was_not_given() -> None:
    field = parse.SQUEUE_FIELDS.index(("stderr", "STDERR"))
    rows = {r: read(r, "squeue_jobs.txt").splitlines()[0].split(parse.DELIMITER) for r in RELEASES}
    assert rows["22.05"][field].endswith("/out-%j.txt")
    assert rows["24.11"][field] == rows["26.05"][field] == "(null)"
    assert " StdErr= " in read("26.05", "scontrol_show_job_completed_no_error.txt")


@pytest.mark.parametrize("release", RELEASES)
def test_the_prolog_refusal_reads_alike(release: str) -> None:
    job = one_job(release, "prolog_held")
    assert (job.state, job.reason) == ("PENDING", "launch_failed_requeued_held")
    (held,) = parse.parse_squeue(read(release, "squeue_prolog_held.txt"))
    assert held.reason == "launch failed requeued held"  # squeue spells it with spaces
    (node,) = parse.parse_scontrol_nodes(read(release, "scontrol_show_node_prolog_drain.txt"))
    assert node.drained
    assert node.reason is not None and node.reason.startswith("clusterjob: model-mismatch: gpu3")


@pytest.mark.parametrize("release", RELEASES)
def test_sacct_reads_alike(release: str) -> None:
    rows = {j.name: j for j in parse.parse_sacct(read(release, "sacct_jobs.txt"))}
    assert rows["rec-done"].state == "COMPLETED"
    assert (rows["rec-failed"].state, rows["rec-failed"].exit_code) == ("FAILED", 3)
    assert rows["rec-held"].state == "CANCELLED"
    assert rows["rec-held"].start is None  # cancelled while pending: Start None/Unknown
    assert "gres/gpu:a100=1" in (rows["rec-done"].alloc_tres or "")


@pytest.mark.parametrize("release", RELEASES)
def test_nodes_partitions_and_scancel_read_alike(release: str) -> None:
    nodes = {
        n.name: n
        for n in parse.parse_scontrol_nodes(read(release, "scontrol_show_node_detail.txt"))
    }
    assert sorted(nodes) == ["gpu1", "gpu2", "gpu3", "h1", "mig1"]
    assert parse.gpu_counts(nodes["gpu1"].gres) == {"a100": 2, "v100": 2}
    assert parse.gpu_counts(nodes["h1"].gres_used) == {"h100": 8}
    parts = parse.parse_scontrol_partitions(read(release, "scontrol_show_partition.txt"))
    assert [p.name for p in parts] == ["gpu", "suspect", "h100", "mig"]
    said = read(release, "scancel_verbose_unknown.stderr.txt")
    assert parse.parse_scancel_unknown(said) == ["99999"]


def test_squeue_json_honours_jobs_from_24_11_only() -> None:
    """Why clusterjob reads squeue --Format: 22.05's --json ignores --jobs."""
    counts = {r: len(json.loads(read(r, "squeue_json_jobs.txt"))["jobs"]) for r in RELEASES}
    assert counts["22.05"] > 1
    assert counts["24.11"] == counts["26.05"] == 1
    job = json.loads(read("24.11", "squeue_json_jobs.txt"))["jobs"][0]
    assert job["job_state"] == ["RUNNING"]  # a list from data_parser v0.0.42


@pytest.mark.parametrize("release", RELEASES)
def test_the_configured_hooks_are_read_on_every_release(release: str) -> None:
    """24.11 and 26.05 print a list-valued key one item per line (``Prolog[0] = ...``)."""
    config = parse.parse_scontrol_config(read(release, "scontrol_show_config.txt"))
    assert config["Prolog"].endswith("/hooks/clusterjob-prolog")
    assert config["TaskProlog"].endswith("/hooks/clusterjob-task-prolog")
    assert config["ClusterName"] == "sandbox"
    assert ("Prolog[0]" in read(release, "scontrol_show_config.txt")) == (release != "22.05")


def test_a_list_valued_key_comes_back_comma_joined_as_slurm_conf_writes_it() -> None:
    text = (
        "Prolog[0]               = /a/one\nProlog[1]               = /b/two\nPrologFlags = Alloc\n"
    )
    assert parse.parse_scontrol_config(text) == {"Prolog": "/a/one,/b/two", "PrologFlags": "Alloc"}
