"""Every job shape, run on the real local cluster: GPU syntax x CPU form x launcher x nodes.

Slurm takes every GPU request spelling, so each syntax and CPU form is a variant of the
sandbox's site file (same nodes and models, ``gpu_request.syntax`` / ``cpus`` changed) in a
temporary directory, and its job scripts run against the one cluster. All the jobs are
submitted first (the module fixture), then each test waits for its own: a job is a few
seconds, and the cluster runs several at once.

Each task the launcher starts prints its node, Slurm rank, torchrun's ranks, its GPUs and
CPUs per task; the tests count them per node: one torchrun agent per node with its own node
rank, the srun launcher's tasks (one per GPU where the site runs one task per GPU), each
seeing exactly its GPUs, and one preflight per node.
"""

from __future__ import annotations

import io
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site

from .conftest import Sandbox, finish_despite_dying_slurmd

pytestmark = pytest.mark.slurm

SYNTAXES = ("gres", "gpus-per-node", "gpus", "gpus-per-task", "none")
CPU_FORMS = ("cpus-per-gpu", "cpus-per-task")
LAUNCHERS = ("none", "srun", "torchrun")
CPUS_PER_GPU = 3  # a count no default gives, so the tests see whose CPUs a task got
WHOLE_NODE_GPUS = 4  # syntax none: the variant's whole-node partition

# The probe's line goes out in one write. torchrun's --tee copies each worker's lines from its
# log file as it finds them, so a line caught half-written is printed as two, the rest under
# a second "[rankN]: " (torch's tail_logfile); with PYTHONUNBUFFERED=1 in the job's
# environment, print() writes the newline apart from the text and that happened here.
PROBE = """\
import os
names = ("SLURMD_NODENAME", "SLURM_PROCID", "GROUP_RANK", "RANK", "LOCAL_RANK", "WORLD_SIZE",
         "CUDA_VISIBLE_DEVICES", "SLURM_CPUS_PER_TASK")
line = "shape-probe: " + " ".join(f"{n}={os.environ.get(n, '-')}" for n in names) + "\\n"
os.write(1, line.encode())
"""


@dataclass(frozen=True)
class Shape:
    syntax: str
    cpus: str
    launcher: str
    nodes: int
    tasks_per_node: int | None = None  # --tasks-per-node (srun launcher only)

    @property
    def name(self) -> str:
        tasks = f"-{self.tasks_per_node}tasks" if self.tasks_per_node else ""
        return f"{self.syntax}-{self.cpus}-{self.launcher}-{self.nodes}n{tasks}"

    @property
    def model(self) -> str:
        # Two models, so that two jobs of two nodes run at once on gpu[1-2].
        if self.syntax == "none":
            return "A100"
        return "V100" if (SYNTAXES.index(self.syntax) + self.nodes) % 2 else "A100"

    @property
    def gpus(self) -> int:
        return WHOLE_NODE_GPUS if self.syntax == "none" else 2

    @property
    def per_task_cpus(self) -> bool:
        """Whether the batch asks CPUs per task (else per GPU)."""
        return self.cpus == "cpus-per-task" or self.syntax == "gpus-per-task"

    @property
    def cpus_per_task(self) -> int | None:
        """The batch's --cpus-per-task (none: no CPU count is asked for there)."""
        if not self.per_task_cpus or self.syntax == "none":
            return None
        return CPUS_PER_GPU * self.gpus // self.srun_tasks

    @property
    def srun_tasks(self) -> int:
        """The srun launcher's tasks per node: one per GPU where the site runs one task per
        GPU (asks CPUs per task, or one GPU per task), else one; --tasks-per-node over both."""
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return self.gpus if self.per_task_cpus else 1


SHAPES = [
    Shape(syntax, cpus, launcher, nodes)
    for syntax in SYNTAXES
    for cpus in CPU_FORMS
    for launcher in LAUNCHERS
    for nodes in (1, 2)
] + [
    Shape("gres", "cpus-per-gpu", "srun", 2, tasks_per_node=2),
    Shape("gpus-per-node", "cpus-per-task", "srun", 2, tasks_per_node=2),
]


def _param(shape: Shape) -> object:
    marks = [pytest.mark.torch] if shape.launcher == "torchrun" else []
    return pytest.param(shape, id=shape.name, marks=marks)


def variant_site(sandbox: Sandbox, directory: Path, syntax: str, cpus: str) -> Path:
    """The sandbox's site with another GPU syntax and CPU form (syntax none: see below)."""
    site = YAML(typ="safe").load(sandbox.site_path.read_text())
    site["gpu_request"]["syntax"] = syntax
    site["gpu_request"]["cpus"] = cpus
    if syntax == "none":
        # A site that asks for no GPU option cannot tell two models on one node apart, and
        # gpu[1-2] hold A100s and V100s: this variant's node map calls all four A100 and its
        # one partition gives them whole, preflight warn (each node's preflight finds the
        # V100s, says so once, and the job goes on). Slurm's partition gpu is the same.
        for entry in site["node_map"]:
            if entry["nodes"] in ("gpu1", "gpu2"):
                entry["gpus"] = [dict(gpu, model="A100") for gpu in entry["gpus"]]
        gpu = site["partitions"]["gpu"]
        site["partitions"] = {
            "gpu": {
                "nodes": gpu["nodes"], "time_limit": gpu["time_limit"], "default": True,
                "gpus_per_node": WHOLE_NODE_GPUS, "preflight": "warn",
                "defaults": {"account": "sandbox"},
            }
        }  # fmt: skip
    path = directory / f"site-{syntax}-{cpus}.yaml"
    out = io.StringIO()
    YAML(typ="safe").dump(site, out)
    path.write_text(out.getvalue())
    return path


