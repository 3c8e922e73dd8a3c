"""``gres``: ``--gres=gpu:TYPE:N`` per node, or ``--gres=gpu:N`` where untyped requests are
allowed (``type_required: false``) and the model has no GRES type."""

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
class Gres(GpuRequestSyntax):
    name: ClassVar[str] = "gres"
    usage: ClassVar[str] = "--gres=gpu:TYPE:N"
    position: ClassVar[int] = 10

    def gaps(self, model: GpuModel, type_required: bool) -> tuple[ModelGap, ...]:
        return gaps_of(gres_type_gap(self, model, type_required))

    def options(self, model: GpuModel, gpus: int, nodes: int, type_required: bool) -> GpuOptions:
        prefix = type_prefix(model.gres_type)
        return GpuOptions((f"--gres=gpu:{prefix}{gpus}",), model.gres_type)
