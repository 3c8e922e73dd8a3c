"""GPU request syntaxes, one module each, chosen by the name a site file gives.

Adding a syntax is adding a module here that defines one ``@register``-ed subclass of
``GpuRequestSyntax`` (see ``gres.py``); every module of this package is imported below, so
nothing else needs to name it.
"""

from __future__ import annotations

import importlib
import pkgutil

from clusterjob.site.gpu_syntax.base import GpuOptions, GpuRequestSyntax, ModelGap, registered

__all__ = ["GpuOptions", "GpuRequestSyntax", "ModelGap", "syntax_named", "syntax_names"]

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


def syntax_names() -> tuple[str, ...]:
    """The names a site file may give as ``gpu_request.syntax``, in listing order."""
    return tuple(s.name for s in registered())


def syntax_named(name: str) -> GpuRequestSyntax:
    """The syntax called ``name``; KeyError when there is none."""
    for syntax in registered():
        if syntax.name == name:
            return syntax
    raise KeyError(name)
