"""Site discovery: the documented order, names vs paths, ClusterName matching, clear failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterjob.errors import SiteNotFound, SlurmUnavailable
from clusterjob.resources import site_configs_dir
from clusterjob.site.discovery import declared_cluster_name, find_site

EXAMPLE = site_configs_dir() / "mllab.yaml"


@pytest.fixture
def roots(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """An environment with an empty home and /etc, so the real machine's files never leak in."""
    home = tmp_path / "home"
    etc = tmp_path / "etc"
    (home / ".config" / "clusterjob" / "sites").mkdir(parents=True)
    (etc / "sites").mkdir(parents=True)
    return {"HOME": str(home)}, home / ".config" / "clusterjob", etc


def _site(path: Path, cluster: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"site: {path.stem}\ncluster_name: {cluster}\n")
    return path


def _no_cluster() -> str | None:
    raise AssertionError("ClusterName must not be asked for when an earlier source matched")


def test_spec_path_wins_over_everything(roots, tmp_path: Path) -> None:
    environ, user, etc = roots
    _site(user / "site.yaml")
    mine = _site(tmp_path / "mine.yaml")
    environ["CLUSTERJOB_SITE"] = str(_site(tmp_path / "env.yaml"))
    assert find_site(str(mine), environ=environ, cluster_name=_no_cluster, etc_dir=etc) == mine


def test_spec_name_searches_user_then_etc_then_shipped(roots) -> None:
    environ, user, etc = roots
    assert find_site("mllab", environ=environ, cluster_name=None, etc_dir=etc) == EXAMPLE
    in_etc = _site(etc / "sites" / "mllab.yaml")
    assert find_site("mllab", environ=environ, cluster_name=None, etc_dir=etc) == in_etc
    in_user = _site(user / "sites" / "mllab.yaml")
    assert find_site("mllab", environ=environ, cluster_name=None, etc_dir=etc) == in_user


def test_xdg_config_home_is_respected(roots, tmp_path: Path) -> None:
    environ, _, etc = roots
    environ["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    mine = _site(tmp_path / "xdg" / "clusterjob" / "site.yaml")
    assert find_site(None, environ=environ, cluster_name=_no_cluster, etc_dir=etc) == mine


def test_env_var_then_user_default_then_etc_default(roots, tmp_path: Path) -> None:
    environ, user, etc = roots
    etc_default = _site(etc / "site.yaml")
    assert find_site(None, environ=environ, cluster_name=_no_cluster, etc_dir=etc) == etc_default
    user_default = _site(user / "site.yaml")
    assert find_site(None, environ=environ, cluster_name=_no_cluster, etc_dir=etc) == user_default
    environ["CLUSTERJOB_SITE"] = "hpccentre"
    found = find_site(None, environ=environ, cluster_name=_no_cluster, etc_dir=etc)
    assert found == site_configs_dir() / "hpccentre.yaml"


def test_cluster_name_picks_the_matching_site(roots) -> None:
    environ, user, etc = roots
    _site(etc / "sites" / "other.yaml", cluster="other")
    mine = _site(user / "sites" / "prod.yaml", cluster="'big-iron'")
    found = find_site(None, environ=environ, cluster_name=lambda: "big-iron", etc_dir=etc)
    assert found == mine
    found = find_site(None, environ=environ, cluster_name=lambda: "h100farm", etc_dir=etc)
    assert found == site_configs_dir() / "h100farm.yaml"


def test_nothing_found_says_what_was_tried(roots) -> None:
    environ, user, etc = roots
    with pytest.raises(SiteNotFound) as info:
        find_site(None, environ=environ, cluster_name=lambda: "nowhere", etc_dir=etc)
    message = str(info.value)
    assert str(user / "site.yaml") in message and str(etc / "site.yaml") in message
    assert "cluster_name nowhere" in message and str(etc / "sites") in message


def test_unreadable_cluster_name_is_reported_not_raised(roots) -> None:
    environ, _, etc = roots

    def broken() -> str | None:
        raise SlurmUnavailable(["scontrol"], None, "scontrol: command not found")

    with pytest.raises(SiteNotFound, match="Slurm ClusterName \\(could not be read"):
        find_site(None, environ=environ, cluster_name=broken, etc_dir=etc)


def test_bad_spec_does_not_fall_through(roots, tmp_path: Path) -> None:
    environ, user, etc = roots
    _site(user / "site.yaml")
    with pytest.raises(SiteNotFound, match="no site named 'mlab'.*known sites: .*mllab"):
        find_site("mlab", environ=environ, cluster_name=None, etc_dir=etc)
    environ["CLUSTERJOB_SITE"] = str(tmp_path / "gone.yaml")
    with pytest.raises(SiteNotFound, match="CLUSTERJOB_SITE .*gone.yaml: no such site config"):
        find_site(None, environ=environ, cluster_name=None, etc_dir=etc)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("site: a\ncluster_name: lab-a  # comment\n", "lab-a"),
        ('cluster_name: "lab b"\n', "lab b"),
        ("cluster_name:\n", None),
        ("  cluster_name: nested\n", None),
        ("site: a\n", None),
    ],
)
def test_declared_cluster_name(tmp_path: Path, text: str, expected: str | None) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    assert declared_cluster_name(path) == expected
