"""Site keys real clusters need: a mandatory account (`account: required`, per partition too),
a QoS with its own limits named beside a partition (`qos:`), a partition that implies its
model, and GPU jobs without a GPU option (`syntax: none` with the site's task shape). Each at
the loader, at resolve/render, and through the real `clusterjob submit` command, which must
refuse before sbatch runs (an `sbatch` on PATH records whether it was called)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from clusterjob.errors import ConfigError, UsageError
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, ResolvedJob, resolve
from clusterjob.site import schema
from clusterjob.site.admin import format_site, site_summary
from clusterjob.site.loader import load_site, validate_site_file
from clusterjob.site.model import Site

TOKEN = "0123456789abcdef"

# CSC-like: every job names an account, a devel QoS (2 h, 16 GPUs, 4 nodes) used with accel,
# a test partition of one model.
CSC = """\
site: csc
account: {account}
gpu_request: {{syntax: gres, type_required: true}}
{top}
models:
  V100: {{gres_type: v100, nvml_names: ["Tesla V100-SXM2-32GB"]}}
  A100: {{gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}}
partitions:
  accel:
    nodes: "g[01-10]"
    default: true
    time_limit: "3-00:00:00"
{accel}
  test:
    nodes: "t1"
    time_limit: "0:15:00"
{test}
  mixed:
    nodes: "g01,t1"
qos:
  devel:
    max_time: "2:00:00"
    max_gpus_per_job: 16
    max_nodes: 4
    partitions: [accel]
node_map:
  - nodes: "g[01-10]"
    gpus: [{{model: V100}}, {{model: V100}}, {{model: V100}}, {{model: V100}}]
  - nodes: "t1"
    gpus: [{{model: A100}}, {{model: A100}}]
"""

# Whole GPU nodes shared among 32 tasks through CUDA MPS: no GPU option, the site's shape.
MPS = """\
site: mps
gpu_request: {syntax: none}
defaults: {tasks_per_node: 32, cpus_per_task: 8, sbatch: ["--exclusive"]}
models:
  A100: {nvml_names: ["NVIDIA A100-SXM4-80GB"]}
  V100: {nvml_names: ["Tesla V100-SXM2-32GB"]}
partitions:
  gpu: {nodes: "g[1-4]", default: true, gpus_per_node: 4}
  old: {nodes: "v1", gpus_per_node: 2}
  cpu: {nodes: "c1"}
node_map:
  - nodes: "g[1-4]"
    gpus: [{model: A100}, {model: A100}, {model: A100}, {model: A100}]
  - nodes: "v1"
    gpus: [{model: V100}, {model: V100}]
  - nodes: "c1"
    gpus: []
