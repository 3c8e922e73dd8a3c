"""``gres``: ``--gres=gpu:TYPE:N`` per node, or ``--gres=gpu:N`` where untyped requests are
allowed (``type_required: false``) and the model has no GRES type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from clusterjob.site.gpu_syntax.base import TypedCountSyntax, register


@register
@dataclass(frozen=True)
class Gres(TypedCountSyntax):
    name: ClassVar[str] = "gres"
    usage: ClassVar[str] = "--gres=gpu:TYPE:N"
    position: ClassVar[int] = 10
    option: ClassVar[str] = "--gres=gpu:"
