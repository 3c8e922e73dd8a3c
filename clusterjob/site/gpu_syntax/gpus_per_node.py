"""``gpus-per-node``: ``--gpus-per-node=TYPE:N`` (``--gpus-per-node=N`` when untyped)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from clusterjob.site.gpu_syntax.base import TypedCountSyntax, register


@register
@dataclass(frozen=True)
class GpusPerNode(TypedCountSyntax):
    name: ClassVar[str] = "gpus-per-node"
    usage: ClassVar[str] = "--gpus-per-node=TYPE:N"
    position: ClassVar[int] = 30
    option: ClassVar[str] = "--gpus-per-node="
