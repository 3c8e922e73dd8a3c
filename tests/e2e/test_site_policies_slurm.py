"""Site policies on the local cluster: a site with AMD GPUs (which clusterjob cannot check)
runs its jobs with ``preflight: warn`` and stops them with one clear line with
``required``; extra GRES reach Slurm in the GPU request's one --gres; a site line is applied.

The sandbox's v100 GRES stand in for the AMD GPUs: the site file says they are MI250X
(``vendor: amd``), so the preflight has nothing it can check them with, as on a real AMD node.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from .conftest import Cli, Sandbox
from .test_end_to_end import finished, logs, wait_status

pytestmark = pytest.mark.slurm

AMD_SITE = """\
site: sandbox-amd
cluster_name: sandbox
node_command: {node_command}
preflight: {preflight}
gpu_request: {{syntax: gres, type_required: true}}
defaults: {{account: sandbox, cpus_per_gpu: 1, mem_per_gpu: 1G, sbatch: ["--hint=nomultithread"]}}
models:
  A100: {{gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}}
  MI250X: {{vendor: amd, gres_type: v100}}
partitions:
  gpu: {{nodes: "gpu[1-2]", default: true, time_limit: "1:00:00"}}
node_map:
  - nodes: "gpu[1-2]"
    gpus:
      - {{model: A100, bus_id: "0000:07:00.0"}}
      - {{model: A100, bus_id: "0000:0b:00.0"}}
      - {{model: MI250X, bus_id: "0000:48:00.0"}}
      - {{model: MI250X, bus_id: "0000:4c:00.0"}}
"""


def _site(sandbox: Sandbox, tmp_path: Path, preflight: str) -> Path:
    node_command = re.search(r"^node_command: (.+)$", sandbox.site_path.read_text(), re.MULTILINE)
    assert node_command, "the sandbox site names its node command"
    path = tmp_path / f"amd-{preflight}.yaml"
    path.write_text(AMD_SITE.format(node_command=node_command.group(1), preflight=preflight))
    return path


def _settled(cj: Cli, job: str, wanted: tuple[str, ...]) -> tuple[dict, str]:
    """The finished job's row and log, read again for a few seconds until the log has every
    ``wanted`` line and accounting has the job's GPUs (both can trail the job's end)."""
    row = wait_status(cj, job, finished)
    deadline = time.monotonic() + 15
    while True:
        out = logs(cj, job)
        if (all(w in out for w in wanted) and row.get("gpus")) or time.monotonic() > deadline:
            return row, out
        time.sleep(1)
        row = wait_status(cj, job, finished)


def _submit(cj: Cli, site: Path, *args: str) -> str:
    proc = cj("submit", "--site", str(site), *args)
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"Submitted job (\d+)", proc.stdout)
    assert match, proc.stdout
    return match.group(1)


def test_amd_gpus_run_with_preflight_warn(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    site = _site(sandbox, tmp_path, "warn")
    job = _submit(
        cj, site, "--gpus", "1", "--model", "MI250X", "--", "bash", "-c", "echo amd-job-ran"
    )
    row, out = _settled(cj, job, ("amd-job-ran", "cannot check MI250X GPUs"))
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (row, out)
    assert "amd-job-ran" in out, out
    assert "cannot check MI250X GPUs" in out, out
    assert "going on: this site's preflight is warn" in out, out
    assert "gres/gpu:v100=1" in row["gpus"].split(","), row


def test_amd_gpus_stop_with_preflight_required(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    site = _site(sandbox, tmp_path, "required")
    job = _submit(
        cj, site, "--gpus", "1", "--model", "MI250X", "--", "bash", "-c", "echo amd-job-ran"
    )
    row = wait_status(cj, job, finished)
    out = logs(cj, job)
    assert row["state"] == "FAILED", (row, out)
    assert "amd-job-ran" not in out, out
    lines = [line for line in out.splitlines() if "cannot check MI250X GPUs" in line]
    assert len(lines) == 1 and "set preflight: warn (or off)" in lines[0], out


def test_extra_gres_and_site_lines_reach_slurm(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    """--gres pfsdir:scratch:1 joins the GPU request (one --gres), so Slurm gives both; the
    site's --hint line is in the job."""
    site = _site(sandbox, tmp_path, "off")
    job = _submit(
        cj,
        site,
        "--gpus", "1", "--model", "A100", "--gres", "pfsdir:scratch:1",
        "--", "bash", "-c", "echo gres-job-ran",
    )  # fmt: skip
    row = wait_status(cj, job, finished)
    out = logs(cj, job)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (row, out)
    record = sandbox.job(job)
    tres = record.get("TresPerNode", "") + record.get("TRES", "")
    assert "gpu:a100:1" in tres and "pfsdir" in tres, record