"""


def csc(
    tmp_path: Path, *, account: str = "required", top: str = "", accel: str = "", test: str = ""
) -> Path:
    path = tmp_path / "csc.yaml"
    path.write_text(CSC.format(account=account, top=top, accel=accel, test=test))
    return path


def mps(tmp_path: Path, text: str = MPS) -> Path:
    path = tmp_path / "mps.yaml"
    path.write_text(text)
    return path


def resolved(site: Site, environ: dict[str, str] | None = None, **kw: object) -> ResolvedJob:
    request = JobRequest("train.py", token=TOKEN, **kw)  # type: ignore[arg-type]
    return resolve(site, request, environ=environ or {}, choose_interpreter=False)


def sbatch_lines(site: Site, environ: dict[str, str] | None = None, **kw: object) -> list[str]:
    script = render(site, resolved(site, environ, **kw), python="/usr/bin/python3").script
    return [line[len("#SBATCH ") :] for line in script.splitlines() if line.startswith("#SBATCH ")]


def issues(path: Path) -> list[str]:
    _, found = validate_site_file(path)
    return [f"{i.line}: {i.key_path}: {i.message}" for i in found]


# -- the real command, with an sbatch that records being called ---------------------------------


@pytest.fixture
def submit(tmp_path: Path):
    """``clusterjob submit --site SITE ARGS`` as its own process, with a fake ``sbatch`` first
    on PATH that records its call and answers a job id: (the process, whether sbatch ran)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "sbatch-called"
    fake = bin_dir / "sbatch"
    fake.write_text(f'#!/bin/sh\nfor a; do last=$a; done\ncat "$last" > "{called}"\necho 4242\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")

    def run(site: Path, *args: str, env: dict[str, str] | None = None):
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "SLURM_"))}
        environ.update(
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            CLUSTERJOB_DATA_DIR=str(tmp_path / "data"),
            **(env or {}),
        )
        proc = subprocess.run(
            [sys.executable, "-m", "clusterjob", "submit", str(script), "--site", str(site),
             *args],
            env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        ran = called.exists()
        sent = called.read_text() if ran else ""
        called.unlink(missing_ok=True)
        return proc, sent

    return run


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterjob: error: "), proc.stderr
    return lines[0][len("clusterjob: error: ") :]


# -- 1. a mandatory account ------------------------------------------------------------------


def test_account_required_refuses_a_job_with_none(tmp_path: Path) -> None:
    site = load_site(csc(tmp_path))
    assert site.account == "required"
    with pytest.raises(UsageError) as info:
        resolved(site, gpus=1, model="V100")
    assert str(info.value) == (
        "site csc charges every job to an account: give --account NAME (-A), or set SBATCH_ACCOUNT"
    )


@pytest.mark.parametrize(
    ("top", "kw", "environ", "written"),
    [
        ("", {"account": "project_2001234"}, {}, "--account=project_2001234"),
        ("defaults: {account: project_42}", {}, {}, "--account=project_42"),
        ('defaults: {account: "{project}_gpu"}', {"project": "p7"}, {}, "--account=p7_gpu"),
        ("", {}, {"SBATCH_ACCOUNT": "project_9"}, None),  # sbatch reads it itself
    ],
)
def test_account_required_is_met_by_every_way_of_giving_one(
    tmp_path: Path, top: str, kw: dict, environ: dict, written: str | None
) -> None:
    site = load_site(csc(tmp_path, top=top))
    lines = sbatch_lines(site, environ, gpus=1, model="V100", **kw)
    accounts = [x for x in lines if x.startswith("--account")]
    assert accounts == ([written] if written else [])


def test_an_account_pattern_without_project_says_to_give_one(tmp_path: Path) -> None:
    site = load_site(csc(tmp_path, top='defaults: {account: "{project}_gpu"}'))
    with pytest.raises(UsageError, match=r"give --project \(accounts here are \{project\}_gpu\)"):
        resolved(site, gpus=1, model="V100")


def test_account_rule_per_partition_over_the_sites(tmp_path: Path) -> None:
    site = load_site(csc(tmp_path, test="    account: optional"))
    assert sbatch_lines(site, gpus=1, partition="test")  # no account needed there
    with pytest.raises(UsageError, match="^site csc charges"):
        resolved(site, gpus=1, model="V100")
    site = load_site(csc(tmp_path, account="optional", test="    account: required"))
    assert sbatch_lines(site, gpus=1, model="V100")
    with pytest.raises(UsageError, match="^partition test at site csc charges every job"):
        resolved(site, gpus=1, partition="test")


def test_a_cpu_only_job_needs_its_account_too(tmp_path: Path) -> None:
    site = load_site(csc(tmp_path))
    with pytest.raises(UsageError, match="charges every job to an account"):
        resolved(site, gpus=0)


def test_a_bad_account_rule_is_one_config_line(tmp_path: Path) -> None:
    found = issues(csc(tmp_path, account="yes", test="    account: always"))
    assert found == [
        "2: account: expected one of required, optional, got 'yes'",
        "17: partitions.test.account: expected one of required, optional, got 'always'",
    ]


def test_submit_refuses_without_account_before_sbatch(tmp_path: Path, submit) -> None:
    site = csc(tmp_path)
    proc, sent = submit(site, "--gpus", "1", "--model", "V100")
    assert one_error_line(proc).startswith("site csc charges every job to an account")
    assert sent == "", "sbatch must not run"
    proc, sent = submit(site, "--gpus", "1", "--model", "V100", "-A", "project_2001234")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --account=project_2001234\n" in sent
    proc, sent = submit(site, "--gpus", "1", "--model", "V100", env={"SBATCH_ACCOUNT": "p"})
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=accel\n" in sent


# -- 2. a QoS with limits beside a partition ---------------------------------------------------


def test_qos_limits_are_read(tmp_path: Path) -> None:
    from clusterjob.site.model import QosLimits  # new with the qos section

    site = load_site(csc(tmp_path, account="optional"))
    assert site.qos == (QosLimits("devel", "2:00:00", 16, 4, ("accel",)),)
    assert "qos" in schema.json_schema()["definitions"]


def test_the_issues_devel_job_is_refused_naming_each_limit_and_the_qos(tmp_path: Path) -> None:
    site = load_site(csc(tmp_path, account="optional"))
    with pytest.raises(UsageError) as info:
        resolved(site, nodes=5, gpus=4, model="V100", qos="devel", time="3:00:00")
    assert str(info.value) == (
        "--time 3:00:00 is longer than QoS devel's limit 2:00:00; QoS devel takes at most 16 "
        "GPUs per job, this job asks for 20 (4 x 5 nodes) at site csc"
    )


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"nodes": 5, "gpus": 1}, "QoS devel takes at most 4 nodes per job, this job asks for 5"),
        ({"nodes": 5, "gpus": 0}, "QoS devel takes at most 4 nodes per job, this job asks for 5"),
        ({"gpus": 1, "time": "2:00:01"}, "--time 2:00:01 is longer than QoS devel's limit"),
        (
            {"gpus": 1, "partition": "mixed"},
            "QoS devel at site csc is used with partition accel, not mixed",
        ),
    ],
)
def test_each_qos_limit_is_checked(tmp_path: Path, kw: dict, message: str) -> None:
    site = load_site(csc(tmp_path, account="optional"))
    kw = {"model": "V100", **kw} if kw.get("gpus") else kw
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        resolved(site, qos="devel", **kw)


