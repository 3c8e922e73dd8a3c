"""Exact tests of the jobs core (submit, status, logs) over the fake Slurm: the messages,
paths and command lines in full, so that a changed word, index or condition is noticed
(scripts/mutation.sh runs these with the jobs-submit, jobs-status and jobs-logs targets)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob.errors import UsageError
from clusterjob.jobs import logs
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
from clusterjob.jobs.status import StatusCache
from clusterjob.jobscript.request import JobRequest
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.runner import Runner, SlurmResult


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
