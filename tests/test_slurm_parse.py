"""Parsers against output recorded from a real Slurm 22.05 (tests/fixtures/slurm/README.md)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from clusterjob.slurm import parse

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("text", "job_id", "cluster"),
    [
        (fixture("sbatch_parsable.txt"), "11", None),
        ("123;lab-a\n", "123", "lab-a"),
        ("  7\n", "7", None),
    ],
)
def test_parse_job_id(text: str, job_id: str, cluster: str | None) -> None:
    assert parse.parse_job_id(text) == parse.SubmittedJobId(job_id, cluster)


@pytest.mark.parametrize("text", ["", "\n", "Submitted batch job 12\n", "12;\n", "abc"])
def test_parse_job_id_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse.parse_job_id(text)


@pytest.mark.parametrize(
    ("name", "job_id", "start", "nodes", "partition"),
    [
        ("sbatch_test_only_now.stderr.txt", "1", datetime(2026, 11, 29, 16, 18, 15), "recn1",
         "gpu"),
        ("sbatch_test_only_sandbox.stderr.txt", "7", datetime(2026, 11, 29, 16, 26, 53), "gpu1",
         "gpu"),
        # Slurm's "never" while the nodes are busy with unlimited jobs: year 10194
        ("sbatch_test_only_far_future.stderr.txt", "10", None, "recn1", "gpu"),
    ],
)  # fmt: skip
def test_parse_test_only(name, job_id, start, nodes, partition) -> None:
    estimate = parse.parse_test_only(fixture(name))
    assert (estimate.job_id, estimate.start, estimate.nodes, estimate.partition) == (
        job_id,
        start,
        nodes,
        partition,
    )
    assert estimate.processors == 1


def test_parse_test_only_rejects_an_error() -> None:
    with pytest.raises(ValueError):
        parse.parse_test_only(fixture("sbatch_err_partition.stderr.txt"))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        # every error line, once each, Slurm's own summary last
        (
            "sbatch_err_partition.stderr.txt",
            "invalid partition specified: nope; Invalid partition name specified",
        ),
        ("sbatch_err_invalid_gres.stderr.txt", "Invalid generic resource (gres) specification"),
        ("sbatch_err_bad_gres_type.stderr.txt", "Requested node configuration is not available"),
        ("sbatch_err_socket_timeout.stderr.txt", "Socket timed out on send/recv operation"),
        ("sbatch_err_missing_script.stderr.txt", "Unable to open file nothere.sh"),
        # the sandbox's job_submit.lua: its line first, Slurm's summary after
        (
            "sbatch_err_job_submit_lua.stderr.txt",
            "You must always specify a type when requesting gpu GRES; Unspecified error",
        ),
        (
            "sbatch_test_only_err_job_submit_lua.stderr.txt",
            "You must always specify a type when requesting gpu GRES; Unspecified error",
        ),
    ],
)
def test_sbatch_error_message(name: str, message: str) -> None:
    assert parse.sbatch_error_message(fixture(name)) == message


def test_parse_scancel_unknown() -> None:
    """scancel --verbose 99999 99998_3 on the sandbox (22.05): exit 0, both named on stderr."""
    text = fixture("scancel_verbose_unknown.stderr.txt")
    assert parse.parse_scancel_unknown(text) == ["99999", "99998_3"]
    assert parse.parse_scancel_unknown("scancel: Terminating job 12\n") == []
    assert parse.parse_scancel_unknown("") == []


def test_parse_squeue_states_reasons_and_paths() -> None:
    jobs = {j.job_id: j for j in parse.parse_squeue(fixture("squeue_jobs.txt"))}
    assert sorted(jobs, key=int) == ["2", "3", "4", "5", "13", "15"]  # 99999 is not there
    table = [
        # id, state, reason, nodes
        ("2", "COMPLETED", None, "recn1"),
        ("3", "CANCELLED", None, "recn1"),
        ("4", "RUNNING", None, "recn1"),
        ("5", "FAILED", "BadConstraints", None),
        ("13", "PENDING", "PartitionTimeLimit", None),
        ("15", "PENDING", "Priority", None),
    ]
    for job_id, state, reason, nodes in table:
        j = jobs[job_id]
        assert (j.state, j.reason, j.nodes) == (state, reason, nodes), job_id
    running = jobs["4"]
    assert running.cluster == "recclu"
    assert running.name == "sleeper"
    assert running.comment == "clusterjob:toksleep"
    assert running.tres_per_node == "gres:gpu:a100:2"
    assert running.start == datetime(2026, 11, 29, 16, 18, 55)
    assert running.stdout == "/tmp/cjrec/jobs/%x-%j.out"  # squeue does not expand it
    assert running.stderr == "/tmp/cjrec/jobs/%x-%j.err"
    assert jobs["13"].start is None  # N/A


def test_parse_squeue_sandbox_recording() -> None:
    jobs = {j.job_id: j for j in parse.parse_squeue(fixture("squeue_jobs_sandbox.txt"))}
    assert jobs["3"].state == "FAILED" and jobs["3"].reason == "NonZeroExitCode"
    assert jobs["6"].reason == "BeginTime"
    assert {j.cluster for j in jobs.values()} == {"sandbox"}


def test_parse_squeue_empty_and_malformed() -> None:
    assert parse.parse_squeue("") == []
    with pytest.raises(ValueError):
        parse.parse_squeue("12|RUNNING|None\n")


def test_parse_squeue_name_with_separator_stays_whole() -> None:
    line = fixture("squeue_jobs.txt").splitlines()[0] + parse.DELIMITER + "more"
    assert parse.parse_squeue(line)[0].name.endswith(parse.DELIMITER + "more")


def test_squeue_format_matches_the_recorded_command() -> None:
    fields = parse.squeue_format().split(",")
    assert fields[0] == "JobArrayID:0" + parse.DELIMITER
    assert fields[-1] == "Name:0"
    assert len(fields) == len(parse.SQUEUE_FIELDS)


@pytest.mark.parametrize(
    ("job_id", "state", "exit_code", "signal", "nodes", "reason"),
    [
        ("2", "COMPLETED", 0, 0, "gpu1", None),
        ("3", "FAILED", 3, 0, "gpu1", None),
        ("4", "CANCELLED", 0, 0, "gpu2", None),  # "CANCELLED by 0"
    ],
)
def test_parse_sacct(job_id, state, exit_code, signal, nodes, reason) -> None:
    jobs = {j.job_id: j for j in parse.parse_sacct(fixture("sacct_jobs.txt"))}
    j = jobs[job_id]
    assert (j.state, j.exit_code, j.signal, j.nodes, j.reason) == (
        state,
        exit_code,
        signal,
        nodes,
        reason,
    )
    assert j.cluster == "sandbox"


def test_parse_sacct_drops_steps_and_reads_pending() -> None:
    with_steps = parse.parse_sacct(fixture("sacct_jobs_with_steps.txt"))
    assert [j.job_id for j in with_steps] == ["2", "3", "4"]
    assert "gres/gpu:a100=1" in (with_steps[0].alloc_tres or "")
    pending = {j.job_id: j for j in parse.parse_sacct(fixture("sacct_pending.txt"))}
    assert pending["12"].state == "PENDING"
    assert pending["12"].start is None and pending["12"].nodes is None
    assert pending["12"].reason == "BeginTime"


@pytest.mark.parametrize(
    ("name", "state", "reason", "exit_code", "signal", "stdout", "stderr"),
    [
        ("running", "RUNNING", None, 0, 0, "sleeper-3.out", "sleeper-3.err"),
        ("pending", "PENDING", "Resources", 0, 0, "sleeper-4.out", "sleeper-4.err"),
        ("completed", "COMPLETED", None, 0, 0, "hello-2.out", "hello-2.out"),
        ("failed", "FAILED", "BadConstraints", 0, 1, "hello-5.out", "hello-5.out"),
        ("cancelled", "CANCELLED", None, 0, 15, "sleeper-3.out", "sleeper-3.err"),
    ],
)
def test_parse_scontrol_job(name, state, reason, exit_code, signal, stdout, stderr) -> None:
    (job,) = parse.parse_scontrol_jobs(fixture(f"scontrol_show_job_{name}.txt"))
    assert (job.state, job.reason, job.exit_code, job.signal) == (state, reason, exit_code, signal)
    # scontrol expands the --output pattern %x-%j
    assert (job.stdout, job.stderr) == (f"/tmp/cjrec/jobs/{stdout}", f"/tmp/cjrec/jobs/{stderr}")
    assert job.work_dir == "/tmp/cjrec/jobs"
    assert job.comment and job.comment.startswith("clusterjob:")
    assert job.raw["AllocNode:Sid"].startswith("localhost:")


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        (
            "running",
            dict(job_id="3", nodes="recn1", start=datetime(2026, 11, 29, 16, 18, 18),
                 run_time="00:00:32"),
        ),
        (
            "pending",  # StartTime is Slurm's expected start; no nodes yet
            dict(job_id="4", nodes=None, start=datetime(2027, 11, 29, 16, 18, 18),
                 run_time="00:00:00"),
        ),
    ],
)  # fmt: skip
def test_parse_scontrol_job_every_field(name: str, fields: dict[str, object]) -> None:
    """Field by field, so a value read from the wrong key (or not at all) shows."""
    (job,) = parse.parse_scontrol_jobs(fixture(f"scontrol_show_job_{name}.txt"))
    got = {k: getattr(job, k) for k in fields}
    assert got == fields
    assert (job.name, job.partition, job.end, job.tres_per_node) == (
        "sleeper",
        "gpu",
        None,
        "gres:gpu:a100:2",
    )
    assert (job.tres_per_job, job.tres_per_task) == (None, None)
    assert job.raw["JobId"] == job.job_id and job.raw["UserId"] == "root(0)"


def test_parse_scontrol_config_cluster_name() -> None:
    config = parse.parse_scontrol_config(fixture("scontrol_show_config.txt"))
    assert config["ClusterName"] == "recclu"
    assert config["MinJobAge"] == "600 sec"


@pytest.mark.parametrize(
    ("name", "state", "flags", "gres_used", "reason"),
    [
        ("scontrol_show_node_mixed.txt", "MIXED", (), None, None),
        (
            "scontrol_show_node_detail_alloc.txt",
            "MIXED",
            (),
            "gpu:a100:2(IDX:0-1),gpu:v100:0(IDX:N/A)",
            None,
        ),
        (
            "scontrol_show_node_detail_drain_alloc.txt",
            "MIXED",
            ("DRAIN",),
            "gpu:a100:2(IDX:0-1),gpu:v100:0(IDX:N/A)",
            "clusterjob: GPU 1 is V100, map says A100 [root@2026-11-29T16:21:50]",
        ),
        (
            "scontrol_show_node_drain_invalid.txt",
            "IDLE",
            ("DRAIN", "INVALID_REG"),
            None,
            "Low socket*core*thread count, Low CPUs [root@2026-11-29T16:17:56]",
        ),
    ],
)
def test_parse_scontrol_nodes(name, state, flags, gres_used, reason) -> None:
    (node,) = parse.parse_scontrol_nodes(fixture(name))
    assert node.name == "recn1"
    assert node.gres == "gpu:a100:2,gpu:v100:1"
    assert (node.state, node.flags, node.gres_used, node.reason) == (
        state,
        flags,
        gres_used,
        reason,
    )
    assert node.drained == ("DRAIN" in flags)
    assert node.partitions == ("gpu", "debug")
    assert node.raw["OS"].startswith("Linux ")  # a value with spaces


def test_scontrol_reason_may_contain_equals_signs() -> None:
    line = "NodeName=n1 State=IDLE+DRAIN Gres=gpu:a100:4 Reason=clusterjob: slot=2 bus=0000:07:00.0"
    (node,) = parse.parse_scontrol_nodes(line)
    assert node.reason == "clusterjob: slot=2 bus=0000:07:00.0"


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("/out/%x-%j.out", "/out/train-42.out"),
        ("slurm-%j.out", "slurm-42.out"),
        ("%u/%N/%5j.log", "ana/gpu1/00042.log"),
        ("100%%-%A", "100%-42"),
    ],
)
def test_expand_output_pattern(pattern: str, expected: str) -> None:
    got = parse.expand_output_pattern(
        pattern, job_id="42", name="train", user="ana", first_node="gpu1"
    )
    assert got == expected


@pytest.mark.parametrize(
    ("state", "final"),
    [("CANCELLED by 0", True), ("COMPLETED", True), ("RUNNING", False), ("PENDING", False),
     ("OUT_OF_MEMORY", True), ("REQUEUED", False), ("", False)],
)  # fmt: skip
def test_is_final(state: str, final: bool) -> None:
    assert parse.is_final(state) is final


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        (
            "billing=2,cpu=2,gres/gpu:a100=2,gres/gpu=2,mem=120G,node=1",
            "gres/gpu:a100=2,gres/gpu=2",
        ),
        ("gres:gpu:v100:1", "gres:gpu:v100:1"),
        ("cpu=1,mem=1G,node=1", None),
        ("", None),
        (None, None),
    ],
)
def test_gpu_tres(text: str | None, gpus: str | None) -> None:
    assert parse.gpu_tres(text) == gpus


def test_squeue_gpus_of_jobs_that_asked_per_job_or_per_task() -> None:
    """Recorded on the sandbox: `sbatch --gpus=v100:2` and `-n 2 --gpus-per-task=a100:1`
    leave tres-per-node empty; their GPUs are in tres-per-job and tres-per-task."""
    per_job, per_task = parse.parse_squeue(fixture("squeue_gpus_per_job_task_sandbox.txt"))
    assert (per_job.tres_per_node, per_job.tres_per_job) == (None, "gres:gpu:v100:2")
    assert parse.requested_gpu_counts(per_job.tres_per_job) == {"v100": 2}
    assert (per_task.tres_per_node, per_task.tres_per_task) == (None, "gres:gpu:a100:1")
    assert parse.requested_gpu_counts(None, (per_task.tres_per_task, 2)) == {"a100": 2}
    running = {j.job_id: j for j in parse.parse_squeue(fixture("squeue_jobs_sandbox.txt"))}
    assert all(not j.tres_per_job and not j.tres_per_task for j in running.values())


# -- GPU counts in every TRES spelling -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("cpu=2,gres/gpu=2,gres/gpu:a100=2", {"a100": 2}),  # typed entries win
        ("cpu=2,gres/gpu=3", {None: 3}),
        ("cpu=2,gres/gpu=0", {}),
        ("cpu=2,mem=4G,gres/gpu=x", {}),  # a value that is not a count is skipped
        ("gres/gpu:a100=1,gres/gpu:v100=2", {"a100": 1, "v100": 2}),
        ("gres:gpu:a100:2", {"a100": 2}),  # 21.08 and later
        ("gres/gpu:a100:1", {"a100": 1}),  # 24.11 and later
        ("gpu:1", {None: 1}),  # before 21.08
        ("gres:gpu:rtx2080", {"rtx2080": 1}),
        ("gres:gpu:2,gres:gpu:a100:1", {None: 2, "a100": 1}),
        ("gres:gpu:a100:1,gres:gpu:a100:2", {"a100": 3}),
        ("gres:mps:100,gres:gpu:1", {None: 1}),  # not a GPU
        ("gres:gpu:a:b:c:2", {}),  # unreadable: left out
        ("gres:gpu:a100:2,cpu=4", {"a100": 2}),
        ("", {}),
        (None, {}),
    ],
)
def test_tres_gpu_counts(text: str | None, counts: dict[str | None, int]) -> None:
    assert parse.tres_gpu_counts(text) == counts
    assert parse.alloc_tres_gpu_counts(text) == counts


def test_tres_gpu_counts_says_what_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="clusterjob.slurm"):
        parse.tres_gpu_counts("gres:gpu:a:b:c:2")
    assert "ignored TRES item 'gres:gpu:a:b:c:2' (in 'gres:gpu:a:b:c:2')" in caplog.text


@pytest.mark.parametrize(
    ("record", "counts"),
    [
        ({"AllocTRES": "cpu=2,gres/gpu:a100=2", "TRES": "gres/gpu:v100=1"}, {"a100": 2}),
        ({"AllocTRES": "cpu=2", "TRES": "cpu=2,gres/gpu:v100=1"}, {"v100": 1}),
        ({"TresPerJob": "gres:gpu:3", "TresPerNode": "gres:gpu:1", "NumNodes": "2"}, {None: 3}),
        ({"TresPerNode": "gres:gpu:a100:2", "NumNodes": "3"}, {"a100": 6}),
        ({"TresPerNode": "gres:gpu:a100:2", "NumNodes": "2-4"}, {"a100": 4}),  # pending range
        ({"TresPerNode": "gres:gpu:a100:2"}, {"a100": 2}),
        ({"TresPerNode": "gres:gpu:a100:2", "NumNodes": "N/A"}, {"a100": 2}),
        ({"TresPerTask": "gres/gpu:1", "NumTasks": "4", "NumNodes": "2"}, {None: 4}),
        ({"TRES": "cpu=1,node=1", "TresPerNode": "gres:pfsdir:1"}, {}),
        ({}, {}),
    ],
)
def test_job_gpu_counts(record: dict[str, str], counts: dict[str | None, int]) -> None:
    assert parse.job_gpu_counts(record) == counts


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("gpu:a100:2,gpu:v100:2,pfsdir:scratch:1", "gpu:a100:2,gpu:v100:2"),
        ("pfsdir:scratch:1", None),
        ("gpu:a100:2(IDX:0-1),gpu:a:b:c:1", "gpu:a100:2(IDX:0-1)"),
        (None, None),
    ],
)
def test_gpu_gres(text: str | None, gpus: str | None) -> None:
    assert parse.gpu_gres(text) == gpus


# -- small readers, row by row (what mutation testing showed untested) ------------------------


@pytest.mark.parametrize(
    ("item", "entry"),
    [
        ("gpu:a100", parse.GresEntry("gpu", "a100", 1)),  # name:type, count left out
        ("tmp:844G", parse.GresEntry("tmp", None, 844 * 1024**3)),
        ("mem:2K", parse.GresEntry("mem", None, 2048)),
        ("gpu:a100:2(IDX:)", parse.GresEntry("gpu", "a100", 2)),
        ("gpu:a100:2(IDX:0,3)", parse.GresEntry("gpu", "a100", 2, "0,3")),
        ("pfsdir:scratch:no_consume:1",
         parse.GresEntry("pfsdir", "scratch", 1, None, ("no_consume",))),
        ("gpu:a:b:2", None),  # two types
        ("gpu:a100:x:y", None),
        ("gpu:a100:2)", None),
        ("9gpu:1", None),
        ("", None),
    ],
)  # fmt: skip
def test_parse_gres_item(item: str, entry: parse.GresEntry | None) -> None:
    assert parse.parse_gres_item(item) == entry


@pytest.mark.parametrize(
    ("text", "entries", "unknown"),
    [
        ("(null)", [], []),
        ("N/A", [], []),
        ("  ", [], []),
        (None, [], []),
        ("gpu:a:b:2,gpu:1", [parse.GresEntry("gpu", None, 1)], ["gpu:a:b:2"]),
    ],
)
def test_parse_gres_items(text: str | None, entries: list, unknown: list) -> None:
    assert parse.parse_gres_items(text) == (entries, unknown)


def test_parse_gres_logs_the_item_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="clusterjob.slurm"):
        parse.parse_gres("gpu:a:b:c:2,gpu:a100:2")
    assert "ignored GRES item 'gpu:a:b:c:2' (in 'gpu:a:b:c:2,gpu:a100:2')" in caplog.text


def test_gpu_counts_add_up_per_type() -> None:
    counts = parse.gpu_counts("gpu:a100:1,gpu:v100:2,gpu:a100:1,gpu:1")
    assert counts == {"a100": 2, "v100": 2, None: 1}


@pytest.mark.parametrize(
    ("state", "normal"),
    [
        ("CANCELLED by 1000", "CANCELLED"),
        ("RUNNING+", "RUNNING"),
        ("completing", "COMPLETING"),
        ("", ""),
    ],
)
def test_normalise_state(state: str, normal: str) -> None:
    assert parse.normalise_state(state) == normal


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("2:0", (2, 0)),
        ("0:15", (0, 15)),
        ("1", (1, None)),
        ("x:1", (None, None)),
        ("", (None, None)),
    ],
)
def test_parse_exit_code(text: str, parsed: tuple[int | None, int | None]) -> None:
    assert parse.parse_exit_code(text) == parsed


@pytest.mark.parametrize(
    ("state", "flags", "unavailable"),
    [
        ("IDLE", (), False),
        ("MIXED", (), False),
        ("IDLE*", (), True),  # not responding
        ("DOWN", (), True),
        ("IDLE", ("DRAIN",), True),
        ("ALLOCATED", ("COMPLETING",), False),
    ],
)
def test_node_unavailable(state: str, flags: tuple[str, ...], unavailable: bool) -> None:
    node = parse.NodeRecord("n1", state, flags, None, None, None, ())
    assert parse.node_unavailable(node) is unavailable


def test_null_values() -> None:
    assert [parse._null(v) for v in ("", " (null) ", "N/A", "x")] == [None, None, None, "x"]


def test_split_top_keeps_nested_parentheses_together() -> None:
    assert parse._split_top("a((b),c),d") == ["a((b),c)", "d"]
    assert parse._split_top("a(b,(c,d)),e") == ["a(b,(c,d))", "e"]


def test_expand_output_pattern_big_j_and_no_node() -> None:
    got = parse.expand_output_pattern(
        "%J-%N-%A.out", job_id="7", name="n", user="u", first_node=None
    )
    assert got == "7--7.out"


def test_parse_job_id_says_what_sbatch_printed() -> None:
    with pytest.raises(ValueError, match=r"^sbatch printed 'Submitted x', not a job id$"):
        parse.parse_job_id("Submitted x\n")


def test_a_minimal_scontrol_job_record_reads_as_nothing_known() -> None:
    """Keys a release does not print are empty, never a made-up value."""
    (job,) = parse.parse_scontrol_jobs("JobId=5\n")
    assert (job.job_id, job.name, job.state, job.reason, job.partition) == ("5", "", "", None, "")
    assert (job.exit_code, job.signal, job.nodes, job.start, job.end) == (
        None,
        None,
        None,
        None,
        None,
    )
    assert (job.run_time, job.work_dir, job.stdout, job.stderr, job.comment) == (
        "",
        None,
        None,
        None,
        None,
    )
    assert (job.tres_per_node, job.tres_per_job, job.tres_per_task) == (None, None, None)


def test_scontrol_job_end_time_and_gpus_per_task() -> None:
    (done,) = parse.parse_scontrol_jobs(fixture("scontrol_show_job_completed.txt"))
    assert done.end is not None and done.start is not None and done.end >= done.start
    (job,) = parse.parse_scontrol_jobs("JobId=6 TresPerTask=gres/gpu:1 TresPerJob=gres:gpu:2\n")
    assert (job.tres_per_task, job.tres_per_job) == ("gres/gpu:1", "gres:gpu:2")


MULTILINE_NODES = """\
NodeName=n1 Arch=x86_64 CoresPerSocket=1
   Gres=gpu:a100:2
   State=IDLE+DRAIN ThreadsPerCore=1
   Reason=card 1 bad: ecc=12 x [root@2026-01-01T00:00:00]
   Partitions=gpu,debug
   Comment=(null)