def test_a_qos_within_its_limits_is_written_beside_its_partition(tmp_path: Path) -> None:
    site = load_site(csc(tmp_path, account="optional"))
    lines = sbatch_lines(site, nodes=4, gpus=4, model="V100", qos="devel", time="2:00:00")
    assert "--partition=accel" in lines and "--qos=devel" in lines
    # --qos devel alone goes to the partition it is used with
    path = csc(tmp_path, account="optional")
    text = path.read_text().replace("    default: true\n", "")
    path.write_text(text.replace('nodes: "g01,t1"', 'nodes: "g01,t1"\n    default: true'))
    site = load_site(path)
    assert resolved(site, gpus=2, model="V100").partition.name == "mixed"
    assert resolved(site, gpus=2, model="V100", qos="devel").partition.name == "accel"


def test_a_job_without_time_gets_the_qos_limit_not_the_partitions(tmp_path: Path) -> None:
    site = load_site(csc(tmp_path, account="optional"))
    assert "--time=2:00:00" in sbatch_lines(site, gpus=1, model="V100", qos="devel")
    assert not any(x.startswith("--time") for x in sbatch_lines(site, gpus=1, model="V100"))


def test_a_default_qos_is_checked_as_the_users(tmp_path: Path) -> None:
    site = load_site(csc(tmp_path, account="optional", accel="    defaults: {qos: devel}"))
    assert "--qos=devel" in sbatch_lines(site, gpus=4, model="V100", time="1:00:00")
    with pytest.raises(UsageError, match="QoS devel's limit 2:00:00"):
        resolved(site, gpus=4, model="V100", time="5:00:00")


