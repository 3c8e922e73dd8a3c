"""What a site asks of every job beyond the GPUs, and what the user adds: one rule each.

* Extra GRES (local NVMe, ...) go into the GPU request's one ``--gres`` value: sbatch keeps
  only the last ``--gres`` option, so a second line would drop the GPUs without a word.
* The site's, partition's and model's ``defaults`` (site < partition < model < the user's
  option): account (a pattern such as ``{project}@a100``), QoS or QoS by time, a default
  time, CPUs and memory per GPU, extra GRES, extra ``#SBATCH`` lines.
* A partition's limits (GPUs per job, exact GPUs per node, nodes), refused at submit with
  what is possible.

Pure: reads the site and the request, never Slurm.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from clusterjob.errors import UsageError
from clusterjob.site.model import GpuModel, JobDefaults, Partition, QosLimits, QosRule
from clusterjob.slurm.syntax import sbatch_option_name, time_seconds

# One GRES: name[:type][:count] (sbatch --gres list item), e.g. nvme:10, gpu:a100:2, bandwidth.
GRES_ITEM = re.compile(r"\A[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.-]+)?(?::[0-9]+[KMGTP]?)?\Z")

# sbatch options that ask for GPUs: with clusterjob's own GPU request they would replace or
# contradict it, so --sbatch-arg may not carry them for a GPU job.
GPU_OPTIONS = ("--gpus", "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket", "-G")


def option_value(arg: str) -> str | None:
    """The value of ``--name=value``, ``--name value`` or ``-Xvalue``; None for a flag."""
    name = sbatch_option_name(arg)
    rest = arg[len(name) :]
    if rest.startswith(("=", " ")):
        return rest[1:]
    return rest or None


def gres_name(item: str) -> str:
    return item.split(":", 1)[0]


def check_gres(items: Iterable[str], source: str) -> tuple[str, ...]:
    """Extra GRES as given by the user: each ``name[:type][:count]``, none of them ``gpu``."""
    out = []
    for item in items:
        for part in item.split(","):
            if not GRES_ITEM.match(part):
                raise UsageError(f"{source} {part!r}: expected NAME[:TYPE][:COUNT], e.g. nvme:10")
            if gres_name(part) == "gpu":
                raise UsageError(
                    f"{source} {part!r} asks for GPUs: give --gpus N (and --model) instead; "
                    "a second GPU request would replace the first"
                )
            out.append(part)
    return tuple(out)


def merge_gres(*layers: Sequence[str]) -> tuple[str, ...]:
    """Extra GRES from the least to the most specific layer; a later one of the same name
    replaces an earlier one (the user's nvme:20 over the site's nvme:10), order kept."""
    merged: dict[str, str] = {}
    for layer in layers:
        for item in layer:
            merged.pop(gres_name(item), None)
            merged[gres_name(item)] = item
    return tuple(merged.values())


def split_sbatch_args(
    args: Sequence[str], has_gpus: bool
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The user's ``--sbatch-arg`` options: GRES ones taken out (to be merged into the one
    ``--gres``), the rest kept. A GPU option next to clusterjob's own GPU request is refused:
    sbatch would keep one of the two, silently."""
    gres: list[str] = []
    kept: list[str] = []
    for arg in args:
        name = sbatch_option_name(arg)
        if name == "--gres":
            value = option_value(arg)
            if not value:
                raise UsageError(f"--sbatch-arg {arg!r}: --gres needs a value, e.g. --gres=nvme:10")
            gres += check_gres([value], "--sbatch-arg=--gres")
            continue
        if name in GPU_OPTIONS and has_gpus:
            raise UsageError(
                f"--sbatch-arg {arg!r} asks for GPUs next to clusterjob's own GPU request "
                "(--gpus/--model): give the GPUs with --gpus and --model only"
            )
        kept.append(arg)
    return tuple(gres), tuple(kept)


def with_gres(options: Sequence[str], extra: Sequence[str]) -> tuple[str, ...]:
    """The GPU options with the extra GRES in the one ``--gres`` value: appended to the GPU's
    ``--gres=gpu:...`` where there is one, else one ``--gres=`` option of their own."""
    if not extra:
        return tuple(options)
    joined = ",".join(extra)
    out = list(options)
    for i, option in enumerate(out):
        if option.startswith("--gres="):
            out[i] = f"{option},{joined}"
            return tuple(out)
    return (*out, f"--gres={joined}")


def merge_sbatch_lines(*layers: Sequence[str]) -> tuple[str, ...]:
    """Extra ``#SBATCH`` options from the least to the most specific layer (site, partition,
    model, the user's --sbatch-arg): a later one with the same option name replaces an
    earlier one, so no option is written twice."""
    merged: dict[str, str] = {}
    for layer in layers:
        for arg in layer:
            name = sbatch_option_name(arg)
            merged.pop(name, None)
            merged[name] = arg
    return tuple(merged.values())


# -- defaults ----------------------------------------------------------------------------------

PROJECT_FIELD = "{project}"


