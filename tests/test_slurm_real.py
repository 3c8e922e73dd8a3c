"""The parsers against Slurm output recorded by other people on other sites and releases.

Each file of tests/fixtures/slurm/real/ starts with ``#`` lines naming its source (a public
repository or issue thread), the Slurm version where known and what was edited; the rest is
the output as printed. The expected readings below are written by hand from that output.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from clusterjob.errors import SlurmError
from clusterjob.jobs.explain import sbatch_hint, with_sbatch_hint
from clusterjob.site.loader import load_site
from clusterjob.slurm import parse

REAL = Path(__file__).parent / "fixtures" / "slurm" / "real"


def real(name: str) -> str:
    """The recorded output of a fixture, without its provenance header."""
    lines = (REAL / name).read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


def test_every_real_fixture_names_its_source_and_what_was_edited() -> None:
    for path in sorted(REAL.glob("*.txt")):
        header = [line for line in path.read_text().splitlines() if line.startswith("# ")]
        text = "\n".join(header)
        assert "source:" in text, path.name
        assert "edited:" in text, path.name
        assert "version" in text.casefold(), path.name
        assert real(path.name).strip(), path.name


def _columns(name: str) -> list[list[str]]:
    return [line.split() for line in real(name).splitlines() if line.strip()]


# --- GRES items: Gres= / GresUsed= values ----------------------------------------------------

# OSC: count-only resources beside the GPUs, socket lists with commas, `no_consume` flags.
OSC = {
    # node: (configured GPUs, GPUs in use)
    "a0001": ({"a100": 4}, {"a100": 4}),
    "a0008": ({"a100": 4}, {"a100": 2}),
    "a0016": ({"a100": 4}, {"a100": 2}),
    "a0020": ({"a100": 4}, {"a100": 3}),
    "a0023": ({"a100": 4}, {"a100": 4}),
    "a0101": ({"a100": 2}, {"a100": 2}),
    "a0349": ({}, {}),  # no GPUs, only count-only GRES
    "a0351": ({"a100": 3}, {"a100": 3}),
}


@pytest.mark.parametrize(("node", "configured", "used"), [(n, *v) for n, v in OSC.items()])
def test_osc_gres_with_no_consume_items(node: str, configured: dict, used: dict) -> None:
    rows = {row[0]: row for row in _columns("sinfo_gres_osc.txt")}
    _, gres, gres_used, _state = rows[node]
    assert parse.gpu_counts(gres) == configured
    assert parse.gpu_counts(gres_used) == used
    entries, unknown = parse.parse_gres_items(gres)
    assert unknown == []
    by_name = {(e.name, e.type): e for e in entries}
    assert by_name[("pfsdir", "scratch")] == parse.GresEntry(
        "pfsdir", "scratch", 1, None, ("no_consume",)
    )
    if node != "a0349":
        # `nsight:no_consume:1` is an untyped count-only GRES, not a type "no_consume"
        assert by_name[("nsight", None)].flags == ("no_consume",)


def test_osc_gres_used_indices_with_commas() -> None:
    rows = {row[0]: row for row in _columns("sinfo_gres_osc.txt")}
    (gpu,) = [e for e in parse.parse_gres(rows["a0016"][2]) if e.name == "gpu"]
    assert (gpu.count, gpu.indices) == (2, "0,3")
    (gpu,) = [e for e in parse.parse_gres(rows["a0020"][2]) if e.name == "gpu"]
    assert (gpu.count, gpu.indices) == (3, "0-1,3")


@pytest.mark.parametrize(
    ("node", "used", "indices"),
    [
        ("fb10dl03", {"1080ti": 2}, ["0-1"]),
        ("fb10dl08", {"2080ti": 1}, ["0"]),
        ("fb10dl09", {"3090": 3}, ["0-2"]),  # a numeric type
        ("resterampe", {"1080ti": 1, "980gtx": 1}, ["0", "1"]),  # two types on one node
        ("fb10dl[04-05]", {"titanx": 0}, [None]),
    ],
)
def test_labshare_gres_used_numeric_and_mixed_types(node, used, indices) -> None:
    rows = {row[1]: row[0] for row in _columns("sinfo_gres_used_labshare.txt")[1:]}
    assert parse.gpu_counts(rows[node]) == used
    assert [e.indices for e in parse.parse_gres(rows[node])] == indices


def test_count_only_gres_with_a_unit_is_no_gpu() -> None:
    for _node, gres in _columns("sinfo_gres_tmp_prometheus_exporter.txt"):
        (entry,) = parse.parse_gres(gres)
        assert entry.name == "tmp" and entry.type is None
        assert entry.count in (844 * 1024**3, 467 * 1024**3)
        assert parse.gpu_counts(gres) == {}


def test_sherlock_untyped_gres_and_tres() -> None:
    text = real("sinfo_json_gres_sherlock.txt")
    assert parse.gpu_counts("gpu:4(S:0-1)") == {None: 4}
    assert parse.gpu_counts("gpu:(null):4(IDX:0-3)") == {None: 4}
    assert parse.parse_gres("gpu:(null):4(IDX:0-3)")[0].indices == "0-3"
    cfg, alloc = (line.split("=", 1)[1] for line in text.splitlines()[:2])
    assert parse.tres_gpu_counts(cfg) == {None: 4}
    assert parse.alloc_tres_gpu_counts(alloc) == {None: 3}


@pytest.mark.parametrize(
    ("item", "entry"),
    [
        ("gpu:a100:no_consume:4", parse.GresEntry("gpu", "a100", 4, None, ("no_consume",))),
        ("mps:shared:100", parse.GresEntry("mps", None, 100, None, ("shared",))),
        ("shard:a100:one_sharing:8", parse.GresEntry("shard", "a100", 8, None, ("one_sharing",))),
        ("gpu:a100_3g.20gb:2(S:0)", parse.GresEntry("gpu", "a100_3g.20gb", 2)),
        ("gpu:nvidia_h100_80gb_hbm3_1g.10gb:7",
         parse.GresEntry("gpu", "nvidia_h100_80gb_hbm3_1g.10gb", 7)),
        ("gpu:2080:2", parse.GresEntry("gpu", "2080", 2)),
        ("gpu:rtx2080", parse.GresEntry("gpu", "rtx2080", 1)),
        ("gpu:h100:8(S:0-1)(IDX:0-7)", parse.GresEntry("gpu", "h100", 8, "0-7")),
    ],
)  # fmt: skip
def test_every_item_form(item: str, entry: parse.GresEntry) -> None:
    assert parse.parse_gres_item(item) == entry


@pytest.mark.parametrize("item", ["gpu:a:b:c:2", ":2", "gpu:a100:2)", "(IDX:0)", "gpu:a b:1"])
def test_an_unknown_item_is_none_and_never_raises(item: str) -> None:
    assert parse.parse_gres_item(item) is None
    assert parse.gpu_counts(f"{item},gpu:v100:1") == {"v100": 1}


# --- scontrol show node / partition --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cpus", "partitions"),
    [
        ("scontrol_show_node_slinky_2505.txt", "224", ("slinky", "all")),
        ("scontrol_show_node_slinky_2511.txt", "192", ("all",)),
    ],
)
def test_dynamic_node_printed_for_people(name: str, cpus: str, partitions: tuple) -> None:
    (node,) = parse.parse_scontrol_nodes(real(name))
    assert (node.name, node.state, node.flags) == ("slinky-0", "IDLE", ("DYNAMIC_NORM",))
    assert node.gres is None and node.gres_used is None
    assert node.partitions == partitions
    assert node.raw["CPUTot"] == cpus
    assert node.raw["OS"].startswith("Linux ") and node.reason is None
    assert not parse.node_unavailable(node)
    assert parse.gpu_counts(node.gres) == {}
    assert parse.alloc_tres_gpu_counts(node.raw.get("AllocTRES")) == {}


def test_slinky_2505_comment_and_empty_alloc_tres() -> None:
    (node,) = parse.parse_scontrol_nodes(real("scontrol_show_node_slinky_2505.txt"))
    assert node.raw["Comment"] == '{"namespace":"slurm","podName":"amd-gpu-worker-slinky-0"}'
    assert node.raw["AllocTRES"] == ""
    assert node.raw["ResumeAfterTime"] == "None"


def test_osc_owens_partitions() -> None:
    parts = {
        p.name: p
        for p in parse.parse_scontrol_partitions(real("scontrol_show_partition_osc_owens.txt"))
    }
    assert sorted(parts) == ["batch", "debug", "gpuserial", "hugemem"]
    assert (parts["batch"].state, parts["batch"].default) == ("INACTIVE", True)
    assert parts["gpuserial"].nodes == "o[0649-0659,0661-0701,0703-0722,0724-0805]"
    assert (parts["debug"].max_time, parts["hugemem"].max_time) == ("01:00:00", "7-00:00:00")
    # TRES lists count-only GRES and licenses beside the GPUs
    assert parse.tres_gpu_counts(parts["gpuserial"].raw["TRES"]) == {"p100": 154}
    assert parse.tres_gpu_counts(parts["hugemem"].raw["TRES"]) == {}


# --- a job's GPUs: TresPerNode, TresPerJob, TresPerTask, AllocTRES ---------------------------


def test_scontrol_job_before_21_08_printed_for_people() -> None:
    (job,) = parse.parse_scontrol_jobs(real("scontrol_show_job_chpc_pre2108.txt"))
    assert (job.job_id, job.name, job.state, job.partition) == (
        "1144481", "dummy.job", "RUNNING", "statdgx"
    )  # fmt: skip
    assert job.nodes == "chpc-gpu019"
    assert job.start == datetime(2022, 11, 19, 17, 56, 5)
    assert job.tres_per_node == "gpu:1"  # no gres: prefix before 21.08
    assert job.raw["NtasksPerTRES"] == "0" and job.raw["Power"] == ""
    assert job.raw["MemPerTres"] == "gpu:16000"
    assert job.gpus == {None: 1}
    assert parse.gpu_tres(job.tres_per_node) == "gpu:1"


def test_scontrol_job_asked_with_gpus_per_job() -> None:
    (job,) = parse.parse_scontrol_jobs(real("scontrol_show_job_sonny_tresperjob.txt"))
    assert (job.job_id, job.state, job.nodes) == ("8690", "RUNNING", "gpu01")
    assert job.tres_per_node is None and job.tres_per_job == "gres:gpu:1"
    assert job.raw["UserId"] == "albert.einstein(1250890533)"
    assert job.raw["GroupId"] == "domain users(1250800513)"  # a value with a space
    assert job.gpus == {"a100": 1}  # what it was given (TRES=) names the type
    assert job.stdout is not None and job.stdout.endswith("/output.log")


def test_ntasks_per_tres_on_one_line() -> None:
    """The form the issue reported: ``-o`` output, ``NtasksPerTRES:0`` after TresPerNode."""
    line = (
        "JobId=77 JobName=x JobState=PENDING Reason=Resources NumNodes=2 NumTasks=2 "
        "Power= TresPerNode=gres:gpu:rtx2080,gres:gg:g0 NtasksPerTRES:0"
    )
    (job,) = parse.parse_scontrol_jobs(line)
    assert job.tres_per_node == "gres:gpu:rtx2080,gres:gg:g0"
    assert job.raw["NtasksPerTRES"] == "0"
    assert job.gpus == {"rtx2080": 2}


@pytest.mark.parametrize(
    ("record", "gpus"),
    [
        ({"AllocTRES": "cpu=8,gres/gpu:a100=2,gres/gpu=2", "TresPerJob": "gres:gpu:4"},
         {"a100": 2}),
        ({"TresPerJob": "gres:gpu:a100:4", "NumNodes": "2"}, {"a100": 4}),
        ({"TresPerNode": "gres:gpu:v100:2", "NumNodes": "3-3"}, {"v100": 6}),
        ({"TresPerNode": "gres/gpu:h100:1", "NumNodes": "1"}, {"h100": 1}),  # 24.11 spelling
        ({"TresPerTask": "gres:gpu:1", "NumTasks": "4", "NumNodes": "2"}, {None: 4}),
        ({"TresPerNode": "gpu:2"}, {None: 2}),  # before 21.08
        ({"TRES": "cpu=1,mem=1G,node=1"}, {}),
        ({}, {}),
    ],
)  # fmt: skip
def test_job_gpu_counts(record: dict, gpus: dict) -> None:
    assert parse.job_gpu_counts(record) == gpus


def test_squeue_tres_alloc() -> None:
    lines = [line for line in real("squeue_tres_alloc_osc.txt").splitlines() if "=" in line]
    assert [parse.tres_gpu_counts(line) for line in lines] == [{}, {"a100": 1}]
    assert parse.gpu_tres(lines[1]) == "gres/gpu=1,gres/gpu:a100=1"


@pytest.mark.parametrize(
    ("text", "gpus"),
    [("gpu:1", "gpu:1"), ("gres/gpu:a100:1", "gres/gpu:a100:1"), ("gres:mps:100", None),
     ("gres:gpu:a100:2,gres:gpfs:ess:1", "gres:gpu:a100:2")],
)  # fmt: skip
def test_gpu_tres_in_every_spelling(text: str, gpus: str | None) -> None:
    assert parse.gpu_tres(text) == gpus


# --- sbatch: refusals and --test-only ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("sbatch_err_must_specify_type_lavila.stderr.txt",
         "You must always specify a type when requesting gpu GRES; Unspecified error"),
        ("sbatch_err_cannot_find_gpu_spec_nvidia.stderr.txt",
         "Cannot find GPU specification, you may not submit a job not requesting GPUs in a GPU "
         "partition, partition: ...; Unspecified error"),
        ("sbatch_err_gres_format_bridges.stderr.txt",
         "Gres format wrong, specify --gres=gpu:TYPE:NUM See "
         "https://www.psc.edu/bridges/user-guide/running-jobs; "
         "Invalid generic resource (gres) specification"),
        ("sbatch_err_invalid_gpu_spec_clima.stderr.txt",
         "ERROR: Invalid GPU specification. Use --gres=gpu:<type>:<count>.  Make sure you "
         "specify a gpu type.; Unspecified error"),
        ("sbatch_err_partition_plugin_torch.stderr.txt",
         "*** Error partition 'h200_courant' is not valid for this job; "
         "*** Error: CPU job setup is not valid"),
        ("sbatch_err_cpu_count_pman.stderr.txt",
         "CPU count per node can not be satisfied; Requested node configuration is not available"),
        ("sbatch_err_spank_io_arjuna.stderr.txt",
         "spank: x11.so: Plugin file not found; I/O error writing script/environment to file"),
        ("sbatch_err_qos_repeated_autosubmit.stderr.txt", "invalid qos specification"),
        ("sbatch_err_qos_policy_lido3.stderr.txt",
         "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)"),
    ],
)  # fmt: skip
def test_sbatch_errors_every_line_plugin_first(name: str, message: str) -> None:
    assert parse.sbatch_error_message(real(name)) == message


def test_plugin_lines_come_before_slurms_summary() -> None:
    stderr = (
        "sbatch: error: Batch job submission failed: Unspecified error\n"
        "sbatch: error: You must always specify a type when requesting gpu GRES\n"
    )
    assert parse.sbatch_error_messages(stderr) == [
        "You must always specify a type when requesting gpu GRES",
        "Batch job submission failed: Unspecified error",
    ]


@pytest.fixture
def mllab():
    from clusterjob import resources

    return load_site(resources.site_configs_dir() / "mllab.yaml")


@pytest.mark.parametrize(
    ("name", "hint_words"),
    [
        ("sbatch_err_must_specify_type_lavila.stderr.txt", ["requires a GPU type", "a100 (A100)"]),
        ("sbatch_err_invalid_gpu_spec_clima.stderr.txt", ["requires a GPU type"]),
        ("sbatch_err_gres_format_bridges.stderr.txt", ["requires a GPU type"]),
        ("sbatch_err_cannot_find_gpu_spec_nvidia.stderr.txt", ["only jobs that ask for GPUs"]),
        ("sbatch_err_cpu_count_pman.stderr.txt", ["can ever satisfy"]),
        ("sbatch_err_spank_io_arjuna.stderr.txt", []),
    ],
)
def test_a_refusal_shows_every_line_and_the_hint_of_any(name, hint_words, mllab) -> None:
    stderr = real(name)
    hinted = with_sbatch_hint(SlurmError(["sbatch"], 1, stderr), mllab)
    shown = str(hinted)
    assert shown.count("\n") == 0  # one line
    for message in parse.sbatch_error_messages(stderr):
        assert message.removeprefix("Batch job submission failed: ") in shown
    for word in hint_words:
        assert word in hinted.hint
    assert bool(hinted.hint) is bool(hint_words)
    assert stderr.strip() in hinted.stderr  # the whole stderr is kept
    assert sbatch_hint(parse.sbatch_error_message(stderr), None) or not hint_words


@pytest.mark.parametrize(
    ("name", "job_id", "start", "processors", "nodes", "partition"),
    [
        ("sbatch_test_only_archer2_2021.stderr.txt", "639625", datetime(2021, 11, 13, 4, 47, 2),
         256, "nid001294", "standard"),
        ("sbatch_test_only_stray_word_cstar.stderr.txt", "19861401",
         datetime(2026, 11, 7, 9, 18, 44), 1, "a241", "shared"),
    ],
)  # fmt: skip
def test_test_only_sentences(name, job_id, start, processors, nodes, partition) -> None:
    e = parse.parse_test_only(real(name))
    assert (e.job_id, e.start, e.processors, e.nodes, e.partition) == (
        job_id, start, processors, nodes, partition
    )  # fmt: skip


def test_test_only_26_05_stray_word() -> None:
    line = (
        "sbatch: Job 143 to start at 2026-12-04T13:37:08 a using 1 processors on nodes gpu2 "
        "in partition gpu"
    )
    assert parse.parse_test_only(line).nodes == "gpu2"


def test_test_only_fails_loudly_with_the_raw_line() -> None:
    line = "sbatch: Job 143 to start at 2026-12-04T13:37:08 on nodes gpu2 (partition gpu)"
    with pytest.raises(ValueError) as info:
        parse.parse_test_only("sbatch: some other note\n" + line + "\n")
    assert repr(line) in str(info.value)


# --- what is skipped is said with --debug ----------------------------------------------------


def test_avail_with_debug_names_an_unknown_gres_item_and_counts_the_rest(tmp_path) -> None:
    """A stand-in scontrol prints a node whose Gres= has an item of no known form: `avail`
    counts the GPUs beside it, and says what it skipped only with --debug."""
    import os
    import subprocess
    import sys

    fixtures = REAL.parent
    node = (
        "NodeName=gpu1 State=IDLE Partitions=gpu "
        "Gres=gpu:a100:2,gpu:v100:2,weird:a:b:c:1 GresUsed=gpu:a100:1(IDX:0),gpu:v100:0(IDX:N/A)"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho '{node}'\n")
    scontrol.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env.pop("CLUSTERJOB_DEBUG", None)
    site = str(fixtures / "sandbox_site.yaml")
    for extra, shown in (([], False), (["--debug"], True)):
        done = subprocess.run(
            [sys.executable, "-m", "clusterjob", *extra, "avail", "--site", site, "--json"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        rows = {(r["partition"], r["model"]): r for r in json.loads(done.stdout)["rows"]}
        assert (rows["gpu", "A100"]["free"], rows["gpu", "A100"]["total"]) == (1, 2)
        assert (rows["gpu", "V100"]["free"], rows["gpu", "V100"]["total"]) == (2, 2)
        assert ("clusterjob: debug: ignored GRES item 'weird:a:b:c:1'" in done.stderr) is shown