def test_bad_qos_sections_are_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        CSC.format(account="optional", top="", accel="", test="    submit_as: qos").replace(
            """    partitions: [accel]
""",
            """    partitions: [accel, gpu, test]
    max_gpus: 3
  short:
    max_time: "2 hours"
  test: {max_nodes: 1}
""",
        )
    )
    assert issues(path) == [
        "25: qos.devel.partitions[1]: unknown partition 'gpu'; partitions: accel, test, mixed",
        "25: qos.devel.partitions[2]: partition test is not named with --partition "
        "(submit_as: qos): no QoS can stand beside it",
        "26: qos.devel.max_gpus: unknown key (did you mean 'max_gpus_per_job'?); valid keys: "
        "max_gpus_per_job, max_nodes, max_time, partitions",
        "28: qos.short.max_time: not a Slurm time: '2 hours' (e.g. 2:00:00)",
        "29: qos.test: partition test is asked for as this QoS (submit_as: qos): its limits "
        "are the partition's",
    ]


def test_submit_refuses_a_job_over_the_qos_before_sbatch(tmp_path: Path, submit) -> None:
    site = csc(tmp_path, account="optional")
    proc, sent = submit(site, "-N", "5", "--gpus", "4", "--model", "V100", "--qos", "devel",
                        "-t", "3:00:00")  # fmt: skip
    assert one_error_line(proc).startswith("--time 3:00:00 is longer than QoS devel's limit")
    assert sent == ""
    proc, sent = submit(site, "-N", "2", "--gpus", "4", "--model", "V100", "--qos", "devel",
                        "-t", "1:00:00")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=accel\n" in sent and "#SBATCH --qos=devel\n" in sent


# -- 3. a partition that implies its model ------------------------------------------------------


def test_a_partition_of_one_model_implies_it(tmp_path: Path) -> None:
    site = load_site(csc(tmp_path, account="optional"))
    job = resolved(site, gpus=2, partition="test")
    assert job.model is not None and job.model.name == "A100"
    assert "--gres=gpu:a100:2" in sbatch_lines(site, gpus=2, partition="test")
    with pytest.raises(UsageError, match="--model is required at site csc"):
        resolved(site, gpus=1, partition="mixed")  # two models there
    job = resolved(site, gpus=1)  # no partition named: the default's one model
    assert (job.partition.name, getattr(job.model, "name", None)) == ("accel", "V100")


def test_site_show_says_where_model_may_be_left_out(tmp_path: Path) -> None:
    site = load_site(csc(tmp_path, account="required"))
    lines = format_site(site)
    assert (
        "--model: required, except with -p accel (V100, the default partition), test (A100)"
        in lines
    )
    assert "account: required (--account, --project or SBATCH_ACCOUNT)" in lines
    assert (
        "QoS devel (with -p accel): time limit 2:00:00; at most GPUs/job 16; at most nodes 4"
        in (lines)
    )
    summary = json.loads(json.dumps(site_summary(site)))
    implied = {p["name"]: p["implied_model"] for p in summary["partitions"]}
    assert implied == {"accel": "V100", "test": "A100", "mixed": None}
    assert summary["account"] == "required" and summary["qos"][0]["max_nodes"] == 4


def test_submit_with_a_partition_of_one_model_reaches_sbatch(tmp_path: Path, submit) -> None:
    proc, sent = submit(csc(tmp_path, account="optional"), "-p", "test", "--gpus", "1")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --gres=gpu:a100:1\n" in sent
    assert "export CLUSTERJOB_EXPECT_MODEL=A100\n" in sent


# -- 4. GPU jobs without a GPU option --------------------------------------------------------


