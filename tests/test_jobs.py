"""The jobs core over the fake Slurm: status batching and caching, submit, resubmit, logs."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob import resources
from clusterjob.api.cluster import Cluster
from clusterjob.cli.app import run
from clusterjob.errors import SlurmError, SlurmTransientError, SlurmUnavailable, UsageError
from clusterjob.jobs import status as job_status
from clusterjob.jobs.cancel import cancel
from clusterjob.jobs.explain import explain, sbatch_hint, sbatch_hints, with_sbatch_hint
from clusterjob.jobs.logs import follow, output_path
from clusterjob.jobs.registry import JobRecord, Registry
from clusterjob.jobs.status import CACHE_FILE, DEFAULT_CACHE_SECONDS, StatusCache, status
from clusterjob.jobs.submit import Submitted, TestOnlyResult, resubmit, submit
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from clusterjob.slurm import parse

TRAIN = str(Path(__file__).resolve().parent.parent / "examples" / "train.py")
SLURM_FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def track(registry: Registry, slurm: FakeSlurm, job_id: str, state: str = "PENDING") -> None:
    registry.add(tracked(slurm, job_id, state))


def tracked(slurm: FakeSlurm, job_id: str, state: str = "PENDING") -> JobRecord:
    job = slurm.jobs[job_id]
    return JobRecord(
        job_id=job_id,
        cluster=slurm.cluster,
        site="mllab",
        token=f"tok{job_id}",
        job_name=job["name"],
        script="#!/bin/bash\n",
        script_path="",
        command_line="",
        work_dir="/home/ana/run",
        git_commit=None,
        submitted_at=time.time(),
        state=state,
    )


def populate(n: int) -> tuple[FakeSlurm, Registry]:
    """n tracked jobs: a third running, a third pending, a third ended long ago (sacct only)."""
    slurm = FakeSlurm()
    registry = Registry()
    for i in range(n):
        if i % 3 == 0:
            job_id = slurm.add_job(state="RUNNING", reason="None")
        elif i % 3 == 1:
            job_id = slurm.add_job(state="PENDING", reason="Resources")
        else:
            job_id = slurm.add_job(state="FAILED", reason="NonZeroExitCode", exit_code="3:0")
            slurm.forgotten.add(job_id)
    registry.add(*(tracked(slurm, job_id) for job_id in slurm.jobs))
    return slurm, registry


@pytest.mark.parametrize("n", [1, 3, 100, 1000])
def test_status_is_at_most_two_slurm_calls_whatever_the_number_of_jobs(data, n: int) -> None:
    slurm, registry = populate(n)
    rows = status(client=slurm.client(), registry=registry)
    assert len(rows) == n
    # squeue, sacct, and one `scontrol show node` for the jobs seen failing for the first
    # time: was a GPU to blame? (clusterjob.jobs.hardware)
    assert len(slurm.calls) <= 3
    assert len(slurm.commands("squeue")) == 1
    assert len(slurm.commands("scontrol")) <= 1
    by_id = {r.job_id: r for r in rows}
    for job_id, job in slurm.jobs.items():
        assert by_id[job_id].state == job["state"]
    failed = [r for r in rows if r.state == "FAILED"]
    assert all(r.exit_code == 3 and r.source == "sacct" for r in failed)
    pending = [r for r in rows if r.state == "PENDING"]
    assert all("free GPUs of that type" in r.explanation for r in pending)


def test_ten_status_calls_in_a_few_seconds_cost_two_slurm_calls(data) -> None:
    slurm, registry = populate(30)
    for _ in range(10):  # each like a separate invocation: new client, registry and cache
        status(client=slurm.client(), registry=Registry(), cache=StatusCache())
    assert len(slurm.calls) == 3  # squeue, sacct, the failed ones' nodes (scontrol)
    later = time.time() + DEFAULT_CACHE_SECONDS + 1
    status(client=slurm.client(), registry=Registry(), now=later)
    assert len(slurm.calls) == 4  # cache expired: one squeue (the ended ones are recorded)


def test_ended_jobs_are_served_from_the_registry_without_slurm(data) -> None:
    slurm, registry = populate(9)
    status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    calls = len(slurm.calls)
    # the third that ended is now recorded as FAILED: only the others are asked about
    status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    asked = slurm.commands("squeue")[-1]
    ids = next(a for a in asked if a.startswith("--jobs=")).split("=", 1)[1].split(",")
    assert len(ids) == 6
    assert len(slurm.calls) - calls == 1  # nothing left for sacct


def test_squeue_exit_code_comes_from_sacct_and_cache_is_shared(data) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    done = slurm.add_job(state="FAILED", reason="NonZeroExitCode", exit_code="2:0")
    track(registry, slurm, done)
    (row,) = status(client=slurm.client(), registry=registry)
    assert (row.state, row.exit_code, row.source) == ("FAILED", 2, "sacct")
    assert json.loads((data / CACHE_FILE).read_text())["squeue"]["ids"] == [done]


@pytest.mark.parametrize(("state", "code"), [("COMPLETED", 0), ("FAILED", 3)])
def test_an_end_sacct_has_not_recorded_yet_carries_scontrols_exit_code(
    data, state: str, code: int
) -> None:
    # Seen in a CI run: right after a job ended, squeue said COMPLETED while sacct still had
    # it RUNNING, and status printed COMPLETED with exit_code null (and kept it).
    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(state=state, reason="None", exit_code=f"{code}:0")
    slurm.unrecorded_end.add(job_id)
    track(registry, slurm, job_id)
    (row,) = status(client=slurm.client(), registry=registry)
    assert (row.state, row.exit_code, row.source) == (state, code, "squeue")
    assert registry.get(job_id).exit_code == code
    (untracked,) = status([job_id], client=slurm.client(), registry=Registry(data / "o.db"))
    assert (untracked.state, untracked.exit_code) == (state, code)


def test_a_completing_jobs_partial_node_list_does_not_replace_the_recorded_one(data) -> None:
    # Seen in a CI run: a two-node job polled while COMPLETING (squeue then names only the
    # nodes still completing, "gpu1") kept that list, and `logs --node gpu2` said the job
    # ran on gpu1 only.
    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(state="RUNNING", reason="None", nodes="gpu[1-2]")
    track(registry, slurm, job_id)
    status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert registry.get(job_id).nodes == "gpu[1-2]"
    slurm.jobs[job_id].update(state="COMPLETING", nodes="gpu1")
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert row.state == "COMPLETING"
    assert registry.get(job_id).nodes == "gpu[1-2]"
    slurm.jobs[job_id].update(state="COMPLETED", nodes="gpu[1-2]", exit_code="0:0")
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert (row.state, registry.get(job_id).nodes) == ("COMPLETED", "gpu[1-2]")


def test_an_end_is_recorded_with_squeues_node_list_over_sacccts_first_node(data) -> None:
    # Seen in two clean-clone CI runs: right after a two-node job ended, squeue said
    # COMPLETED on gpu[1-2] while sacct's record named gpu1 only; the registry kept "gpu1" and
    # `logs --node gpu2` said the job ran on gpu1.
    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(state="COMPLETED", reason="None", nodes="gpu[1-2]", exit_code="0:0")
    slurm.sacct_nodes[job_id] = "gpu1"
    track(registry, slurm, job_id)
    (row,) = status(client=slurm.client(), registry=registry)
    assert (row.state, row.exit_code) == ("COMPLETED", 0)
    assert registry.get(job_id).nodes == "gpu[1-2]"


def test_an_end_known_to_nobody_but_squeue_is_recorded_with_squeues_exit_code(data) -> None:
    # Right after a job ends, slurmdbd has not recorded it: sacct still says RUNNING. squeue's
    # exit_code column carries the code in the same call, so no per-job scontrol call is made
    # (50 futures polled together once made one each, when many ended at once).
    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(state="FAILED", reason="NonZeroExitCode", exit_code="3:0")
    slurm.unrecorded_end.add(job_id)
    track(registry, slurm, job_id)
    slurm.calls.clear()
    (row,) = status(client=slurm.client(), registry=registry)
    assert (row.state, row.exit_code, row.source) == ("FAILED", 3, "squeue")
    # and its nodes' drain reasons, once: a GPU fault the Epilog found? (jobs.hardware)
    assert [c[0] for c in slurm.calls] == ["squeue", "sacct", "scontrol"]
    recorded = registry.get(job_id)
    assert (recorded.state, recorded.exit_code) == ("FAILED", 3)


@pytest.mark.parametrize(
    ("fields", "gpus"),
    [
        ({"tres_per_node": "gres:gpu:3g.40gb:1"}, "gres/gpu:3g.40gb=1,gres/gpu=1"),
        ({"tres_per_node": "gres/gpu:a100:4", "nodes": "gpu[1-2]"},
         "gres/gpu:a100=8,gres/gpu=8"),  # 24.11's spelling; per node, times the nodes
        ({"tres_per_node": "", "tres_per_job": "gres:gpu:3"}, "gres/gpu=3"),  # --gpus
    ],
)  # fmt: skip
def test_an_end_seen_by_squeue_first_records_the_gpus_as_sacct_spells_them(
    data, fields: dict[str, str], gpus: str
) -> None:
    """Seen in a CI run: a MIG job's status said ``gres:gpu:3g.40gb:1`` (squeue's request per
    node) where sacct says ``gres/gpu:3g.40gb=1``, because squeue saw the end first and a
    final record is not asked about again. An ended job's GPUs read one way, the whole job's
    as AllocTRES lists them, whichever of the two saw the end."""
    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(state="COMPLETED", reason="None", **fields)
    slurm.unrecorded_end.add(job_id)
    track(registry, slurm, job_id)
    (row,) = status(client=slurm.client(), registry=registry)
    assert (row.state, row.source, row.gpus) == ("COMPLETED", "squeue", gpus)
    assert registry.get(job_id).gpus == gpus


def test_an_end_squeue_gives_no_code_for_is_not_recorded_until_one_is_known(data) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(state="COMPLETED", reason="None")
    slurm.unrecorded_end.add(job_id)
    track(registry, slurm, job_id)
    slurm.jobs[job_id]["exit_code"] = "4294967294"  # Slurm's NO_VAL, as squeue would print it
    (row,) = status(client=slurm.client(), registry=registry)
    assert (row.state, row.exit_code) == ("COMPLETED", None)
    assert not parse.is_final(registry.get(job_id).state)  # asked again next time
    slurm.jobs[job_id]["exit_code"] = "0:0"
    slurm.unrecorded_end.clear()
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert (row.state, row.exit_code, row.source) == ("COMPLETED", 0, "sacct")


def test_another_clusters_job_with_the_same_id_is_not_mistaken(data) -> None:
    slurm = FakeSlurm(cluster="here")
    registry = Registry()
    job_id = slurm.add_job(state="RUNNING", reason="None")
    track(registry, slurm, job_id)
    registry.add(
        JobRecord(job_id, "elsewhere", "s", "tok-else", "x", "#!", "", "", "", None, time.time())
    )
    rows = status(client=slurm.client(), registry=registry)
    states = sorted((r.cluster, r.state) for r in rows)
    assert states == [("elsewhere", "UNKNOWN"), ("here", "RUNNING")]


def test_forgotten_job_without_accounting_is_unknown_with_the_reason(data) -> None:
    slurm = FakeSlurm(accounting=False)
    registry = Registry()
    job_id = slurm.add_job(state="COMPLETED", reason="None")
    slurm.forgotten.add(job_id)
    track(registry, slurm, job_id)
    (row,) = status(client=slurm.client(), registry=registry)
    assert row.state == "UNKNOWN"
    assert "accounting is off" in row.explanation
    assert len(slurm.calls) == 2


def test_status_of_an_untracked_job_and_last(data) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    other = slurm.add_job(state="RUNNING", reason="None", name="not-ours")
    mine = slurm.add_job(state="PENDING", reason="QOSMaxGRESPerUser")
    track(registry, slurm, mine)
    rows = status([other, "last"], client=slurm.client(), registry=registry)
    assert [(r.job_id, r.site) for r in rows] == [(mine, "mllab"), (other, "")]
    assert "as many GPUs as your QOS allows" in rows[0].explanation
    with pytest.raises(UsageError, match="does not know"):
        status(["777777"], client=slurm.client(), registry=registry)


@pytest.mark.parametrize(
    ("state", "reason", "words"),
    [
        ("PENDING", "Resources", "free GPUs of that type"),
        ("PENDING", "Priority", "ahead in the queue"),
        ("PENDING", "QOSMaxGRESPerUser", "as many GPUs as your QOS allows"),
        ("PENDING", "ReqNodeNotAvail, UnavailableNodes:gpu3", "down, drained or reserved"),
        ("PENDING", "launch failed requeued held", "scontrol release 42"),
        ("PENDING", "JobHeldUser", "scontrol release 42"),
        # the release hint is for held jobs only: an ended job keeps its last reason
        ("CANCELLED", "launch failed requeued held", ""),
        ("CANCELLED by 1000", "JobHeldUser", ""),
        ("CANCELLED", "JobHeldAdmin", ""),
        (
            "PENDING",
            "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority "
            "partitions",
            "every node that could run it is down or drained",
        ),
        ("PENDING", "PartitionTimeLimit", "never start"),
        ("OUT_OF_MEMORY", None, "host memory"),
        ("RUNNING", None, ""),
    ],
)
def test_pending_reasons_in_gpu_terms(state: str, reason: str | None, words: str) -> None:
    text = explain(state, reason, "42")
    assert words in text
    assert bool(text) is bool(words)


# --- sbatch errors in the site's own words ----------------------------------------------------


@pytest.fixture(scope="module")
def mllab() -> Site:
    return load_site(resources.site_configs_dir() / "mllab.yaml")


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
    error = SlurmError(["sbatch"], 1, (SLURM_FIXTURES / fixture).read_text())
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


def test_an_error_that_says_what_to_do_keeps_its_hint(mllab: Site) -> None:
    """The Slurm layer's own account of an unfinished submission (may a job exist?) stays."""
    error = SlurmUnavailable(["sbatch"], None, "sbatch: error: Invalid partition", hint="look")
    with pytest.raises(SlurmUnavailable) as info, sbatch_hints(mllab):
        raise error
    assert info.value is error


