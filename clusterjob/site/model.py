"""A site, as clusterjob knows it: frozen dataclasses built by ``clusterjob.site.loader``.

Nothing here parses YAML or touches Slurm; this is the vocabulary of the submission side
(request -> sbatch script). The node side's part (GPU slots, check and Prolog policies) is in
``clusterjob.site.nodemodel``, which the Prolog imports without this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusterjob.gpu.models import model_for_nvml_name
from clusterjob.site.nodemodel import CheckPolicy, GresUnit, NodeGpu, PrologPolicy, gres_units

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # the node side imports this module and never needs the syntaxes
    from clusterjob.site.gpu_syntax.base import GpuRequestSyntax


@dataclass(frozen=True)
class GpuModel:
    name: str  # canonical, e.g. "A100"
    aliases: tuple[str, ...]  # matched case-insensitively, as is the canonical name
    gres_type: str | None  # this site's GRES type name, e.g. "a100" or "nvidia_a100-sxm4-80gb"
    nvml_names: tuple[str, ...]  # NVML device names that identify this model on a node
    memory_gb: int | None = None
    constraint: str | None = None  # node feature for sites that select the model by --constraint
    vendor: str = "nvidia"  # VENDORS
    defaults: JobDefaults = field(default_factory=lambda: JobDefaults())  # over the partition's
    gres_type_overlap: bool = False  # True: its type is a substring of another's on purpose
    members: tuple[str, ...] = ()  # a model group ("any V100"): the models it stands for
    max_per_job: int | None = None  # the most one job may ask for (e.g. of a MIG slice)

    def matches(self, name: str) -> bool:
        wanted = name.casefold()
        return wanted == self.name.casefold() or any(wanted == a.casefold() for a in self.aliases)


@dataclass(frozen=True)
class QosRule:
    """One entry of ``qos_by_time``: a job whose time is at most ``max_time`` gets ``qos``
    (None: no ``--qos``, the QoS Slurm gives a job that names none)."""

    max_time: str  # a Slurm time
    qos: str | None


@dataclass(frozen=True)
class JobDefaults:
    """What a job gets when the user does not say. The same keys at the top of the site file
    (``defaults:``), per partition and per model; the more specific wins, the user's option
    over all (``clusterjob.jobscript.directives.effective_defaults``)."""

    account: str | None = None  # may hold {project}: "{project}@a100" with --project
    qos: str | None = None
    cpus_per_gpu: int | None = None
    mem_per_gpu: str | None = None  # Slurm size string, e.g. "64G"
    time: str | None = None  # the --time of a job that gives none (the partition's limit aside)
    qos_by_time: tuple[QosRule, ...] = ()  # the QoS chosen by the job's time, shortest first
    gres: tuple[str, ...] = ()  # extra GRES merged into the one --gres, e.g. ("nvme:10",)
    sbatch: tuple[str, ...] = ()  # extra #SBATCH options, e.g. ("--hint=nomultithread",)
    # The task shape of a job that asks for none (whole nodes shared among tasks, e.g. through
    # CUDA MPS): --ntasks-per-node and --cpus-per-task; cpus_per_task and cpus_per_gpu are one
    # choice, as qos and qos_by_time are.
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    max_requeues: int | None = None  # how often a job may be requeued (--max-requeues)


@dataclass(frozen=True)
class QosLimits:
    """A QoS a job may name beside its partition (``--qos devel --partition=accel``), with
    the limits the site gives it: checked at submit, so a job over them is refused in one
    line instead of pending or refused by Slurm later."""

    name: str
    max_time: str | None = None  # a Slurm time
    max_gpus_per_job: int | None = None
    max_nodes: int | None = None
    partitions: tuple[str, ...] = ()  # the partitions it is used with; empty: any


# Whether a job must name the account it is charged to (--account, a site default, or
# SBATCH_ACCOUNT): sites that refuse jobs without one say `account: required`.
ACCOUNT_RULES = ("required", "optional")
# How a job's preflight is treated: required (a failed or impossible check ends the job),
# warn (said on stderr, the job goes on), off (not run).
PREFLIGHT_MODES = ("required", "warn", "off")
# GPU vendors: the node checks read NVIDIA GPUs through NVML; AMD GPUs cannot be checked yet.
VENDORS = ("nvidia", "amd")
# The batch scheduler a site runs: the job script's directives and the commands that submit
# and follow a job are its own (clusterjob.jobscript.backends picks them by this name).
SCHEDULERS = ("slurm", "gridengine")
# How a partition is named to Slurm: --partition, --qos (the QoS is the queue), or not at all
# (the site routes jobs by their size and length).
SUBMIT_AS = ("partition", "qos", "none")
# The CPU and memory options a site documents: per GPU, or per task (tasks = GPUs per node)
# and per node.
CPU_FORMS = ("cpus-per-gpu", "cpus-per-task")
MEMORY_FORMS = ("mem-per-gpu", "mem")
# A --gpus total over several nodes: split per node (--gpus-per-node), or kept as a total.
MULTI_NODE_FORMS = ("per-node", "total")


@dataclass(frozen=True)
class ModelGroup:
    """Several models a job may take any one of ("any V100": 16 or 32 GB), asked for as one
    GRES type they share or as an OR of their node features (``[v100-16g|v100-32g]``)."""

    name: str
    aliases: tuple[str, ...]
    models: tuple[str, ...]  # canonical model names

    def matches(self, name: str) -> bool:
        wanted = name.casefold()
        return wanted == self.name.casefold() or any(wanted == a.casefold() for a in self.aliases)


@dataclass(frozen=True)
class RequestForm:
    """How this site writes the CPUs, memory and multi-node GPUs of a request."""

    cpus: str = "cpus-per-gpu"  # CPU_FORMS
    memory: str = "mem-per-gpu"  # MEMORY_FORMS
    multi_node: str = "per-node"  # MULTI_NODE_FORMS (the gpus syntax only)


@dataclass(frozen=True)
class JobEnvironment:
    """How this site's (or one partition's) jobs get their software: the interpreter when
    the user names none and no venv or conda env is active at submit, and shell lines run
    before the program (``module load cuda``). At most one of python, venv, conda."""

    python: str | None = None  # an absolute interpreter path
    venv: str | None = None  # a virtual environment's directory (its bin/python)
    conda: str | None = None  # a conda env name or prefix, activated with conda's shell hook
    setup: tuple[str, ...] = ()  # verbatim shell lines

    @property
    def chooses_interpreter(self) -> bool:
        return any(v is not None for v in (self.python, self.venv, self.conda))


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: str  # the hostlist as written, e.g. "gpu-a[01-16]"
    node_names: tuple[str, ...]  # expanded
    time_limit: str | None = None  # Slurm time string, e.g. "2-00:00:00"
    default: bool = False
    defaults: JobDefaults = field(default_factory=JobDefaults)  # over the site's
    checks: CheckPolicy = field(default_factory=CheckPolicy)  # over the site's
    job: JobEnvironment = field(default_factory=JobEnvironment)
    submit_as: str = "partition"  # SUBMIT_AS
    max_gpus_per_job: int | None = None
    gpus_per_node: int | None = None  # exactly this many per node (whole-node partitions)
    max_nodes: int | None = None
    preflight: str | None = None  # PREFLIGHT_MODES; None: the site's
    account: str | None = None  # ACCOUNT_RULES; None: the site's


def nests_in_matching_or(feature: str) -> bool:
    """Whether a model's feature expression can be one option of a matching OR: Slurm takes
    one set of brackets per job and no parentheses inside parentheses."""
    return not any(c in feature for c in "()[]")


def matching_or(features: Sequence[str]) -> str:
    """Features any one of which every node of the job shares, as Slurm's matching OR:
    ``[v100-16g|v100-32g]``. An expression with ``&`` or ``|`` is one option in parentheses,
    ``[(gpu&hbm80g)|a100]``: Slurm refuses an ``&`` without a node count inside brackets, and
    reads features left to right with no precedence (22.05 to 26.05 alike)."""
    options = [f"({f})" if any(op in f for op in "&|") else f for f in features]
    return "[" + "|".join(options) + "]"


def group_model(group: ModelGroup, members: Sequence[GpuModel]) -> GpuModel:
    """A model group as one model to ask for: the GRES type its models share (else untyped),
    and where each has a node feature, their OR in brackets (Slurm's matching OR: all nodes
    of the job with the same one)."""
    types = {m.gres_type for m in members}
    features = [m.constraint for m in members if m.constraint]
    constraint = None
    if len(features) == len(members):
        constraint = matching_or(features)
    shared = members[0].defaults  # the members' own defaults, where they are all the same
    return GpuModel(
        name=group.name,
        aliases=group.aliases,
        gres_type=types.pop() if len(types) == 1 else None,
        nvml_names=tuple(n for m in members for n in m.nvml_names),
        constraint=constraint,
        vendor=members[0].vendor,
        defaults=shared if all(m.defaults == shared for m in members) else JobDefaults(),
        members=group.models,
    )


MIG_SLICE_MARK = " MIG "  # NVML names a slice "<the GPU's name> MIG <profile>"


def slice_nvml_name(gpu_nvml_name: str, profile: str) -> str:
    """ "NVIDIA A100-SXM4-80GB", "1g.10gb" -> "NVIDIA A100-SXM4-80GB MIG 1g.10gb"."""
    return f"{gpu_nvml_name}{MIG_SLICE_MARK}{profile}"


def slice_of(nvml_name: str) -> tuple[str, str] | None:
    """ "NVIDIA A100-SXM4-80GB MIG 1g.10gb" -> ("NVIDIA A100-SXM4-80GB", "1g.10gb"): the GPU a
    MIG slice's NVML name is cut from, and its profile; None for a whole GPU's name."""
    gpu, mark, profile = nvml_name.rpartition(MIG_SLICE_MARK)
    return (gpu, profile) if mark and gpu and profile else None


def slice_model(models: Iterable[GpuModel], parent: GpuModel, profile: str) -> GpuModel | None:
    """The model of ``profile`` slices of ``parent``: the one whose NVML names include one of
    the parent's with `` MIG <profile>`` after it, the name NVML gives such a slice. A slice
    model is an ordinary model (its own ``gres_type``, aliases, ``max_per_job``)."""
    wanted = {slice_nvml_name(n, profile).casefold() for n in parent.nvml_names}
    for m in models:
        if any(n.casefold() in wanted for n in m.nvml_names):
            return m
    return None


def mig_profile_size(profile: str) -> tuple[int, int]:
    """ "3g.40gb" -> (3, 40): the compute slices and GB of memory a MIG profile takes."""
    compute, _, rest = profile.partition("g.")
    return int(compute), int(rest.split("gb", 1)[0])


@dataclass(frozen=True)
class NodeMap:
    """Node name -> its GPUs in PCI bus order. ``lines`` keeps where each node was defined."""

    nodes: dict[str, tuple[NodeGpu, ...]]
    lines: dict[str, int] = field(default_factory=dict)
    features: dict[str, tuple[str, ...]] = field(default_factory=dict)  # beyond the models'

    def gpus(self, node: str) -> tuple[NodeGpu, ...] | None:
        return self.nodes.get(node)

    def __contains__(self, node: object) -> bool:
        return node in self.nodes


@dataclass(frozen=True)
class Site:
    name: str
    cluster_name: str | None
    source: Path  # the YAML file this site was loaded from
    gpu_syntax: GpuRequestSyntax  # how GPUs are asked for here (clusterjob.site.gpu_syntax)
    type_required: bool
    models: tuple[GpuModel, ...]
    partitions: tuple[Partition, ...]
    node_map: NodeMap
    prolog: PrologPolicy = field(default_factory=PrologPolicy)
    checks: CheckPolicy = field(default_factory=CheckPolicy)
    templates_dir: Path | None = None  # site template directory (overrides/extends templates/)
    node_command: str | None = (
        None  # how job scripts call clusterjob on a node (path to the command)
    )
    job: JobEnvironment = field(default_factory=JobEnvironment)  # partitions may override
    defaults: JobDefaults = field(default_factory=JobDefaults)  # partitions, models over it
    preflight: str = "required"  # PREFLIGHT_MODES; partitions may override
    form: RequestForm = field(default_factory=RequestForm)
    model_groups: tuple[ModelGroup, ...] = ()
    account: str = "optional"  # ACCOUNT_RULES; partitions may override
    qos: tuple[QosLimits, ...] = ()  # QoS with limits, named beside a partition
    scheduler: str = "slurm"  # SCHEDULERS

    def group(self, name: str) -> ModelGroup | None:
        """The model group called ``name`` or one of its aliases, case-insensitively."""
        return next((g for g in self.model_groups if g.matches(name)), None)

    def members(self, model: str) -> tuple[str, ...]:
        """The models a (canonical) model or group name stands for."""
        found = next((g for g in self.model_groups if g.name == model), None)
        return found.models if found is not None else (model,)

    def model(self, name: str) -> GpuModel | None:
        """The model called ``name`` or one of its aliases, case-insensitively."""
        for m in self.models:
            if m.matches(name):
                return m
        return None

    def model_by_name(self, canonical: str) -> GpuModel:
        for m in self.models:
            if m.name == canonical:
                return m
        raise KeyError(canonical)

    def model_for_nvml_name(self, nvml_name: str) -> GpuModel | None:
        """The model whose NVML names include ``nvml_name`` (exact, case-insensitive)."""
        by_name = {m.name: m for m in self.models}
        found = model_for_nvml_name(nvml_name, {m.name: m.nvml_names for m in self.models})
        return None if found is None else by_name[found]

    def slice_model(self, parent: str, profile: str) -> GpuModel | None:
        """The site's model of ``profile`` slices of the ``parent`` model (see ``slice_model``)."""
        return slice_model(self.models, self.model_by_name(parent), profile)

    def unit_model(self, unit: GresUnit) -> str:
        """The model a GRES index is: its GPU's, or its slice's (the profile when the site
        has no model for it)."""
        if unit.profile is None:
            return unit.slot.model
        found = self.slice_model(unit.slot.model, unit.profile)
        return found.name if found is not None else f"{unit.slot.model} MIG {unit.profile}"

    def unit_gres_type(self, unit: GresUnit) -> str | None:
        """A GRES index's type: its model's; for a slice without a model of its own, its
        profile (``1g.10gb``, as Slurm's gres.conf examples name them: not the parent's type
        with the profile after it, which Slurm's substring match would take for the parent)."""
        if unit.profile is None:
            return self.model_by_name(unit.slot.model).gres_type
        found = self.slice_model(unit.slot.model, unit.profile)
        return found.gres_type if found is not None else unit.profile

    def gres_models(self, node: str) -> tuple[str, ...]:
        """The model of each GRES index of ``node`` (a slice's model for MIG slices)."""
        gpus = self.node_map.gpus(node) or ()
        if not any(g.mig for g in gpus):
            return tuple(g.model for g in gpus)
        return tuple(self.unit_model(u) for u in gres_units(gpus))

    def sole_model(self, partition: Partition) -> GpuModel | None:
        """The one model a partition's nodes hold (a MIG slice counts as its slice's model),
        which ``--model`` may leave out there; None where they hold several, or none."""
        found = {m for node in partition.node_names for m in self.gres_models(node)}
        name = found.pop() if len(found) == 1 else None
        return next((m for m in self.models if m.name == name), None)

    def qos_limits(self, name: str) -> QosLimits | None:
        """The QoS called ``name`` with its limits, where the site lists it."""
        return next((q for q in self.qos if q.name == name), None)

    def partition(self, name: str) -> Partition | None:
        for p in self.partitions:
            if p.name == name:
                return p
        return None
