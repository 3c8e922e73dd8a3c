"""Which model an NVML device name is: the one lookup every part of clusterjob shares."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["model_for_nvml_name"]


def model_for_nvml_name(nvml_name: str | None, models: Mapping[str, Iterable[str]]) -> str | None:
    """The model whose NVML names include ``nvml_name`` (exact, case-insensitive), or None.

    ``models`` maps each model to the NVML names that identify it (a site's ``nvml_names``).
    """
    if nvml_name is None:
        return None
    wanted = nvml_name.casefold()
    for model, names in models.items():
        if any(wanted == n.casefold() for n in names):
            return model
    return None
