"""Forms other sites print, made real on the sandbox: a count-only GRES beside the GPUs
(`pfsdir:scratch:no_consume:1` on every node, as Ohio Supercomputer Center's GPU nodes list
it) and a job_submit/lua plugin that refuses a GPU request without a type."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from clusterjob.errors import SlurmError
from clusterjob.jobs.explain import sbatch_hints
from clusterjob.sandbox.config import COUNT_ONLY_GRES, SANDBOX_NODES
from clusterjob.site.loader import load_site
from clusterjob.slurm import parse
from clusterjob.slurm.commands import SlurmClient

from .conftest import clusterjob_cli

pytestmark = pytest.mark.slurm


def test_nodes_carry_a_count_only_gres_beside_their_gpus(sandbox):
    nodes = parse.parse_scontrol_nodes(sandbox.run("scontrol", "show", "node", "-o", "-d"))
    assert {n.name for n in nodes} == {n.name for n in SANDBOX_NODES}
    assert "pfsdir:scratch:no_consume:1" in COUNT_ONLY_GRES
    for node in nodes:
        # 22.05 prints the configured `pfsdir:scratch:no_consume:1` as `pfsdir:scratch:1`
        pfsdir = [(e.type, e.count) for e in parse.parse_gres(node.gres) if e.name == "pfsdir"]
        assert pfsdir == [("scratch", 1)], node.gres
        used = [(e.type, e.count) for e in parse.parse_gres(node.gres_used) if e.name == "pfsdir"]
        assert used == [("scratch", 0)], node.gres_used
        # a GPU in MIG mode is one GRES per slice
        expected = sum(len(g.mig) or 1 for g in SANDBOX_NODES_BY_NAME[node.name].mapped)
        assert sum(parse.gpu_counts(node.gres).values()) == expected


SANDBOX_NODES_BY_NAME = {n.name: n for n in SANDBOX_NODES}


def test_avail_and_site_diff_count_the_gpus_right(sandbox):
    site = str(sandbox.site_path)
    done = clusterjob_cli("avail", "--site", site, "--json", env=sandbox.env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    skipped = {s["node"] for s in report["skipped"]}
    totals: Counter[str] = Counter()
    for row in report["rows"]:
        totals[row["model"]] += row["total"]
    expected: Counter[str] = Counter()
    by_partition: dict[str, set[str]] = {}
    for node in SANDBOX_NODES:
        by_partition.setdefault(node.partition, set()).add(node.name)
    loaded = load_site(sandbox.site_path)
    for part in loaded.partitions:  # a node counts once per partition it is in
        for name in part.node_names:
            if name not in skipped:
                for model in loaded.gres_models(name):  # a MIG slice counts for its model
                    expected[model] += 1
    assert totals == expected
    assert "no_consume" not in totals and "pfsdir" not in totals and "scratch" not in totals

    done = clusterjob_cli("site", "diff", "--site", site, "--json", env=sandbox.env, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    diff = json.loads(done.stdout)
    assert diff["gres"] == [] and diff["not_in_map"] == [] and diff["not_in_slurm"] == []


def test_a_job_submit_plugin_refusal_shows_its_line_and_the_hint(sandbox, tmp_path):
    """The sandbox's job_submit.lua refuses `--gres=gpu:1` as typed-GPU sites do: sbatch prints
    the plugin's line, then "Batch job submission failed: Unspecified error"."""
    script = tmp_path / "untyped.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH -p gpu\ntrue\n")
    site = load_site(sandbox.site_path)
    client = SlurmClient()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in sandbox.env.items():
            mp.setenv(key, value)
        with pytest.raises(SlurmError) as info, sbatch_hints(site):
            client.sbatch(script, token="e2eplugin", workdir=tmp_path)
    shown = str(info.value)
    assert "You must always specify a type when requesting gpu GRES" in shown
    assert shown.index("You must always specify a type") < shown.index("Unspecified error")
    assert "this cluster requires a GPU type: pass --model" in info.value.hint
    for model in site.models:
        assert f"{model.gres_type} ({model.name})" in info.value.hint
    assert "sbatch: error: Batch job submission failed: Unspecified error" in info.value.stderr
    assert shown.count("\n") == 0