def test_whole_node_job_has_the_sites_shape_and_no_gpu_option(tmp_path: Path) -> None:
    site = load_site(mps(tmp_path))
    job = resolved(
        site, gpus=0, partition="gpu"
    )  # no --gpus, no --model: the partition implies both
    assert job.model is not None and (job.model.name, job.gpus_per_node) == ("A100", 4)
    assert job.launcher == "srun" and job.tasks_per_node == 32
    lines = sbatch_lines(site, gpus=0, partition="gpu")
    assert lines[1:] == [
        "--partition=gpu",
        "--nodes=1",
        "--ntasks-per-node=32",
        "--cpus-per-task=8",
        "--exclusive",
        f"--comment=clusterjob:{TOKEN}",
    ]
    script = render(site, job, python="/usr/bin/python3").script
    assert "export CLUSTERJOB_EXPECT_COUNT=4\n" in script
    assert "export CLUSTERJOB_EXPECT_MODEL=A100\n" in script
    assert "\n# Preflight: check this job's GPUs" in script


def test_whole_node_job_found_by_model_or_default(tmp_path: Path) -> None:
    site = load_site(mps(tmp_path))
    assert resolved(site, gpus=0, model="V100").partition.name == "old"
    assert resolved(site, gpus=0, model="V100").gpus_per_node == 2
    job = resolved(site, gpus=0)  # the default partition: its GPUs and its one model
    assert (job.partition.name, getattr(job.model, "name", None), job.gpus_per_node) == (
        "gpu",
        "A100",
        4,
    )
    cpu = resolved(site, gpus=0, partition="cpu")
    assert cpu.model is None and "--exclusive" in sbatch_lines(site, gpus=0, partition="cpu")


def test_the_users_task_shape_wins(tmp_path: Path) -> None:
    site = load_site(mps(tmp_path))
    lines = sbatch_lines(site, gpus=0, partition="gpu", tasks_per_node=1, cpus_per_gpu=16)
    assert "--ntasks-per-node=1" in lines and "--cpus-per-gpu=16" in lines
    assert not any(x.startswith("--cpus-per-task") for x in lines)


def test_cpus_per_task_and_cpus_per_gpu_are_one_choice(tmp_path: Path) -> None:
    text = MPS.replace(
        "partitions:\n  gpu: {", "partitions:\n  gpu: {defaults: {cpus_per_gpu: 6}, "
    )
    site = load_site(mps(tmp_path, text))
    lines = sbatch_lines(site, gpus=0, partition="gpu")  # the partition's choice over the site's
    assert "--cpus-per-gpu=6" in lines and not any(x.startswith("--cpus-per-task") for x in lines)
    bad = MPS.replace("cpus_per_task: 8,", "cpus_per_task: 8, cpus_per_gpu: 2,")
    assert issues(mps(tmp_path, bad)) == [
        "3: defaults.cpus_per_task: give cpus_per_gpu or cpus_per_task, not both"
    ]


def test_site_lines_for_the_task_shape_point_at_its_keys(tmp_path: Path) -> None:
    bad = MPS.replace('sbatch: ["--exclusive"]', 'sbatch: ["--ntasks-per-node=32", "-c 8"]')
    bad = bad.replace("cpus_per_task: 8, ", "")
    assert issues(mps(tmp_path, bad)) == [
        "3: defaults.sbatch[0]: --ntasks-per-node is written by clusterjob: set "
        "defaults.tasks_per_node instead",
        "3: defaults.sbatch[1]: -c is written by clusterjob: set defaults.cpus_per_task instead",
    ]


def test_submit_a_whole_node_job_without_gpu_option(tmp_path: Path, submit) -> None:
    proc, sent = submit(mps(tmp_path), "-p", "gpu")
    assert proc.returncode == 0, proc.stderr
    for line in ("--ntasks-per-node=32", "--cpus-per-task=8", "--exclusive"):
        assert f"#SBATCH {line}\n" in sent
    assert "--gres" not in sent and "--gpus" not in sent
    assert "export CLUSTERJOB_EXPECT_COUNT=4\n" in sent