# --- submit / resubmit / cancel / logs, with the real site, request and render -------------


@pytest.fixture
def mllab_job(tmp_path: Path):
    site = load_site(resources.site_configs_dir() / "mllab.yaml")
    resolved = resolve(site, JobRequest(script=TRAIN, gpus=2, model="a100"))
    return site, resolved, render(site, resolved)


def test_submit_writes_the_script_records_and_returns_the_id(data, tmp_path, mllab_job) -> None:
    site, resolved, rendered = mllab_job
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run(
        ["git", "-C", str(work), "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q",
         "--allow-empty", "-m", "x"],
        check=True,
    )  # fmt: skip
    slurm = FakeSlurm(cluster="mllab")
    result = submit(
        site,
        resolved,
        rendered,
        client=slurm.client(),
        workdir=work,
        command_line=["clusterjob", "submit", "--gpus", "2", "train.py"],
    )
    assert isinstance(result, Submitted)
    assert f"Submitted job {result.job_id}" in str(result)
    record = Registry().get("last")
    assert record is not None
    assert (record.job_id, record.cluster, record.site) == (result.job_id, "mllab", "mllab")
    assert record.token == rendered.token
    assert record.script == rendered.script
    assert Path(record.script_path).read_text() == rendered.script
    assert Path(record.script_path).parent == data / "scripts"
    assert record.work_dir == str(work.resolve())
    assert record.command_line == "clusterjob submit --gpus 2 train.py"
    assert record.git_commit and len(record.git_commit) == 40
    assert slurm.commands("sbatch")[0][2] == f"--chdir={work.resolve()}"


