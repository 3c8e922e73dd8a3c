"""Where the shipped templates and example site configs live.

In a wheel they are inside the package (``clusterjob/_data/``, see pyproject.toml);
in a source checkout or an editable install they are the top-level folders.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    installed = _PACKAGE / "_data" / name
    if installed.is_dir():
        return installed
    return _PACKAGE.parent / name


def templates_dir() -> Path:
    return _data_dir("templates")


def site_configs_dir() -> Path:
    return _data_dir("site_configs")
