"""`clusterjob site init` on real clusters: the local one and clusters shaped like shipped
site files (`sandbox up --like`) give back the site's models (by GRES type, or node feature
for untyped GPUs), partitions with their time limits and default, the models in each
partition, QoS limits and the type rule, on the fields the shaped cluster really carries;
with --probe, one job per node configuration gives back the node map's models in PCI bus
order, with their bus IDs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import hostlist
import pytest
from shipped_sites import slurm_site_names
from trusted_tree import trusted_tmp_dir

from clusterjob import resources
from clusterjob.sandbox import cluster
from clusterjob.sandbox.config import ClusterShape, Layout
from clusterjob.sandbox.shape import shape_of
from clusterjob.site.compare import model_key, partition_models
from clusterjob.site.loader import load_site
from clusterjob.site.model import GpuModel, Site
from clusterjob.site.nodeprobe import JOB_NAME, node_configurations
from clusterjob.slurm.describe import gpu_layouts
from clusterjob.slurm.parse import parse_scontrol_nodes
from clusterjob.slurm.syntax import time_seconds

from .conftest import Sandbox

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
# Every shipped Slurm site, and qoslab: mllab with QoS limits (no shipped site has a qos:
# section). A Grid Engine example has no Slurm sandbox to be initialised from.
SITES = (*slurm_site_names(), "qoslab")
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


def node_slots(site: Site, node: str) -> list[tuple[tuple[str, str], str | None]]:
    """A node's node-map slots as (what selects the slot's model, bus ID), which a site and
    the one ``site init --probe`` wrote share: the model's GRES type or node feature, else
    (an untyped GPU Slurm knows by no name) the NVML name the stand-in reports and the probe
    job reads, its model's first. Which GPU holds which MIG slice init guesses: not compared."""

    def selects(model: GpuModel) -> tuple[str, str]:
        if model.gres_type or model.constraint:
            return model_key(model)
        return ("NVML name", model.nvml_names[0].casefold() if model.nvml_names else "")

    return [
        (selects(site.model_by_name(g.model)), g.bus_id) for g in site.node_map.gpus(node) or ()
    ]


def nvml_sees(site: Site, node: str) -> bool:
    return all(
        site.model_by_name(g.model).vendor == "nvidia" for g in site.node_map.gpus(node) or ()
    )


def _init(env: dict[str, str], out: Path, *probe: str) -> Site:
    """``site init`` with ``--probe-syntax``, or the ``probe`` options given."""
    done = _cli("site", "init", *(probe or ["--probe-syntax"]), "--out", str(out), env=env)
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
        env = dict(os.environ, **cluster.client_env(state), CLUSTERJOB_DATA_DIR=str(trusted))
        env.pop("CLUSTERJOB_SITE", None)
        out = trusted / "init.yaml"
        # --probe: one job per node configuration reads its PCI bus order into the node map
        init = _init(env, out, "--probe", "--probe-timeout", "120")
        site = load_site(path)
        shape = shape_of(Layout(state))
        assert described(init, shape, {q.name for q in site.qos}) == carried(site, shape)
        text = out.read_text()
        for node in (n.name for n in shape.nodes if n.mapped):
            want = node_slots(site, node)
            if not nvml_sees(site, node):
                # NVML does not see AMD GPUs (lumi's MI250X): the probe job reads none, so the
                # node keeps Slurm's count of GPUs, without bus IDs, and is listed not probed
                assert [bus for _, bus in node_slots(init, node)] == [None] * len(want)
                assert f"# Not probed (no bus IDs): {node}: job " in text, text
                continue
            assert node_slots(init, node) == want, (node, text)
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


# gpu3's boards sit in another order than the sandbox's node map says (its Prolog refuses
# jobs there: tests/e2e/test_end_to_end.py), so a probe job there is held and gpu3 drained.
MISMATCHED = "gpu3"


def _slots(site: Site, node: str) -> list[tuple[str, str | None]]:
    """A node's slots as (model, bus ID), the fields both files carry (the MIG slices'
    placement is the sandbox's own; init guesses it)."""
    return [(g.model.casefold(), g.bus_id) for g in site.node_map.gpus(node) or ()]


