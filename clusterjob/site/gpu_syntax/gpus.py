"""``gpus``: ``--gpus=TYPE:N`` with N the job's total over all its nodes. Slurm may spread
a total unevenly; the preflight checks that each node got its share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from clusterjob.site.gpu_syntax.base import TypedCountSyntax, register


@register
@dataclass(frozen=True)
class Gpus(TypedCountSyntax):
    name: ClassVar[str] = "gpus"
    usage: ClassVar[str] = "--gpus=TYPE:N"
    position: ClassVar[int] = 40
    option: ClassVar[str] = "--gpus="
    per_job: ClassVar[bool] = True
