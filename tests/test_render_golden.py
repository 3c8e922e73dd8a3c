"""Golden job scripts for the shipped example sites (site_configs/*.yaml, via the real loader).

A rendered script that differs from tests/golden/<name>.sh fails with a unified diff. To accept
a change on purpose: ``CLUSTERJOB_REGEN_GOLDEN=1 pytest tests/test_render_golden.py``, then
review ``git diff tests/golden``. A missing golden file is a failure, never created silently.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterjob import resources
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site

GOLDEN_DIR = Path(__file__).parent / "golden"
REGEN_ENV = "CLUSTERJOB_REGEN_GOLDEN"
TOKEN = "0123456789abcdef"


def assert_golden(path: Path, actual: str) -> None:
    """Compare ``actual`` with the golden file at ``path``; rewrite it only when asked to."""
    if os.environ.get(REGEN_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    if not path.is_file():
        pytest.fail(
            f"golden file {path} is missing; create it with {REGEN_ENV}=1 and review it",
            pytrace=False,
        )
    expected = path.read_text()
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=str(path),
                tofile="rendered",
            )
        )
        pytest.fail(
            f"rendered script differs from {path.name} "
            f"(if intended: {REGEN_ENV}=1, then review the diff):\n{diff}",
            pytrace=False,
        )


def _portable(script: str) -> str:
    """Machine-specific paths replaced by stable placeholders."""
    repo = str(resources.site_configs_dir().resolve().parent)
    return script.replace(sys.executable, "<sys.executable>").replace(repo, "<repo>")


CASES = {
    # mllab: typed GRES; the defaults of partition gpu applied
    "mllab-a100x2": ("mllab", dict(model="a100", gpus=2, args=("--lr", "3e-4"))),
    # mllab: two nodes of the debug partition, with every per-job option set
    "mllab-v100x2-2nodes-options": (
        "mllab",
        dict(
            model="V100-32GB",
            gpus=2,
            nodes=2,
            partition="debug",
            time="00:30:00",
            job_name="sweep lr",
            array="0-3%2",
            dependency="afterok:41",
            output="logs/%x-%A_%a.out",
            error="logs/%x-%A_%a.err",
            signal="B:USR1@90",
            requeue=True,
            exclude="ml-gpu01",
            mail_type="END,FAIL",
            mail_user="ada@example.org",
            constraint="ib",
            sbatch_args=("--exclusive",),
            args=("--config", "configs/my run.yaml", "'$(touch pwned)'; rm -rf ~"),
        ),
    ),
    # hpccentre: --gpus-per-node with NVML-style GRES names, plus the model's node feature
    "hpccentre-a100x4": ("hpccentre", dict(model="A100", gpus=4)),
    # mllab: a sweep as one array job (task i's arguments chosen by SLURM_ARRAY_TASK_ID), a
    # single-node --signal sent to the batch shell, --requeue appending to one log
    "mllab-a100x1-sweep": (
        "mllab",
        dict(
            model="a100",
            gpus=1,
            array="%2",
            signal="USR1@90",
            requeue=True,
            args=("--epochs", "3"),
            task_args=(("--lr=1e-4", "--bs=32"), ("--lr=3e-4", "--name=$(touch pwned) it's")),
        ),
    ),
    # hpccentre: 8 per node only exists in gpu-big, which is not the default partition
    "hpccentre-a100x8-2nodes": ("hpccentre", dict(model="a100-sxm4-80gb", gpus=8, nodes=2)),
    # h100farm: untyped GRES, the model chosen by --constraint; torchrun over four nodes
    "h100farm-h100x8-4nodes": ("h100farm", dict(model="h100", gpus=8, nodes=4)),
    "h100farm-a100x1-dev": ("h100farm", dict(model="A100", gpus=1, partition="dev")),
    # The example sites written from real clusters' documentation (tests/test_real_sites.py
    # compares their #SBATCH lines with the documented ones; these pin the whole script).
    # perlmutter: the QoS is the queue, one task per GPU (each task sees every GPU: no --gpu-bind)
    "perlmutter-a100x4": ("perlmutter", dict(model="a100", gpus=4, account="m4321")),
    # perlmutter on two nodes: each srun step (preflight, torchrun's agents; the srun launcher's
    # tasks) says its own layout, GPUs and CPUs, without the batch's one-GPU-per-task request
    "perlmutter-a100x4-2nodes": ("perlmutter", dict(model="a100", gpus=4, nodes=2)),
    "perlmutter-a100x4-2nodes-srun": (
        "perlmutter",
        dict(model="a100", gpus=4, nodes=2, launcher="srun"),
    ),
    # narval: no partition, a MIG slice by its type, memory per node
    "narval-mig-4g": ("narval", dict(model="4g.20gb", gpus=1, mem_per_gpu="40G")),
    # jeanzay: "any V100" on the default partition, QoS by time, account from the project
    "jeanzay-v100x4-2nodes": (
        "jeanzay",
        dict(model="v100", gpus=4, nodes=2, time="30:00:00", project="abc"),
    ),
    # lumi: AMD GPUs, whole nodes, preflight warn
    "lumi-mi250x8-2nodes": ("lumi", dict(gpus=8, nodes=2, project="465000000")),
    # lonestar6: no GPU option, the queue gives whole nodes
    "lonestar6-a100x3": ("lonestar6", dict(model="a100", gpus=3)),
    # gelab: Grid Engine (#$ lines: -l gpu=N,gpu_type=T, -q, -t, -hold_jid)
    "gelab-a100x2": ("gelab", dict(model="a100", gpus=2, time="1:00:00")),
    "gelab-h100x8-sweep-hold": (
        "gelab",
        dict(
            model="H100",
            gpus=8,
            job_name="sweep",
            task_args=(("--lr", "0.1"), ("--lr", "0.01")),
            dependency="afterany:41",
            output="logs/%x-%A_%a.out",
            requeue=True,
            launcher="torchrun",
        ),
    ),
    "gelab-cpu-short": ("gelab", dict(gpus=0, partition="short.q", mail_type="END,FAIL")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_job_script(name: str, tmp_path: Path) -> None:
    site_name, request_kw = CASES[name]
    site = load_site(resources.site_configs_dir() / f"{site_name}.yaml")
    job = resolve(site, JobRequest("train.py", token=TOKEN, **request_kw))  # type: ignore[arg-type]
    rendered = render(site, job, python="/usr/bin/python3")
    script = _portable(rendered.script)
    assert_golden(GOLDEN_DIR / f"{name}.sh", script)
    path = tmp_path / "job.sh"
    path.write_text(rendered.script)
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_every_example_site_has_a_golden_case() -> None:
    sites = {p.stem for p in resources.site_configs_dir().glob("*.yaml")}
    assert sites and sites <= {site for site, _ in CASES.values()}


def test_no_stray_golden_files() -> None:
    assert {p.stem for p in GOLDEN_DIR.glob("*.sh")} == set(CASES)


def test_missing_golden_file_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REGEN_ENV, raising=False)
    with pytest.raises(pytest.fail.Exception, match="is missing"):
        assert_golden(tmp_path / "nope.sh", "x\n")
    assert not (tmp_path / "nope.sh").exists()


def test_golden_mismatch_shows_a_unified_diff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(REGEN_ENV, raising=False)
    golden = tmp_path / "g.sh"
    golden.write_text("a\nb\n")
    with pytest.raises(pytest.fail.Exception) as info:
        assert_golden(golden, "a\nc\n")
    assert "-b\n+c\n" in str(info.value)
    assert_golden(golden, "a\nb\n")  # equal: passes