def effective_defaults(*layers: JobDefaults) -> JobDefaults:
    """Layers from the least to the most specific (site, partition, model): each key of a
    later layer replaces the earlier one's; ``qos`` and ``qos_by_time`` are one choice (a layer
    that sets either replaces both), as are ``cpus_per_gpu`` and ``cpus_per_task``; ``gres``
    merges by name and ``sbatch`` by option name."""
    out = JobDefaults()
    for layer in layers:
        qos, rules = out.qos, out.qos_by_time
        if layer.qos is not None or layer.qos_by_time:
            qos, rules = layer.qos, layer.qos_by_time
        cpus_per_gpu, cpus_per_task = out.cpus_per_gpu, out.cpus_per_task
        if layer.cpus_per_gpu is not None or layer.cpus_per_task is not None:
            cpus_per_gpu, cpus_per_task = layer.cpus_per_gpu, layer.cpus_per_task
        tasks = layer.tasks_per_node if layer.tasks_per_node is not None else out.tasks_per_node
        out = JobDefaults(
            account=layer.account if layer.account is not None else out.account,
            qos=qos,
            cpus_per_gpu=cpus_per_gpu,
            mem_per_gpu=layer.mem_per_gpu if layer.mem_per_gpu is not None else out.mem_per_gpu,
            time=layer.time if layer.time is not None else out.time,
            qos_by_time=rules,
            gres=merge_gres(out.gres, layer.gres),
            sbatch=merge_sbatch_lines(out.sbatch, layer.sbatch),
            tasks_per_node=tasks,
            cpus_per_task=cpus_per_task,
            max_requeues=layer.max_requeues if layer.max_requeues is not None else out.max_requeues,
        )
    return out


def account_for(pattern: str | None, project: str | None, site: str) -> str | None:
    """The account a job is charged to: the site's pattern with ``{project}`` filled in
    (``{project}@a100`` on Jean Zay), or the pattern itself when it has no field. Without
    ``--project`` a pattern writes no ``--account``: Slurm charges the user's default account
    (and refuses the job in one line where there is none)."""
    if pattern is None:
        if project is not None:
            raise UsageError(
                f"--project: site {site} does not build accounts from a project; give --account"
            )
        return None
    if PROJECT_FIELD not in pattern:
        return pattern
    if project is None:
        return None
    return pattern.replace(PROJECT_FIELD, project)


def qos_for_time(rules: Sequence[QosRule], seconds: int | None) -> str | None:
    """The QoS of the first rule whose ``max_time`` holds the job's time (rules are sorted
    by the loader); None when the time is not known (Slurm's default QoS applies)."""
    if seconds is None or not rules:
        return None
    for rule in rules:
        limit = time_seconds(rule.max_time)
        if limit is None or seconds <= limit:
            return rule.qos
    longest = rules[-1]
    name = longest.qos or "the default QoS"
    raise UsageError(
        f"no QoS of this site takes a job of that length: the longest, {name}, "
        f"ends at {longest.max_time}"
    )


# -- partition limits --------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """The GPUs a job asks for: per node, and nodes."""

    gpus_per_node: int
    nodes: int

    @property
    def total(self) -> int:
        return self.gpus_per_node * self.nodes


def limit_problem(partition: Partition, shape: Shape) -> str | None:
    """Why ``shape`` does not fit ``partition``'s limits, with what would; None if it fits."""
    exact = partition.gpus_per_node
    if exact is not None and shape.gpus_per_node != exact:
        return (
            f"partition {partition.name} gives whole nodes of {exact} GPUs: ask for "
            f"--gpus {exact} (per node)"
        )
    return size_problem(f"partition {partition.name}", partition, shape)


def size_problem(holder: str, limits: Partition | QosLimits, shape: Shape) -> str | None:
    """Why ``shape`` is over the GPUs per job or the nodes ``holder`` (a partition, a QoS)
    takes; None if it is not."""
    most = limits.max_gpus_per_job
    if most is not None and shape.total > most:
        return (
            f"{holder} takes at most {most} GPUs per job, this job asks for "
            f"{shape.total} ({shape.gpus_per_node} x {shape.nodes} nodes)"
        )
    nodes = limits.max_nodes
    if nodes is not None and shape.nodes > nodes:
        return f"{holder} takes at most {nodes} nodes per job, this job asks for {shape.nodes}"
    return None


def time_problem(partition: Partition, seconds: int | None, shown: str) -> str | None:
    return over_time(f"partition {partition.name}'s", partition.time_limit, seconds, shown)


def over_time(whose: str, limit_text: str | None, seconds: int | None, shown: str) -> str | None:
    """``--time SHOWN is longer than WHOSE limit L``; None when within it or unknown."""
    if limit_text is None or seconds is None:
        return None
    limit = time_seconds(limit_text)
    if limit is not None and seconds > limit:
        return f"--time {shown} is longer than {whose} limit {limit_text}"
    return None


def qos_problem(qos: QosLimits, shape: Shape, seconds: int | None, shown: str | None) -> str | None:
    """Every limit of ``qos`` the job is over, in one line naming each and the QoS; None
    when it is within them all."""
    problems = [
        p
        for p in (
            over_time(f"QoS {qos.name}'s", qos.max_time, seconds, shown or ""),
            size_problem(f"QoS {qos.name}", qos, shape),
        )
        if p is not None
    ]
    return "; ".join(problems) or None


# -- model groups ------------------------------------------------------------------------------


def without_group_feature(model: GpuModel, node_models: Iterable[tuple[str, ...]]) -> GpuModel:
    """A group's feature is left out where every node of the partition has only its models
    (Jean Zay: "any V100" on the V100 partition is no constraint at all)."""
    if not model.members or model.constraint is None:
        return model
    if all(set(models) <= set(model.members) for models in node_models):
        return replace(model, constraint=None)
    return model
