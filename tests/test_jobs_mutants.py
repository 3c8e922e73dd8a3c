"""Exact tests of the jobs core (submit, status, logs) over the fake Slurm: the messages,
paths and command lines in full, so that a changed word, index or condition is noticed
(scripts/mutation.sh runs these with the jobs-submit, jobs-status and jobs-logs targets)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob import resources
from clusterjob.errors import RegistryError, SlurmError, UsageError
from clusterjob.jobs import logs
from clusterjob.jobs.explain import explain
from clusterjob.jobs.logs import (
    RankLayout,
    follow,
    is_finished,
    output_path,
    rank_layout,
    read_text,
    select_lines,
)
from clusterjob.jobs.registry import JobRecord, Registry
from clusterjob.jobs.status import (
    JobStatus,
    StatusCache,
    StatusFilter,
    _summary,
    _Task,
    cache_for,
    status,
)
from clusterjob.jobs.submit import (
    REQUEST_FORMAT,
    Changes,
    Submitted,
    TestOnlyResult,
    check_output_dirs,
    expand_dependency,
    provenance,
    recorded_request,
    resubmit,
    send_recorded,
    start_git_commit,
    submit,
)
from clusterjob.jobscript.render import RenderedJob, render
from clusterjob.jobscript.request import JobRequest, ResolvedJob, resolve
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from clusterjob.slurm import parse, ssh
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.parse import StartEstimate, SubmittedJobId
from clusterjob.slurm.runner import Runner, SlurmResult, SshTransport


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def record(job_id: str, *, script: str = "#!/bin/bash\n", **fields: object) -> JobRecord:
    values: dict[str, object] = {
        "job_id": job_id,
        "cluster": "fake",
        "site": "mllab",
        "token": f"tok{job_id}",
        "job_name": "sweep",
        "script": script,
        "script_path": "",
        "command_line": "",
        "work_dir": "/home/ana/run",
        "git_commit": None,
        "submitted_at": time.time(),
        "state": "PENDING",
        **fields,
    }
    return JobRecord(**values)  # type: ignore[arg-type]


def array_script(spec: str, *lines: str) -> str:
    return f"#!/bin/bash\n#SBATCH --array={spec}\n" + "".join(f"{x}\n" for x in lines)


# --- logs: output_path --------------------------------------------------------------------------


def test_an_array_without_a_task_is_refused_with_its_first_task(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    registry.add(record("500", script=array_script("3-5%2")))
    with pytest.raises(UsageError) as info:
        output_path("500", client=slurm.client(), registry=registry)
    assert str(info.value) == (
        "job 500 is an array of 3 tasks (3-5); name one: clusterjob logs 500_3 (or --task 3); "
        "`clusterjob status 500 --tasks` lists them"
    )
    assert slurm.calls == []


def test_a_task_named_twice_must_be_the_same_task(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array({3: ("RUNNING", "0:0")}, stdout="/live/%j.out", stderr="/live/%j.err")
    registry = Registry()
    registry.add(record(job, script=array_script("0-9")))
    client = slurm.client()
    assert output_path(f"{job}_3", task=3, client=client) == Path(f"/live/{job}_3.out")
    with pytest.raises(UsageError) as info:
        output_path(f"{job}_3", task=4, client=client)
    assert str(info.value) == f"job {job}_3 and --task 4 name different tasks"
    # stderr of a live task: scontrol's second path
    assert output_path(f"{job}_3", stderr=True, client=client) == Path(f"/live/{job}_3.err")
    assert output_path(job, task=3, stderr=True, client=client) == Path(f"/live/{job}_3.err")


def test_output_path_asks_scontrol_only_while_the_record_may_be_stale(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    client = slurm.client()
    # running, recorded paths: scontrol's are newer
    running = slurm.add_job(state="RUNNING", stdout="/live/out-%j", stderr="/live/err-%j")
    registry.add(record(running, state="RUNNING", stdout_path="/rec/out", stderr_path="/rec/err"))
    assert output_path(running, client=client, registry=registry) == Path(f"/live/out-{running}")
    assert output_path(running, stderr=True, client=client, registry=registry) == Path(
        f"/live/err-{running}"
    )
    # ended and recorded: the record, without asking Slurm
    ended = slurm.add_job(state="COMPLETED", stdout="/live/out-%j", stderr="/live/err-%j")
    registry.add(record(ended, state="COMPLETED", stdout_path="/rec/out", stderr_path="/rec/err"))
    calls = len(slurm.calls)
    assert output_path(ended, client=client, registry=registry) == Path("/rec/out")
    assert output_path(ended, stderr=True, client=client, registry=registry) == Path("/rec/err")
    assert len(slurm.calls) == calls
    # ended without recorded paths: scontrol, while it remembers the job
    bare = slurm.add_job(state="COMPLETED", stdout="/live/out-%j", stderr="/live/err-%j")
    registry.add(record(bare, state="COMPLETED"))
    assert output_path(bare, client=client, registry=registry) == Path(f"/live/out-{bare}")
    assert output_path(bare, stderr=True, client=client, registry=registry) == Path(
        f"/live/err-{bare}"
    )


def test_output_path_of_a_job_clusterjob_did_not_submit(data: Path) -> None:
    slurm = FakeSlurm()
    stranger = slurm.add_job(state="RUNNING", stdout="/w/%j.out", stderr="/w/%j.err")
    empty = Registry(data / "other.db")
    client = slurm.client()
    assert output_path(stranger, client=client, registry=empty) == Path(f"/w/{stranger}.out")
    assert output_path(stranger, stderr=True, client=client, registry=empty) == Path(
        f"/w/{stranger}.err"
    )
    slurm.forgotten_by_scontrol.add(stranger)
    with pytest.raises(UsageError) as info:
        output_path(stranger, client=client, registry=empty)
    assert str(info.value) == (
        f"job {stranger}: Slurm no longer knows it and clusterjob did not submit it"
    )


def test_a_no_val_path_from_scontrol_is_not_taken_for_a_tracked_job(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job = slurm.add_job(state="RUNNING", stdout="/w/slurm-4294967294.out")
    registry.add(record(job, state="RUNNING"))
    assert output_path(job, client=slurm.client(), registry=registry) == Path(
        f"/home/ana/run/slurm-{job}.out"
    )
    empty = slurm.add_job(state="RUNNING", stdout="")
    registry.add(record(empty, state="RUNNING"))
    assert output_path(empty, client=slurm.client(), registry=registry) == Path(
        f"/home/ana/run/slurm-{empty}.out"
    )


# --- logs: an array task's file ------------------------------------------------------------------


def test_a_live_tasks_file_is_scontrols_over_the_scripts_pattern(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array(
        {1: ("RUNNING", "0:0"), 2: ("COMPLETED", "0:0")},
        stdout="/live/%j.out",
        stderr="/live/%j.err",
    )
    registry = Registry()
    registry.add(record(job, script=array_script("0-3", "#SBATCH --output=o/%A_%a.out")))
    client = slurm.client()
    assert output_path(f"{job}_1", client=client) == Path(f"/live/{job}_1.out")
    assert output_path(f"{job}_1", stderr=True, client=client) == Path(f"/live/{job}_1.err")
    # a task's NO_VAL or empty path from scontrol: the script's pattern
    slurm.jobs[f"{job}_1"]["stdout"] = "/live/4294967294.out"
    assert output_path(f"{job}_1", client=client) == Path(f"/home/ana/run/o/{job}_1.out")
    slurm.jobs[f"{job}_1"]["stdout"] = ""
    assert output_path(f"{job}_1", client=client) == Path(f"/home/ana/run/o/{job}_1.out")


def test_an_ended_tasks_file_comes_from_the_recorded_script(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array({2: ("COMPLETED", "0:0")}, stdout="/live/%j.out")
    registry = Registry()
    script = array_script(
        "0-3%1", "#SBATCH --output=o/%x-%A_%a.out", "#SBATCH --error=/abs/e-%u-%A_%2a.err"
    )
    registry.add(record(job, script=script, state="COMPLETED"))
    client = slurm.client()
    user = logs._user()
    assert user
    calls = len(slurm.calls)
    assert output_path(f"{job}_2", client=client) == Path(f"/home/ana/run/o/sweep-{job}_2.out")
    assert output_path(f"{job}_2", stderr=True, client=client) == Path(
        f"/abs/e-{user}-{job}_02.err"
    )
    assert len(slurm.calls) == calls
    with pytest.raises(UsageError) as info:
        output_path(f"{job}_7", client=client)
    assert str(info.value) == f"job {job} has no task 7 (its tasks: 0-3)"
    with pytest.raises(UsageError) as info:
        output_path(job, task=-1, client=client)
    assert str(info.value) == f"not a task id: '-1' (expected digits, e.g. {job}_3)"


def test_stderr_of_an_ended_task_without_error_line_is_its_output(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array({})
    registry = Registry()
    registry.add(record(job, script=array_script("0-1"), state="FAILED"))
    assert output_path(f"{job}_1", stderr=True, client=slurm.client()) == Path(
        f"/home/ana/run/slurm-{job}_1.out"
    )


def test_a_task_nobody_knows(data: Path) -> None:
    slurm = FakeSlurm()
    with pytest.raises(UsageError) as info:
        output_path("700_2", client=slurm.client(), registry=Registry())
    assert str(info.value) == "job 700_2: Slurm no longer knows it and clusterjob did not submit it"
    live = slurm.add_array({2: ("RUNNING", "0:0")}, stdout="/w/%j.out")
    assert output_path(f"{live}_2", client=slurm.client(), registry=Registry()) == Path(
        f"/w/{live}_2.out"
    )


def test_the_user_in_a_pattern_is_empty_when_it_cannot_be_known(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import getpass

    def nobody() -> str:
        raise KeyError("uid 4242")

    monkeypatch.setattr(getpass, "getuser", nobody)
    assert logs._user() == ""
    slurm = FakeSlurm()
    job = slurm.add_array({})
    registry = Registry()
    registry.add(record(job, script=array_script("0-1", "#SBATCH -o /l/%u-%a"), state="FAILED"))
    assert output_path(f"{job}_1", client=slurm.client()) == Path("/l/-1")


# --- logs: reading and following ------------------------------------------------------------


def test_read_text_decodes_what_it_can(tmp_path: Path) -> None:
    path = tmp_path / "out"
    assert read_text(path) is None
    path.write_bytes(b"caf\xc3\xa9 \xff end\n")
    assert read_text(path) == "caf\u00e9 \ufffd end\n"
    asked: list[tuple[str, int]] = []

    def read(name: str, offset: int) -> bytes | None:
        asked.append((name, offset))
        return b"remote\xfe"

    assert read_text(Path("/far/away"), read) == "remote\ufffd"
    assert asked == [("/far/away", 0)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_follow_polls_every_half_second_and_asks_slurm_every_ten(tmp_path: Path) -> None:
    clock = Clock()
    asked: list[float] = []

    def finished() -> bool:
        asked.append(clock.now)
        return len(asked) == 2

    def read(name: str, offset: int) -> bytes | None:
        return None

    assert list(follow(tmp_path / "x", finished=finished, sleep=clock.sleep, clock=clock,
                       read=read)) == []  # fmt: skip
    assert set(clock.sleeps) == {0.5}
    assert asked == [10.0, 20.0]


def test_follow_reads_what_was_written_as_the_job_ended(tmp_path: Path) -> None:
    clock = Clock()
    content = bytearray(b"caf\xc3")
    offsets: list[int] = []

    def read(name: str, offset: int) -> bytes | None:
        offsets.append(offset)
        return bytes(content[offset:]) or None

    def finished() -> bool:
        content.extend(b"\xa9 \xff last\n")  # the rest of a character, then a bad byte
        return True

    chunks = list(
        follow(Path("/x"), finished=finished, check_every=1.0, poll=0.25, sleep=clock.sleep,
               clock=clock, read=read)
    )  # fmt: skip
    assert chunks == ["caf", "\u00e9 \ufffd last\n"]
    assert clock.sleeps == [0.25] * 4  # asked at exactly check_every (1.0), not after
    assert offsets == [0, 4, 4, 4, 4, 4, 4, 13]


def test_is_finished_takes_ended_and_unknown_jobs_as_finished(data: Path) -> None:
    slurm = FakeSlurm(accounting=False)
    registry = Registry()
    running = slurm.add_job(state="RUNNING")
    pending = slurm.add_job(state="PENDING")
    done = slurm.add_job(state="COMPLETED")
    gone = slurm.add_job(state="COMPLETED")
    slurm.forgotten.add(gone)
    for job in (running, pending, done, gone):
        registry.add(record(job))

    def finished(job: str) -> bool:
        return is_finished(job, client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))

    assert [finished(j) for j in (running, pending, done, gone)] == [False, False, True, True]


def test_is_finished_reads_the_registry_and_cache_it_is_given(data: Path) -> None:
    slurm = FakeSlurm(accounting=False)
    registry = Registry(data / "mine.db")
    job = slurm.add_job(state="RUNNING")
    registry.add(record(job, state="COMPLETED"))  # its end recorded; Slurm forgot it
    slurm.forgotten.add(job)
    assert is_finished(job, client=slurm.client(), registry=registry)
    other = slurm.add_job(state="RUNNING")
    registry.add(record(other))
    cache = StatusCache(data / "cache.json", ttl=0)
    assert not is_finished(other, client=slurm.client(), registry=registry, cache=cache)
    slurm.jobs[other]["state"] = "COMPLETED"
    assert is_finished(other, client=slurm.client(), registry=registry, cache=cache)


def test_a_status_cache_turned_off_writes_nothing(data: Path) -> None:
    off, on = StatusCache(data / "off.json", ttl=0), StatusCache(data / "on.json", ttl=10)
    for cache in (off, on):
        cache.put("squeue", ["1"], 100.0, stdout="1|RUNNING")
    assert not (data / "off.json").exists()
    assert off.get("squeue", ["1"], 100.0) is None
    assert on.get("squeue", ["1"], 101.0) == {"at": 100.0, "ids": ["1"], "stdout": "1|RUNNING"}


# --- logs: one rank's or one node's lines -------------------------------------------------------

SRUN_TEXT = "0: a0\n 1: a1\n2: b2\n3: b3\nno label\n10: late"


@pytest.mark.parametrize(
    ("rank", "node", "kept"),
    [
        (None, None, SRUN_TEXT),
        (1, None, " 1: a1\n"),
        (10, None, "10: late"),
        (None, "gpu1", "0: a0\n 1: a1\n"),
        (None, "gpu2", "2: b2\n3: b3\n"),
        (3, "gpu2", "3: b3\n"),
        (1, "gpu2", ""),
    ],
)
def test_select_lines_of_srun_tasks(rank: int | None, node: str | None, kept: str) -> None:
    layout = RankLayout("srun", ("gpu1", "gpu2"), tasks_per_node=2)
    assert select_lines(SRUN_TEXT, layout, rank=rank, node=node) == kept


TORCH_TEXT = "0: [rank0]: a\n0: [rank1]: b\n1: [rank2]: c\n1: [rank3]: d\nplain [rank3]: e\n"


@pytest.mark.parametrize(
    ("rank", "node", "kept"),
    [
        (3, None, "1: [rank3]: d\nplain [rank3]: e\n"),
        (1, None, "0: [rank1]: b\n"),
        (None, "gpu2", "1: [rank2]: c\n1: [rank3]: d\n"),
        (None, "gpu1", "0: [rank0]: a\n0: [rank1]: b\n"),
        (2, "gpu1", ""),
        (0, "gpu1", "0: [rank0]: a\n"),
    ],
)
def test_select_lines_of_torchrun_workers(rank: int | None, node: str | None, kept: str) -> None:
    layout = RankLayout("torchrun", ("gpu1", "gpu2"), tasks_per_node=1)
    assert select_lines(TORCH_TEXT, layout, rank=rank, node=node) == kept


def test_select_lines_of_a_node_skips_unlabelled_lines_anywhere() -> None:
    layout = RankLayout("srun", ("gpu1", "gpu2"), tasks_per_node=1)
    assert select_lines("banner\n1: b\n0: a\n", layout, rank=None, node="gpu1") == "0: a\n"


def test_select_lines_on_one_node_keeps_every_line() -> None:
    text = "[rank1]: x\nplain\n"
    layout = RankLayout("torchrun", ("gpu1",))
    assert select_lines(text, layout, rank=None, node="gpu1") == text
    assert select_lines(text, layout, rank=1, node="gpu1") == "[rank1]: x\n"
    assert select_lines("5: x\n", RankLayout("none", ("gpu1",)), rank=None, node="gpu1") == "5: x\n"


def test_select_lines_refusals() -> None:
    with pytest.raises(UsageError) as info:
        select_lines("", RankLayout("srun", ("gpu1", "gpu2")), rank=None, node="gpu9")
    assert str(info.value) == "--node gpu9: the job ran on gpu1, gpu2"
    with pytest.raises(UsageError) as info:
        select_lines("", RankLayout("srun", ()), rank=0, node="gpu1")
    assert str(info.value) == "--node gpu1: the job ran on no node yet"
    with pytest.raises(UsageError) as info:
        select_lines("x\n", RankLayout("none", ("gpu1",)), rank=0, node=None)
    assert str(info.value) == (
        "--rank: this job started one process (no launcher), whose output is all there is"
    )
    assert select_lines("x\n", RankLayout("none", ("gpu1",)), rank=None, node=None) == "x\n"


def scontrol_with_nodes(nodes: str):
    def answer(cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        assert list(cmd) == ["scontrol", "show", "job", "-o", "800"]
        return SlurmResult(tuple(cmd), 0, f"JobId=800 JobState=RUNNING NodeList={nodes}\n", "")

    return answer


def test_rank_layout_from_the_request_and_the_nodes(data: Path) -> None:
    registry = Registry()
    request = JobRequest(script="train.py", nodes=2, gpus=0, tasks_per_node=4)
    registry.add(
        record("800", request=json.dumps(asdict(request)), nodes="gpu[3-4]", state="RUNNING")
    )
    client = FakeSlurm().client()
    assert rank_layout("800", registry=registry, client=client) == RankLayout(
        "srun", ("gpu3", "gpu4"), 4
    )
    assert rank_layout("last", registry=registry, client=client) == RankLayout(
        "srun", ("gpu3", "gpu4"), 4
    )
    Registry().add(
        record("801", request=json.dumps(asdict(request)), nodes="gpu9", state="RUNNING")
    )
    assert rank_layout("801", client=client) == RankLayout("srun", ("gpu9",), 4)


def test_rank_layout_of_srun_is_the_scripts_tasks_per_node_on_a_task_per_gpu_site(
    data: Path,
) -> None:
    """On Perlmutter (cpus-per-task: one task per GPU) `--launcher srun` starts four tasks a
    node: task 5 is on the second node, not the sixth (`logs --node` used to take one)."""
    site = load_site(resources.site_configs_dir() / "perlmutter.yaml")
    request = JobRequest(script=TRAIN, model="A100", gpus=4, nodes=2, launcher="srun")
    script = render(site, resolve(site, request)).script
    assert "#SBATCH --ntasks-per-node=4" in script.splitlines()
    registry = Registry()
    registry.add(
        record("802", request=json.dumps(asdict(request)), nodes="nid[001-002]",
               state="RUNNING", script=script)
    )  # fmt: skip
    layout = rank_layout("802", registry=registry, client=FakeSlurm().client())
    assert layout == RankLayout("srun", ("nid001", "nid002"), 4)
    text = "5: on the second node\n1: on the first\n"
    assert select_lines(text, layout, rank=None, node="nid002") == "5: on the second node\n"


def test_rank_layout_asks_slurm_for_the_nodes_not_recorded_yet(data: Path) -> None:
    registry = Registry()
    request = JobRequest(script="train.py", nodes=2, gpus=2)
    registry.add(record("800", request=json.dumps(asdict(request)), state="RUNNING"))
    client = SlurmClient(Runner(scontrol_with_nodes("gpu[1,7]")))
    assert rank_layout("800", registry=registry, client=client) == RankLayout(
        "torchrun", ("gpu1", "gpu7"), 1
    )
    gone = SlurmClient(Runner(FakeSlurm()))
    assert rank_layout("800", registry=registry, client=gone) == RankLayout("torchrun", (), 1)


def test_rank_layout_needs_a_job_clusterjob_submitted(data: Path) -> None:
    with pytest.raises(UsageError) as info:
        rank_layout("801_2", registry=Registry(), client=FakeSlurm().client())
    assert str(info.value) == "job 801_2: --rank/--node need a job clusterjob submitted"


# --- submit -------------------------------------------------------------------------------------

TRAIN = str(Path(__file__).resolve().parent.parent / "examples" / "train.py")


@pytest.fixture(scope="module")
def mllab() -> Site:
    return load_site(resources.site_configs_dir() / "mllab.yaml")


def rendered_job(site: Site, **fields: object) -> tuple[ResolvedJob, RenderedJob]:
    resolved = resolve(site, JobRequest(script=TRAIN, model="a100", **fields))  # type: ignore[arg-type]
    return resolved, render(site, resolved)


def git_repo(path: Path) -> str:
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.name=a", "-c", "user.email=a@b"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    (path / "tracked").write_text("1\n")
    subprocess.run([*git, "add", "tracked"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git[:3], "rev-parse", "HEAD"], capture_output=True, text=True)
    return head.stdout.strip()


def test_submitted_and_test_only_results_in_words() -> None:
    done = Submitted("42", "mllab", "mllab", "/d/s.sh")
    assert str(done) == (
        "Submitted job 42 on cluster mllab (site mllab); script kept at /d/s.sh\n"
        "Follow it with: clusterjob status 42; clusterjob logs 42 -f"
    )
    assert str(Submitted("42", "", "lab", "/d/s.sh")).splitlines()[0] == (
        "Submitted job 42 (site lab); script kept at /d/s.sh"
    )
    when = datetime(2026, 11, 29, 16, 18, 15)
    estimate = StartEstimate("7", "2026-11-29T16:18:15", when, 8, "gpu[1-2]", "gpu")
    assert str(TestOnlyResult(estimate)) == (
        "Slurm accepts this job: it would start at 2026-11-29 16:18:15 on gpu[1-2] in "
        "partition gpu (8 processors). Nothing was submitted."
    )
    never = StartEstimate("7", "Unknown", None, 1, "gpu1", "gpu")
    assert str(TestOnlyResult(never)) == (
        "Slurm accepts this job: it would start at no foreseeable time (Slurm says Unknown: "
        "the request fits, but the nodes are busy) on gpu1 in partition gpu (1 processors). "
        "Nothing was submitted."
    )


def git_commit(workdir: Path) -> str | None:
    return start_git_commit(workdir)()


def test_git_commit_of_a_clean_a_dirty_and_no_checkout(tmp_path: Path, monkeypatch) -> None:
    head = git_repo(tmp_path / "repo")
    assert git_commit(tmp_path / "repo") == head
    (tmp_path / "repo" / "untracked").write_text("x\n")
    assert git_commit(tmp_path / "repo") == head  # untracked files do not count
    (tmp_path / "repo" / "tracked").write_text("2\n")
    assert git_commit(tmp_path / "repo") == f"{head}-dirty"
    plain = tmp_path / "plain"
    plain.mkdir()
    assert git_commit(plain) is None
    monkeypatch.setenv("PATH", str(plain))  # no git at all
    assert git_commit(tmp_path / "repo") is None


def test_the_commit_is_asked_for_once_sbatch_answered_and_recorded_with_the_job_id(
    data: Path,
) -> None:
    """Every submission path (sbatch, a resubmission, another scheduler) goes through
    ``send_recorded``: git reads the work tree while the job is sent, its answer is waited
    for only after, and lands in the record with the job id."""
    registry = Registry(data / "jobs.db")
    order: list[str] = []

    def sbatch() -> SubmittedJobId:
        (during,) = registry.pending()
        order.append(f"sbatch, commit then: {during.git_commit}")
        return SubmittedJobId("123", "fake")

    def commit() -> str:
        order.append("git's answer")
        return "abc123-dirty"

    done = send_recorded(registry, record("", token="tokG"), sbatch, lambda: "", commit)
    assert order == ["sbatch, commit then: None", "git's answer"]
    (kept,) = registry.all()
    assert (kept.job_id, kept.git_commit) == ("123", "abc123-dirty")
    assert (done.job_id, done.git_commit) == ("123", "abc123-dirty")


def test_git_commit_is_found_from_below_a_work_tree_and_git_runs_only_where_one_may_be(
    tmp_path: Path, monkeypatch
) -> None:
    """A submission from a folder deep in a checkout (or a linked work tree, whose .git is a
    file) records its commit; outside any, git is not even started, unless GIT_DIR says
    where the repository is."""
    import subprocess

    head = git_repo(tmp_path / "repo")
    deep = tmp_path / "repo" / "a" / "b"
    deep.mkdir(parents=True)
    assert git_commit(deep) == head
    subprocess.run(
        ["git", "-C", str(tmp_path / "repo"), "worktree", "add", "-q", str(tmp_path / "linked")],
        check=True, capture_output=True,
    )  # fmt: skip
    assert (tmp_path / "linked" / ".git").is_file()
    assert git_commit(tmp_path / "linked") == head
    plain = tmp_path / "plain"
    plain.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "git-ran"
    (bin_dir / "git").write_text(f'#!/bin/sh\necho "$@" >> {ran}\n')
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert git_commit(plain) is None and not ran.exists()
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "repo" / ".git"))
    assert git_commit(plain) is None and ran.exists()  # asked: the stand-in says nothing


def test_submit_records_exactly_what_reproduces_the_job(data: Path, tmp_path: Path, mllab) -> None:
    resolved, rendered = rendered_job(mllab, array="0-3")
    work = tmp_path / "work"
    head = git_repo(work)
    slurm = FakeSlurm(cluster="other")  # the site's cluster name wins over Slurm's
    registry = Registry(data / "mine.db")
    result = submit(
        mllab, resolved, rendered, client=slurm.client(), registry=registry, workdir=work,
        command_line=["clusterjob", "submit", "a b"],
    )  # fmt: skip
    path = data / "scripts" / f"clusterjob-{rendered.token}.sh"
    assert result == Submitted(
        "100", "mllab", "mllab", str(path), f"sbatch --parsable --chdir={work} {path}", 4
    )
    assert slurm.commands("sbatch") == [["sbatch", "--parsable", f"--chdir={work}", str(path)]]
    assert path.read_text() == rendered.script
    assert path.stat().st_mode & 0o777 == 0o700
    (kept,) = registry.all()
    assert kept == JobRecord(
        job_id="100", cluster="mllab", site="mllab", token=rendered.token,
        job_name=resolved.job_name, script=rendered.script, script_path=str(path),
        command_line="clusterjob submit 'a b'", work_dir=str(work), git_commit=head,
        submitted_at=kept.submitted_at, state="PENDING",
        request=json.dumps({**asdict(resolved.request), "request_format": REQUEST_FORMAT}),
        host="", scheduler="slurm",
    )  # fmt: skip
    assert Registry().all() == []  # the registry given, not the default one


def test_submit_takes_the_cluster_name_from_slurm_when_the_site_has_none(data: Path, mllab) -> None:
    site = replace(mllab, cluster_name=None)
    resolved, rendered = rendered_job(site)
    slurm = FakeSlurm(cluster="fromslurm")
    result = submit(site, resolved, rendered, client=slurm.client(), workdir="/w")
    assert isinstance(result, Submitted)
    assert (result.cluster, result.tasks) == ("fromslurm", None)
    assert Registry().get(result.job_id).cluster == "fromslurm"

    class NoConfig(FakeSlurm):
        def _scontrol(self, cmd: list[str], timeout: float) -> SlurmResult:
            return SlurmResult(tuple(cmd), 1, "", "scontrol: error: no config")

    resolved, rendered = rendered_job(site)
    result = submit(site, resolved, rendered, client=NoConfig().client(), workdir="/w")
    assert isinstance(result, Submitted) and result.cluster == ""


def test_submit_records_the_source_directorys_commit(data: Path, tmp_path: Path, mllab) -> None:
    head = git_repo(tmp_path / "src")
    (tmp_path / "run").mkdir()
    resolved, rendered = rendered_job(mllab)
    submit(mllab, resolved, rendered, client=FakeSlurm().client(), workdir=tmp_path / "run",
           source_dir=tmp_path / "src")  # fmt: skip
    assert Registry().get("last").git_commit == head


class StdinSlurm(FakeSlurm):
    """A login node over ssh: sbatch reads the script from stdin."""

    def __init__(self) -> None:
        super().__init__(cluster="far")
        self.stdin: list[str | None] = []

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        self.stdin.append(input)
        return super().__call__(cmd, timeout, input)

    def _sbatch(self, cmd: list[str], timeout: float) -> SlurmResult:
        script = self.stdin[-1]
        assert script is not None and cmd[-1].startswith("--chdir=")
        path = Path(tempfile.mkdtemp()) / "stdin.sh"
        path.write_text(script)
        return super()._sbatch([*cmd, str(path)], timeout)

    def client(self) -> SlurmClient:
        transport = SshTransport(ssh.parse_target("ada@login1"))
        return SlurmClient(Runner(self, transport=transport, sleep=self.sleep, clock=self.clock))


def test_submit_to_a_remote_cluster(data: Path, tmp_path: Path, mllab) -> None:
    resolved, rendered = rendered_job(mllab)
    slurm = StdinSlurm()
    with pytest.raises(UsageError) as info:
        submit(mllab, resolved, rendered, client=slurm.client())
    assert str(info.value) == "a job on a remote cluster needs its directory there"
    local = tmp_path / "local"
    git_repo(local)  # a checkout here with the remote directory's name: not the job's
    result = submit(mllab, resolved, rendered, client=slurm.client(), workdir=str(local))
    assert isinstance(result, Submitted)
    assert slurm.commands("sbatch") == [["sbatch", "--parsable", f"--chdir={local}"]]
    assert slurm.stdin[-1] == rendered.script
    assert Registry().all() == []  # recorded under the host's name
    (kept,) = Registry(host="ada@login1").all()
    assert (kept.host, kept.git_commit, kept.work_dir) == ("ada@login1", None, str(local))

    class Dry(StdinSlurm):
        def _sbatch(self, cmd: list[str], timeout: float) -> SlurmResult:
            assert self.stdin[-1] == rendered.script
            return super()._sbatch(cmd, timeout)

    dry = Dry()
    assert isinstance(
        submit(mllab, resolved, rendered, test_only=True, client=dry.client(), workdir="/r/w"),
        TestOnlyResult,
    )
    assert dry.commands("sbatch") == [["sbatch", "--test-only", "--chdir=/r/w"]]


def test_submit_test_only_writes_a_test_script_and_words_a_refusal(data: Path, mllab) -> None:
    resolved, rendered = rendered_job(mllab)
    seen: list[str] = []

    class Refusing(FakeSlurm):
        def _sbatch(self, cmd: list[str], timeout: float) -> SlurmResult:
            seen.append(Path(cmd[-1]).read_text())
            return SlurmResult(
                tuple(cmd), 1, "", "sbatch: error: Batch job submission failed: Invalid "
                "partition name specified\n"
            )  # fmt: skip

    slurm = Refusing()
    with pytest.raises(SlurmError) as info:
        submit(mllab, resolved, rendered, test_only=True, client=slurm.client(), workdir="/w")
    path = data / "scripts" / f"clusterjob-test-{rendered.token}.sh"
    assert slurm.commands("sbatch") == [["sbatch", "--test-only", "--chdir=/w", str(path)]]
    assert seen == [rendered.script]
    assert not path.exists()
    assert "gpu (default)" in str(info.value)  # the site's partitions


def test_a_job_submitted_but_not_recorded_says_so(data: Path, mllab, monkeypatch) -> None:
    resolved, rendered = rendered_job(mllab)

    def broken(self: Registry, *args: object, **kwargs: object) -> None:
        raise RegistryError("disk full")

    monkeypatch.setattr(Registry, "complete", broken)
    with pytest.raises(RegistryError) as info:
        submit(mllab, resolved, rendered, client=FakeSlurm().client(), workdir="/w")
    assert str(info.value) == (
        "job 100 WAS submitted, but could not be recorded: disk full; cancel it with "
        "`clusterjob cancel 100`"
    )


def test_a_registry_that_cannot_record_stops_the_submission(data: Path, mllab, monkeypatch) -> None:
    """The submission is recorded before sbatch runs: a registry that cannot take it stops
    it with no job created."""
    resolved, rendered = rendered_job(mllab)

    def broken(self: Registry, *records: JobRecord) -> None:
        raise RegistryError("disk full")

    monkeypatch.setattr(Registry, "add", broken)
    slurm = FakeSlurm()
    with pytest.raises(RegistryError, match="^disk full$"):
        submit(mllab, resolved, rendered, client=slurm.client(), workdir="/w")
    assert slurm.commands("sbatch") == []


def test_check_output_dirs_word_for_word(tmp_path: Path) -> None:
    gone = tmp_path / "gone"  # a working directory not made yet: plain names need nothing
    assert check_output_dirs("out.log", "./err.log", gone) == []
    with pytest.raises(UsageError) as info:
        check_output_dirs("%j/out", "errs/x.err", tmp_path)
    assert str(info.value) == (
        f"--error errs/x.err: directory {tmp_path}/errs does not exist (Slurm cannot create it "
        "and the job would fail silently); create it or pass --mkdir"
    )
    (tmp_path / "outs").mkdir()
    with pytest.raises(UsageError, match="^--error errs/x.err: directory"):
        check_output_dirs("outs/o", "errs/x.err", tmp_path)
    with pytest.raises(UsageError, match="^--error errs/x.err: directory"):
        check_output_dirs(None, "errs/x.err", tmp_path)
    made = check_output_dirs("a/b/out", str(tmp_path / "c/d/err"), tmp_path, mkdir=True)
    assert made == [tmp_path / "a/b", tmp_path / "c/d"]
    assert (tmp_path / "a/b").is_dir() and (tmp_path / "c/d").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError) as info:
        check_output_dirs("file/x/out", None, tmp_path, mkdir=True)
    assert str(info.value) == (
        f"--output file/x/out: cannot create {tmp_path}/file/x: Not a directory"
    )


def test_last_in_a_dependency_from_the_default_registry(data: Path) -> None:
    Registry().add(record("55"))
    assert expand_dependency("afterok:last") == "afterok:55"


def full_request() -> JobRequest:
    return JobRequest(
        script="train.py", args=("--lr", "1"), sbatch_args=("--exclusive",),
        task_args=(("a",), ("b", "c")), setup=("echo hi",), modules=("cuda",),
        env=("K=V",), launcher_args=("--nnodes=1",), gres=("nvme:10",), array="%2",
    )  # fmt: skip


def test_recorded_request_is_the_request_as_submitted() -> None:
    request = full_request()
    assert recorded_request(record("9", request=json.dumps(asdict(request)))) == request
    nulls = {**asdict(JobRequest(script="t.py")), "args": None, "sbatch_args": None,
             "task_args": None, "setup": None, "modules": None}  # fmt: skip
    assert recorded_request(record("9", request=json.dumps(nulls))) == JobRequest(
        script="t.py", token=nulls["token"]
    )
    old = {k: v for k, v in asdict(JobRequest(script="t.py")).items() if k not in ("env", "gres")}
    assert recorded_request(record("9", request=json.dumps(old))).env == ()


def test_a_recorded_tasks_per_node_of_1_is_read_by_the_form_it_was_written_in() -> None:
    """Before form 2, 1 task per node was recorded for "not asked for" too (resubmitting such
    a job renders what it rendered then: one task per GPU where the site runs so); from form
    2 on, None is "not asked for" and 1 is one task per node."""
    plain = asdict(JobRequest(script="t.py", tasks_per_node=1))
    assert recorded_request(record("9", request=json.dumps(plain))).tasks_per_node is None
    asked = {**plain, "request_format": REQUEST_FORMAT}
    assert recorded_request(record("9", request=json.dumps(asked))).tasks_per_node == 1
    two = {k: (2 if k == "tasks_per_node" else v) for k, v in plain.items()}
    assert recorded_request(record("9", request=json.dumps(two))).tasks_per_node == 2
    unasked = {**asdict(JobRequest(script="t.py")), "request_format": REQUEST_FORMAT}
    assert recorded_request(record("9", request=json.dumps(unasked))).tasks_per_node is None


def test_recorded_request_refusals() -> None:
    with pytest.raises(UsageError) as info:
        recorded_request(record("9"))
    assert str(info.value) == (
        "job 9 was recorded without its request (an older clusterjob); resubmit it with "
        "--same-script"
    )
    with pytest.raises(UsageError) as info:
        recorded_request(record("9", request='{"script": "t.py", "colour": 1}'))
    assert str(info.value).startswith("job 9: its recorded request is unreadable (")
    assert "colour" in str(info.value)


def test_resubmit_renders_again_into_the_registry_given(data: Path, tmp_path: Path, mllab) -> None:
    resolved, rendered = rendered_job(mllab, array="0-3")
    slurm = FakeSlurm()
    registry = Registry(data / "mine.db")
    first = submit(mllab, resolved, rendered, client=slurm.client(), registry=registry,
                   workdir="/w/run")  # fmt: skip
    assert isinstance(first, Submitted)
    again = resubmit(first.job_id, site=mllab, client=slurm.client(), registry=registry)
    assert slurm.commands("sbatch")[-1][:3] == ["sbatch", "--parsable", "--chdir=/w/run"]
    assert again.tasks == 4
    new = registry.get(again.job_id)
    assert new is not None and new.resubmit_of == first.job_id
    assert "#SBATCH --array=0-3\n" in new.script
    assert Registry().all() == []
    with pytest.raises(UsageError) as info:
        resubmit(first.job_id, site=replace(mllab, name="other"), client=slurm.client(),
                 registry=registry)  # fmt: skip
    assert str(info.value) == (
        f"job {first.job_id} was submitted at site mllab, but the site config found here is "
        "other; pass --site (or --same-script)"
    )
    with pytest.raises(UsageError) as info:
        resubmit(first.job_id, client=slurm.client(), registry=registry)
    assert str(info.value) == "resubmit needs the site config to render the job again"
    with pytest.raises(UsageError) as info:
        resubmit(first.job_id, same_script=True, changes=Changes(args=("x",)),
                 client=slurm.client(), registry=registry)  # fmt: skip
    assert str(info.value) == "--same-script replays the old script: it takes no changes"


def test_resubmit_of_a_sweep_keeps_its_limit(data: Path, mllab) -> None:
    resolved, rendered = rendered_job(mllab, task_args=(("1",), ("2",), ("3",)), array="%2")
    slurm = FakeSlurm()
    first = submit(mllab, resolved, rendered, client=slurm.client(), workdir="/w")
    assert isinstance(first, Submitted)
    again = resubmit(first.job_id, site=mllab, changes=Changes(gpus=2), client=slurm.client())
    assert "#SBATCH --array=0-2%2\n" in Registry().get(again.job_id).script
    resolved, rendered = rendered_job(mllab, task_args=(("1",), ("2",)))
    plain = submit(mllab, resolved, rendered, client=slurm.client(), workdir="/w")
    assert isinstance(plain, Submitted)
    again = resubmit(plain.job_id, site=mllab, client=slurm.client())
    assert "#SBATCH --array=0-1\n" in Registry().get(again.job_id).script


def test_replay_is_the_old_script_with_a_new_token(data: Path, tmp_path: Path, mllab) -> None:
    work = tmp_path / "work"
    head = git_repo(work)
    resolved, rendered = rendered_job(mllab)
    slurm = FakeSlurm()
    registry = Registry(data / "mine.db")
    first = submit(mllab, resolved, rendered, client=slurm.client(), registry=registry,
                   workdir=work, command_line=["cj", "x"])  # fmt: skip
    assert isinstance(first, Submitted)
    (work / "tracked").write_text("changed\n")
    again = resubmit(first.job_id, same_script=True, client=slurm.client(), registry=registry)
    new = registry.get(again.job_id)
    assert new is not None
    path = data / "scripts" / f"clusterjob-{new.token}.sh"
    assert again == Submitted(
        new.job_id, "mllab", "mllab", str(path), f"sbatch --parsable --chdir={work} {path}"
    )
    old = registry.get(first.job_id)
    assert old is not None
    assert new == replace(
        old, job_id=again.job_id, token=new.token, script=old.script.replace(old.token, new.token),
        script_path=str(path), git_commit=f"{head}-dirty", submitted_at=new.submitted_at,
        resubmit_of=first.job_id,
    )  # fmt: skip
    assert new.state == "PENDING" and new.request == old.request
    assert slurm.commands("sbatch")[-1] == ["sbatch", "--parsable", f"--chdir={work}", str(path)]
    assert path.read_text() == new.script
    assert Registry().all() == []


def test_replay_on_a_remote_cluster(data: Path, tmp_path: Path, mllab) -> None:
    work = tmp_path / "work"
    git_repo(work)
    resolved, rendered = rendered_job(mllab)
    slurm = StdinSlurm()
    first = submit(mllab, resolved, rendered, client=slurm.client(), workdir=str(work))
    assert isinstance(first, Submitted)
    again = resubmit(first.job_id, same_script=True, client=slurm.client())
    new = Registry(host="ada@login1").get(again.job_id)
    assert new is not None and (new.host, new.git_commit) == ("ada@login1", None)
    assert slurm.stdin[-1] == new.script
    assert slurm.commands("sbatch")[-1] == ["sbatch", "--parsable", f"--chdir={work}"]


def test_replay_needs_the_token_in_the_script(data: Path) -> None:
    Registry().add(record("60", script="#!/bin/bash\n#SBATCH --comment=other\n"))
    with pytest.raises(UsageError) as info:
        resubmit("60", same_script=True, client=FakeSlurm().client())
    assert str(info.value) == "job 60: its recorded script has no clusterjob:tok60 comment"


def test_provenance_in_full(data: Path) -> None:
    request = {"python": "/usr/bin/python3", "python_why": "--python"}
    Registry().add(
        record("70", git_commit="abc-dirty", command_line="cj submit", script_path="/s/a b.sh",
               request=json.dumps(request), submitted_at=datetime(2026, 1, 2, 3, 4, 5).timestamp())
    )  # fmt: skip
    assert provenance("70") == {
        "job_id": "70", "cluster": "fake", "site": "mllab", "submitted": "2026-01-02T03:04:05",
        "command_line": "cj submit", "work_dir": "/home/ana/run", "git_commit": "abc",
        "git_dirty": True, "token": "tok70", "script_path": "/s/a b.sh",
        "sbatch_command": "sbatch --parsable --chdir=/home/ana/run '/s/a b.sh'",
        "resubmit_of": None, "state": "PENDING", "python": "/usr/bin/python3",
        "python_why": "--python", "max_requeues": None, "restarts": None,
        "requeue_limit_reached": None, "hardware": None, "gpu_usage": [],
    }  # fmt: skip
    Registry().add(record("71", git_commit="abc"), record("72"))
    assert (provenance("71")["git_commit"], provenance("71")["git_dirty"]) == ("abc", False)
    assert (provenance("72")["git_commit"], provenance("72")["git_dirty"]) == (None, None)


@pytest.mark.parametrize(
    ("request_text", "python", "why"),
    [
        (None, None, None),
        ('{"python": "/p/python3", "python_why": "venv"}', "/p/python3", "venv"),
        ('{"python": null, "conda": "torch", "python_why": "--conda"}', "conda env torch",
         "--conda"),
        ('{"python": "/p/python3", "conda": "torch"}', "/p/python3", None),
        ('{"conda": ""}', None, None),
        ("not json", None, None),
        ('["python"]', None, None),
    ],
)  # fmt: skip
def test_the_recorded_interpreter(
    data: Path, request_text: str | None, python: str | None, why: str | None
) -> None:
    Registry().add(record("80", request=request_text))
    shown = provenance("80")
    assert (shown["python"], shown["python_why"]) == (python, why)


# --- status -------------------------------------------------------------------------------------


def tracked(job_id: str, **fields: object) -> JobRecord:
    values: dict[str, object] = {"job_name": "train", "submitted_at": time.time() - 100}
    return record(job_id, **{**values, **fields})


def test_status_rows_and_records_from_squeue_and_sacct_in_full(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    running = slurm.add_job(
        state="RUNNING", reason="None", nodes="gpu[1-2]", elapsed="1:02", work_dir="",
        stdout="out/%x-%N-%u.log", stderr="/abs/%j.err", tres_per_node="gres:gpu:a100:2",
    )  # fmt: skip
    waiting = slurm.add_job(state="PENDING", reason="Priority", stdout="b-%j.out", stderr="",
                            work_dir="/sq/dir")  # fmt: skip
    quiet = slurm.add_job(state="RUNNING", reason="None", stdout="", stderr="")
    ended = slurm.add_job(
        state="FAILED", reason="NonZeroExitCode", exit_code="3:0", nodes="gpu[1-2]",
        elapsed="0:05", alloc_tres="billing=8,cpu=8,gres/gpu:a100=2,mem=10G,node=2",
    )  # fmt: skip
    slurm.forgotten.add(ended)
    start = time.time() - 100
    for job in (running, waiting, quiet, ended):
        registry.add(tracked(job, cluster="", submitted_at=start))
    now = start + 50
    rows = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0), now=now)
    since = datetime.fromtimestamp(start).isoformat(timespec="seconds")
    common = {"cluster": "fake", "name": "train", "submitted": since, "site": "mllab"}
    assert rows == [
        JobStatus(job_id=running, state="RUNNING", reason=None, explanation="",
                  nodes="gpu[1-2]", elapsed="1:02", exit_code=None, source="squeue",
                  gpus="gres/gpu:a100=4,gres/gpu=4", **common),  # 2 per node, 2 nodes
        JobStatus(job_id=waiting, state="PENDING", reason="Priority",
                  explanation=explain("PENDING", "Priority", waiting), nodes=None,
                  elapsed="0:00", exit_code=None, source="squeue",
                  gpus="gres/gpu:a100=1,gres/gpu=1", **common),
        JobStatus(job_id=quiet, state="RUNNING", reason=None, explanation="", nodes="gpu1",
                  elapsed="0:00", exit_code=None, source="squeue",
                  gpus="gres/gpu:a100=1,gres/gpu=1", **common),
        JobStatus(job_id=ended, state="FAILED", reason="NonZeroExitCode", explanation="",
                  nodes="gpu[1-2]", elapsed="0:05", exit_code=3, source="sacct",
                  gpus="gres/gpu:a100=2", **common),
    ]  # fmt: skip
    user = slurm.jobs[running]["user"]
    kept = {job: registry.get(job) for job in (running, waiting, quiet, ended)}
    assert {j: (r.cluster, r.state, r.reason, r.exit_code, r.nodes) for j, r in kept.items()} == {
        running: ("fake", "RUNNING", None, None, "gpu[1-2]"),
        waiting: ("fake", "PENDING", "Priority", None, None),
        quiet: ("fake", "RUNNING", None, None, "gpu1"),
        ended: ("fake", "FAILED", "NonZeroExitCode", 3, "gpu[1-2]"),
    }
    assert {j: (r.stdout_path, r.stderr_path, r.gpus, r.elapsed) for j, r in kept.items()} == {
        running: (f"/home/ana/run/out/train-gpu1-{user}.log", f"/abs/{running}.err",
                  "gres/gpu:a100=4,gres/gpu=4", "1:02"),
        waiting: (f"/sq/dir/b-{waiting}.out", f"/sq/dir/b-{waiting}.out",
                  "gres/gpu:a100=1,gres/gpu=1", "0:00"),
        quiet: (None, None, "gres/gpu:a100=1,gres/gpu=1", "0:00"),
        ended: (None, None, "gres/gpu:a100=2", "0:05"),
    }  # fmt: skip
    assert {r.state_checked_at for r in kept.values()} == {now}


def test_a_recorded_end_is_shown_as_recorded(data: Path) -> None:
    registry = Registry()
    start = time.time() - 100
    registry.add(
        tracked("300", state="FAILED", reason="NonZeroExitCode", exit_code=3, nodes="gpu[1-2]",
                elapsed="0:05", gpus="gres/gpu:a100=2", submitted_at=start),
        tracked("301", state="COMPLETED", reason="Dependency", exit_code=0, submitted_at=start),
    )  # fmt: skip
    slurm = FakeSlurm()
    rows = status(client=slurm.client(), registry=registry)
    since = datetime.fromtimestamp(start).isoformat(timespec="seconds")
    assert rows == [
        JobStatus(job_id="300", cluster="fake", name="train", state="FAILED",
                  reason="NonZeroExitCode", explanation=explain("FAILED", "NonZeroExitCode", "300"),
                  nodes="gpu[1-2]", elapsed="0:05", exit_code=3, submitted=since, site="mllab",
                  source="registry", gpus="gres/gpu:a100=2"),
        JobStatus(job_id="301", cluster="fake", name="train", state="COMPLETED", reason=None,
                  explanation=explain("COMPLETED", "Dependency", "301"), nodes=None,
                  elapsed=None, exit_code=0, submitted=since, site="mllab", source="registry"),
    ]  # fmt: skip
    assert slurm.calls == []


def test_jobs_nobody_knows_are_unknown_with_the_reason_why(data: Path) -> None:
    registry = Registry()
    registry.add(tracked("900"))
    (row,) = status(client=FakeSlurm().client(), registry=registry, cache=StatusCache(ttl=0))
    assert (row.state, row.source, row.reason) == ("UNKNOWN", "none", None)
    assert row.explanation == (
        "neither squeue nor sacct knows this job (submitted on another cluster?)"
    )
    off = FakeSlurm(accounting=False)
    (row,) = status(client=off.client(), registry=registry, cache=StatusCache(ttl=0))
    assert row.explanation == (
        "Slurm no longer reports it (it ended over MinJobAge ago?) and accounting is off, so "
        "its end state is unknown"
    )


def test_every_record_is_shown_in_order_whatever_comes_first(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    start = time.time() - 100
    array = slurm.add_array({0: ("RUNNING", "0:0")}, pending="1")
    other = slurm.add_job(state="RUNNING", comment="clusterjob:someoneelse")
    plain = slurm.add_job(state="RUNNING")
    registry.add(
        tracked("5", state="COMPLETED", exit_code=0, submitted_at=start),
        tracked(array, script=array_script("0-1"), submitted_at=start + 1),
        tracked(other, submitted_at=start + 2),
        tracked("6", state="COMPLETED", exit_code=0, submitted_at=start + 3),
        tracked(plain, submitted_at=start + 4),
    )
    rows = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert [(r.job_id, r.state) for r in rows] == [
        ("5", "COMPLETED"), (array, "RUNNING"), (other, "UNKNOWN"), ("6", "COMPLETED"),
        (plain, "RUNNING"),
    ]  # fmt: skip
    assert rows[2].explanation == (
        f"Slurm's job {other} is another job now (the cluster was rebuilt and its job ids "
        "started again?); this one's end is unknown"
    )


def test_a_rebuilt_clusters_job_known_only_to_sacct(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_job(state="COMPLETED")
    slurm.forgotten.add(job)
    registry = Registry()
    registry.add(tracked(job, submitted_at=time.time() + 7200))  # sacct's is far older
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert (row.state, row.source) == ("UNKNOWN", "none")
    assert row.explanation.startswith(f"Slurm's job {job} is another job now")


class OtherClusterFirst(FakeSlurm):
    """sacct of a federation: the same id on another cluster, listed first."""

    def _sacct(self, cmd: list[str], timeout: float) -> SlurmResult:
        result = super()._sacct(cmd, timeout)
        extra = [
            self._line({**job, "cluster": "twin", "state": "COMPLETED", "end": "Unknown"},
                       parse.SACCT_FIELDS)
            for job in self.jobs.values()
        ]  # fmt: skip
        return self._ok(cmd, "".join(f"{x}\n" for x in extra) + result.stdout)


def test_sacct_rows_of_another_cluster_are_not_taken(data: Path) -> None:
    slurm = OtherClusterFirst()
    job = slurm.add_job(state="FAILED", exit_code="2:0")
    slurm.forgotten.add(job)
    registry = Registry()
    registry.add(tracked(job))
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert (row.cluster, row.state, row.exit_code) == ("fake", "FAILED", 2)


def test_status_defaults_to_recent_jobs_of_the_default_registry(data: Path) -> None:
    slurm = FakeSlurm()
    old = time.time() - 3 * 86400
    Registry().add(
        tracked("1", state="COMPLETED", exit_code=0, submitted_at=old),
        tracked("2", state="COMPLETED", exit_code=0),
    )
    assert [r.job_id for r in status(client=slurm.client())] == ["2"]
    assert [r.job_id for r in status(show_all=True, client=slurm.client())] == ["1", "2"]


def test_jobs_clusterjob_did_not_submit(data: Path) -> None:
    slurm = FakeSlurm()
    running = slurm.add_job(state="RUNNING", reason="None")
    gone = slurm.add_job(state="FAILED", reason="NonZeroExitCode", exit_code="4:0")
    slurm.forgotten.add(gone)
    array = slurm.add_array({2: ("RUNNING", "0:0")}, name="sweep")
    theirs = slurm.add_array({0: ("RUNNING", "0:0")}, comment="clusterjob:someoneelse")
    empty = Registry(data / "other.db")
    rows = status([array, running, gone, theirs], tasks=True, client=slurm.client(),
                  registry=empty, cache=StatusCache(ttl=0))  # fmt: skip
    assert [(r.job_id, r.state, r.source) for r in rows] == [
        (array, "RUNNING", "squeue"), (running, "RUNNING", "squeue"),
        (gone, "FAILED", "sacct"), (theirs, "RUNNING", "squeue"),
    ]  # fmt: skip
    assert rows[0] == JobStatus(
        job_id=array, cluster="", name="sweep", state="RUNNING", reason=None,
        explanation="1 task: 1 RUNNING", nodes="gpu1", elapsed=None, exit_code=None,
        submitted=None, site="", source="squeue", gpus="gres/gpu:a100=1,gres/gpu=1",
        tasks_summary="1 task: 1 RUNNING", tasks=rows[0].tasks,
    )  # fmt: skip
    assert [t.job_id for t in rows[0].tasks] == [f"{array}_2"]
    assert (rows[2].submitted, rows[2].site, rows[2].exit_code) == (None, "", 4)
    assert rows[3].tasks_summary == "1 task: 1 RUNNING"


class Recorded(FakeSlurm):
    """Answers squeue and sacct with the rows given, whatever is asked."""

    def __init__(self, squeue: list[dict[str, str]], sacct: list[dict[str, str]]) -> None:
        super().__init__()
        self.squeue_rows = squeue
        self.sacct_rows = sacct

    def _squeue(self, cmd: list[str], timeout: float) -> SlurmResult:
        lines = [self._line(self._fields(**r), parse.SQUEUE_FIELDS) for r in self.squeue_rows]
        return self._ok(cmd, "".join(f"{x}\n" for x in lines))

    def _sacct(self, cmd: list[str], timeout: float) -> SlurmResult:
        lines = [
            self._line({**self._fields(**r), "end": "Unknown"}, parse.SACCT_FIELDS)
            for r in self.sacct_rows
        ]
        return self._ok(cmd, "".join(f"{x}\n" for x in lines))


def row_fields(job_id: str, state: str, reason: str = "None", **fields: str) -> dict[str, str]:
    return {"job_id": job_id, "state": state, "reason": reason, **fields}


def test_an_untracked_task_inside_a_pending_range(data: Path) -> None:
    squeue = [row_fields("700_[4-9]", "PENDING", "JobArrayTaskLimit")]
    rows = status(["700_5"], client=Recorded(squeue, []).client(), registry=Registry(),
                  cache=StatusCache(ttl=0))  # fmt: skip
    assert [(r.job_id, r.state, r.source, r.reason) for r in rows] == [
        ("700_5", "PENDING", "squeue", "JobArrayTaskLimit")
    ]
    assert rows[0].explanation == explain("PENDING", "JobArrayTaskLimit", "700_5")
    sacct = [row_fields("701_[0-3]", "CANCELLED", "Dependency", exit_code="0:15")]
    (row,) = status(["701_2"], client=Recorded([], sacct).client(), registry=Registry(),
                    cache=StatusCache(ttl=0))  # fmt: skip
    assert (row.job_id, row.state, row.source, row.reason) == ("701_2", "CANCELLED", "sacct", None)
    assert row.explanation == ""  # a pending reason kept by sacct is history once ended
    squeue = [row_fields("703_[0-2]", "PENDING", "Priority"),
              row_fields("703_[4-9]", "PENDING", "JobHeldUser")]  # fmt: skip
    (row,) = status(["703_5"], client=Recorded(squeue, []).client(), registry=Registry(),
                    cache=StatusCache(ttl=0))  # fmt: skip
    assert (row.job_id, row.reason) == ("703_5", "JobHeldUser")
    assert row.explanation == "held by you: `scontrol release 703_5` to let it start"
    sacct = [row_fields("704_[0-3]", "DEADLINE")]  # pending tasks past their --deadline
    (row,) = status(["704_1"], client=Recorded([], sacct).client(), registry=Registry(),
                    cache=StatusCache(ttl=0))  # fmt: skip
    assert (row.job_id, row.explanation) == ("704_1", "could not finish before its --deadline")
    with pytest.raises(UsageError) as info:
        status(["702_1"], client=Recorded([], []).client(), registry=Registry(),
               cache=StatusCache(ttl=0))  # fmt: skip
    assert str(info.value) == "job 702_1: Slurm does not know it"


def test_an_array_squeue_shows_whole_costs_no_sacct(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    waiting = slurm.add_array({}, pending="0-3")
    going = slurm.add_array({0: ("RUNNING", "0:0")}, pending="1-3")
    registry.add(tracked(waiting, script=array_script("0-3")))
    registry.add(tracked(going, script=array_script("0-3")))
    status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert slurm.commands("sacct") == []
    slurm.forgotten.add(f"{going}_0")  # task 0 ended: only sacct can say how
    slurm.jobs[f"{going}_0"]["state"] = "COMPLETED"
    status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    (asked,) = slurm.commands("sacct")
    assert f"--jobs={going}" in asked


def test_an_array_row_and_its_task_rows_in_full(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array(
        {0: ("COMPLETED", "0:0"), 1: ("RUNNING", "0:0")}, pending="2-3", elapsed="2:00",
        reason="JobArrayTaskLimit",
    )  # fmt: skip
    slurm.forgotten.add(f"{job}_0")
    slurm.jobs[f"{job}_0"]["alloc_tres"] = "gres/gpu:a100=1"
    slurm.jobs[f"{job}_1"]["nodes"] = "gpu2"
    start = time.time() - 100
    registry = Registry()
    request = {"task_args": [["a"], ["b c"], ["d"], ["e"]]}
    registry.add(tracked(job, cluster="", script=array_script("0-3%1"), submitted_at=start,
                         job_name="sweep", request=json.dumps(request)))  # fmt: skip
    now = start + 10
    (row,) = status(tasks=True, client=slurm.client(), registry=registry,
                    cache=StatusCache(ttl=0), now=now)  # fmt: skip
    since = datetime.fromtimestamp(start).isoformat(timespec="seconds")
    summary = "4 tasks: 1 COMPLETED, 1 RUNNING, 2 PENDING"

    def task(n: int, state: str, **fields: object) -> JobStatus:
        values: dict[str, object] = {
            "job_id": f"{job}_{n}", "cluster": "", "name": "sweep", "state": state,
            "reason": None, "explanation": explain(state, None, f"{job}_{n}"), "nodes": None,
            "elapsed": "2:00", "exit_code": None, "submitted": since, "site": "mllab",
            "source": "squeue", "gpus": "gres/gpu:a100=1,gres/gpu=1",
        }  # fmt: skip
        return JobStatus(**{**values, **fields})  # type: ignore[arg-type]

    pending = {"reason": "JobArrayTaskLimit", "elapsed": "2:00"}
    assert row == JobStatus(
        job_id=job, cluster="", name="sweep", state="RUNNING", reason=None,
        explanation=summary, nodes="gpu[1-2]", elapsed=None, exit_code=None, submitted=since,
        site="mllab", source="squeue", gpus="gres/gpu:a100=1", tasks_summary=summary,
        tasks=(
            task(0, "COMPLETED", nodes="gpu1", exit_code=0, source="sacct",
                 gpus="gres/gpu:a100=1", params="a"),
            task(1, "RUNNING", nodes="gpu2", params="'b c'"),
            task(2, "PENDING", params="d", **pending,
                 explanation=explain("PENDING", "JobArrayTaskLimit", f"{job}_2")),
            task(3, "PENDING", params="e", **pending,
                 explanation=explain("PENDING", "JobArrayTaskLimit", f"{job}_3")),
        ),
    )  # fmt: skip
    kept = registry.get(job)
    assert (kept.cluster, kept.state, kept.reason, kept.exit_code, kept.nodes, kept.tasks) == (
        "fake",
        "RUNNING",
        None,
        None,
        "gpu[1-2]",
        None,
    )
    assert kept.state_checked_at == now
    # all ended: the state, code and tasks are recorded
    for n in (1, 2, 3):
        slurm.jobs[f"{job}_{n}"] = {**slurm.jobs[f"{job}_1"], "job_id": f"{job}_{n}",
                                    "state": "FAILED", "exit_code": f"{n}:0"}  # fmt: skip
        slurm.forgotten.add(f"{job}_{n}")
    del slurm.jobs[f"{job}_[2-3]"]
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert (row.state, row.exit_code, row.tasks_summary, row.source) == (
        "FAILED",
        1,
        "4 tasks: 1 COMPLETED, 3 FAILED (exit 1,2,3)",
        "sacct",
    )
    kept = registry.get(job)
    assert (kept.state, kept.exit_code) == ("FAILED", 1)
    assert [t["state"] for t in json.loads(kept.tasks)] == ["COMPLETED"] + ["FAILED"] * 3
    (again,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert again.source == "registry" and again.tasks_summary == row.tasks_summary


def test_a_pending_array_says_why_after_its_summary(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array({}, pending="0-1", reason="Priority")
    registry = Registry()
    registry.add(tracked(job, script=array_script("0-1")))
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert (row.state, row.reason) == ("PENDING", "Priority")
    assert row.explanation == "2 tasks: 2 PENDING; " + explain("PENDING", "Priority", job)


def test_an_array_ended_in_squeue_before_sacct_is_recorded_as_running(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array({0: ("COMPLETED", "0:0")})
    slurm.unrecorded_end.add(f"{job}_0")
    registry = Registry()
    registry.add(tracked(job, script=array_script("0")))
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert (row.state, row.exit_code) == ("COMPLETED", None)
    kept = registry.get(job)
    assert (kept.state, kept.exit_code, kept.tasks) == ("RUNNING", None, None)


def test_tasks_nobody_knows_are_listed_unknown(data: Path) -> None:
    slurm = FakeSlurm(accounting=False)
    job = slurm.add_array({})
    registry = Registry()
    registry.add(tracked(job, script=array_script("0-1")))
    (row,) = status(tasks=True, client=slurm.client(), registry=registry,
                    cache=StatusCache(ttl=0))  # fmt: skip
    assert [(t.job_id, t.state, t.source) for t in row.tasks] == [
        (f"{job}_0", "UNKNOWN", "none"), (f"{job}_1", "UNKNOWN", "none")
    ]  # fmt: skip
    assert (row.state, row.source, row.tasks_summary) == ("UNKNOWN", "none", "2 tasks: 2 UNKNOWN")
    with pytest.raises(UsageError) as info:
        status([f"{job}_5"], client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert str(info.value) == f"job {job} has no task 5 (2 tasks: 2 UNKNOWN)"


class SacctSays(FakeSlurm):
    """sacct's view of some rows differs from squeue's (a requeue, a late echo)."""

    def __init__(self) -> None:
        super().__init__()
        self.sacct_fields: dict[str, dict[str, str]] = {}

    def _sacct(self, cmd: list[str], timeout: float) -> SlurmResult:
        saved = {j: dict(self.jobs[j]) for j in self.sacct_fields}
        for j, fields in self.sacct_fields.items():
            self.jobs[j].update(fields)
        try:
            return super()._sacct(cmd, timeout)
        finally:
            for j, fields in saved.items():
                self.jobs[j] = fields


def test_a_tasks_state_from_squeue_and_sacct(data: Path) -> None:
    slurm = SacctSays()
    job = slurm.add_array(
        {0: ("COMPLETED", "0:0"), 1: ("RUNNING", "0:0"), 2: ("COMPLETED", "0:0"),
         3: ("FAILED", "5:0")},
    )  # fmt: skip
    slurm.jobs[f"{job}_0"]["state"] = "PENDING"  # squeue: a late echo of the pending task
    slurm.sacct_fields[f"{job}_0"] = {"state": "COMPLETED"}
    slurm.sacct_fields[f"{job}_1"] = {"state": "COMPLETED"}  # requeued: squeue runs it again
    slurm.jobs[f"{job}_2"]["reason"] = "NonZeroExitCode"  # not pending: dropped all the same
    slurm.jobs[f"{job}_3"]["reason"] = "Dependency"  # a pending reason: dropped once ended
    registry = Registry()
    registry.add(tracked(job, script=array_script("0-3")))
    (row,) = status(tasks=True, client=slurm.client(), registry=registry,
                    cache=StatusCache(ttl=0))  # fmt: skip
    assert [(t.state, t.reason, t.exit_code, t.source) for t in row.tasks] == [
        ("COMPLETED", None, 0, "sacct"),
        ("RUNNING", None, None, "squeue"),
        ("COMPLETED", None, 0, "sacct"),
        ("FAILED", None, 5, "sacct"),
    ]


def test_a_failed_tasks_own_reason_is_kept(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array({0: ("FAILED", "5:0")})
    slurm.jobs[f"{job}_0"]["reason"] = "NonZeroExitCode"
    slurm.forgotten.add(f"{job}_0")
    registry = Registry()
    registry.add(tracked(job, script=array_script("0")))
    (row,) = status(tasks=True, client=slurm.client(), registry=registry,
                    cache=StatusCache(ttl=0))  # fmt: skip
    assert [(t.state, t.reason) for t in row.tasks] == [("FAILED", "NonZeroExitCode")]


def test_a_plain_row_among_an_arrays_rows_is_skipped(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_job(state="RUNNING")
    slurm.jobs[f"{job}_1"] = {**slurm.jobs[job], "job_id": f"{job}_1"}
    registry = Registry()
    registry.add(tracked(job, script=array_script("1")))
    (row,) = status(tasks=True, client=slurm.client(), registry=registry,
                    cache=StatusCache(ttl=0))  # fmt: skip
    assert [(t.job_id, t.state) for t in row.tasks] == [(f"{job}_1", "RUNNING")]


def task_of(n: int, state: str, code: int | None = None, reason: str | None = None) -> _Task:
    return _Task(n, state, reason, code, None, None, None, "sacct")


@pytest.mark.parametrize(
    ("tasks", "expected"),
    [
        ([("COMPLETED", 0), ("COMPLETED", 0)], ("COMPLETED", "2 tasks: 2 COMPLETED", 0)),
        ([("COMPLETED", None)], ("COMPLETED", "1 task: 1 COMPLETED", 0)),
        ([("FAILED", 7), ("FAILED", 3), ("COMPLETED", 0)],
         ("FAILED", "3 tasks: 1 COMPLETED, 2 FAILED (exit 3,7)", 7)),
        ([("CANCELLED", 9), ("FAILED", 3)],
         ("FAILED", "2 tasks: 1 FAILED (exit 3), 1 CANCELLED (exit 9)", 3)),
        ([("CANCELLED", 0), ("CANCELLED", 0)], ("CANCELLED", "2 tasks: 2 CANCELLED", 0)),
        ([("CANCELLED", 0), ("CANCELLED", 15)],
         ("CANCELLED", "2 tasks: 2 CANCELLED (exit 15)", 15)),
        ([("CANCELLED", None), ("COMPLETED", 0)],
         ("CANCELLED", "2 tasks: 1 COMPLETED, 1 CANCELLED", None)),
        ([("RUNNING", None), ("FAILED", 3)],
         ("RUNNING", "2 tasks: 1 FAILED (exit 3), 1 RUNNING", None)),
        ([("PENDING", None), ("FAILED", 3)],
         ("PENDING", "2 tasks: 1 FAILED (exit 3), 1 PENDING", None)),
        ([("UNKNOWN", None), ("COMPLETED", 0)],
         ("UNKNOWN", "2 tasks: 1 COMPLETED, 1 UNKNOWN", None)),
    ],
)  # fmt: skip
def test_an_arrays_summary(
    tasks: list[tuple[str, int | None]], expected: tuple[str, str, int | None]
) -> None:
    state, summary, code, reason = _summary([task_of(n, s, c) for n, (s, c) in enumerate(tasks)])
    assert (state, summary, code) == expected
    assert reason is None


def test_an_arrays_pending_reason_is_its_first_tasks_own() -> None:
    tasks = [task_of(0, "PENDING"), task_of(1, "PENDING", reason="Priority")]
    assert _summary(tasks)[3] == "Priority"
    assert _summary([task_of(0, "PENDING")])[3] is None


# --- a requeued job ------------------------------------------------------------------------------


class Restarts(FakeSlurm):
    def __init__(self, restarts: str | None) -> None:
        super().__init__()
        self.restarts = restarts

    def _scontrol(self, cmd: list[str], timeout: float) -> SlurmResult:
        result = super()._scontrol(cmd, timeout)
        if self.restarts is None:
            return self._ok(cmd, re.sub(r"Restarts=\S+ ", "", result.stdout))
        return self._ok(cmd, re.sub(r"Restarts=\S+", f"Restarts={self.restarts}", result.stdout))


@pytest.mark.parametrize(
    ("restarts", "start", "explanation"),
    [
        ("2", "N/A", "requeued (restart 2)"),
        ("1", "2026-12-01T10:30:00", "requeued (restart 1), eligible at 10:30"),
        ("0", "N/A", None),
        (None, "N/A", None),
        ("x", "N/A", None),
    ],
)
def test_a_requeued_job_says_so(
    data: Path, restarts: str | None, start: str, explanation: str | None
) -> None:
    slurm = Restarts(restarts)
    job = slurm.add_job(state="PENDING", reason="BeginTime", start=start)
    registry = Registry()
    registry.add(tracked(job, script="#!/bin/bash\n#SBATCH --requeue\n"))
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert row.explanation == (explanation or explain("PENDING", "BeginTime", job))
    assert row.restarts == (int(restarts) if explanation else None)


def test_restarts_only_for_a_requeued_job_waiting_to_begin(data: Path) -> None:
    slurm = Restarts("3")
    running = slurm.add_job(state="RUNNING", reason="BeginTime")
    gone = slurm.add_job(state="PENDING", reason="BeginTime")
    slurm.forgotten_by_scontrol.add(gone)
    registry = Registry()
    registry.add(tracked(running, script="#SBATCH --requeue\n"))
    registry.add(tracked(gone, script="#SBATCH --requeue\n"))
    rows = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert [r.restarts for r in rows] == [None, None]


# --- the status cache ----------------------------------------------------------------------------


def test_every_file_kept_per_cluster_reached_names_it_alike(data: Path) -> None:
    """The status cache, the avoid list and the remote cache spell a host's label in a file
    name one way (``slurm.ssh.file_key``): the same cluster, the same key in every name."""
    from clusterjob.jobs.badnodes import AvoidList
    from clusterjob.slurm.ssh import parse_target

    label = parse_target("ada@login-1:2222").label
    key = parse_target("ada@login-1:2222").key()
    assert key == "ada@login-1_2222"  # the port's colon replaced
    assert StatusCache(host=label).path.name == f"status-cache-{key}.json"
    assert AvoidList(host=label).path == data / f"bad-nodes-{key}.json"
    assert AvoidList().path.name == "bad-nodes.json"


def test_the_cache_file_per_host(data: Path, monkeypatch) -> None:
    assert StatusCache().path == data / "status-cache.json"
    assert StatusCache(host="ada@login-1.x").path == data / "status-cache-ada@login-1.x.json"
    assert StatusCache(host="a b/c:D").path == data / "status-cache-a_b_c_D.json"
    assert cache_for(StdinSlurm().client()).path == data / "status-cache-ada@login1.json"
    assert cache_for(FakeSlurm().client()).path == data / "status-cache.json"
    assert StatusCache().ttl == 10.0
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0.5")
    assert StatusCache().ttl == 0.5
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0")
    assert StatusCache().ttl == 0.0
    for bad in ("-1", "soon", "nan"):
        monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", bad)
        with pytest.raises(UsageError) as info:
            StatusCache()
        assert str(info.value) == (
            f"CLUSTERJOB_STATUS_CACHE_SECONDS={bad!r}: give a number of seconds (0: no cache)"
        )


def test_cache_freshness_and_coverage(tmp_path: Path) -> None:
    cache = StatusCache(tmp_path / "a" / "b" / "cache.json", ttl=10)
    cache.put("squeue", ["2", "1"], 100.0, stdout="x")
    assert json.loads(cache.path.read_text()) == {
        "squeue": {"at": 100.0, "ids": ["1", "2"], "stdout": "x"}
    }
    assert cache.get("squeue", ["1", "2"], 100.0) is not None
    assert cache.get("squeue", ["1"], 109.9) is not None
    assert cache.get("squeue", ["1"], 110.0) is None
    assert cache.get("squeue", ["1"], 99.0) is None  # from the future: not trusted
    assert cache.get("squeue", ["3"], 100.0) is None
    assert cache.get("sacct", ["1"], 100.0) is None
    assert StatusCache(cache.path, ttl=0.5).get("squeue", ["1"], 100.2) is not None
    assert StatusCache(cache.path, ttl=0).get("squeue", ["1"], 100.0) is None
    cache.path.write_text(json.dumps({"squeue": {"ids": ["1"]}}))
    assert StatusCache(cache.path, ttl=10).get("squeue", ["1"], 10.5) is None
    assert StatusCache(cache.path, ttl=10).get("squeue", ["1"], 9.5) is not None
    cache.path.write_text(json.dumps({"squeue": {"at": 5.0}}))
    assert cache.get("squeue", [], 6.0) == {"at": 5.0}
    cache.path.write_text("[1, 2]")
    assert cache.get("squeue", [], 6.0) is None
    cache.put("sacct", ["1"], 7.0, stdout="")
    assert json.loads(cache.path.read_text()) == {"sacct": {"at": 7.0, "ids": ["1"], "stdout": ""}}


def test_sacct_answers_and_its_absence_are_cached(data: Path) -> None:
    slurm = FakeSlurm(accounting=False)
    job = slurm.add_job(state="COMPLETED")
    slurm.forgotten.add(job)
    registry = Registry()
    registry.add(tracked(job))
    cache = StatusCache(data / "c.json", ttl=10)
    now = time.time()
    status(client=slurm.client(), registry=registry, cache=cache, now=now)
    assert json.loads(cache.path.read_text())["sacct"] == {
        "at": now, "ids": [job], "disabled": True
    }  # fmt: skip
    (row,) = status(client=slurm.client(), registry=registry, cache=cache, now=now + 1)
    assert row.state == "UNKNOWN" and "accounting is off" in row.explanation
    assert len(slurm.commands("sacct")) == 1
    on = FakeSlurm()
    done = on.add_job(state="COMPLETED")
    on.forgotten.add(done)
    other = Registry(data / "o.db")
    other.add(tracked(done))
    cache = StatusCache(data / "d.json", ttl=10)
    status([done], client=on.client(), registry=other, cache=cache, now=now)
    assert set(json.loads(cache.path.read_text())["sacct"]) == {"at", "ids", "stdout"}
    (row,) = status([done], client=on.client(), registry=other, cache=cache, now=now + 1)
    assert row.state == "COMPLETED" and len(on.commands("sacct")) == 1


# --- filters ---------------------------------------------------------------------------------


def test_status_filter_keeps_every_match() -> None:
    def row(name: str, state: str, submitted: str | None) -> JobStatus:
        return JobStatus("1", "c", name, state, None, "", None, None, None, submitted, "s", "x")

    rows = [row("a", "FAILED", "2026-12-01T10:00:00"), row("b", "RUNNING", "2026-12-01T11:00:00"),
            row("c", "RUNNING", "2026-12-01T12:00:00")]  # fmt: skip
    assert StatusFilter.parse(state="running").apply(rows) == rows[1:]
    assert StatusFilter.parse(name="[bc]").apply(rows) == rows[1:]
    noon = datetime(2026, 12, 1, 12, 0, 0).timestamp()
    assert StatusFilter.parse(since="1h", now=noon).apply(rows) == rows[1:]
    assert StatusFilter.parse(since="1h", now=noon).since == noon - 3600
    assert StatusFilter.parse(since="2026-12-01T11:00:00").apply(rows) == rows[1:]


def test_a_job_is_ours_up_to_ten_minutes_either_side_of_its_submission(data: Path) -> None:
    slurm = FakeSlurm()
    at = datetime(2026, 12, 1, 10, 10, 0)
    early = slurm.add_job(state="RUNNING", submit="2026-12-01T10:00:00")
    late = slurm.add_job(state="RUNNING", submit="2026-12-01T10:20:00", name="renamed")
    registry = Registry()
    registry.add(tracked(early, submitted_at=at.timestamp()))
    registry.add(tracked(late, submitted_at=at.timestamp()))
    rows = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0),
                  now=at.timestamp())  # fmt: skip
    assert [(r.job_id, r.state) for r in rows] == [(early, "RUNNING"), (late, "RUNNING")]


def test_an_untracked_jobs_exit_code_while_squeue_still_shows_it(data: Path) -> None:
    slurm = FakeSlurm()
    running = slurm.add_job(state="RUNNING", reason="None")
    ended = slurm.add_job(state="FAILED", reason="NonZeroExitCode", exit_code="3:0")
    slurm.unrecorded_end.add(ended)
    rows = status([running, ended], client=slurm.client(), registry=Registry(),
                  cache=StatusCache(ttl=0))  # fmt: skip
    assert [(r.state, r.exit_code, r.source) for r in rows] == [
        ("RUNNING", None, "squeue"), ("FAILED", 3, "squeue")
    ]  # fmt: skip


def test_a_timed_out_sbatch_is_found_by_its_token_not_submitted_twice(data: Path, mllab) -> None:
    resolved, rendered = rendered_job(mllab)
    slurm = FakeSlurm()
    slurm.sbatch_plan = ["timeout_created"]
    first = submit(mllab, resolved, rendered, client=slurm.client(), workdir="/w")
    assert isinstance(first, Submitted) and first.job_id == "100"
    slurm.sbatch_plan = ["timeout_created"]
    again = resubmit("100", same_script=True, client=slurm.client())
    assert again.job_id == "101"
    assert len(slurm.commands("sbatch")) == 2 and sorted(slurm.jobs) == ["100", "101"]


def test_a_script_without_its_token_is_refused_word_for_word(data: Path, mllab) -> None:
    resolved, rendered = rendered_job(mllab)
    broken = replace(rendered, script=rendered.script.replace("--comment", "--x"))
    with pytest.raises(UsageError) as info:
        submit(mllab, resolved, broken, client=FakeSlurm().client(), workdir="/w")
    assert str(info.value) == (
        f"the job script does not carry `#SBATCH --comment=clusterjob:{rendered.token}`; a "
        "site template that overrides job.sh.j2 must keep that line (it makes submission "
        "safe to retry)"
    )


def test_an_ended_task_and_record_are_explained_with_their_own_ids(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array({0: ("NODE_FAIL", "0:0")})
    slurm.forgotten.add(f"{job}_0")
    registry = Registry()
    registry.add(tracked(job, script=array_script("0")))
    registry.add(tracked("400", state="NODE_FAIL", exit_code=0))
    rows = status(tasks=True, client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert [t.explanation for t in rows[0].tasks] == [
        f"a node of the job failed; resubmit (`clusterjob resubmit {job}_0`)"
    ]
    assert rows[1].explanation == "a node of the job failed; resubmit (`clusterjob resubmit 400`)"


def test_a_pending_arrays_reason_is_recorded(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array({}, pending="0-1", reason="Priority")
    registry = Registry()
    registry.add(tracked(job, script=array_script("0-1")))
    status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert (registry.get(job).state, registry.get(job).reason) == ("PENDING", "Priority")
    held = slurm.add_array({}, pending="0-1", reason="JobHeldUser")
    registry.add(tracked(held, script=array_script("0-1")))
    (row,) = status([held], client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert row.explanation == (
        f"2 tasks: 2 PENDING; held by you: `scontrol release {held}` to let it start"
    )


def test_an_arrays_rows_of_another_submission_or_cluster_are_not_its_own(data: Path) -> None:
    slurm = FakeSlurm()
    theirs = slurm.add_array({0: ("RUNNING", "0:0")}, comment="clusterjob:someoneelse")
    old = slurm.add_array({0: ("COMPLETED", "0:0")})
    slurm.forgotten.add(f"{old}_0")
    registry = Registry()
    registry.add(tracked(theirs, script=array_script("0")))
    registry.add(tracked(old, script=array_script("0"), submitted_at=time.time() + 7200))
    rows = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert [(r.state, r.source) for r in rows] == [("UNKNOWN", "none"), ("UNKNOWN", "none")]
    twin = Recorded([row_fields("800_0", "RUNNING", cluster="twin")],
                    [row_fields("800_0", "COMPLETED", cluster="twin")])  # fmt: skip
    other = Registry(data / "o.db")
    other.add(tracked("800", script=array_script("0")))
    (row,) = status(client=twin.client(), registry=other, cache=StatusCache(ttl=0))
    assert (row.state, row.source) == ("UNKNOWN", "none")


def test_a_stale_range_after_an_end_and_a_running_task_only_sacct_sees(data: Path) -> None:
    squeue = [row_fields("810_[0-2]", "PENDING", "Priority")]
    sacct = [row_fields("810_0", "COMPLETED", exit_code="0:0"),
             row_fields("811_0", "RUNNING", exit_code="0:0")]  # fmt: skip
    slurm = Recorded(squeue, sacct)
    registry = Registry()
    registry.add(tracked("810", script=array_script("0-2")))
    registry.add(tracked("811", script=array_script("0")))
    rows = status(tasks=True, client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert [(t.state, t.exit_code, t.source) for t in rows[0].tasks] == [
        ("COMPLETED", 0, "sacct"), ("PENDING", None, "squeue"), ("PENDING", None, "squeue")
    ]  # fmt: skip
    assert [(t.state, t.exit_code) for t in rows[1].tasks] == [("RUNNING", None)]


def test_a_relative_stderr_is_under_the_recorded_directory(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_job(state="RUNNING", work_dir="", stdout="/o.out", stderr="e-%j.err")
    registry = Registry()
    registry.add(tracked(job))
    status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert registry.get(job).stderr_path == f"/home/ana/run/e-{job}.err"


def test_untracked_arrays_known_to_sacct_only_and_a_single_task(data: Path) -> None:
    slurm = FakeSlurm()
    job = slurm.add_array({0: ("COMPLETED", "0:0"), 1: ("FAILED", "2:0")})
    slurm.forgotten.update({f"{job}_0", f"{job}_1"})
    running = slurm.add_array({1: ("RUNNING", "0:0")})
    rows = status([job, f"{running}_1"], client=slurm.client(), registry=Registry(),
                  cache=StatusCache(ttl=0))  # fmt: skip
    assert [(r.job_id, r.state, r.exit_code, r.source, r.tasks_summary) for r in rows] == [
        (job, "FAILED", 2, "sacct", "2 tasks: 1 COMPLETED, 1 FAILED (exit 2)"),
        (f"{running}_1", "RUNNING", None, "squeue", None),
    ]


def test_status_filter_since_a_time_ago_from_now() -> None:
    since = StatusFilter.parse(since="1h").since
    assert since is not None and abs(since - (time.time() - 3600)) < 60