NodeName=n2 Arch=x86_64
   Gres=gpu:1
   State=DOWN*
   Reason=Not responding [slurm@2026-01-01T00:00:00]
   Partitions=gpu
"""


def test_multiline_node_records_with_free_text_reasons() -> None:
    """A Reason runs to the end of its own line, whatever it contains; the keys after it are
    read as usual."""
    n1, n2 = parse.parse_scontrol_nodes(MULTILINE_NODES)
    assert (n1.name, n1.state, n1.flags, n1.gres) == ("n1", "IDLE", ("DRAIN",), "gpu:a100:2")
    assert n1.reason == "card 1 bad: ecc=12 x [root@2026-01-01T00:00:00]"
    assert n1.partitions == ("gpu", "debug")
    assert n1.raw["Comment"] == "(null)" and "ecc" not in n1.raw
    assert (n2.name, n2.state, n2.flags, n2.gres) == ("n2", "DOWN*", (), "gpu:1")
    assert n2.reason == "Not responding [slurm@2026-01-01T00:00:00]"
    assert n2.partitions == ("gpu",)


def test_squeue_and_sacct_rows_field_by_field() -> None:
    """The first row of each recording, whole: a field read from the wrong column shows."""
    rows = parse.parse_squeue("\n" + fixture("squeue_jobs.txt"))  # a blank line is skipped
    assert len(rows) == 6
    first = rows[0]
    assert (first.job_id, first.cluster, first.state, first.reason) == (
        "13", "recclu", "PENDING", "PartitionTimeLimit",
    )  # fmt: skip
    assert (first.partition, first.nodes, first.elapsed, first.time_limit) == (
        "debug", None, "0:00", "1:00:00",
    )  # fmt: skip
    assert (first.start, first.submit) == (None, datetime(2026, 11, 29, 16, 18, 23))
    assert (first.user, first.work_dir, first.name) == ("root", "/tmp/cjrec/jobs", "hello")
    assert (first.stdout, first.comment) == ("/tmp/cjrec/jobs/%x-%j.out", "clusterjob:tok123abc")
    done = parse.parse_sacct("\n" + fixture("sacct_jobs.txt"))
    assert len(done) == 3
    job = done[0]
    assert (job.job_id, job.cluster, job.name, job.state) == ("2", "sandbox", "rec-ok", "COMPLETED")
    assert (job.exit_code, job.signal, job.elapsed, job.nodes) == (0, 0, "00:00:01", "gpu1")
    assert (job.start, job.end, job.submit) == (
        datetime(2026, 11, 29, 16, 26, 34),
        datetime(2026, 11, 29, 16, 26, 35),
        datetime(2026, 11, 29, 16, 26, 33),
    )
    assert (job.partition, job.work_dir, job.reason) == ("gpu", "/tmp/cjsb", None)


def test_a_row_with_the_wrong_number_of_fields_is_refused() -> None:
    line = fixture("squeue_jobs.txt").splitlines()[0]
    short = parse.DELIMITER.join(line.split(parse.DELIMITER)[:-2])
    width = len(parse.SQUEUE_FIELDS)
    with pytest.raises(ValueError) as info:
        parse.parse_squeue(short)
    assert str(info.value) == f"squeue line has {width - 2} fields, expected {width}: {short!r}"
    sacct_line = fixture("sacct_jobs.txt").splitlines()[0] + parse.DELIMITER + "x"
    width = len(parse.SACCT_FIELDS)
    with pytest.raises(ValueError) as info:
        parse.parse_sacct(sacct_line)
    assert str(info.value) == (
        f"sacct line has {width + 1} fields, expected {width}: {sacct_line!r}"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", (0, 0)),
        ("768", (3, 0)),  # 22.05: exited with 3
        ("9", (0, 9)),  # 22.05: killed by SIGKILL
        ("15", (0, 15)),
        ("65280", (255, 0)),
        ("65536", (None, None)),
        ("4294967294", (None, None)),  # NO_VAL
        ("-2", (None, None)),
        ("3:0", (3, 0)),  # 24.11 on
        ("0:15", (0, 15)),
        ("", (None, None)),
        ("N/A", (None, None)),
    ],
)
def test_squeues_exit_code_column_in_either_form(text: str, expected: tuple) -> None:
    assert parse.parse_queued_exit_code(text) == expected


def test_squeue_rows_carry_the_exit_code_of_an_ended_job() -> None:
    jobs = {j.name: j for j in parse.parse_squeue(fixture("squeue_jobs_sandbox.txt"))}
    assert (jobs["rec-fail"].state, jobs["rec-fail"].exit_code) == ("FAILED", 3)
    assert (jobs["rec-ok"].exit_code, jobs["rec-ok"].signal) == (0, 0)
    arrays = {j.job_id: j for j in parse.parse_squeue(fixture("squeue_array_done_sandbox.txt"))}
    assert (arrays["516_3"].exit_code, arrays["516_0"].exit_code) == (7, 0)


@pytest.mark.parametrize(
    ("counts", "spelled"),
    [
        ({"a100": 2}, "gres/gpu:a100=2,gres/gpu=2"),
        ({None: 3}, "gres/gpu=3"),
        ({"a100": 1, "v100": 2}, "gres/gpu:a100=1,gres/gpu:v100=2,gres/gpu=3"),
        ({}, None),
    ],
)
def test_gpu_counts_spelled_as_alloc_tres(counts: dict, spelled: str | None) -> None:
    assert parse.alloc_tres_spelling(counts) == spelled
    if spelled:  # read back as the same counts
        assert parse.tres_gpu_counts(spelled) == counts


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-29T16:18:15",
        " 2026-11-29T16:18:15\n",
        "0001-01-01T00:00:00",
        "9999-12-31T23:59:59",
        "Unknown",
        "N/A",
        "None",
        "(null)",
        "",
        "10194-01-01T00:00:00",  # sbatch --test-only for a job that could never start
        "0000-01-01T00:00:00",
        "2026-02-30T00:00:00",
        "2026-11-29T24:00:00",
        "2026-11-29T23:59:60",
        "2026-11-29 16:18:15",
        "2026-11-29T16:18",
        "2026-11-29T16:18:15.5",
        "2026-11-29T16:18:15+01:00",
    ],
)
def test_parse_time_reads_what_strptime_reads(text: str) -> None:
    """parse_time reads Slurm's timestamps without strptime (whose first call costs a
    module and locale tables): the same answer as strptime with Slurm's format, for each
    shape a Slurm client prints and the near misses."""
    try:
        expected: datetime | None = datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        expected = None
    assert parse.parse_time(text) == expected
