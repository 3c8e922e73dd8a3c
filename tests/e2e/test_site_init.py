"""`clusterjob site init` on real clusters: the local one and clusters shaped like shipped
site files (`sandbox up --like`) give back the site's models (by GRES type, or node feature
for untyped GPUs), partitions with their time limits and default, the models in each
partition, QoS limits and the type rule, on the fields the shaped cluster really carries."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import hostlist
import pytest
from trusted_tree import trusted_tmp_dir

from clusterjob import resources
from clusterjob.sandbox import cluster
from clusterjob.sandbox.config import ClusterShape, Layout
from clusterjob.sandbox.shape import shape_of
from clusterjob.site.compare import model_key, partition_models
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from clusterjob.slurm.syntax import time_seconds

from .conftest import Sandbox

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
# Every shipped site, and qoslab: mllab with QoS limits (no shipped site has a qos: section).
SITES = (*sorted(p.stem for p in resources.site_configs_dir().glob("*.yaml")), "qoslab")
QOS = """
qos:
  debug: {max_time: "01:00:00", max_nodes: 1, max_gpus_per_job: 2}
  long: {max_time: "7-00:00:00", max_nodes: 4}
"""


@pytest.fixture
def trusted() -> Iterator[Path]:
    yield from trusted_tmp_dir()


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", *args],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip


def _seconds(text: str | None) -> int | None:
    return None if text is None else time_seconds(text)


def carried(site: Site, shape: ClusterShape) -> dict[str, object]:
    """What a cluster shaped like ``site`` says of it: the models its nodes hold (as GRES
    types or features), its partitions' limits and models, the site's QoS limits."""
    names = [n.name for n in shape.nodes]
    held = {m for n in names for m in site.gres_models(n)}
    # an untyped GPU without a feature is known to Slurm by no name (lumi's, lonestar6's)
    keys = {m.name: model_key(m) for m in site.models if m.gres_type or m.constraint}
    partitions = {}
    for part in shape.partitions:
        members = hostlist.expand_hostlist(part.hostlist)
        models = {keys[m] for n in members for m in site.gres_models(n) if m in keys}
        partitions[part.name] = (
            _seconds(part.max_time), part.default, sorted(f"{k[0]} {k[1]}" for k in models)
        )  # fmt: skip
    return {
        "models": sorted(keys[m] for m in held if m in keys),
        "partitions": partitions,
        "qos": {q.name: (_seconds(q.max_time), q.max_nodes, q.max_gpus_per_job) for q in site.qos},
        "type_required": shape.type_required,
    }


def described(init: Site, shape: ClusterShape, qos: set[str]) -> dict[str, object]:
    """The same fields of the site ``site init`` wrote."""
    partitions = {
        p.name: (
            _seconds(p.time_limit),
            p.default,
            [m for m in partition_models(init, p.name) if not m.startswith("name ")],
        )
        for p in init.partitions
    }
    return {
        "models": sorted(model_key(m) for m in init.models if m.gres_type or m.constraint),
        "partitions": partitions,
        "qos": {
            q.name: (_seconds(q.max_time), q.max_nodes, q.max_gpus_per_job)
            for q in init.qos
            if q.name in qos
        },
        "type_required": init.type_required,
    }


def _init(env: dict[str, str], out: Path) -> Site:
    done = _cli("site", "init", "--probe", "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and out.is_file()
    return load_site(out)


def test_init_on_the_local_cluster_gives_back_its_site(sandbox: Sandbox, trusted: Path) -> None:
    env = dict(sandbox.env, CLUSTERJOB_DATA_DIR=str(trusted / "data"))
    env.pop("CLUSTERJOB_SITE", None)
    out = trusted / "init.yaml"
    init = _init(env, out)
    site = load_site(sandbox.site_path)
    shape = shape_of(sandbox.layout)
    assert described(init, shape, set()) == carried(site, shape)
    # the file it wrote is a site jobs run on: the GPUs checked for model and count
    env.update(CLUSTERJOB_SITE=str(out), CLUSTERJOB_STATUS_CACHE_SECONDS="0")
    submit = ["submit", TRAIN, "--gpus", "2", "--model", "a100", "--time", "0:05:00"]
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", *submit], capture_output=True, text=True,
        timeout=300, env=env, cwd=trusted,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    waited = _cli("wait", "last", "--timeout", "240", env=env)
    logs = _cli("logs", "last", env=env).stdout
    assert waited.returncode == 0, (waited.stdout, waited.stderr, logs)
    assert ": OK (" in logs, logs
    diff = _cli("site", "init", "--diff", str(sandbox.site_path), env=env)
    assert diff.returncode in (0, 1) and "Traceback" not in diff.stderr
    assert "differences" in diff.stdout


@pytest.mark.parametrize("name", SITES)
def test_init_on_a_cluster_shaped_like_a_site_gives_it_back(
    sandbox: Sandbox, trusted: Path, name: str
) -> None:
    path = resources.site_configs_dir() / f"{name}.yaml"
    if name == "qoslab":  # mllab with QoS limits (no shipped site has a qos: section)
        text = (resources.site_configs_dir() / "mllab.yaml").read_text()
        text = text.replace("site: mllab", "site: qoslab").replace("cluster_name: mllab", "")
        path = trusted / "qoslab.yaml"
        path.write_text(text.replace("\nnode_map:", QOS + "\nnode_map:", 1))
    state = trusted / "like"
    up = _cli(
        "sandbox", "up", "--like", str(path), "--state-dir", str(state), "--timeout", "240",
        env=dict(os.environ),
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        env = dict(os.environ, **cluster.client_env(state))
        env.pop("CLUSTERJOB_SITE", None)
        init = _init(env, trusted / "init.yaml")
        site = load_site(path)
        shape = shape_of(Layout(state))
        assert described(init, shape, {q.name for q in site.qos}) == carried(site, shape)
    finally:
        _cli("sandbox", "down", "--state-dir", str(state), "--purge", env=dict(os.environ))
    assert cluster.status(sandbox.state_dir).up  # the running one was not disturbed


def test_a_cluster_without_a_site_file_is_described_once(sandbox: Sandbox, trusted: Path) -> None:
    """No --site, no CLUSTERJOB_SITE, no default file and no site declaring the cluster:
    `avail` and `submit` use `site init`'s description, written once to the user's cache."""
    home = trusted / "home"
    home.mkdir(mode=0o700)
    env = dict(sandbox.env, HOME=str(home), CLUSTERJOB_DATA_DIR=str(trusted / "data"))
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "CLUSTERJOB_SITE"):
        env.pop(name, None)
    avail = _cli("avail", "--json", env=env)
    assert avail.returncode == 0, avail.stderr
    described = home / ".cache" / "clusterjob" / "described" / "sandbox.yaml"
    assert described.is_file() and f"wrote to {described}" in avail.stderr
    dry = subprocess.run(
        [sys.executable, "-m", "clusterjob", "submit", TRAIN, "--gpus", "1", "--model", "v100",
         "--dry-run"], capture_output=True, text=True, timeout=300, env=env, cwd=trusted,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --gres=gpu:v100:1" in dry.stdout
    assert f"export CLUSTERJOB_SITE={described}" in dry.stdout
    assert "wrote to" not in dry.stderr  # the description of a moment ago, not a new one
