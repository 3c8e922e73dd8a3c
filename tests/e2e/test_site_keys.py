"""Site keys on the local cluster: a mandatory account, a QoS with limits beside its
partition, a partition that implies its model, and a whole-node GPU job with no GPU option.

Variant site files are written from the sandbox's own (its node command and node map); the
cluster's QoS and accounts are not changed: the QoS with limits is the existing ``normal``,
the account the sandbox's ``sandbox``. A refused job must never reach Slurm (no job of its
name in squeue or sacct); an accepted one runs to COMPLETED with the directives it needs.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from .conftest import Cli, Sandbox
from .test_end_to_end import finished, logs, wait_status

pytestmark = pytest.mark.slurm

JOB = ("--", "bash", "-c", 'echo "tasks=$SLURM_NTASKS_PER_NODE cpus=$SLURM_CPUS_PER_TASK"')


def _sandbox_site(sandbox: Sandbox) -> dict[str, Any]:
    data: dict[str, Any] = YAML(typ="safe").load(sandbox.site_path.read_text())
    return data


def _write(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.yaml"
    with path.open("w") as fh:
        YAML(typ="safe").dump(data, fh)
    return path


def _csc_site(sandbox: Sandbox, tmp_path: Path) -> Path:
    """The sandbox's site with ``account: required`` (and no account default), and the
    cluster's ``normal`` QoS listed with limits, used with partition h100 only."""
    data = _sandbox_site(sandbox)
    data["site"] = "sandbox-csc"
    data["account"] = "required"
    for partition in data["partitions"].values():
        partition["defaults"].pop("account", None)
    data["qos"] = {
        "normal": {"max_time": "0:10:00", "max_gpus_per_job": 2, "max_nodes": 1,
                   "partitions": ["h100"]},
    }  # fmt: skip
    return _write(tmp_path, "csc", data)


def _mps_site(sandbox: Sandbox, tmp_path: Path) -> Path:
    """The sandbox's H100 node as a site that asks for GPUs with no option: the partition
    gives whole nodes (``--exclusive``) with their 8 GPUs, jobs have the site's task shape."""
    data = _sandbox_site(sandbox)
    h1 = [entry for entry in data["node_map"] if entry["nodes"] == "h1"]
    assert h1, "the sandbox site maps node h1"
    h100 = data["partitions"]["h100"]
    data.update(
        site="sandbox-mps",
        gpu_request={"syntax": "none"},
        models={"H100": data["models"]["H100"], "A100": data["models"]["A100"]},
        node_map=h1,
    )
    h100["defaults"] = {"tasks_per_node": 2, "cpus_per_task": 1, "sbatch": ["--exclusive"]}
    h100.update(default=True, gpus_per_node=8)
    data["partitions"] = {"h100": h100}
    return _write(tmp_path, "mps", data)


def _name() -> str:
    return f"sitekeys-{uuid.uuid4().hex[:8]}"


def _never_reached_slurm(sandbox: Sandbox, name: str) -> None:
    assert sandbox.run("squeue", "-h", "-n", name, "-o", "%i").strip() == ""
    assert sandbox.run("sacct", "-n", "-X", "--name", name, "-o", "JobID").strip() == ""


def _refused(cj: Cli, sandbox: Sandbox, site: Path, *args: str) -> str:
    name = _name()
    proc = cj("submit", "--site", str(site), "--job-name", name, *args, *JOB)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterjob: error: "), proc.stderr
    _never_reached_slurm(sandbox, name)
    return lines[0]


def _completed(cj: Cli, sandbox: Sandbox, site: Path, *args: str) -> tuple[dict[str, str], str]:
    """Submit; wait for the end; the job's ``scontrol show job`` fields and its output."""
    proc = cj("submit", "--site", str(site), "--job-name", _name(), *args, *JOB)
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"Submitted job (\d+)", proc.stdout)
    assert match, proc.stdout
    job = match.group(1)
    row = wait_status(cj, job, finished, timeout=300)  # a shared, busy cluster
    out = logs(cj, job)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (row, out)
    return sandbox.job(job), out


def _dry_run_lines(cj: Cli, site: Path, *args: str) -> list[str]:
    proc = cj("submit", "--site", str(site), "--dry-run", *args, *JOB)
    assert proc.returncode == 0, proc.stderr
    return [ln for ln in proc.stdout.splitlines() if ln.startswith("#SBATCH ")]


def test_account_required(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    site = _csc_site(sandbox, tmp_path)
    line = _refused(cj, sandbox, site, "--gpus", "1", "--model", "A100")
    assert line.endswith("site sandbox-csc charges every job to an account: give --account "
                         "NAME (-A), or set SBATCH_ACCOUNT")  # fmt: skip
    fields, _ = _completed(cj, sandbox, site, "--gpus", "1", "--model", "A100", "-A", "sandbox")
    assert fields["Account"] == "sandbox", fields
    # sbatch reads SBATCH_ACCOUNT itself: the job is charged to it with no --account line
    proc = cj("submit", "--site", str(site), "--gpus", "1", "--model", "A100", "--parsable",
              *JOB, extra_env={"SBATCH_ACCOUNT": "sandbox"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    assert sandbox.job(job)["Account"] == "sandbox"
    assert wait_status(cj, job, finished, timeout=300)["state"] == "COMPLETED"


def test_qos_with_limits_beside_its_partition(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    site = _csc_site(sandbox, tmp_path)
    line = _refused(cj, sandbox, site, "--gpus", "4", "--qos", "normal", "-t", "0:20:00", "-A",
                    "sandbox")  # fmt: skip
    assert line.endswith(
        "--time 0:20:00 is longer than QoS normal's limit 0:10:00; QoS normal takes at most 2 "
        "GPUs per job, this job asks for 4 (4 x 1 nodes) at site sandbox-csc"
    ), line
    line = _refused(cj, sandbox, site, "-p", "gpu", "--gpus", "1", "--model", "A100", "--qos",
                    "normal", "-A", "sandbox")  # fmt: skip
    assert line.endswith("QoS normal at site sandbox-csc is used with partition h100, not gpu")
    # --qos normal alone: to h100, whose one model (H100) needs no --model
    args = ("--gpus", "2", "--qos", "normal", "-t", "0:05:00", "-A", "sandbox")
    lines = _dry_run_lines(cj, site, *args)
    for wanted in ("--partition=h100", "--qos=normal", "--account=sandbox", "--gres=gpu:h100:2"):
        assert f"#SBATCH {wanted}" in lines, lines
    fields, _ = _completed(cj, sandbox, site, *args)
    assert (fields["Partition"], fields["QOS"], fields["Account"]) == ("h100", "normal",
                                                                       "sandbox")  # fmt: skip


def test_whole_node_job_without_gpu_option(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    site = _mps_site(sandbox, tmp_path)
    lines = _dry_run_lines(cj, site, "-A", "sandbox")  # no --gpus, no --model, no -p
    assert not any(re.match(r"#SBATCH --(gres|gpus)", ln) for ln in lines), lines
    for wanted in ("--ntasks-per-node=2", "--cpus-per-task=1", "--exclusive"):
        assert f"#SBATCH {wanted}" in lines, lines
    fields, out = _completed(cj, sandbox, site, "-A", "sandbox")
    # the node's GPUs, given whole (scontrol says TRES= on 22.05, AllocTRES= from 24.11)
    allocated = fields.get("AllocTRES") or fields.get("TRES", "")
    assert "gres/gpu=8" in allocated, fields
    assert "preflight h1: OK (8 GPU slot(s))" in out, out  # the GPUs Slurm gave, checked
    assert out.count("tasks=2 cpus=1") == 2, out
