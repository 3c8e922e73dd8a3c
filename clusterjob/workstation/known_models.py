"""Common NVML device names -> a canonical model name and the aliases people type.

Used on a workstation that no site config describes. Names are matched whole (after
normalising case, spaces and the vendor prefixes NVIDIA/Tesla/GeForce/Quadro), never by
substring: ``A10`` must not take an ``A100``, nor ``L40`` an ``L40S``, nor ``RTX 3090`` a
``RTX 3090 Ti`` (Slurm's substring GRES matching has exactly this trap).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownModel:
    name: str  # canonical, e.g. "A100"
    aliases: tuple[str, ...]  # what people type; compared with model_key()
    nvml_names: re.Pattern[str]  # full match against nvml_key(name)


def model_key(text: str) -> str:
    """What a person typed, reduced so that ``RTX 3090``, ``rtx-3090`` and ``rtx3090`` agree."""
    return re.sub(r"[^0-9a-z]", "", text.casefold())


_PREFIXES = re.compile(r"^(?:(?:nvidia|tesla|geforce|quadro)\s+)+")


def nvml_key(nvml_name: str) -> str:
    """An NVML device name without vendor words, lower case, single spaces, ``-`` kept."""
    text = " ".join(nvml_name.casefold().split())
    return _PREFIXES.sub("", text)


def _m(name: str, aliases: tuple[str, ...], pattern: str) -> KnownModel:
    return KnownModel(name, aliases, re.compile(pattern))


# Patterns are written against nvml_key(): e.g. "NVIDIA A100-SXM4-80GB" -> "a100-sxm4-80gb",
# "NVIDIA GeForce RTX 3090" -> "rtx 3090", "Tesla V100-SXM2-32GB" -> "v100-sxm2-32gb".
KNOWN_MODELS: tuple[KnownModel, ...] = (
    _m("B200", ("b200",), r"b200\b.*"),
    _m("GH200", ("gh200",), r"gh200\b.*"),
    _m("H200", ("h200",), r"h200\b.*"),
    _m("H100", ("h100", "h100-sxm", "h100-pcie", "h100-nvl"), r"h100\b.*"),
    _m("H800", ("h800",), r"h800\b.*"),
    _m("A100", ("a100", "a100-sxm4", "a100-pcie"), r"a100\b.*"),
    _m("A800", ("a800",), r"a800\b.*"),
    _m("A40", ("a40",), r"a40\b.*"),
    _m("A30", ("a30",), r"a30\b.*"),
    _m("A10G", ("a10g",), r"a10g\b.*"),
    _m("A10", ("a10",), r"a10\b.*"),
    _m("L40S", ("l40s",), r"l40s\b.*"),
    _m("L40", ("l40",), r"l40\b.*"),
    _m("L4", ("l4",), r"l4\b.*"),
    _m("V100", ("v100", "v100-sxm2", "v100-pcie", "v100s"), r"v100s?\b.*"),
    _m("P100", ("p100",), r"p100\b.*"),
    _m("T4", ("t4",), r"t4\b.*"),
    _m("RTX 6000 Ada", ("rtx6000ada", "6000ada"), r"rtx 6000 ada generation"),
    _m("A6000", ("rtxa6000", "a6000"), r"rtx a6000"),
    _m("A5000", ("rtxa5000", "a5000"), r"rtx a5000"),
    _m("A4000", ("rtxa4000", "a4000"), r"rtx a4000"),
    _m("RTX 8000", ("quadrortx8000", "rtx8000"), r"rtx 8000"),
    _m("RTX 6000", ("quadrortx6000", "rtx6000"), r"rtx 6000"),
    _m("RTX 5090", ("rtx5090", "5090"), r"rtx 5090"),
    _m("RTX 4090", ("rtx4090", "4090"), r"rtx 4090"),
    _m("RTX 4080", ("rtx4080", "4080"), r"rtx 4080"),
    _m("RTX 3090 Ti", ("rtx3090ti", "3090ti"), r"rtx 3090 ti"),
    _m("RTX 3090", ("rtx3090", "3090"), r"rtx 3090"),
    _m("RTX 3080 Ti", ("rtx3080ti", "3080ti"), r"rtx 3080 ti"),
    _m("RTX 3080", ("rtx3080", "3080"), r"rtx 3080"),
    _m("RTX 2080 Ti", ("rtx2080ti", "2080ti"), r"rtx 2080 ti"),
    _m("TITAN RTX", ("titanrtx",), r"titan rtx"),
    _m("TITAN V", ("titanv",), r"titan v"),
    _m("1080 Ti", ("gtx1080ti", "1080ti"), r"gtx 1080 ti"),
)


def known_model_for_nvml_name(nvml_name: str) -> KnownModel | None:
    """The built-in model an NVML device name belongs to, or None for a card not in the table."""
    key = nvml_key(nvml_name)
    for model in KNOWN_MODELS:
        if model.nvml_names.fullmatch(key):
            return model
    return None


def known_model(spec: str) -> KnownModel | None:
    """The built-in model called ``spec`` (canonical name or alias, any case/spacing)."""
    key = model_key(spec)
    for model in KNOWN_MODELS:
        if key == model_key(model.name) or key in {model_key(a) for a in model.aliases}:
            return model
    return None