@dataclass(frozen=True)
class Submitted:
    job_id: str
    output: Path
    script: str


@pytest.fixture(scope="module")
def matrix_jobs(
    request: pytest.FixtureRequest, sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> dict[Shape, Submitted]:
    """Every selected shape's job, all submitted before any test waits."""
    wanted = [
        item.callspec.params["shape"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    ]
    directory = tmp_path_factory.mktemp("shapes")
    probe = directory / "probe.py"
    probe.write_text(PROBE)
    jobs: dict[Shape, Submitted] = {}
    for shape in wanted:
        site_file = variant_site(sandbox, directory, shape.syntax, shape.cpus)
        site = load_site(site_file)
        job = resolve(
            site,
            JobRequest(
                str(probe),
                gpus=shape.gpus,
                model=shape.model,
                nodes=shape.nodes,
                partition="gpu",
                launcher=shape.launcher,
                tasks_per_node=shape.tasks_per_node,
                cpus_per_gpu=None if shape.syntax == "none" else CPUS_PER_GPU,
                mem_per_gpu=None if shape.syntax == "none" else "500M",
                # without a memory request a job takes its nodes' memory, and runs alone
                sbatch_args=("--mem=1G",) if shape.syntax == "none" else (),
                time="4:00",
                job_name=shape.name,
            ),
        )
        script = render(site, job, python=sys.executable).script
        path = directory / f"{shape.name}.sh"
        path.write_text(script)
        output = directory / f"{shape.name}.out"
        jobs[shape] = Submitted(sandbox.sbatch(f"--output={output}", str(path)), output, script)
    return jobs


def _probes(out: str) -> list[dict[str, str]]:
    return [
        dict(pair.split("=", 1) for pair in m.group(1).split())
        for m in re.finditer(r"shape-probe: (.*)$", out, re.M)
    ]


def _finished(submitted: Submitted, sandbox: Sandbox) -> tuple[dict[str, str], str]:
    """The job's fields and output once it ended (``finish_despite_dying_slurmd``)."""
    script = submitted.output.with_suffix(".sh")
    return finish_despite_dying_slurmd(sandbox, submitted.job_id, submitted.output, script, 420)


def _gpus(task: dict[str, str]) -> list[str]:
    value = task["CUDA_VISIBLE_DEVICES"]
    return [] if value == "-" else value.split(",")


@pytest.mark.parametrize("shape", [_param(s) for s in SHAPES])
def test_shape_runs_one_agent_or_the_right_tasks_per_node_each_on_its_gpus(
    shape: Shape, matrix_jobs: dict[Shape, Submitted], sandbox: Sandbox
) -> None:
    submitted = matrix_jobs[shape]
    fields, out = _finished(submitted, sandbox)
    context = f"\n--- script\n{submitted.script}\n--- output\n{out}"
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), context
    nodes = sandbox.run("scontrol", "show", "hostnames", fields["NodeList"]).split()
    assert len(nodes) == shape.nodes, fields

    # The preflight ran once on each node of the job, and passed (none: it finds the V100s
    # the variant's node map leaves out, and says so; see variant_site).
    said = "FAILED" if shape.syntax == "none" else "OK"
    report = rf"^(?:clusterjob: error: )?preflight (\S+): {said}\b"
    preflights = Counter(re.findall(report, out, re.M))
    assert preflights == Counter(nodes), context

    tasks = _probes(out)
    per_node = Counter(t["SLURMD_NODENAME"] for t in tasks)
    node_gpus = 0 if shape.syntax == "none" else shape.gpus  # none: Slurm binds no GPU
    if shape.launcher == "none":  # the batch shell on the first node
        assert len(tasks) == 1 and tasks[0]["SLURMD_NODENAME"] == nodes[0], context
        assert len(_gpus(tasks[0])) == node_gpus, context
    elif shape.launcher == "srun":
        assert per_node == Counter({n: shape.srun_tasks for n in nodes}), context
        ranks = sorted(int(t["SLURM_PROCID"]) for t in tasks)
        assert ranks == list(range(shape.nodes * shape.srun_tasks)), context
        one_each = shape.syntax == "gpus-per-task" and shape.srun_tasks == shape.gpus
        for node in nodes:
            seen = [_gpus(t) for t in tasks if t["SLURMD_NODENAME"] == node]
            if one_each:  # each task its own GPU
                assert all(len(g) == 1 for g in seen), context
                assert len({g[0] for g in seen}) == shape.gpus, context
            else:  # the node's tasks share its GPUs
                assert all(len(g) == node_gpus for g in seen), context
                assert len({tuple(g) for g in seen}) == 1, context
        if shape.cpus_per_task is not None:
            cpus = CPUS_PER_GPU * shape.gpus // shape.srun_tasks
            assert {t["SLURM_CPUS_PER_TASK"] for t in tasks} == {str(cpus)}, context
    else:  # torchrun: one agent per node, its own node rank, one worker per GPU
        assert per_node == Counter({n: shape.gpus for n in nodes}), context
        world = shape.nodes * shape.gpus
        assert sorted(int(t["RANK"]) for t in tasks) == list(range(world)), context
        assert {t["WORLD_SIZE"] for t in tasks} == {str(world)}, context
        node_rank = {t["SLURMD_NODENAME"]: t["GROUP_RANK"] for t in tasks}
        assert len(set(node_rank.values())) == shape.nodes, context
        for task in tasks:
            assert node_rank[task["SLURMD_NODENAME"]] == task["GROUP_RANK"], context
            assert len(_gpus(task)) == node_gpus, context
        if shape.cpus_per_task is not None and shape.nodes > 1:  # the agent: the node's CPUs
            cpus = CPUS_PER_GPU * shape.gpus
            assert {t["SLURM_CPUS_PER_TASK"] for t in tasks} == {str(cpus)}, context
