"""The interface every GPU request syntax implements, and the registry that names them.

A syntax is how a site wants GPUs asked for in sbatch (``gpu_request.syntax`` in the site
file). Each one lives in its own module of this package as one frozen dataclass, registered
by name with ``@register``; the loader, ``resolve`` and ``site show`` only ever go through
this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

if TYPE_CHECKING:
    from clusterjob.site.model import GpuModel


@dataclass(frozen=True)
class ModelGap:
    """A model key a syntax needs and the model lacks, with what to say about it."""

    key: str  # the model's key in the site file, e.g. "gres_type"
    in_config: str  # said at the key when the site file is validated
    at_request: str  # said when a request meets a model built without the site loader


@dataclass(frozen=True)
class GpuOptions:
    """N GPUs of one model as sbatch options, before any node feature is added."""

    options: tuple[str, ...]  # e.g. ("--gres=gpu:a100:2",)
    gres_type: str | None  # the GRES type written in them; None when untyped


class GpuRequestSyntax(ABC):
    """One way of asking Slurm for GPUs: its name in the site file, its usage text for
    ``site show``, what it needs of each model, and how it spells a request."""

    name: ClassVar[str]  # as written in gpu_request.syntax
    usage: ClassVar[str]  # the sbatch options it writes, e.g. "--gres=gpu:TYPE:N"
    position: ClassVar[int]  # its place where the syntaxes are listed (valid choices)

    @abstractmethod
    def gaps(self, model: GpuModel, type_required: bool) -> tuple[ModelGap, ...]:
        """What ``model`` lacks for this syntax to select it; empty when it can be asked for."""

    @abstractmethod
    def options(self, model: GpuModel, gpus: int, nodes: int, type_required: bool) -> GpuOptions:
        """``gpus`` GPUs of ``model`` on each of ``nodes`` nodes (the model has no gaps)."""

    # Where sbatch hands this syntax's request on to the job's srun steps (srun reads them as
    # its own options): a step that says its own GPUs runs without them, so that a per-task
    # request of the batch is not also applied to the step's tasks.
    batch_env: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def step_options(
        self, gres_type: str | None, gpus: int, nodes: int, tasks: int
    ) -> tuple[str, ...]:
        """The srun options that give a step of ``tasks`` tasks on each of ``nodes`` nodes the
        job's ``gpus`` GPUs per node, of the GRES type the batch asked for (None: untyped)."""

    def __str__(self) -> str:
        return self.name


class TypedCountSyntax(GpuRequestSyntax):
    """A syntax that is one option, ``OPTION=[TYPE:]N``, with the model's GRES type (typed
    requests may be required) and N per node, or the job's total when ``per_job``. Most
    syntaxes are this, so theirs is data: the option's spelling and what N counts."""

    option: ClassVar[str]  # e.g. "--gres=gpu:" or "--gpus-per-node="
    per_job: ClassVar[bool] = False  # N is the total over all nodes (--gpus)

    def gaps(self, model: GpuModel, type_required: bool) -> tuple[ModelGap, ...]:
        return gaps_of(gres_type_gap(self, model, type_required))

    def options(self, model: GpuModel, gpus: int, nodes: int, type_required: bool) -> GpuOptions:
        return GpuOptions((self.count_option(model.gres_type, gpus, nodes),), model.gres_type)

    def step_options(
        self, gres_type: str | None, gpus: int, nodes: int, tasks: int
    ) -> tuple[str, ...]:
        return (self.count_option(gres_type, gpus, nodes),)  # a node's tasks share them

    def count_option(self, gres_type: str | None, gpus: int, nodes: int) -> str:
        count = gpus * nodes if self.per_job else gpus
        return f"{self.option}{type_prefix(gres_type)}{count}"


_REGISTRY: dict[str, GpuRequestSyntax] = {}

_S = TypeVar("_S", bound=type[GpuRequestSyntax])


def register(cls: _S) -> _S:
    """Class decorator: make the syntax known under its ``name``."""
    if cls.name in _REGISTRY:
        raise ValueError(f"GPU request syntax {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls()
    return cls


def registered() -> tuple[GpuRequestSyntax, ...]:
    """Every registered syntax, in listing order."""
    return tuple(sorted(_REGISTRY.values(), key=lambda s: (s.position, s.name)))


# -- what the syntaxes need of a model ---------------------------------------------------------


def gres_type_gap(
    syntax: GpuRequestSyntax, model: GpuModel, type_required: bool
) -> ModelGap | None:
    """A site that requires typed requests needs every model's GRES type."""
    if not type_required or model.gres_type is not None:
        return None
    return ModelGap(
        "gres_type",
        f"required when gpu_request.syntax is {syntax.name} and type_required is true",
        "no GRES type given, but gpu_request.type_required is true",
    )


def constraint_gap(syntax: GpuRequestSyntax, model: GpuModel) -> ModelGap | None:
    """A syntax that selects the model by node feature needs every model's feature."""
    if model.constraint:
        return None
    return ModelGap(
        "constraint",
        f"required when gpu_request.syntax is {syntax.name}",
        f"no node feature given, but gpu_request.syntax is {syntax.name}",
    )


def gaps_of(*found: ModelGap | None) -> tuple[ModelGap, ...]:
    return tuple(gap for gap in found if gap is not None)


def type_prefix(gres_type: str | None) -> str:
    """``a100:`` for a typed request, nothing for an untyped one."""
    return f"{gres_type}:" if gres_type else ""
