"""``gpus-per-node``: ``--gpus-per-node=TYPE:N`` (``--gpus-per-node=N`` when untyped)."""

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
class GpusPerNode(GpuRequestSyntax):
    name: ClassVar[str] = "gpus-per-node"
    usage: ClassVar[str] = "--gpus-per-node=TYPE:N"
    position: ClassVar[int] = 30

    def gaps(self, model: GpuModel, type_required: bool) -> tuple[ModelGap, ...]:
        return gaps_of(gres_type_gap(self, model, type_required))

    def options(self, model: GpuModel, gpus: int, nodes: int, type_required: bool) -> GpuOptions:
        prefix = type_prefix(model.gres_type)
        return GpuOptions((f"--gpus-per-node={prefix}{gpus}",), model.gres_type)
