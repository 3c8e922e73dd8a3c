"""``gpus``: ``--gpus=TYPE:N`` with N the job's total over all its nodes. Slurm may spread
a total unevenly; the preflight checks that each node got its share."""

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
class Gpus(GpuRequestSyntax):
    name: ClassVar[str] = "gpus"
    usage: ClassVar[str] = "--gpus=TYPE:N"
    position: ClassVar[int] = 40

    def gaps(self, model: GpuModel, type_required: bool) -> tuple[ModelGap, ...]:
        return gaps_of(gres_type_gap(self, model, type_required))

    def options(self, model: GpuModel, gpus: int, nodes: int, type_required: bool) -> GpuOptions:
        prefix = type_prefix(model.gres_type)
        return GpuOptions((f"--gpus={prefix}{gpus * nodes}",), model.gres_type)
