"""``gres+constraint``: ``--gres=gpu:N --constraint=FEATURE``, the node feature selecting
the model; typed (``--gres=gpu:TYPE:N``) only where the site requires types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from clusterjob.site.gpu_syntax.base import (
    GpuOptions,
    GpuRequestSyntax,
    ModelGap,
    constraint_gap,
    gaps_of,
    register,
    type_prefix,
)

if TYPE_CHECKING:
    from clusterjob.site.model import GpuModel


@register
@dataclass(frozen=True)
class GresConstraint(GpuRequestSyntax):
    name: ClassVar[str] = "gres+constraint"
    usage: ClassVar[str] = "--gres=gpu:N --constraint=FEATURE"
    position: ClassVar[int] = 20

    def gaps(self, model: GpuModel, type_required: bool) -> tuple[ModelGap, ...]:
        return gaps_of(constraint_gap(self, model))

    def options(self, model: GpuModel, gpus: int, nodes: int, type_required: bool) -> GpuOptions:
        # The --constraint option is the model's node feature, added for every syntax.
        typed = model.gres_type if type_required and model.gres_type else None
        return GpuOptions((f"--gres=gpu:{type_prefix(typed)}{gpus}",), typed)

    def step_options(
        self, gres_type: str | None, gpus: int, nodes: int, tasks: int
    ) -> tuple[str, ...]:
        return (f"--gres=gpu:{type_prefix(gres_type)}{gpus}",)
