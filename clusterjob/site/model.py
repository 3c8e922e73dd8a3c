"""A site, as clusterjob knows it: frozen dataclasses built by ``clusterjob.site.loader``.

Nothing here parses YAML or touches Slurm; this is the vocabulary shared by the
submission side (request -> sbatch script) and the node side (preflight checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from clusterjob.gpu.models import model_for_nvml_name

if TYPE_CHECKING:  # the node side imports this module and never needs the syntaxes
    from clusterjob.site.gpu_syntax.base import GpuRequestSyntax


class OnError(str, Enum):
    """What the Prolog does when it cannot check (internal error, NVML unavailable)."""

    DRAIN = "drain"
    PASS = "pass"


@dataclass(frozen=True)
class GpuModel:
    name: str  # canonical, e.g. "A100"
    aliases: tuple[str, ...]  # matched case-insensitively, as is the canonical name
    gres_type: str | None  # this site's GRES type name, e.g. "a100" or "nvidia_a100-sxm4-80gb"
    nvml_names: tuple[str, ...]  # NVML device names that identify this model on a node
    memory_gb: int | None = None
    constraint: str | None = None  # node feature for sites that select the model by --constraint

    def matches(self, name: str) -> bool:
        wanted = name.casefold()
        return wanted == self.name.casefold() or any(wanted == a.casefold() for a in self.aliases)


@dataclass(frozen=True)
class PartitionDefaults:
    account: str | None = None
    qos: str | None = None
    cpus_per_gpu: int | None = None
    mem_per_gpu: str | None = None  # Slurm size string, e.g. "64G"


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


# The node checks' ids, as clusterjob.node.checks registers them (a test keeps the two equal):
# the site file may name them (checks.severity) and is validated below the node layer.
NODE_CHECK_IDS = (
    "node-unmapped",
    "gpu-count",
    "driver-version",
    "gpu-missing",
    "model-mismatch",
    "gpu-uuid",
    "gpu-extra",
    "alloc-env",
    "alloc-slot",
    "gres-index",
    "alloc-count",
    "alloc-model",
    "cuda-order",
    "gpu-lost",
    "ecc-uncorrectable",
    "row-remap-failure",
    "row-remap-pending",
    "mig-pending",
    "mig-mode",
    "mig-layout",
    "alloc-mig",
    "pcie-degraded",
    "nvlink-down",
    "nvlink-fabric",
    "clocks-throttled",
    "gpu-hot",
    "power-capped",
    "retired-pages-pending",
    "gpu-busy",
    "numa-affinity",
    "persistence-off",
)
CHECK_SEVERITIES = ("error", "warning", "off")


@dataclass(frozen=True)
class CheckPolicy:
    """What a site, or one partition, asks of the node checks: the oldest NVIDIA driver and
    CUDA driver API it accepts, and per check id a severity ("error", "warning" or "off")
    instead of the check's own."""

    driver_min: str | None = None  # e.g. "535.104.05"
    severity: Mapping[str, str] = field(default_factory=dict)
    cuda_min: str | None = None  # the CUDA version the driver supports, e.g. "12.4"

    def under(self, partition: CheckPolicy) -> CheckPolicy:
        """This site-wide policy with a partition's on top of it."""
        return CheckPolicy(
            partition.driver_min or self.driver_min,
            {**self.severity, **partition.severity},
            partition.cuda_min or self.cuda_min,
        )


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: str  # the hostlist as written, e.g. "gpu-a[01-16]"
    node_names: tuple[str, ...]  # expanded
    time_limit: str | None = None  # Slurm time string, e.g. "2-00:00:00"
    default: bool = False
    defaults: PartitionDefaults = field(default_factory=PartitionDefaults)
    checks: CheckPolicy = field(default_factory=CheckPolicy)  # over the site's
    job: JobEnvironment = field(default_factory=JobEnvironment)


@dataclass(frozen=True)
class NodeGpu:
    """One GPU slot of a node, in physical (PCI bus) order; slot i is Slurm GRES index i."""

    slot: int
    model: str  # canonical model name
    bus_id: str | None = None  # normalised with clusterjob.pci.normalise_bus_id
    uuid: str | None = None
    nvlinks: int | None = None  # NVLink links that must be active (the slot's nvlinks: key)
    mig: tuple[str, ...] | None = None  # MIG profiles of its slices; (): MIG off; None: any


@dataclass(frozen=True)
class NodeMap:
    """Node name -> its GPUs in PCI bus order. ``lines`` keeps where each node was defined."""

    nodes: dict[str, tuple[NodeGpu, ...]]
    lines: dict[str, int] = field(default_factory=dict)

    def gpus(self, node: str) -> tuple[NodeGpu, ...] | None:
        return self.nodes.get(node)

    def __contains__(self, node: object) -> bool:
        return node in self.nodes


@dataclass(frozen=True)
class PrologPolicy:
    on_error: OnError = OnError.DRAIN  # documented default: an unchecked node is not trusted
    deadline_seconds: float = 20.0  # well under a typical PrologEpilogTimeout
    log_path: str = "/var/log/clusterjob/prolog.jsonl"


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

    def partition(self, name: str) -> Partition | None:
        for p in self.partitions:
            if p.name == name:
                return p
        return None