def test_submit_test_only_records_nothing(data, tmp_path, mllab_job) -> None:
    site, resolved, rendered = mllab_job
    slurm = FakeSlurm()
    result = submit(site, resolved, rendered, test_only=True, client=slurm.client())
    assert isinstance(result, TestOnlyResult)
    assert "Nothing was submitted" in str(result) and "gpu1" in str(result)
    assert Registry().all() == [] and slurm.jobs == {}
    assert list((data / "scripts").iterdir()) == []


def test_submit_refuses_a_script_without_its_token(data, mllab_job) -> None:
    site, resolved, rendered = mllab_job
    broken = type(rendered)(rendered.script.replace("--comment", "--x"), [], rendered.token)
    with pytest.raises(UsageError, match="--comment=clusterjob:"):
        submit(site, resolved, broken, client=FakeSlurm().client())


def test_a_refused_submission_names_the_sites_partitions_and_records_nothing(
    data, mllab_job
) -> None:
    site, resolved, rendered = mllab_job
    slurm = FakeSlurm()
    slurm.sbatch_plan = [(SLURM_FIXTURES / "sbatch_err_partition.stderr.txt").read_text()]
    with pytest.raises(SlurmError) as info:
        submit(site, resolved, rendered, client=slurm.client())
    assert not isinstance(info.value, SlurmTransientError)
    message = str(info.value)
    assert "Invalid partition name specified" in message
    assert "gpu (default)" in message and "debug" in message
    assert len(slurm.calls) == 1
    assert Registry().all() == []