def test_probe_jobs_read_the_node_map_one_job_per_configuration(
    sandbox: Sandbox, trusted: Path
) -> None:
    env = dict(sandbox.env, CLUSTERJOB_DATA_DIR=str(trusted / "data"))
    env.pop("CLUSTERJOB_SITE", None)
    nodes = parse_scontrol_nodes(sandbox.run("scontrol", "show", "node", "-o", "-d"))
    configs = node_configurations(nodes, gpu_layouts(nodes))
    gpu_nodes = [n for c in configs for n in c.nodes]
    assert len(configs) < len(gpu_nodes)  # gpu1 and gpu2 are one configuration
    start = sandbox.run("date", "+%Y-%m-%dT%H:%M:%S").strip()
    out = trusted / "probed.yaml"
    try:
        done = _cli(
            "site", "init", "--probe", "--probe-timeout", "240", "--out", str(out), "--json",
            env=env,
        )  # fmt: skip
    finally:
        if "DRAIN" in sandbox.node(MISMATCHED).get("State", ""):
            sandbox.resume(MISMATCHED)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "probe jobs [" in done.stderr, done.stderr
    jobs = json.loads(done.stdout)["probe_jobs"]
    assert [j["nodes"] for j in jobs] == [c.hostlist for c in configs]
    # a node another test left drained (a fault it injected) gets no job, and is listed
    down = [c for c, j in zip(configs, jobs, strict=True) if j["job_id"] is None]
    assert all("no usable node (" in j["reason"] for j in jobs if j["job_id"] is None), jobs
    deadline = time.monotonic() + 60  # slurmdbd records a job a moment after it ends
    while True:
        rows = sandbox.run(
            "sacct", "-X", "-n", "-P", "-a", f"--name={JOB_NAME}", "-S", start, "-o",
            "JobID,NodeList",
        ).split()  # fmt: skip
        if len(rows) >= len(configs) - len(down) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(rows) == len(configs) - len(down), (rows, jobs)
    assert sorted(r.split("|")[0] for r in rows) == sorted(j["job_id"] for j in jobs if j["job_id"])
    probed = load_site(out)
    site = load_site(sandbox.site_path)
    for node in gpu_nodes:
        if node != MISMATCHED and not any(node in c.nodes for c in down):
            assert _slots(probed, node) == _slots(site, node), (node, out.read_text())
    for c in down:
        assert f"not probed: {c.hostlist}: no usable node (" in done.stderr, done.stderr
    # the refused node is kept, without bus IDs, and listed as not probed
    assert [bus for _, bus in _slots(probed, MISMATCHED)] == [None] * 4
    assert f"not probed: {MISMATCHED}: job " in done.stderr, done.stderr
    assert f"# Not probed (no bus IDs): {MISMATCHED}: job " in out.read_text()
    # nodes of one configuration share one entry
    assert "gpu[1-2]" in out.read_text()


def test_a_job_runs_on_a_cluster_without_a_site_file(sandbox: Sandbox, trusted: Path) -> None:
    """No site file at all: a real job (not --dry-run) runs on `site init`'s description and
    its preflight checks the GPUs it was given."""
    home = trusted / "home"
    home.mkdir(mode=0o700)
    env = dict(sandbox.env, HOME=str(home), CLUSTERJOB_DATA_DIR=str(trusted / "data"),
               CLUSTERJOB_STATUS_CACHE_SECONDS="0")  # fmt: skip
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "CLUSTERJOB_SITE"):
        env.pop(name, None)
    # the headline command, as is
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", "submit", TRAIN, "--gpus", "2", "--model", "A100"],
        capture_output=True, text=True, timeout=300, env=env, cwd=trusted,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    waited = _cli("wait", "last", "--timeout", "240", env=env)
    logs = _cli("logs", "last", env=env).stdout
    assert waited.returncode == 0, (waited.stdout, waited.stderr, logs)
    status = _cli("status", "last", "--json", env=env)
    assert '"COMPLETED"' in status.stdout, status.stdout
    # the preflight table: the two A100s it was given, checked against the description's
    # model (its default partition holds gpu1 and gpu2)
    assert re.search(r"^SLOT\s+BUS ID\s+EXPECTED\s+FOUND\s+STATUS$", logs, re.M), logs
    allocated = [ln for ln in logs.splitlines() if re.match(r"^\d+\* ", ln)]
    assert len(allocated) == 2, logs
    for line in allocated:
        assert re.search(r"\bA100\s+NVIDIA A100-SXM4-80GB \(A100\)\s+ok$", line), line
    assert re.search(r"^preflight gpu[12]: OK \(", logs, re.M), logs
    described = home / ".cache" / "clusterjob" / "described" / "sandbox.yaml"
    assert described.is_file() and f"wrote to {described}" in done.stderr
