"""The loaded site kept in the user's cache: read back only while the file and the code are
what built it; errors never cached; never from a directory others may write to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import clusterjob.site.loader as loader
from clusterjob import resources
from clusterjob.errors import ConfigError
from clusterjob.site.sitecache import load_site

SITE = (resources.site_configs_dir() / "mllab.yaml").read_text()


def _entries() -> list[Path]:
    directory = Path(os.environ["XDG_CACHE_HOME"]) / "clusterjob" / "sites"
    return sorted(directory.glob("*.pickle")) if directory.is_dir() else []


def _no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("the site was parsed again")

    monkeypatch.setattr(loader, "load_site", refuse)


def _site(tmp_path: Path, text: str = SITE) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return path


def test_a_second_load_is_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _site(tmp_path)
    first = load_site(path)
    assert len(_entries()) == 1
    _no_parsing(monkeypatch)
    assert load_site(path) == first


def test_an_edit_of_the_same_size_is_seen(tmp_path: Path) -> None:
    path = _site(tmp_path)
    first = load_site(path)
    stat = path.stat()
    path.write_text(SITE.replace("site: mllab", "site: mllbb", 1))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    assert path.stat().st_size == stat.st_size
    assert (first.name, load_site(path).name) == ("mllab", "mllbb")


def test_a_bad_site_is_refused_every_time(tmp_path: Path) -> None:
    path = _site(tmp_path, SITE + "bogus_key: 1\n")
    for _ in range(2):
        with pytest.raises(ConfigError, match="bogus_key"):
            load_site(path)
    assert _entries() == []


def test_a_cache_others_may_write_to_is_not_used(tmp_path: Path) -> None:
    directory = Path(os.environ["XDG_CACHE_HOME"]) / "clusterjob" / "sites"
    directory.mkdir(parents=True)
    directory.chmod(0o777)
    load_site(_site(tmp_path))
    assert _entries() == []


def test_a_damaged_entry_is_loaded_again(tmp_path: Path) -> None:
    path = _site(tmp_path)
    first = load_site(path)
    (entry,) = _entries()
    entry.write_bytes(b"\x80\x05garbage")
    assert load_site(path) == first


def test_a_site_whose_template_dir_is_gone_is_refused_again(tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    path = _site(tmp_path, SITE + "templates: templates\n")
    assert load_site(path).templates_dir == templates
    templates.rmdir()
    with pytest.raises(ConfigError, match="not a directory"):
        load_site(path)


def test_an_edit_replaces_the_entry(tmp_path: Path) -> None:
    path = _site(tmp_path)
    load_site(path)
    path.write_text(SITE.replace("site: mllab", "site: other", 1))
    assert load_site(path).name == "other"
    assert len(_entries()) == 1
