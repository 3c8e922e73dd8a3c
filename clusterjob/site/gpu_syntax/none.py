"""``none``: no GPU option at all. The partition (queue) implies the GPUs and gives whole
nodes, as TACC's Lonestar6 and Frontera do (``-p gpu-a100``); the job still knows the model
and the count per node (the partition's ``gpus_per_node``), so the preflight checks them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from clusterjob.site.gpu_syntax.base import GpuOptions, GpuRequestSyntax, ModelGap, register

if TYPE_CHECKING:
    from clusterjob.site.model import GpuModel


@register
@dataclass(frozen=True)
class NoGpuOption(GpuRequestSyntax):
    name: ClassVar[str] = "none"
    usage: ClassVar[str] = "no GPU option: the partition gives whole nodes with their GPUs"
    position: ClassVar[int] = 50

    def gaps(self, model: GpuModel, type_required: bool) -> tuple[ModelGap, ...]:
        return ()

    def options(self, model: GpuModel, gpus: int, nodes: int, type_required: bool) -> GpuOptions:
        return GpuOptions((), None)

    def step_options(
        self, gres_type: str | None, gpus: int, nodes: int, tasks: int
    ) -> tuple[str, ...]:
        return ()  # Slurm gives no GPUs to bind: every task sees its node's
