"""Grid Engine's parsers, table-driven, on output recorded from a real Son of Grid Engine
8.1.9 (tests/fixtures/gridengine/README.md), and on a few files written from its documented
formats where no recording shows the case (tests/fixtures/gridengine/documented/)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest

from clusterjob.gridengine import parse, states

FIXTURES = Path(__file__).parent / "fixtures" / "gridengine"
DOCUMENTED = FIXTURES / "documented"


def recorded(name: str) -> tuple[str, int]:
    """A recording's output (stdout and stderr as printed) and the exit status that
    record.sh appended as its last line, ``exit=N``."""
    text = (FIXTURES / name).read_text()
    body, _, last = text.rstrip("\n").rpartition("\n")
    assert last.startswith("exit="), f"{name}: no exit= line"
    return body + "\n", int(last.removeprefix("exit="))


def out(name: str) -> str:
    return recorded(name)[0]


def doc(name: str) -> str:
    return (DOCUMENTED / name).read_text()


# -- qsub ------------------------------------------------------------------------------------


# Job ids, times and loads differ from one recording to the next (README.md): the tests
# below hold what each recording shows by design, never its ids or clock times.


@pytest.mark.parametrize(
    ("name", "tasks", "job_name"),
    [
        ("qsub-plain.txt", None, "plain"),
        ("qsub-array.txt", parse.TaskRange(1, 4, 1), "array2"),
        ("qsub-terse.txt", None, None),
        ("qsub-sync-ok.txt", None, "ok"),
        ("qsub-sync-exit3.txt", None, "exit3"),  # "Job N exited" may be printed first
    ],
)
def test_parse_qsub_recorded(
    name: str, tasks: parse.TaskRange | None, job_name: str | None
) -> None:
    found = parse.parse_qsub(out(name))
    assert found.job_id.isdigit()
    assert (found.tasks, found.name) == (tasks, job_name)


@pytest.mark.parametrize(
    ("text", "job_id", "tasks"),
    [
        ('Your job-array 20.2-10:2 ("a b") has been submitted\n', "20", parse.TaskRange(2, 10, 2)),
        ("13.1-4:1\n", "13", parse.TaskRange(1, 4, 1)),  # qsub -terse of an array
    ],
)
def test_parse_qsub_other_forms(text: str, job_id: str, tasks: parse.TaskRange) -> None:
    found = parse.parse_qsub(text)
    assert (found.job_id, found.tasks) == (job_id, tasks)


@pytest.mark.parametrize(
    "name",
    [
        "qsub-refused-gpu5.txt",
        "qsub-refused-h100.txt",
        "qsub-refused-unknown-complex.txt",
        "qsub-refused-no-script.txt",
        "qsub-sync-refused-gpu5.txt",
    ],
)
def test_refused_qsubs_are_not_read_as_jobs(name: str) -> None:
    text, status = recorded(name)
    assert status != 0
    with pytest.raises(ValueError, match="has been submitted"):
        parse.parse_qsub(text)


@pytest.mark.parametrize("text", ["", "\n", "Submitted batch job 12\n"])
def test_parse_qsub_refuses_other_output(text: str) -> None:
    with pytest.raises(ValueError, match="has been submitted"):
        parse.parse_qsub(text)


def test_task_range() -> None:
    assert parse.TaskRange.parse("2-10:2").ids == (2, 4, 6, 8, 10)
    assert parse.TaskRange.parse("3") == parse.TaskRange(3, 3, 1)
    assert str(parse.TaskRange(1, 4)) == "1-4:1"
    with pytest.raises(ValueError):
        parse.TaskRange.parse("1-")


# -- states ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "state"),
    [
        ("qw", parse.PENDING),
        ("hqw", parse.HELD),
        ("hRwq", parse.HELD),
        ("r", parse.RUNNING),
        ("t", parse.RUNNING),
        ("Rr", parse.RUNNING),
        ("Eqw", parse.ERROR),
        ("dr", parse.DELETING),
        ("dt", parse.DELETING),
        ("s", parse.SUSPENDED),
        ("S", parse.SUSPENDED),
        ("T", parse.SUSPENDED),
    ],
)
def test_job_state(code: str, state: str) -> None:
    assert parse.job_state(code) == state


@pytest.mark.parametrize("code", ["", "RUNNING", "x", "r "])
def test_job_state_refuses(code: str) -> None:
    with pytest.raises(ValueError):
        parse.job_state(code)


# -- qstat -xml --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "jobs"),
    [
        ("qstat-xml-empty.xml", []),
        ("qstat-xml-running.xml", [("r", parse.RUNNING, None)]),
        (
            "qstat-xml-pending.xml",
            [("r", parse.RUNNING, None), ("r", parse.RUNNING, None), ("qw", parse.PENDING, None)],
        ),
        (
            "qstat-xml-held.xml",
            [("r", parse.RUNNING, None), ("hqw", parse.HELD, None), ("hqw", parse.HELD, None)],
        ),
        (
            "qstat-xml-array.xml",
            [("r", parse.RUNNING, None), ("r", parse.RUNNING, "1"), ("qw", parse.PENDING, "2-4:1")],
        ),
    ],
)
def test_qstat_xml_recorded(name: str, jobs: list[tuple[str, str, str | None]]) -> None:
    found = parse.parse_qstat_xml(out(name))
    assert [(j.state_code, j.state, j.tasks) for j in found] == jobs
    for job in found:
        assert job.job_id.isdigit() and job.owner == "root" and job.slots == 1
        assert job.time is not None  # started when running, submitted when pending
        if job.state == parse.RUNNING:
            assert job.queue == "all.q" and (job.host or "").startswith("host")
        else:
            assert job.queue is None and job.host is None


def test_qstat_xml_array_tasks_share_the_job() -> None:
    _, running, pending = parse.parse_qstat_xml(out("qstat-xml-array.xml"))
    assert running.job_id == pending.job_id
    assert parse.TaskRange.parse(pending.tasks or "").ids == (2, 3, 4)


def test_qstat_xml_requested_resources() -> None:
    """With ``qstat -r`` each job lists its hard requests (written from the XML schema)."""
    jobs = parse.parse_qstat_xml(doc("qstat_xml.xml"))
    assert jobs[0].resources == {"gpu": "2", "gpu_type": "a100"}
    assert jobs[0].queue_request == "gpu.q"
    assert [j.state for j in jobs] == [
        parse.RUNNING,
        parse.RUNNING,
        parse.PENDING,
        parse.HELD,
        parse.ERROR,
    ]


@pytest.mark.parametrize("text", ["", "<job_info><job_list/></job_info>", "<other/>", "not xml"])
def test_qstat_xml_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse.parse_qstat_xml(text)


# -- qstat -j ----------------------------------------------------------------------------------


def test_qstat_j_pending_for_want_of_gpus() -> None:
    job = parse.parse_qstat_j(out("qstat-j-pending.txt"))
    assert job.job_id.isdigit() and (job.name, job.owner) == ("pending", "root")
    assert job.resources == {"gpu": "4", "gpu_type": "a100"}
    shortfalls = job.shortfalls()
    assert {s.where for s in shortfalls} == {"host1", "host2", "host3"}
    assert all(s.resource == "gpu" and s.offered < 4 for s in shortfalls)
    assert job.error_reasons == () and job.hold_ids == () and job.tasks is None


def test_qstat_j_running() -> None:
    job = parse.parse_qstat_j(out("qstat-j-running.txt"))
    assert job.resources == {"gpu": "2", "gpu_type": "a100"}
    assert job.scheduling_info == ("There are no messages available",)
    assert job.shortfalls() == ()


def test_qstat_j_hold_jid() -> None:
    job = parse.parse_qstat_j(out("qstat-j-hold-jid.txt"))
    (held_by,) = job.hold_ids
    assert held_by.isdigit()
    assert job.resources == {}
    assert job.scheduling_info == ("job dropped because of job dependencies",)


def test_qstat_j_array() -> None:
    job = parse.parse_qstat_j(out("qstat-j-array.txt"))
    assert job.tasks == parse.TaskRange(1, 4, 1)
    assert [s.offered for s in job.shortfalls()] == [2.0, 2.0, 1.0]


def test_qstat_j_error_reason() -> None:
    job = parse.parse_qstat_j(out("qstat-j-failed.txt"))
    (reason,) = job.error_reasons
    assert 'can\'t open output file "/nonexistent/dir/out"' in reason
    assert job.scheduling_info == ("Job is in error state",)


def test_qstat_j_queue_list_and_queue_instances() -> None:
    job = parse.parse_qstat_j(doc("qstat_j_waiting.txt"))
    assert job.queues == ("gpu.q",)
    assert job.hold_ids == ("12",)
    assert job.shortfalls() == (parse.Shortfall("gpu.q@node2", "gpu", 0.0),)


def test_qstat_j_of_a_missing_job() -> None:
    text, status = recorded("qstat-j-missing.txt")
    assert status == 1
    with pytest.raises(ValueError, match="job_number"):
        parse.parse_qstat_j(text)


# -- qacct -j ----------------------------------------------------------------------------------


def test_qacct_completed() -> None:
    (rec,) = parse.parse_qacct(out("qacct-j-completed.txt"))
    assert rec.job_id.isdigit() and rec.task_id is None
    assert (rec.name, rec.queue, rec.hostname[:4]) == ("ok", "all.q", "host")
    assert (rec.exit_status, rec.failed, rec.failed_reason, rec.succeeded) == (0, 0, "", True)
    assert rec.submitted and rec.started and rec.ended
    assert rec.submitted <= rec.started <= rec.ended
    assert rec.wallclock_s is not None and rec.wallclock_s >= 0
    assert rec.maxvmem_bytes is not None
    assert rec.resources == {"gpu": "1", "gpu_type": "a100"}


def test_qacct_exit_3() -> None:
    (rec,) = parse.parse_qacct(out("qacct-j-exit3.txt"))
    assert (rec.exit_status, rec.failed, rec.succeeded) == (3, 0, False)
    assert rec.resources == {"gpu": "1", "gpu_type": "v100"}


def test_qacct_deleted_while_running() -> None:
    (rec,) = parse.parse_qacct(out("qacct-j-deleted.txt"))
    assert (rec.failed, rec.failed_reason) == (100, "assumedly after job")
    assert rec.exit_status == 137  # printed "137   (Killed)"
    assert rec.maxvmem_bytes is not None  # "4.102MB" in one recording, "0.000B" in another
    assert rec.category == "NONE" and rec.resources == {}


def test_qacct_never_started() -> None:
    (rec,) = parse.parse_qacct(out("qacct-j-failed.txt"))
    assert (rec.failed, rec.failed_reason) == (26, "opening input/output file")
    assert rec.started is None and rec.ended is None  # "-/-"
    assert not rec.succeeded


def test_qacct_array_records() -> None:
    first, second = parse.parse_qacct(doc("qacct_array_deleted.txt"))
    assert (first.task_id, first.exit_status, first.failed) == (1, 3, 0)
    assert (second.task_id, second.exit_status, second.failed) == (2, 137, 100)


def test_qacct_dates_of_older_releases() -> None:
    text = re.sub(
        r"(?m)^start_time .*$", "start_time   12/04/2026 01:54:44.517", out("qacct-j-completed.txt")
    )
    (rec,) = parse.parse_qacct(text)
    assert rec.started == datetime(2026, 12, 4, 1, 54, 44, 517000)


def test_qacct_sizes() -> None:
    text = re.sub(r"(?m)^maxvmem .*$", "maxvmem      4.102MB", out("qacct-j-completed.txt"))
    assert parse.parse_qacct(text)[0].maxvmem_bytes == round(4.102 * 1024**2)


def test_qacct_of_a_missing_job() -> None:
    text, status = recorded("qacct-j-missing.txt")
    assert status == 1
    assert parse.parse_qacct(text) == []


def test_qacct_refuses_a_record_without_exit_status() -> None:
    text = "==============================================================\njobnumber 3\n"
    with pytest.raises(ValueError, match="exit_status"):
        parse.parse_qacct(text)


# -- qhost -F, qconf -sc -----------------------------------------------------------------------


def test_qhost_gpus() -> None:
    idle = parse.parse_qhost(out("qhost-F-gpu.txt"))
    assert [(h.name, h.gpus, h.gpu_type) for h in idle] == [
        ("host1", 4, "a100"),
        ("host2", 4, "a100"),
        ("host3", 2, "v100"),
    ]
    assert idle[0].sources == {"gpu": "hc", "gpu_type": "hf"}
    assert (idle[0].arch, idle[0].cpus) == ("lx-amd64", 2)
    busy = parse.parse_qhost(out("qhost-F-gpu-in-use.txt"))
    assert [h.gpu_type for h in busy] == ["a100", "a100", "v100"]
    assert sum(h.gpus or 0 for h in busy) < sum(h.gpus or 0 for h in idle)  # what is free


def test_qhost_without_resources() -> None:
    found = parse.parse_qhost(out("qhost.txt"))
    assert [h.name for h in found] == ["host1", "host2", "host3"]
    assert all(h.gpus is None for h in found)


def test_qconf_sc() -> None:
    complexes = parse.parse_qconf_sc(out("qconf-sc.txt"))
    assert complexes["gpu"].is_consumable and complexes["gpu"].type == "INT"
    assert not complexes["gpu_type"].is_consumable
    assert complexes["gpu_type"].type == "STRING"
    assert complexes["h_rt"].type == "TIME"
    assert "#name" not in complexes


def test_qconf_sc_refuses_short_lines() -> None:
    with pytest.raises(ValueError, match="8 columns"):
        parse.parse_qconf_sc("gpu gpu INT\n")


# -- every recording -----------------------------------------------------------------------------


def _parser_for(text: str) -> object | None:
    """The parser a recording's content calls for, by its shape; None for the commands not
    parsed here (plain qstat, qhost -q, qdel, a refusal, qstat -j -xml)."""
    head = text.lstrip()
    if head.startswith("<?xml") and "<job_info" in head:
        return parse.parse_qstat_xml
    if head.startswith("HOSTNAME") and "Host Resource" in head:
        return parse.parse_qhost
    if head.startswith("#name"):
        return parse.parse_qconf_sc
    if head.startswith("=====") and "jobnumber" in head:
        return parse.parse_qacct
    if head.startswith("=====") and "job_number:" in head:
        return parse.parse_qstat_j
    if "has been submitted" in head:
        return parse.parse_qsub
    return None


PARSED = [
    p.name
    for p in sorted(FIXTURES.glob("*.*"))
    if p.suffix in (".txt", ".xml")
    and p.read_text().rstrip("\n").rpartition("\n")[2].startswith("exit=")
    and _parser_for(recorded(p.name)[0]) is not None
]


@pytest.mark.parametrize("name", PARSED)
def test_every_recording_of_a_parsed_command_parses(name: str) -> None:
    text, _ = recorded(name)
    parser = _parser_for(text)
    assert callable(parser)
    parser(text)


# -- states in clusterjob's words ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "state", "exit_code", "reason"),
    [
        ("qacct-j-completed.txt", "COMPLETED", 0, ""),
        ("qacct-j-exit3.txt", "FAILED", 3, ""),
        ("qacct-j-deleted.txt", "CANCELLED", 137, "failed 100: assumedly after job"),
        ("qacct-j-failed.txt", "FAILED", 0, "failed 26: opening input/output file"),
    ],
)
def test_outcome_of_accounted_jobs(name: str, state: str, exit_code: int, reason: str) -> None:
    (rec,) = parse.parse_qacct(out(name))
    assert states.outcome(rec) == states.Outcome(state, exit_code, reason)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("qstat-xml-pending.xml", ["RUNNING", "RUNNING", "PENDING"]),
        ("qstat-xml-held.xml", ["RUNNING", "PENDING", "PENDING"]),
        ("qstat-xml-array.xml", ["RUNNING", "RUNNING", "PENDING"]),
    ],
)
def test_live_states(name: str, expected: list[str]) -> None:
    assert [states.live_state(j) for j in parse.parse_qstat_xml(out(name))] == expected


def test_every_qstat_word_has_a_state() -> None:
    words = {parse.job_state(code) for code in ("qw", "hqw", "r", "Eqw", "dr", "s")}
    assert all(states.live_state(_queued(w)) for w in words)


def _queued(state: str) -> parse.QueuedJob:
    return parse.QueuedJob("1", "x", "u", "qw", state, 1)


def test_a_job_is_what_its_tasks_are() -> None:
    _, running, pending = parse.parse_qstat_xml(out("qstat-xml-array.xml"))
    assert states.job_state([running, pending], []) == "RUNNING"
    assert states.job_state([pending], []) == "PENDING"


def test_an_ended_job_is_its_worst_task() -> None:
    first, second = parse.parse_qacct(doc("qacct_array_deleted.txt"))
    assert states.job_state([], [first, second]) == states.Outcome(
        "CANCELLED", 137, "failed 100: assumedly after job"
    )
    assert states.job_state([], [first]) == states.Outcome("FAILED", 3, "")
    (done,) = parse.parse_qacct(out("qacct-j-completed.txt"))
    assert states.job_state([], [done]) == states.Outcome("COMPLETED", 0, "")


def test_a_job_in_neither_is_not_known_yet() -> None:
    assert states.job_state([], []) is None
