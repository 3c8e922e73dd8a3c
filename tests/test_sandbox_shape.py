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
    lines += ["partitions:", "  gpu: {nodes: 'n[1-10]', default: true}", "node_map:"]
    lines += [
        f"  - {{nodes: n{i}, gpus: [{', '.join('{model: A100}' for _ in range(i))}]}}"
        for i in range(1, 11)
    ]
    (tmp_path / "wide.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError, match=r"--like wide: 10 node configurations .* at most 8"):
        shape.like(load_site(tmp_path / "wide.yaml"))
