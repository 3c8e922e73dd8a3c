"""Resolution tables: (site, request) -> the exact sbatch GPU options, or the exact error.

Sites are built here from the data model directly, one per GPU request syntax, so each
table row shows the whole input. Golden tests over the shipped example YAML files are in
test_render_golden.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import hostlist
import pytest

from clusterjob.errors import ConfigError, UsageError
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.gpu_syntax import syntax_named
from clusterjob.site.model import GpuModel, JobDefaults, NodeMap, Partition, RequestForm, Site
from clusterjob.site.nodemodel import NodeGpu

A100 = GpuModel("A100", ("a100-80gb", "A100-SXM4-80GB"), "a100", ("NVIDIA A100-SXM4-80GB",), 80)
V100 = GpuModel("V100", ("v100-32gb",), "v100", ("Tesla V100-SXM2-32GB",), 32)
H100 = GpuModel("H100", ("h100-80gb",), "h100", ("NVIDIA H100 80GB HBM3",), 80)


def partition(name: str, nodes: str, **kw: object) -> Partition:
    return Partition(name, nodes, tuple(hostlist.expand_hostlist(nodes)), **kw)  # type: ignore[arg-type]


def node_map(*spec: tuple[str, list[str]]) -> NodeMap:
    nodes: dict[str, tuple[NodeGpu, ...]] = {}
    for hosts, models in spec:
        for host in hostlist.expand_hostlist(hosts):
            nodes[host] = tuple(NodeGpu(slot=i, model=m) for i, m in enumerate(models))
    return NodeMap(nodes)


def make_site(
    syntax: str = "gres",
    *,
    type_required: bool = True,
    models: tuple[GpuModel, ...] = (A100, V100),
    name: str = "mllab",
    templates_dir: Path | None = None,
) -> Site:
    """A100 x4 on gpu-a[01-12], V100 x2 on gpu-v[01-04], one mixed node, three partitions."""
    return Site(
        name=name,
        cluster_name=name,
        source=Path(f"/etc/clusterjob/{name}.yaml"),
        gpu_syntax=syntax_named(syntax),
        type_required=type_required,
        models=models,
        partitions=(
            partition(
                "gpu",
                "gpu-a[01-12],gpu-v[01-04]",
                default=True,
                time_limit="2-00:00:00",
                defaults=JobDefaults(account="ml", qos="normal", cpus_per_gpu=8, mem_per_gpu="64G"),
            ),
            partition("debug", "gpu-v[01-02]", time_limit="01:00:00"),
            partition("mixed", "mix01"),
            partition("cpu", "cpu[01-04]"),
        ),
        node_map=node_map(
            ("gpu-a[01-12]", ["A100"] * 4),
            ("gpu-v[01-04]", ["V100"] * 2),
            ("mix01", ["A100", "V100", "V100", "A100"]),
        ),
        templates_dir=templates_dir,
    )


GRES_SITE = make_site("gres")
GRES_UNTYPED_SITE = make_site(
    "gres",
    type_required=False,
    models=(replace(A100, gres_type=None, constraint="a100"), replace(V100, gres_type=None)),
)
CONSTRAINT_SITE = make_site(
    "gres+constraint",
    type_required=False,
    models=(
        replace(A100, gres_type=None, constraint="a100"),
        replace(V100, gres_type=None, constraint="v100"),
    ),
)
CONSTRAINT_TYPED_SITE = make_site(
    "gres+constraint",
    type_required=True,
    models=(replace(A100, constraint="a100"), replace(V100, constraint="v100")),
)
GPN_SITE = make_site(
    "gpus-per-node",
    models=(
        replace(A100, gres_type="nvidia_a100-sxm4-80gb"),
        replace(V100, gres_type="tesla_v100-sxm2-32gb"),
    ),
)
GPUS_SITE = make_site("gpus")


@pytest.mark.parametrize(
    ("site", "request_kw", "options", "constraint"),
    [
        # gres, typed
        (GRES_SITE, dict(model="A100", gpus=2), ("--gres=gpu:a100:2",), None),
        (GRES_SITE, dict(model="a100-sxm4-80GB", gpus=4), ("--gres=gpu:a100:4",), None),
        (GRES_SITE, dict(model="v100", gpus=2, nodes=3), ("--gres=gpu:v100:2",), None),
        (GRES_SITE, dict(model="V100", gpus=1, constraint="ib"), ("--gres=gpu:v100:1",), "ib"),
        # gres, untyped: the node feature selects the model when there is one
        (
            GRES_UNTYPED_SITE,
            dict(model="A100", gpus=2),
            ("--gres=gpu:2", "--constraint=a100"),
            None,
        ),
        (  # no type, no feature: only where the partition holds V100s alone
            GRES_UNTYPED_SITE,
            dict(model="V100", gpus=2, partition="debug"),
            ("--gres=gpu:2",),
            None,
        ),
        # gres+constraint
        (CONSTRAINT_SITE, dict(model="A100", gpus=2), ("--gres=gpu:2", "--constraint=a100"), None),
        (
            CONSTRAINT_SITE,
            dict(model="v100", gpus=1, constraint="ib&nvme"),
            ("--gres=gpu:1", "--constraint=v100&ib&nvme"),
            None,
        ),
        (
            CONSTRAINT_TYPED_SITE,
            dict(model="A100", gpus=3),
            ("--gres=gpu:a100:3", "--constraint=a100"),
            None,
        ),
        # gpus-per-node, long GRES type names
        (GPN_SITE, dict(model="A100", gpus=4), ("--gpus-per-node=nvidia_a100-sxm4-80gb:4",), None),
        (
            GPN_SITE,
            dict(model="V100", gpus=2, nodes=2, constraint="ib"),
            ("--gpus-per-node=tesla_v100-sxm2-32gb:2",),
            "ib",
        ),
        (
            make_site("gpus-per-node", models=(replace(A100, constraint="a100_80g"),)),
            dict(model="A100", gpus=2, constraint="ib"),
            ("--gpus-per-node=a100:2", "--constraint=a100_80g&ib"),
            None,
        ),
        # gpus: the total over the job; over several nodes, per node (multi_node: per-node,
        # the default: Slurm may split a --gpus total unevenly)
        (GPUS_SITE, dict(model="A100", gpus=4), ("--gpus=a100:4",), None),
        (GPUS_SITE, dict(model="A100", gpus=4, nodes=3), ("--gpus-per-node=a100:4",), None),
    ],
)
def test_gpu_options_in_the_sites_syntax(
    site: Site, request_kw: dict, options: tuple[str, ...], constraint: str | None
) -> None:
    job = resolve(site, JobRequest("train.py", **request_kw))
    assert job.gres.options == options
    assert job.constraint == constraint
    assert job.gres.per_node == request_kw["gpus"]
    assert job.gres.nodes == request_kw.get("nodes", 1)


@pytest.mark.parametrize(
    ("site", "request_kw", "message"),
    [
        (
            GRES_SITE,
            dict(model="P100"),
            "unknown GPU model 'P100' at site mllab; "
            "this site has: A100 (13 nodes), V100 (5 nodes)",
        ),
        (
            GRES_SITE,
            dict(model=None),
            "--model is required at site mllab; this site has: A100 (13 nodes), V100 (5 nodes)",
        ),
        (
            GRES_SITE,
            dict(model="A100", partition="gpus"),
            "unknown partition 'gpus' at site mllab (did you mean gpu?); valid partitions: gpu, "
            "debug, mixed, cpu",
        ),
        (
            GRES_SITE,
            dict(model="A100", partition="debug"),
            "partition debug at site mllab has no A100 nodes (it has: V100); "
            "A100 is in: gpu, mixed",
        ),
        (
            GRES_SITE,
            dict(model="A100", partition="cpu"),
            "partition cpu at site mllab has no A100 nodes (it has: no GPUs in the node map); "
            "A100 is in: gpu, mixed",
        ),
        (
            GRES_SITE,
            dict(model="V100", gpus=3),
            "cannot give 3 V100 GPU(s) per node on 1 node(s) at site mllab: "
            "no node has 3 V100 GPUs; possible: "
            "partition gpu: V100: at most 2 per node (nodes gpu-v[01-04]), "
            "A100: at most 4 per node (nodes gpu-a[01-12]); "
            "partition debug: V100: at most 2 per node (nodes gpu-v[01-02]); "
            "partition mixed: V100: at most 2 per node (nodes mix01), "
            "A100: at most 2 per node (nodes mix01)",
        ),
        (
            GRES_SITE,
            dict(model="V100", gpus=2, nodes=3, partition="debug"),
            "cannot give 2 V100 GPU(s) per node on 3 node(s) at site mllab in partition debug: "
            "only 2 node(s) have 2 or more V100 GPUs; possible: "
            "V100: at most 2 per node (nodes gpu-v[01-02])",
        ),
        (
            GRES_SITE,
            dict(model="A100", gpus=1, nodes=2, nodelist="gpu-a01,gpu-v01"),
            "cannot give 1 A100 GPU(s) per node on 2 node(s) at site mllab: "
            "--nodelist node(s) gpu-v01 cannot give 1 A100 GPUs each; possible: "
            "partition gpu: A100: at most 4 per node (nodes gpu-a[01-12]), "
            "V100: at most 2 per node (nodes gpu-v[01-04]); "
            "partition mixed: A100: at most 2 per node (nodes mix01), "
            "V100: at most 2 per node (nodes mix01)",
        ),
        (GRES_SITE, dict(model="A100", exclude="gpu-a[01"), "--exclude: not a Slurm hostlist"),
        (GRES_SITE, dict(model="A100", gpus=0), "--model asks for GPUs, but this is a CPU-only"),
        (GRES_SITE, dict(gpus=-1), "--gpus must be 0 (a CPU-only job) or more"),
        (GRES_SITE, dict(model="A100", nodes=0), "--nodes must be at least 1"),
        (
            GRES_SITE,
            dict(model="A100", time="3-00:00:00", partition="gpu"),
            "--time 3-00:00:00 is longer than partition gpu's limit 2-00:00:00 at site mllab",
        ),
        (GRES_SITE, dict(model="A100", time="soon"), "--time: not a Slurm time: 'soon'"),
        (GRES_SITE, dict(model="A100", job_name="a\nb"), "line break in --job-name"),
        (GRES_SITE, dict(model="A100", account="ml\r"), "line break in --account"),
        (GRES_SITE, dict(model="A100", qos="a\x00b"), "NUL character in --qos"),
        (GRES_SITE, dict(model="A100", args=("ok", "a\x00b")), "NUL character in a job argument"),
        (GRES_SITE, dict(model="A100", partition=""), "--partition must not be empty"),
        (
            GRES_SITE,
            dict(model="A100", sbatch_args=("exclusive",)),
            "--sbatch-arg 'exclusive' is not an sbatch option",
        ),
        (GRES_SITE, dict(model="A100", token="a b"), "bad submission token"),
        (
            CONSTRAINT_SITE,
            dict(model="A100", constraint="[ib|eth]"),
            "cannot combine --constraint '[ib|eth]' with the 'a100' node feature",
        ),
    ],
)
def test_impossible_requests_say_what_is_possible(
    site: Site, request_kw: dict, message: str
) -> None:
    with pytest.raises(UsageError) as info:
        resolve(site, JobRequest("train.py", **request_kw))
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    ("site", "key_path"),
    [
        # type_required but the model has no GRES type: the site config is at fault
        (
            make_site("gres", models=(replace(A100, gres_type=None),)),
            "models.A100.gres_type",
        ),
        (
            make_site("gpus", models=(replace(A100, gres_type=None),)),
            "models.A100.gres_type",
        ),
        # gres+constraint without a node feature for the model
        (make_site("gres+constraint", models=(A100,)), "models.A100.constraint"),
    ],
)
def test_site_that_cannot_express_the_model_is_a_config_error(site: Site, key_path: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(site, JobRequest("train.py", model="A100"))
    (issue,) = info.value.issues
    assert issue.file == "/etc/clusterjob/mllab.yaml"
    assert issue.key_path == key_path


def test_untyped_site_without_feature_can_still_ask_for_gpus() -> None:
    site = make_site("gpus-per-node", type_required=False, models=(replace(A100, gres_type=None),))
    site = replace(site, node_map=node_map(("gpu-a[01-12]", ["A100"] * 4)))  # A100s alone
    job = resolve(site, JobRequest("train.py", model="A100", gpus=2, nodes=2))
    assert job.gres.options == ("--gpus-per-node=2",)
    assert job.gres.gres_type is None


@pytest.mark.parametrize(
    ("asked", "tasks", "cpus_per_task"),
    [(None, 4, 8), (1, 1, 32), (2, 2, 16), (4, 4, 8)],
)
def test_a_site_of_one_task_per_gpu_writes_the_tasks_asked_for(
    asked: int | None, tasks: int, cpus_per_task: int
) -> None:
    """On a site whose jobs name CPUs per task (one task per GPU), --tasks-per-node, when
    given, is the task count, 1 included (one task driving a node's GPUs); not given, one
    task per GPU. The CPUs per GPU are spread over the tasks."""
    site = replace(GRES_SITE, form=RequestForm(cpus="cpus-per-task"))
    job = resolve(
        site,
        JobRequest("t.py", gpus=4, model="a100", tasks_per_node=asked, launcher="srun"),
        choose_interpreter=False,
    )
    assert (job.sbatch_tasks_per_node, job.cpus_per_task) == (tasks, cpus_per_task)
    assert job.tasks_per_node == (asked or 1)


def test_gpus_per_task_refuses_a_task_count_other_than_the_gpus() -> None:
    """With --gpus-per-task=1 the tasks are the GPUs: another task count would change how
    many GPUs the job gets, so it is refused; the GPU count itself is accepted."""
    site = make_site("gpus-per-task")
    request = JobRequest("t.py", gpus=4, model="a100", launcher="srun")
    job = resolve(site, replace(request, tasks_per_node=4), choose_interpreter=False)
    assert job.sbatch_tasks_per_node == 4
    with pytest.raises(UsageError) as info:
        resolve(site, replace(request, tasks_per_node=2), choose_interpreter=False)
    assert str(info.value) == (
        "--tasks-per-node 2: site mllab gives each task one GPU (--ntasks-per-node=N "
        "--gpus-per-task=TYPE:1), so 4 GPU(s) a node are 4 task(s) a node: drop "
        "--tasks-per-node"
    )


def test_only_model_may_be_left_out() -> None:
    site = make_site(models=(A100,))
    assert resolve(site, JobRequest("train.py")).model.name == "A100"


def test_partition_choice_default_then_first_then_where_it_fits() -> None:
    # default partition has the model
    assert resolve(GRES_SITE, JobRequest("t.py", model="V100")).partition.name == "gpu"
    # explicit partition wins
    job = resolve(GRES_SITE, JobRequest("t.py", model="V100", partition="debug"))
    assert job.partition.name == "debug"
    assert job.eligible_nodes == ("gpu-v01", "gpu-v02")
    # no default partition: the first in file order that has the model
    no_default = replace(
        GRES_SITE, partitions=tuple(replace(p, default=False) for p in GRES_SITE.partitions)
    )
    assert resolve(no_default, JobRequest("t.py", model="V100")).partition.name == "gpu"
    # the default has the model but the request does not fit there: the next that fits
    job = resolve(GRES_SITE, JobRequest("t.py", model="A100", nodes=1, nodelist="mix01", gpus=2))
    assert job.partition.name == "mixed"


def test_exclude_and_nodelist_narrow_the_eligible_nodes() -> None:
    job = resolve(
        GRES_SITE, JobRequest("t.py", model="V100", gpus=2, nodes=2, exclude="gpu-v[01-02]")
    )
    assert job.eligible_nodes == ("gpu-v03", "gpu-v04")
    with pytest.raises(UsageError, match="only 2 node.* outside --exclude"):
        resolve(
            GRES_SITE, JobRequest("t.py", model="V100", gpus=2, nodes=3, exclude="gpu-v01,gpu-v02")
        )


def test_partition_defaults_apply_only_when_not_given() -> None:
    job = resolve(GRES_SITE, JobRequest("t.py", model="A100"))
    assert (job.account, job.qos, job.cpus_per_gpu, job.mem_per_gpu) == ("ml", "normal", 8, "64G")
    job = resolve(
        GRES_SITE,
        JobRequest("t.py", model="A100", account="x", qos="high", cpus_per_gpu=4, mem_per_gpu="1G"),
    )
    assert (job.account, job.qos, job.cpus_per_gpu, job.mem_per_gpu) == ("x", "high", 4, "1G")
    job = resolve(GRES_SITE, JobRequest("t.py", model="V100", partition="debug"))
    assert (job.account, job.qos, job.cpus_per_gpu, job.mem_per_gpu) == (None, None, None, None)


def test_job_defaults() -> None:
    job = resolve(GRES_SITE, JobRequest("dir/train.py", model="A100"))
    assert job.tasks_per_node == 1  # torchrun spawns the per-GPU workers itself
    assert job.job_name == "train"
    assert job.time is None  # the partition's default time applies
    assert len(job.token) == 16 and job.token == job.request.token
    assert JobRequest("t.py").token != JobRequest("t.py").token
