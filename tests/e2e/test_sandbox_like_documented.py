"""Every documented job of the shipped sites (``tests/test_real_sites.py``: each one the
``#SBATCH`` block of a real cluster's user guide) runs to COMPLETED on a local cluster shaped
like its site, `sandbox up --like SITE --nodes ...` giving a job of several nodes as many of
the site's own nodes of its configuration.

The rendered lines are compared with the documentation there; here the same requests go
through `clusterjob submit` to the cluster's real slurmctld, which applies the site's
partitions, QoS, accounts, features and GRES, and the in-job preflight checks each node's
GPUs against the site's node map.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import hostlist
import pytest
from test_real_sites import EXAMPLES, Example
from trusted_tree import trusted_tmp_dir

from clusterjob import resources
from clusterjob.sandbox import cluster
from clusterjob.sandbox.config import ACCOUNT
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site

from .conftest import Sandbox

# torch: a job of several nodes runs train.py under torchrun (the default launcher there),
# with this interpreter's torch; so these run on the host only (scripts/test-releases.sh).
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
SITES = sorted({e.site for e in EXAMPLES.values()})

# The request's keys as `clusterjob submit` options.
OPTIONS = {
    "gpus": "--gpus",
    "nodes": "--nodes",
    "model": "--model",
    "partition": "--partition",
    "time": "--time",
    "account": "--account",
    "qos": "--qos",
    "cpus_per_gpu": "--cpus-per-gpu",
    "mem_per_gpu": "--mem-per-gpu",
    "tasks_per_node": "--tasks-per-node",
    "job_name": "--job-name",
    "output": "--output",
    "error": "--error",
    "constraint": "--constraint",
    "launcher": "--launcher",
}


@pytest.fixture
def trusted() -> Iterator[Path]:
    yield from trusted_tmp_dir()


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", *args],
        capture_output=True, text=True, timeout=900, env=env, cwd=cwd,
    )  # fmt: skip


def submit_options(example: Example) -> list[str]:
    """The documented job as `submit` options. The account the documentation names, or builds
    from a project (``<account>``, ``def-someuser``, ``sos@h100``), is the local cluster's
    own: those are one user's, and Slurm refuses a job whose account does not exist."""
    argv: list[str] = []
    for key, value in example.request.items():
        if key == "sbatch_args":
            argv += [f"--sbatch-arg={a}" for a in value]  # type: ignore[attr-defined]
        elif key not in ("account", "project"):
            argv += [OPTIONS[key], str(value)]
    return [*argv, "--account", ACCOUNT]


def nodes_for(site: Site, examples: list[Example]) -> list[str]:
    """The site's own nodes the site's jobs of several nodes need: for each, the first nodes
    of its partition (or the site) holding its model, as many as it asks."""
    out: list[str] = []
    for example in examples:
        count = int(example.request.get("nodes", 1))  # type: ignore[call-overload]
        if count < 2:
            continue
        model = site.model(str(example.request["model"])) if "model" in example.request else None
        partition = example.request.get("partition")
        names = [
            n
            for n, gpus in site.node_map.nodes.items()
            if (model is None or any(g.model == model.name for g in gpus))
            and (
                partition is None
                or any(p.name == partition and n in p.node_names for p in site.partitions)
            )
        ]
        assert len(names) >= count, (example, names)
        out += [n for n in names[:count] if n not in out]
    return out


@pytest.mark.parametrize("name", SITES)
def test_each_documented_job_of_the_site_completes_on_a_cluster_of_its_shape(
    sandbox: Sandbox, trusted: Path, name: str
) -> None:
    site = load_site(resources.site_configs_dir() / f"{name}.yaml")
    examples = {k: e for k, e in sorted(EXAMPLES.items()) if e.site == name}
    state = trusted / "like"
    up = ["sandbox", "up", "--like", name, "--state-dir", str(state), "--timeout", "300"]
    more = nodes_for(site, list(examples.values()))
    if more:
        up += ["--nodes", hostlist.collect_hostlist(more)]
    started = _cli(*up)
    try:
        assert started.returncode == 0, started.stderr
        env = dict(os.environ, **cluster.client_env(state))
        env.update(CLUSTERJOB_DATA_DIR=str(trusted / "data"), CLUSTERJOB_STATUS_CACHE_SECONDS="0")
        ids = {}
        for key, example in examples.items():
            argv = ["submit", TRAIN, *submit_options(example), "--python", sys.executable]
            argv += ["--mkdir", "--parsable"]  # -o logs/%j: its folder made
            done = _cli(*argv, env=env, cwd=trusted)
            assert done.returncode == 0, (key, argv, done.stderr)
            ids[key] = done.stdout.strip()
        for key, job in ids.items():
            waited = _cli("wait", job, "--timeout", "600", env=env, cwd=trusted)
            out = _cli("logs", job, env=env, cwd=trusted).stdout
            err = _cli("logs", job, "--err", env=env, cwd=trusted).stdout
            out += "" if err == out else err  # a job of -e has two files
            assert waited.returncode == 0, (key, waited.stdout, waited.stderr, out)
            assert "COMPLETED" in waited.stdout, (key, waited.stdout)
            if any(m.vendor == "nvidia" for m in site.models):  # checked once on each node
                nodes = int(examples[key].request.get("nodes", 1))  # type: ignore[call-overload]
                checked = re.findall(r"preflight (\S+): OK \(", out)
                assert len(checked) == len(set(checked)) == nodes, (key, checked, out)
        extra = f"{len(more)} more nodes" if more else "one node per configuration"
        print(f"{name}: {len(ids)} documented jobs COMPLETED ({extra})")
    finally:
        _cli("sandbox", "down", "--state-dir", str(state), "--purge")
    assert cluster.status(sandbox.state_dir).up  # the running one was not disturbed