def test_resubmit_uses_a_fresh_token_and_the_original_directory(data, mllab_job) -> None:
    site, resolved, rendered = mllab_job
    slurm = FakeSlurm()
    first = submit(site, resolved, rendered, client=slurm.client(), workdir="/tmp")
    again = resubmit("last", same_script=True, client=slurm.client())
    assert again.job_id != first.job_id
    new = Registry().get(again.job_id)
    assert new is not None
    assert new.resubmit_of == first.job_id
    assert new.token != rendered.token and rendered.token not in new.script
    assert f"clusterjob:{new.token}" in new.script
    assert slurm.commands("sbatch")[-1][2] == "--chdir=/tmp"
    with pytest.raises(UsageError, match="not in the registry"):
        resubmit("999999", client=slurm.client())


def test_cancel_is_one_scancel_and_clears_the_cache(data) -> None:
    slurm, registry = populate(3)
    status(client=slurm.client(), registry=registry)
    ids = list(slurm.jobs)[:2]
    assert cancel([ids[0], "last"], client=slurm.client(), registry=registry) == [
        ids[0],
        list(slurm.jobs)[-1],
    ]
    assert len(slurm.commands("scancel")) == 1
    assert not (data / CACHE_FILE).exists()


def test_a_cancelled_held_job_shows_no_release_hint(data) -> None:
    """A job held after a Prolog failure, then cancelled: its row says CANCELLED, no hint."""
    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(state="PENDING", reason="launch failed requeued held")
    track(registry, slurm, job_id)
    [held] = status(client=slurm.client(), registry=registry)
    assert f"scontrol release {job_id}" in held.explanation
    cancel([job_id], client=slurm.client(), registry=registry)
    [row] = status(client=slurm.client(), registry=registry)
    assert row.state == "CANCELLED"
    assert "release" not in row.explanation and row.reason is None


