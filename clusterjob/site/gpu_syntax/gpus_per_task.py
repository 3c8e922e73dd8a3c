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

    # sbatch hands --gpus-per-task on as both (SLURM_TRES_PER_TASK from Slurm 23.11); srun
    # would bind each task of a step to one GPU by them, a torchrun agent included.
    batch_env: ClassVar[tuple[str, ...]] = ("SLURM_GPUS_PER_TASK", "SLURM_TRES_PER_TASK")

    def options(self, model: GpuModel, gpus: int, nodes: int, type_required: bool) -> GpuOptions:
        return GpuOptions((f"--gpus-per-task={type_prefix(model.gres_type)}1",), model.gres_type)

    def step_options(
        self, gres_type: str | None, gpus: int, nodes: int, tasks: int
    ) -> tuple[str, ...]:
        """Tasks that split the node's GPUs get theirs each, bound explicitly (22.05 left
        CUDA_VISIBLE_DEVICES unset for a typed --gpus-per-task step without --gpu-bind); one
        task per node gets them all per node (a step may not ask more per task than the job),
        unbound: 26.05 binds such a task to one GPU, the job's per-task count, unless told
        --gpu-bind=none (seen: CUDA_VISIBLE_DEVICES=2 of the node's 2,3)."""
        typed = type_prefix(gres_type)
        if tasks > 1 and gpus % tasks == 0:
            each = gpus // tasks
            return (f"--gpus-per-task={typed}{each}", f"--gpu-bind=per_task:{each}")
        return (f"--gpus-per-node={typed}{gpus}", "--gpu-bind=none")
