"""The shape of a local cluster made from a site file (`sandbox up --like`): pure, from each
shipped site; the daemons' side is tests/e2e/test_sandbox_like.py."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from clusterjob import resources
from clusterjob.errors import UsageError
from clusterjob.sandbox import config, shape
from clusterjob.sandbox.config import DEFAULT_SHAPE, MAX_NODES, Layout, Ports
from clusterjob.site.loader import load_site

SITES = sorted(resources.site_configs_dir().glob("*.yaml"))


@pytest.mark.parametrize("path", SITES, ids=lambda p: p.stem)
def test_every_shipped_site_has_a_shape_and_it_survives_its_record(
    path: Path, tmp_path: Path
) -> None:
    site = load_site(path)
    made = shape.like(site)
    assert 1 <= len(made.nodes) <= MAX_NODES
    configs = {
        tuple((g.model, g.bus_id, g.mig) for g in gpus) for gpus in site.node_map.nodes.values()
    }
    mapped = [n for n in made.nodes if n.name in site.node_map]
    assert len(mapped) >= len(configs)  # one node of each GPU configuration, at least
    for node in mapped:  # the node map's GPUs, at its bus ids, in its order
        assert [g.model for g in node.mapped] == [g.model for g in site.node_map.gpus(node.name)]
    names = {n.name for n in made.nodes}
    for part in made.partitions:  # every partition Slurm gets has nodes, all of the site's
        assert set(part.hostlist.split(",")) <= names
    assert sum(p.default for p in made.partitions) == 1
    assert made.cluster_name == (site.cluster_name or site.name).lower()
    layout = Layout(tmp_path)
    shape.record(layout, made, path.read_text())
    assert shape.shape_of(layout) == made
    assert json.loads((tmp_path / shape.SHAPE_FILE).read_text()) == json.loads(
        json.dumps(asdict(made))
    )


def test_a_model_constraint_becomes_the_features_of_the_nodes_that_hold_it() -> None:
    site = load_site(resources.site_configs_dir() / "jeanzay.yaml")
    made = shape.like(site)
    with_constraint = {m.name: m.constraint for m in site.models if m.constraint}
    assert with_constraint, "jeanzay selects its models by constraint"
    for node in made.nodes:
        for gpu in node.mapped:
            if gpu.model in with_constraint:
                words = shape._FEATURE.findall(with_constraint[gpu.model])
                assert set(words) <= set(made.features[node.name])


def test_the_sandboxs_own_shape_is_what_it_always_was(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert shape.shape_of(layout) is DEFAULT_SHAPE
    ports = Ports.from_base(26800)
    gres_conf, _ = config.gres_from_site(
        load_site(resources.site_configs_dir() / "mllab.yaml"), layout
    )
    text = config.slurm_conf(layout, ports, {n.name: "gpu:x:1" for n in DEFAULT_SHAPE.nodes})
    assert "ClusterName=sandbox" in text and "JobSubmitPlugins=lua" in text
    assert "PartitionName=gpu Nodes=gpu[1-2] Default=YES MaxTime=2-00:00:00 State=UP" in text
    assert "Features=" not in text and "OverSubscribe" not in text
    assert "NodeName=" not in gres_conf  # gres.conf for the sandbox's nodes only, none of mllab's


def test_a_site_of_more_configurations_than_the_machine_runs_is_refused(tmp_path: Path) -> None:
    lines = ["site: wide", "gpu_request: {syntax: gres}", "models:"]
    lines += ["  A100: {gres_type: a100, nvml_names: [NVIDIA A100-SXM4-80GB]}"]
    lines += ["partitions:", "  gpu: {nodes: 'n[1-31]', default: true}", "node_map:"]
    lines += [
        f"  - {{nodes: n{i}, gpus: [{', '.join('{model: A100}' for _ in range(i))}]}}"
        for i in range(1, MAX_NODES + 2)
    ]
    (tmp_path / "wide.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        UsageError, match=rf"--like wide: {MAX_NODES + 1} nodes .* at most {MAX_NODES}"
    ):
        shape.like(load_site(tmp_path / "wide.yaml"))


def test_more_of_the_sites_own_nodes_run_beside_one_per_configuration() -> None:
    site = load_site(resources.site_configs_dir() / "jeanzay.yaml")
    plain = [n.name for n in shape.like(site).nodes]
    a100 = [n for n, gpus in site.node_map.nodes.items() if gpus[0].model == "A100"]
    wider = [n.name for n in shape.like(site, a100).nodes]
    assert wider[: len(plain)] == plain  # the configurations first, as before
    assert set(a100) <= set(wider) and len(wider) == len(set(wider))
    made = shape.like(site, a100)
    by_name = {n.name: n for n in made.nodes}
    assert {len(by_name[n].mapped) for n in a100} == {8}  # each as its node map says
    gpu_p5 = next(p for p in made.partitions if p.name == "gpu_p5")
    assert set(a100) <= set(gpu_p5.hostlist.split(","))


def test_a_node_the_site_does_not_have_is_refused_with_a_suggestion() -> None:
    site = load_site(resources.site_configs_dir() / "jeanzay.yaml")
    some = next(iter(site.node_map.nodes))
    with pytest.raises(UsageError, match=rf"--nodes: {some}x is not a node of jeanzay.*{some}"):
        shape.like(site, [some + "x"])


def test_a_site_that_routes_jobs_gets_a_submit_rule_that_routes_them() -> None:
    """Jean Zay's H100 jobs name no partition (-C h100 alone): the site routes them. The
    shaped cluster's job_submit.lua gives a job without --partition the site's routed
    partitions; the sandbox's own shape routes nothing."""
    site = load_site(resources.site_configs_dir() / "jeanzay.yaml")
    made = shape.like(site)
    assert made.routed == ("gpu_p13", "gpu_p6")
    lua = config.job_submit_lua(made)
    assert 'local ROUTED = "gpu_p13,gpu_p6"' in lua and "local TYPE_REQUIRED = false" in lua
    own = config.job_submit_lua(DEFAULT_SHAPE)
    assert "local ROUTED = nil" in own and "local TYPE_REQUIRED = true" in own
    gres = {n.name: "gpu:4" for n in made.nodes}
    text = config.slurm_conf(
        Layout(Path("/x")), Ports.from_base(26800, made.nodes), gres, shape=made
    )
    assert "JobSubmitPlugins=lua" in text  # for the routing, though no type is required
