"""``gpus-per-task``: one task per GPU, ``--ntasks-per-node=N --gpus-per-task=[TYPE:]1``, as
NERSC documents Perlmutter's GPU jobs (each task sees its own GPU with ``--gpu-bind``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from clusterjob.site.gpu_syntax.base import (
    GpuOptions,
    GpuRequestSyntax,
    ModelGap,
    gaps_of,
    gres_type_gap,
    register,
    type_prefix,
)

if TYPE_CHECKING:
    from clusterjob.site.model import GpuModel


@register
@dataclass(frozen=True)
class GpusPerTask(GpuRequestSyntax):
    name: ClassVar[str] = "gpus-per-task"
    usage: ClassVar[str] = "--ntasks-per-node=N --gpus-per-task=TYPE:1"
    position: ClassVar[int] = 35

    def gaps(self, model: GpuModel, type_required: bool) -> tuple[ModelGap, ...]:
        return gaps_of(gres_type_gap(self, model, type_required))

    def options(self, model: GpuModel, gpus: int, nodes: int, type_required: bool) -> GpuOptions:
        return GpuOptions((f"--gpus-per-task={type_prefix(model.gres_type)}1",), model.gres_type)