def test_cancel_of_a_job_slurm_does_not_know_is_an_error(data, capsys, monkeypatch) -> None:
    """scancel 22.05 exits 0 for an unknown id; cancel says the job is unknown, exit 2."""
    slurm, registry = populate(2)
    known = list(slurm.jobs)[0]
    with pytest.raises(UsageError, match=r"^unknown job 99999: Slurm has no such job"):
        cancel(["99999"], client=slurm.client(), registry=registry)
    with pytest.raises(
        UsageError, match=rf"unknown jobs 99999, 99998_3: .*\(cancel requested for {known}\)$"
    ):
        cancel([known, "99999", "99998_3"], client=slurm.client(), registry=registry)
    assert slurm.jobs[known]["state"] == "CANCELLED"
    assert [c[:2] for c in slurm.commands("scancel")] == [["scancel", "--verbose"]] * 2

    monkeypatch.setattr(Cluster, "client", lambda self, budget=None: slurm.client())
    capsys.readouterr()
    assert run(["cancel", "99999"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("clusterjob: error: unknown job 99999: Slurm has no such job")
    assert len(err.splitlines()) == 1
    assert run(["cancel", list(slurm.jobs)[1]]) == 0
    assert capsys.readouterr().out == f"cancel requested for {list(slurm.jobs)[1]}\n"


def test_output_path_from_scontrol_then_registry_then_default(data) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(state="RUNNING", reason="None", stdout="/logs/%j.out")
    track(registry, slurm, job_id)
    assert output_path(job_id, client=slurm.client()) == Path(f"/logs/{job_id}.out")
    status(client=slurm.client(), registry=registry)  # records the expanded path
    slurm.forgotten.add(job_id)
    assert output_path("last", client=slurm.client()) == Path(f"/logs/{job_id}.out")
    other = slurm.add_job(state="COMPLETED", reason="None")
    track(registry, slurm, other)
    slurm.forgotten.add(other)
    assert output_path(other, client=slurm.client()) == Path(f"/home/ana/run/slurm-{other}.out")


def test_follow_prints_appended_output_until_the_job_ends(tmp_path: Path) -> None:
    log = tmp_path / "slurm-1.out"
    now = [0.0]
    writes = iter(["step 1\n", "step 2\n", None])
    ended = []

    def sleep(seconds: float) -> None:
        now[0] += seconds
        text = next(writes, None)
        if text is None:
            ended.append(True)
        else:
            with log.open("a") as f:
                f.write(text)

    chunks = list(
        follow(log, finished=lambda: bool(ended), sleep=sleep, clock=lambda: now[0], check_every=1)
    )
    assert "".join(chunks) == "step 1\nstep 2\n"


def test_cli_status_json_and_table(data, capsys, monkeypatch) -> None:
    slurm, registry = populate(3)
    monkeypatch.setattr(Cluster, "client", lambda self, budget=None: slurm.client())
    assert run(["status", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["state"] for r in rows] == ["RUNNING", "PENDING", "FAILED"]
    assert run(["status"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["JOBID", "STATE", "NAME", "NODES", "GPUS", "TIME",
                                           "SITE", "REASON"]  # fmt: skip
    assert "FAILED (3)" in out
    assert run(["status", "nope"]) == 2
    assert "not a job id" in capsys.readouterr().err


def test_status_shows_the_gpus_of_a_job_that_asked_per_job(data) -> None:
    # A site of the `gpus` syntax asks with --gpus=TYPE:N: squeue's tres-per-node is empty.
    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(
        state="RUNNING", reason="None", tres_per_node="N/A", tres_per_job="gres:gpu:a100:4"
    )
    track(registry, slurm, job_id)
    (row,) = job_status.status(client=slurm.client(), registry=registry)
    assert row.gpus == "gres/gpu:a100=4,gres/gpu=4"


def test_a_jobs_name_and_gpus_read_one_way_whatever_the_source_and_state(data) -> None:
    """Seen in `status --watch`: NAME `allocation` for a moment after a cancel (sacct's name
    until slurmdbd has the job's start), and GPUS `gres:gpu:v100:1` while running (squeue's
    request per node) but `gres/gpu:v100=1,gres/gpu=1` after (sacct's AllocTRES). A job of two
    nodes with one V100 each, followed from pending to its record."""
    from dataclasses import replace

    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(state="PENDING", reason="Priority", name="train-2n",
                           tres_per_node="gres:gpu:v100:1")  # fmt: skip
    registry.add(replace(tracked(slurm, job_id), request=json.dumps({"nodes": 2})))
    seen: list[tuple[str, str, str, str | None]] = []

    def look() -> None:
        (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
        seen.append((row.source, row.state, row.name, row.gpus))

    look()  # pending: squeue, no nodes yet (the two asked for)
    slurm.jobs[job_id].update(state="RUNNING", reason="None", nodes="gpu[1-2]")
    look()  # running: squeue, per node times its nodes
    alloc = "billing=2,cpu=2,gres/gpu:v100=2,gres/gpu=2,node=2"
    slurm.jobs[job_id].update(state="CANCELLED", exit_code="0:15", name="allocation",
                              alloc_tres=alloc)  # fmt: skip
    slurm.forgotten.add(job_id)
    look()  # ended: sacct, before slurmdbd has the job's name
    look()  # recorded: the registry
    assert [s[:2] for s in seen] == [("squeue", "PENDING"), ("squeue", "RUNNING"),
                                     ("sacct", "CANCELLED"), ("registry", "CANCELLED")]  # fmt: skip
    assert {s[2:] for s in seen} == {("train-2n", "gres/gpu:v100=2,gres/gpu=2")}, seen


def test_the_resubmit_a_node_failure_suggests_reaches_the_jobs_cluster() -> None:
    """Typed as printed, it used to miss --host (exit 4) for a job submitted over ssh; over
    ssh a resubmission renders the job again as here (it once needed --same-script)."""
    here = explain("NODE_FAIL", None, "41")
    assert here == "a node of the job failed; resubmit (`clusterjob resubmit 41`)"
    there = explain("NODE_FAIL", None, "41", host="hpc")
    assert there == "a node of the job failed; resubmit (`clusterjob --host hpc resubmit 41`)"
