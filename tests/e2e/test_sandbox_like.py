"""`sandbox up --like SITE`: a local cluster shaped like each shipped site file (its node names,
GPUs per its node map, GRES, features, partitions, accounts, QoS) runs that site's GPU jobs
to COMPLETED, the preflight checking them against the site's own node map."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from shipped_sites import slurm_site_names
from trusted_tree import trusted_tmp_dir

from clusterjob import resources
from clusterjob.sandbox import cluster
from clusterjob.sandbox.config import Layout
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site

from .conftest import Sandbox

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
SITES = slurm_site_names()  # a Slurm sandbox shaped like each Slurm example site


@pytest.fixture
def trusted() -> Iterator[Path]:
    yield from trusted_tmp_dir()


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=cwd,
    )  # fmt: skip


def jobs_of(site: Site) -> list[tuple[str, int]]:
    """(model, GPUs) of a job for each of the site's models some node holds (two at most):
    one GPU, or a whole node where its partition gives whole nodes."""
    held = {g.model for gpus in site.node_map.nodes.values() for g in gpus}
    out = []
    for model in (m for m in site.models if m.name in held and not m.members):
        whole = [
            p.gpus_per_node
            for p in site.partitions
            if p.gpus_per_node
            and any(
                g.model == model.name for n in p.node_names for g in site.node_map.gpus(n) or ()
            )
        ]
        out.append((model.name, whole[0] if whole else 1))
    return out[:2]


@pytest.mark.parametrize("name", SITES)
def test_a_cluster_shaped_like_the_site_runs_its_jobs(
    sandbox: Sandbox, trusted: Path, name: str
) -> None:
    state = trusted / "like"
    up = _cli("sandbox", "up", "--like", name, "--state-dir", str(state), "--timeout", "240")
    try:
        assert up.returncode == 0, up.stderr
        site = load_site(resources.site_configs_dir() / f"{name}.yaml")
        nodes = _cli("sandbox", "status", "--state-dir", str(state)).stdout
        for node in (line.split()[1] for line in nodes.splitlines() if line.startswith("node ")):
            assert node in site.node_map or any(node in p.node_names for p in site.partitions)
        env = dict(os.environ, **cluster.client_env(state))
        env.update(CLUSTERJOB_DATA_DIR=str(trusted / "data"), CLUSTERJOB_STATUS_CACHE_SECONDS="0")
        checked = any(m.vendor == "nvidia" for m in site.models)
        for model, gpus in jobs_of(site):
            submit = ["submit", TRAIN, "--gpus", str(gpus), "--model", model, "--time", "0:10:00"]
            done = _cli(*submit, "--account", "sandbox", env=env, cwd=trusted)
            assert done.returncode == 0, (model, done.stderr)
            waited = _cli("wait", "last", "--timeout", "240", env=env, cwd=trusted)
            logs = _cli("logs", "last", env=env, cwd=trusted).stdout
            assert waited.returncode == 0, (model, waited.stdout, waited.stderr, logs)
            if checked:  # the in-job preflight checked the GPUs against the site's node map
                assert ": OK (" in logs, logs
    finally:
        _cli("sandbox", "down", "--state-dir", str(state), "--purge")
    assert not state.exists() and not cluster.controller_running(state)
    assert cluster.status(sandbox.state_dir).up  # the running one was not disturbed
    assert not (Layout(state).state_dir / "shape.json").exists()
