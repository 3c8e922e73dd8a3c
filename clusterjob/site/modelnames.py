"""Which GPU model a GRES type or node feature names: the table ``site init`` guesses from.

Sites name GRES types freely (``a100``, ``a100_80g``, ``nvidia_a100-sxm4-80gb`` from Slurm's
NVML autodetection, ``a100_3g.20gb`` for a MIG slice) and node features likewise
(``v100-32g``, ``h100``). A name is read as a known model where the table recognises it, and
otherwise left as it is; every guess says how it was made, so the generated site file can say
so in a comment. Pure; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MIG_PROFILE = re.compile(r"(?<![0-9])([1-7])g\.([0-9]+)gb(?:\+me)?")


@dataclass(frozen=True)
class KnownModel:
    """A GPU model as a site file names it, and the NVML names that identify it."""

    name: str  # "A100-80GB"
    family: str  # "A100": the short name users type
    nvml_names: tuple[str, ...]
    memory_gb: int | None
    vendor: str = "nvidia"


def _k(
    name: str, family: str, memory: int | None, *nvml: str, vendor: str = "nvidia"
) -> KnownModel:
    return KnownModel(name, family, tuple(nvml), memory, vendor)


_A100_80 = ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe")
_A100_40 = ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB")
_V100_32 = ("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB")
_V100_16 = ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB")
_H100 = ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL")

# (pattern on the normalised name, memory pattern or None, model). First match wins, so a
# name that contains another's (gh200 / h200, l40s / l40 / l4, a100 / a10) comes first.
_TABLE: tuple[tuple[re.Pattern[str], re.Pattern[str] | None, KnownModel], ...] = tuple(
    (re.compile(p), re.compile(m) if m else None, k)
    for p, m, k in (
        (r"gh200", None, _k("GH200", "GH200", 96, "NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e")),
        (r"h200", None, _k("H200", "H200", 141, "NVIDIA H200", "NVIDIA H200 NVL")),
        (r"h100", None, _k("H100", "H100", 80, *_H100)),
        (r"b200", None, _k("B200", "B200", 180, "NVIDIA B200")),
        (r"a100", r"80g", _k("A100-80GB", "A100", 80, *_A100_80)),
        (r"a100", r"40g", _k("A100-40GB", "A100", 40, *_A100_40)),
        (r"a100", None, _k("A100", "A100", None, *_A100_80, *_A100_40)),
        (r"l40s", None, _k("L40S", "L40S", 48, "NVIDIA L40S")),
        (r"l40", None, _k("L40", "L40", 48, "NVIDIA L40")),
        (r"(?<![a-z0-9])l4(?![0-9])", None, _k("L4", "L4", 24, "NVIDIA L4")),
        (r"a6000", None, _k("RTX-A6000", "A6000", 48, "NVIDIA RTX A6000")),
        (r"(?<![a-z0-9])a40(?![0-9])", None, _k("A40", "A40", 48, "NVIDIA A40")),
        (r"(?<![a-z0-9])a30(?![0-9])", None, _k("A30", "A30", 24, "NVIDIA A30")),
        (r"(?<![a-z0-9])a10(?![0-9])", None, _k("A10", "A10", 24, "NVIDIA A10")),
        (r"v100", r"32g", _k("V100-32GB", "V100", 32, *_V100_32)),
        (r"v100", r"16g", _k("V100-16GB", "V100", 16, *_V100_16)),
        (r"v100", None, _k("V100", "V100", None, *_V100_32, *_V100_16)),
        (r"p100", None, _k("P100", "P100", 16, "Tesla P100-PCIE-16GB", "Tesla P100-SXM2-16GB")),
        (r"(?<![a-z0-9])t4(?![0-9])", None, _k("T4", "T4", 16, "Tesla T4")),
        (r"2080", None, _k("RTX-2080Ti", "RTX2080", 11, "NVIDIA GeForce RTX 2080 Ti")),
        (r"mi300x", None, _k("MI300X", "MI300X", 192, vendor="amd")),
        (r"mi250x", None, _k("MI250X", "MI250X", 64, vendor="amd")),
        (r"mi250", None, _k("MI250", "MI250", 64, vendor="amd")),
        (r"mi210", None, _k("MI210", "MI210", 64, vendor="amd")),
        (r"mi100", None, _k("MI100", "MI100", 32, vendor="amd")),
    )
)

# MIG profile -> the GPUs that offer it, most common first (NVIDIA's MIG user guide).
_MIG_PARENTS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"), ("A100-40GB",)),
    "1g.10gb": ("A100-80GB", "H100", "A100-40GB"),
    **dict.fromkeys(("1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"), ("A100-80GB", "H100")),
    **dict.fromkeys(("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"), ("H200",)),
    **dict.fromkeys(("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"), ("H100",)),
    **dict.fromkeys(("1g.6gb", "2g.12gb", "4g.24gb"), ("A30",)),
}
KNOWN = {k.name: k for _, _, k in _TABLE}


def normalise(name: str) -> str:
    return name.casefold().replace("_", "-").replace(" ", "-")


def known_model(name: str) -> KnownModel | None:
    """The known model a GRES type or node feature names, or None."""
    text = normalise(name)
    for pattern, memory, model in _TABLE:
        if pattern.search(text) and (memory is None or memory.search(text)):
            return model
    return None


def autodetected_nvml_name(gres_type: str) -> str | None:
    """The NVML name behind a type Slurm's NVML autodetection wrote (the name lowercased,
    spaces as underscores): ``nvidia_a100-sxm4-80gb`` -> ``NVIDIA A100-SXM4-80GB``."""
    if not gres_type.casefold().startswith(("nvidia_", "tesla_", "quadro_")):
        return None
    if MIG_PROFILE.search(gres_type):
        return None
    head, _, rest = gres_type.partition("_")
    words = rest.replace("_", " ").upper()  # NVML matches case-insensitively
    vendor = {"tesla": "Tesla", "quadro": "Quadro"}.get(head.casefold(), "NVIDIA")
    return f"{vendor} {words}" if words else None


@dataclass(frozen=True)
class MigGuess:
    """A MIG slice type: its profile and the GPU model it is (probably) cut from."""

    profile: str  # "3g.40gb"
    parent: str  # a KNOWN model name
    certain: bool  # False: the profile fits other GPUs too
    others: tuple[str, ...] = ()


def mig_profile(gres_type: str) -> str | None:
    m = MIG_PROFILE.search(gres_type.casefold())
    return f"{m.group(1)}g.{m.group(2)}gb" if m else None


def guess_mig(gres_type: str, nearby: Iterable[str] = ()) -> MigGuess | None:
    """The slice a MIG GRES type names, and its GPU: from the type's own prefix
    (``a100_3g.20gb``), else the one GPU the profile exists on, else the candidate some
    ``nearby`` name (the node's and the cluster's other GPU types) is, else the likeliest."""
    profile = mig_profile(gres_type)
    if profile is None:
        return None
    prefix = gres_type.casefold().split(profile.split(".")[0] + ".", 1)[0]
    candidates = _MIG_PARENTS.get(profile, ())
    own = known_model(prefix) if prefix.strip("-_ ") else None
    if own is not None:
        fitting = [c for c in candidates if KNOWN[c].family == own.family]
        parent = fitting[0] if fitting else own.name
        return MigGuess(profile, parent, True)
    if len(candidates) == 1:
        return MigGuess(profile, candidates[0], True)
    near = [k for k in (known_model(n) for n in nearby) if k is not None]
    for candidate in candidates:
        if any(k.family == KNOWN[candidate].family for k in near):
            others = tuple(c for c in candidates if c != candidate)
            return MigGuess(profile, candidate, False, others)
    if candidates:
        return MigGuess(profile, candidates[0], False, candidates[1:])
    return MigGuess(profile, "A100-80GB", False)
