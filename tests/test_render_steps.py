"""Every srun step of a job script says its own task layout, GPUs and CPUs.

Inside an allocation srun reads the batch's --ntasks, --ntasks-per-node, --gpus-per-task and
(from Slurm 23.11) --cpus-per-task from the environment: a step that says only
``--ntasks-per-node=1`` under ``#SBATCH --ntasks-per-node=<GPUs>`` ran one preflight and one
torchrun agent per GPU (srun: "can't honor --ntasks-per-node set to 1 ... Ignoring"), and a
one-task-per-node step of a ``--gpus-per-task`` job saw one GPU. tests/e2e/test_shapes_matrix.py
runs every shape on the local cluster; these pin the lines, for every syntax and CPU form.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_request import make_site

from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.model import RequestForm, Site

GPU_SYNTAXES = ("gres", "gpus-per-node", "gpus", "gpus-per-task")  # none: tests/e2e
CPU_FORMS = ("cpus-per-gpu", "cpus-per-task")
NODE = "/opt/clusterjob/bin/clusterjob"


def _site(syntax: str, cpus: str) -> Site:
    return replace(make_site(syntax), form=RequestForm(cpus=cpus))  # cpus_per_gpu 8 in gpu


def _script(site: Site, **kw: object) -> str:
    job = resolve(site, JobRequest("train.py", model="a100", **kw))  # type: ignore[arg-type]
    return render(site, job, python="/usr/bin/python3", node_command=[NODE]).script


def _steps(script: str) -> list[tuple[tuple[str, ...], list[str]]]:
    """Each srun command of ``script``: the variables it runs without (env -u), its options."""
    found = []
    for line in script.splitlines():
        if line.startswith("#") or "srun " not in line:
            continue
        words = shlex.split(line.rstrip("\\"))
        words = words[1:] if words[0] == "exec" else words
        unset: list[str] = []
        if words[0] == "env":
            while words[1] == "-u":
                unset.append(words[2])
                words = words[:1] + words[3:]
            words = words[1:]
        assert words[0] == "srun", line
        options = []
        for word in words[1:]:
            if not word.startswith("-"):
                break
            options.append(word)
        found.append((tuple(unset), options))
    return found


# (syntax, CPU form, launcher): the job's two steps on 2 nodes of 2 A100s, CPUs 8 per GPU.
EXPECTED = {
    ("gres", "cpus-per-gpu", "torchrun"): "--nodes=2 --ntasks=2 --ntasks-per-node=1 "
    "--gres=gpu:a100:2",
    ("gres", "cpus-per-task", "torchrun"): "--nodes=2 --ntasks=2 --ntasks-per-node=1 "
    "--gres=gpu:a100:2 --cpus-per-task=16",
    ("gres", "cpus-per-task", "srun"): "--nodes=2 --ntasks=4 --ntasks-per-node=2 "
    "--gres=gpu:a100:2 --cpus-per-task=8",
    ("gpus-per-node", "cpus-per-task", "torchrun"): "--nodes=2 --ntasks=2 --ntasks-per-node=1 "
    "--gpus-per-node=a100:2 --cpus-per-task=16",
    ("gpus", "cpus-per-gpu", "srun"): "--nodes=2 --ntasks=2 --ntasks-per-node=1 --gpus=a100:4",
    ("gpus-per-task", "cpus-per-gpu", "torchrun"): "--nodes=2 --ntasks=2 --ntasks-per-node=1 "
    "--gpus-per-node=a100:2 --gpu-bind=none --cpus-per-task=16",
    ("gpus-per-task", "cpus-per-task", "srun"): "--nodes=2 --ntasks=4 --ntasks-per-node=2 "
    "--gpus-per-task=a100:1 --gpu-bind=per_task:1 --cpus-per-task=8",
}


@pytest.mark.parametrize(("syntax", "cpus", "launcher"), sorted(EXPECTED))
def test_the_launch_step_says_its_layout_gpus_and_cpus(
    syntax: str, cpus: str, launcher: str
) -> None:
    script = _script(_site(syntax, cpus), gpus=2, nodes=2, launcher=launcher)
    unset, options = _steps(script)[-1]
    assert " ".join(options).startswith(EXPECTED[syntax, cpus, launcher] + " --label "), options
    per_task_gpus = ("SLURM_GPUS_PER_TASK", "SLURM_TRES_PER_TASK")
    assert unset == (per_task_gpus if syntax == "gpus-per-task" else ()), script


@pytest.mark.parametrize("syntax", GPU_SYNTAXES)
@pytest.mark.parametrize("cpus", CPU_FORMS)
@pytest.mark.parametrize("launcher", ["none", "srun", "torchrun"])
def test_every_step_of_a_multi_node_job_says_its_whole_layout(
    syntax: str, cpus: str, launcher: str
) -> None:
    """The class: whatever the batch's tasks, each step names its nodes, its task count and
    its tasks per node (consistent), its GPUs, and its CPUs where the batch asked per task."""
    site = _site(syntax, cpus)
    script = _script(site, gpus=2, nodes=2, launcher=launcher)
    steps = _steps(script)
    # the GPU usage sampler (--overlap, in the background), the preflight, the launch
    assert len(steps) == (2 if launcher == "none" else 3), script
    assert "--overlap" in steps[0][1], steps
    one_task_per_gpu = cpus == "cpus-per-task" or syntax == "gpus-per-task"
    for i, (_, options) in enumerate(steps):
        values = dict(o.split("=", 1) for o in options if "=" in o)
        is_srun_launcher = launcher == "srun" and i == 2
        tasks = 2 if is_srun_launcher and one_task_per_gpu else 1
        assert values["--nodes"] == "2", options
        assert values["--ntasks-per-node"] == str(tasks), options
        assert values["--ntasks"] == str(2 * tasks), options
        gpus = [o for o in options if o.startswith(("--gres=", "--gpus"))]
        assert gpus, options
        if one_task_per_gpu:  # the batch asked CPUs per task: the step says its own
            assert values["--cpus-per-task"] == str(8 * 2 // tasks), options
        else:  # per GPU: srun reads SLURM_CPUS_PER_GPU, and the step has the same GPUs
            assert "--cpus-per-task" not in values, options


@pytest.mark.parametrize(
    ("syntax", "gres"),
    [
        ("gres", ["--gres=gpu:a100:2,nvme:10"]),
        ("gpus-per-task", ["--gpus-per-node=a100:2", "--gres=nvme:10"]),
    ],
)
def test_a_step_keeps_the_jobs_other_gres(syntax: str, gres: list[str]) -> None:
    script = _script(_site(syntax, "cpus-per-gpu"), gpus=2, nodes=2, gres=("nvme:10",))
    for _, options in _steps(script):
        assert [o for o in options if o.startswith(("--gres", "--gpus"))] == gres, options


def test_a_single_node_container_step_gets_the_node_gpus_and_cpus() -> None:
    script = _script(
        _site("gpus-per-task", "cpus-per-gpu"), gpus=4, container_image="nvcr.io#nvidia/pytorch"
    )
    (step,) = _steps(script)
    assert step == (
        ("SLURM_GPUS_PER_TASK", "SLURM_TRES_PER_TASK"),
        ["--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--gpus-per-node=a100:4",
         "--gpu-bind=none", "--cpus-per-task=32", "--container-image=nvcr.io#nvidia/pytorch"],
    )  # fmt: skip


def test_srun_without_the_batch_per_task_gpus_under_bash(tmp_path: Path) -> None:
    """The script as bash runs it: each srun (a stand-in that records its argv and which of
    the batch's per-task variables reached it) is started without them."""
    record = tmp_path / "calls.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorder = (
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    names = ('SLURM_GPUS_PER_TASK', 'SLURM_TRES_PER_TASK')\n"
        "    seen = [n for n in names if n in os.environ]\n"
        "    f.write(json.dumps(dict(argv=sys.argv, seen=seen)) + '\\n')\n"
    )
    for name in ("srun", "scontrol"):
        (bin_dir / name).write_text(recorder)
        (bin_dir / name).chmod(0o755)
    site = _site("gpus-per-task", "cpus-per-task")
    job = resolve(site, JobRequest("train.py", model="a100", gpus=2, nodes=2, launcher="srun"))
    script = render(site, job, python=str(bin_dir / "srun"), node_command=[str(bin_dir / "srun")])
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_GPUS_PER_TASK": "a100:1",
        "SLURM_TRES_PER_TASK": "cpu=8,gres/gpu:a100=1",
    }
    (tmp_path / "job.sh").write_text(script.script)
    done = subprocess.run(
        ["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    sampler = [c for c in calls if "sample-usage" in c["argv"]]  # in the background: may lag
    calls = [c for c in calls if c not in sampler]
    assert [c["seen"] for c in calls + sampler] == [[]] * (2 + len(sampler)), calls
    assert [c["seen"] for c in calls] == [[], []], calls  # the preflight's srun, the launch's
    assert "--ntasks=2" in calls[0]["argv"] and "--ntasks=4" in calls[1]["argv"], calls