# -- the same behaviours on site files the old loader reads too --------------------------------

PLAIN = """\
site: plain
gpu_request: {syntax: SYNTAX}
models:
  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}
  V100: {gres_type: v100, nvml_names: ["Tesla V100-SXM2-32GB"]}
partitions:
  gpu: {nodes: "g[1-2]", default: true, gpus_per_node: 4}
  test: {nodes: "t1", gpus_per_node: 2}
node_map:
  - nodes: "g[1-2]"
    gpus: [{model: V100}, {model: V100}, {model: V100}, {model: V100}]
  - nodes: "t1"
    gpus: [{model: A100}, {model: A100}]
"""


def test_test_partition_implies_its_model_where_site_show_says_so(tmp_path: Path) -> None:
    site = load_site(mps(tmp_path, PLAIN.replace("SYNTAX", "gres")))
    assert "--gres=gpu:a100:2" in sbatch_lines(site, gpus=2, partition="test")
    shown = format_site(site)
    assert "--model: required, except with -p gpu (V100, the default partition), test (A100)" in (
        shown
    )


def test_no_gpus_on_a_whole_node_partition_is_a_gpu_job_checked_by_the_preflight(
    tmp_path: Path,
) -> None:
    site = load_site(mps(tmp_path, PLAIN.replace("SYNTAX", "none")))
    job = resolved(site, gpus=0, partition="test")  # what `submit -p test` asks, no --gpus
    script = render(site, job, python="/usr/bin/python3").script
    assert "export CLUSTERJOB_EXPECT_COUNT=2\n" in script
    assert "export CLUSTERJOB_EXPECT_MODEL=A100\n" in script
    assert "# A CPU-only job" not in script


def test_a_task_shape_where_each_task_is_one_gpu_is_a_config_error(tmp_path: Path) -> None:
    text = PLAIN.replace("SYNTAX", "gpus-per-task").replace(
        "partitions:", "defaults: {tasks_per_node: 8}\npartitions:"
    )
    site = load_site(mps(tmp_path, text.replace(", gpus_per_node: 4", "")))
    with pytest.raises(ConfigError) as info:
        resolved(site, gpus=2, partition="test")
    (issue,) = info.value.issues
    assert (issue.key_path, issue.message) == (
        "defaults.tasks_per_node",
        "gpu_request.syntax gpus-per-task gives each task one GPU: a job's tasks are its GPUs, "
        "so it cannot have a task count of its own",
    )
    assert resolved(site, gpus=0, partition="gpu").tasks_per_node == 8  # a CPU-only job's


def test_node_features_of_a_node_map_entry_are_kept_and_a_bad_one_points_at_its_line(
    tmp_path: Path,
) -> None:
    lines = [
        "site: feat",
        "gpu_request: {syntax: gres}",
        "models:",
        "  A100: {gres_type: a100, nvml_names: [NVIDIA A100-SXM4-80GB]}",
        "partitions:",
        "  gpu: {nodes: 'n[1-2]', default: true}",
        "node_map:",
        "  - nodes: 'n[1-2]'",
        "    features: [mps, 'GPU_SKU:A100', mps]",
        "    gpus: [{model: A100}]",
    ]
    (tmp_path / "feat.yaml").write_text("\n".join(lines) + "\n")
    site = load_site(tmp_path / "feat.yaml")
    assert site.node_map.features == {"n1": ("mps", "GPU_SKU:A100"), "n2": ("mps", "GPU_SKU:A100")}
    lines[8] = "    features: [mps, 'a&b']"
    (tmp_path / "feat.yaml").write_text("\n".join(lines) + "\n")
    _, issues = validate_site_file(tmp_path / "feat.yaml")
    assert [str(i) for i in issues] == [
        f"{tmp_path / 'feat.yaml'}:9: node_map[0].features: not a node feature: 'a&b' "
        "(letters, digits, _ . : - only)"
    ]
