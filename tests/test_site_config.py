"""Site config loading: one bad config per rule, each with its exact `file:line: path: message`."""

from __future__ import annotations

import time
from pathlib import Path

import hostlist
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterjob.errors import ConfigError
from clusterjob.resources import site_configs_dir
from clusterjob.site import schema
from clusterjob.site.gpu_syntax import syntax_named
from clusterjob.site.loader import MAX_BYTES, load_site, validate_site_file
from clusterjob.site.nodemodel import NodeGpu, OnError

BAD = Path(__file__).parent / "bad_configs"

# file name -> the issues it must produce, as "line: rest" (the file path is prepended).
EXPECTED: dict[str, list[str]] = {
    "unknown_key.yaml": [
        "6: models.A100.alias: unknown key (did you mean 'aliases'?); valid keys: "
        + ", ".join(sorted(schema.MODEL.key_table())),
    ],
    "wrong_type_int.yaml": ["7: models.A100.memory_gb: expected an integer, got 'abc'"],
    "bad_gres_type.yaml": [
        "5: models.A100.gres_type: not a GRES type name: 'a100:2' "
        "(letters, digits, '_', '-' and '.' only)",
    ],
    "wrong_type_bool.yaml": [
        "5: gpu_request.type_required: expected true or false, got 'yes'",
    ],
    "wrong_type_string.yaml": [
        '4: models.RTX3090.gres_type: expected a string, got 3090 (write "3090" for text)',
    ],
    "bad_syntax_choice.yaml": [
        "2: gpu_request.syntax: expected one of gres, gres+constraint, gpus-per-node, "
        "gpus-per-task, gpus, none, "
        "got 'gpu-per-node'",
    ],
    "bad_scheduler.yaml": ["2: scheduler: expected one of slurm, gridengine, got 'pbs'"],
    "missing_required.yaml": ["1: site: required key missing"],
    "undefined_model.yaml": [
        "10: node_map[0].gpus[1].model: unknown model 'H100'; defined models: A100, V100",
    ],
    "partition_unknown_nodes.yaml": ["7: partitions.gpu.nodes: not in node_map: n[3-6]"],
    "node_twice.yaml": [
        "8: node_map[1].nodes: n[07-08] already defined in node_map[0] (line 6)",
    ],
    "bad_bus_id.yaml": [
        "8: node_map[0].gpus[0].bus_id: not a PCI bus ID: '0000:zz:00.0' "
        "(expected e.g. 0000:3b:00.0)",
    ],
    "duplicate_bus_id.yaml": [
        "9: node_map[0].gpus[1].bus_id: bus ID 0000:07:00.0 is already used by slot 0 of this node",
    ],
    "bad_nvlinks.yaml": [
        "8: node_map[0].gpus[0].nvlinks: a GPU has at most 36 NVLink links, got 40",
        "9: node_map[0].gpus[1].nvlinks: expected an integer >= 0, got -1",
        "10: node_map[0].gpus[2].nvlinks: expected an integer, got 'many'",
    ],
    "bad_checks.yaml": [
        "8: partitions.gpu.checks.severity.gpu-busy: expected one of error, warning, off, "
        "got 'sometimes'",
        "14: checks.driver_min: not an NVIDIA driver version: 'latest' (e.g. \"535.104.05\")",
        "16: checks.severity.pcie-slow: unknown check id; valid: alloc-count, alloc-env, "
        "alloc-mig, alloc-model, alloc-slot, clocks-throttled, cuda-order, driver-version, "
        "ecc-uncorrectable, gpu-busy, gpu-count, gpu-extra, gpu-hot, gpu-lost, gpu-missing, "
        "gpu-uuid, gres-index, mig-layout, mig-mode, mig-pending, model-mismatch, "
        "node-unmapped, numa-affinity, nvlink-down, nvlink-fabric, pcie-degraded, "
        "persistence-off, power-capped, retired-pages-pending, row-remap-failure, "
        "row-remap-pending",
    ],
    "bad_cuda_min.yaml": [
        "10: checks.cuda_min: not a CUDA version: '12' (e.g. \"12.4\", quoted)",
        '12: partitions.gpu.checks.cuda_min: expected a string, got 12.4 (write "12.4" for text)',
    ],
    "bad_mig.yaml": [
        "8: node_map[0].gpus[0].mig[1]: not a MIG profile: '3g' (e.g. 1g.10gb, or 1g.10gb@7 "
        "with its GPU instance)",
        "9: node_map[0].gpus[1].mig: expected a list of strings, got 'yes'",
        "10: node_map[0].gpus[2].mig: the slices take 8 compute slices, a GPU has 7",
        "11: node_map[0].gpus[3].mig: the slices take 90 GB, a A100 has 80 GB",
        "12: node_map[0].gpus[4].mig[1]: GPU instance 1 is already slice 0",
        "13: node_map[0].gpus[5].mig: give every slice its GPU instance id (@GI) or none",
        "14: node_map[0].gpus[6].mig[0]: not a MIG profile: '1g.10gb@15' (e.g. 1g.10gb, or "
        "1g.10gb@7 with its GPU instance)",
    ],
    "bus_order.yaml": [
        "10: node_map[0].gpus[1].bus_id: GPUs must be listed in PCI bus order: 0000:07:00.0 "
        "comes before 0000:0b:00.0 (slot 0)",
    ],
    "bad_hostlist.yaml": ["6: node_map[0].nodes: bad hostlist 'n[1-2': unbalanced brackets"],
    "alias_collision.yaml": [
        "9: models.H100.aliases[1]: alias 'BIG' already names model A100 (case-insensitive)",
    ],
    "two_defaults.yaml": [
        "11: partitions.debug.default: partition gpu is already the default (line 8); "
        "at most one partition can be",
    ],
    "gres_type_required.yaml": [
        "5: models.V100.gres_type: required when gpu_request.syntax is gpus-per-node and "
        "type_required is true",
    ],
    "constraint_required.yaml": [
        "5: models.V100.constraint: required when gpu_request.syntax is gres+constraint",
    ],
    "malformed_yaml.yaml": [
        "3: YAML syntax error: while parsing a flow mapping (started at line 2): "
        "expected ',' or '}', but got ':'",
    ],
    "empty.yaml": ["1: empty file: expected a site config mapping"],
    "not_mapping.yaml": ["1: expected a mapping of site settings at the top, got a list"],
    "non_utf8.yaml": ["2: not UTF-8 text: byte 0xe9 cannot be decoded"],
    "alias_bomb.yaml": [
        "2: cluster_name: YAML anchors and aliases (&a, *a) are not supported in site "
        "configs; write the value out",
        "9: node_map[0].gpus: YAML anchors and aliases (&b, *b) are not supported in site "
        "configs; write the value out",
    ],
    "duplicate_key.yaml": ["8: site: duplicate key (first defined at line 1)"],
    "uuid_on_many_nodes.yaml": [
        "8: node_map[0].gpus[0].uuid: a UUID names one GPU, but this entry covers 2 nodes (n[1-2])",
    ],
    "bad_time_limit.yaml": [
        "6: partitions.gpu.time_limit: not a Slurm time limit: '2 days' "
        "(e.g. 2-00:00:00, 12:00:00, 30)",
    ],
    "yaml_tag.yaml": [
        "1: site: YAML tags are not supported here (found !!python/object:os.system)",
    ],
    "bad_job_defaults.yaml": [
        "2: gpu_request.cpus: expected one of cpus-per-gpu, cpus-per-task, got 'per-task'",
        "4: defaults.time: not a Slurm time: '2 hours' (e.g. 1:00:00, 2-00:00:00, 30)",
        "7: defaults.qos_by_time: give qos or qos_by_time, not both",
        "8: defaults.gres[0]: GPUs are the request itself (gpu_request, --gpus, --model), not "
        "an extra GRES",
        "9: defaults.sbatch[0]: --gres is written by clusterjob: set defaults.gres (merged into "
        "the one --gres) instead",
        "10: defaults.account: unknown field {user}: the one field an account may hold is "
        "{project}",
        "12: models.A100.constraint: unbalanced brackets in 'a100|(h100'",
    ],
    "bad_partition_limits.yaml": [
        "9: partitions.gpu.time_limit: the site's defaults.time 3-00:00:00 is longer than the "
        "time_limit 2-00:00:00",
        "10: partitions.gpu.gpus_per_node: 4 GPUs per node, but n[1-2] have fewer in the node map",
        "11: partitions.gpu.max_gpus_per_job: 2 is fewer than the 4 GPUs per node every job "
        "here gets: no job fits",
        "12: partitions.gpu.max_nodes: 3 nodes, but the partition has 2",
        "13: partitions.dev.gpus_per_node: required when gpu_request.syntax is none: the GPUs "
        "each job gets on a node (the preflight checks that many)",
        "17: partitions.queue.submit_as: expected one of partition, qos, none, got 'queue'",
    ],
    "mig_slice_as_gpu.yaml": [
        "9: node_map[0].gpus[0].model: A100-1g.10gb is a MIG slice (NVIDIA A100-SXM4-80GB MIG "
        "1g.10gb), not a GPU: list the GPU it is cut from, its slices in mig: (e.g. {model: "
        "A100, mig: [1g.10gb, ...]})",
    ],
    "shared_gres_type.yaml": [
        "5: models.H100.gres_type: GRES type 'a100' is also the type of model A100: Slurm "
        "cannot tell these models apart; give each its own gres_type, or each its own "
        "constraint (node feature)",
    ],
    "group_nested_feature.yaml": [
        "7: model_groups.A100.models: model A100-80GB's constraint 'gpu&(hbm80g|hbm80gx)' "
        "cannot be one option of the group's [A|B]: Slurm takes one set of brackets and no "
        "nested parentheses",
    ],
    "many_errors.yaml": [
        "5: models.A100.memory_gb: expected an integer >= 1, got -1",
        "7: partitions.gpu.colour: unknown key; valid keys: "
        + ", ".join(sorted(schema.PARTITION.key_table())),
        "7: partitions.gpu.nodes: not in node_map: n[3-4]",
        "10: node_map[0].gpus[0].model: unknown model 'V100'; defined models: A100",
        "11: prolog.on_error: expected one of drain, pass, got 'ignore'",
        "11: prolog.deadline_seconds: expected a positive number, got 0",
    ],
}


def test_every_bad_config_has_an_expectation() -> None:
    on_disk = {p.name for p in BAD.glob("*.yaml")} - {"gres_substring_warning.yaml"}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_config_reports_exact_lines(name: str) -> None:
    path = BAD / name
    site, issues = validate_site_file(path)
    assert site is None
    assert [str(i) for i in issues] == [f"{path}:{rest}" for rest in EXPECTED[name]]
    with pytest.raises(ConfigError) as info:
        load_site(path)
    assert [str(i) for i in info.value.issues] == [str(i) for i in issues]


def test_gres_substring_is_a_warning_not_an_error() -> None:
    path = BAD / "gres_substring_warning.yaml"
    site, issues = validate_site_file(path)
    assert site is not None
    assert [str(i) for i in issues] == [
        f"{path}:6: warning: models.A10.gres_type: GRES type 'a10' is a substring of 'a100' "
        "(model A100): Slurm matches types by substring, so asking for 'a10' can also select "
        "A100 GPUs"
    ]


def test_missing_file_is_one_issue(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    site, issues = validate_site_file(path)
    assert site is None
    assert [str(i) for i in issues] == [f"{path}: cannot read: No such file or directory"]


def test_huge_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as fh:
        fh.truncate(MAX_BYTES + 1)  # sparse: costs no disk
    _, issues = validate_site_file(path)
    assert [str(i) for i in issues] == [f"{path}: file is larger than 16 MiB"]


def test_deep_nesting_is_an_issue_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("site: " + "[" * 5000 + "]" * 5000 + "\n")
    _, issues = validate_site_file(path)
    # libyaml composes it (the validator refuses the list); the pure parser would report the
    # nesting itself. Either way: issues with lines, no crash.
    assert issues and not any(i.warning for i in issues)
    assert f"{path}:1: site: expected a string, got a list" in [str(i) for i in issues]


def test_classic_billion_laughs_is_refused_quickly(tmp_path: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    lines.append("node_command: *i")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    site, issues = validate_site_file(path)
    assert time.perf_counter() - start < 5
    assert site is None
    reported = "\n".join(map(str, issues))
    assert f"{path}:9: node_command: YAML anchors and aliases (&i, *i)" in reported


@pytest.mark.parametrize("name", ["mllab.yaml", "hpccentre.yaml", "h100farm.yaml"])
def test_example_sites_load_without_issues(name: str) -> None:
    path = site_configs_dir() / name
    site, issues = validate_site_file(path)
    assert issues == []
    assert site is not None and site.name == name.removesuffix(".yaml")
    for partition in site.partitions:
        assert all(n in site.node_map for n in partition.node_names)


def test_mllab_node_groups_have_their_own_physical_order() -> None:
    site = load_site(site_configs_dir() / "mllab.yaml")
    assert site.gpu_syntax is syntax_named("gres") and site.type_required
    assert [g.model for g in site.node_map.nodes["ml-gpu01"]] == ["A100", "A100", "V100", "V100"]
    assert site.node_map.nodes["ml-gpu05"][0] == NodeGpu(0, "V100", "0000:3b:00.0")
    assert [g.model for g in site.node_map.nodes["ml-gpu08"]] == ["V100", "V100", "A100", "A100"]
    assert site.node_map.lines["ml-gpu01"] == 45 and site.node_map.lines["ml-gpu05"] == 54
    gpu = site.partition("gpu")
    assert gpu is not None and gpu.default and gpu.defaults.cpus_per_gpu == 8
    assert gpu.node_names == tuple(f"ml-gpu{i:02d}" for i in range(1, 9))
    assert site.model("a100-pcie-40gb") == site.model_by_name("A100")
    assert site.prolog.on_error is OnError.DRAIN
    assert site.node_command == "/opt/clusterjob/bin/clusterjob"


def test_templates_resolve_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "tpl").mkdir()
    text = (site_configs_dir() / "mllab.yaml").read_text()
    (tmp_path / "s.yaml").write_text(text + "templates: tpl\n")
    assert load_site(tmp_path / "s.yaml").templates_dir == tmp_path / "tpl"
    (tmp_path / "t.yaml").write_text(text + "templates: missing\n")
    _, issues = validate_site_file(tmp_path / "t.yaml")
    assert [i.message for i in issues] == [f"not a directory: {tmp_path / 'missing'}"]


def test_bus_ids_are_normalised_and_uuids_kept(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "site: t\n"
        "gpu_request: {syntax: gres}\n"
        "models:\n"
        '  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}\n'
        "node_map:\n"
        "  - nodes: n1\n"
        "    gpus:\n"
        '      - {model: A100, bus_id: "00000000:3B:00.0", uuid: "GPU-0a1b"}\n'
        "  - nodes: n2\n"
        "    gpus: []\n"
    )
    site = load_site(path)
    assert site.node_map.nodes["n1"] == (NodeGpu(0, "A100", "0000:3b:00.0", "GPU-0a1b"),)
    assert site.node_map.nodes["n2"] == ()
    assert site.partitions == () and not site.type_required


def _big_site(tmp_path: Path, nodes: int = 10_000) -> Path:
    lines = [
        "site: big",
        "gpu_request: {syntax: gres, type_required: true}",
        "models:",
        "  H100: {gres_type: h100, nvml_names: ['NVIDIA H100 80GB HBM3']}",
        "partitions:",
        f"  gpu: {{nodes: 'gpu[00000-{nodes - 1:05d}]', default: true}}",
        "node_map:",
    ]
    for start in range(0, nodes, 100):
        lines += [f"  - nodes: gpu[{start:05d}-{start + 99:05d}]", "    gpus:"]
        for slot in range(8):
            lines.append(f"      - {{model: H100, bus_id: '0000:{0x18 + 16 * slot:02x}:00.0'}}")
    path = tmp_path / "big.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_ten_thousand_node_site_loads_fast(tmp_path: Path) -> None:
    path = _big_site(tmp_path)
    start = time.perf_counter()
    site = load_site(path)
    elapsed = time.perf_counter() - start
    print(f"10,000-node site loaded in {elapsed:.2f}s")
    assert len(site.node_map.nodes) == 10_000
    assert elapsed < 10  # generous: 2 shared cores; typically ~0.5 s


_name = st.from_regex(r"[a-z]{1,3}-?", fullmatch=True)


@given(
    st.lists(
        st.tuples(_name, st.integers(0, 120), st.sampled_from([0, 2, 3])),
        min_size=1,
        max_size=30,
    )
)
def test_hostlist_compress_expand_round_trip(hosts: list[tuple[str, int, int]]) -> None:
    names = sorted({f"{prefix}{num:0{width}d}" for prefix, num, width in hosts})
    collected = hostlist.collect_hostlist(names)
    assert sorted(hostlist.expand_hostlist(collected)) == names


def test_check_policies_site_wide_and_per_partition(tmp_path: Path) -> None:
    """checks: at the top and in a partition; the partition's wins for its jobs."""
    from clusterjob.site.nodemodel import CheckPolicy
    from clusterjob.site.nodeview import view_from_site

    path = tmp_path / "site.yaml"
    path.write_text(
        (BAD / "bad_checks.yaml")
        .read_text()
        .replace("{gpu-busy: sometimes}", "{gpu-busy: warning}, driver_min: 550.54.15")
        .replace('"latest"', '"535.104.05"')
        .replace("pcie-slow", "pcie-degraded")
    )
    site = load_site(path)
    assert site.checks == CheckPolicy("535.104.05", {"pcie-degraded": "warning", "gpu-hot": "off"})
    view = view_from_site(site, "n1")
    assert view.checks_for("gpu") == CheckPolicy(
        "550.54.15", {"pcie-degraded": "warning", "gpu-hot": "off", "gpu-busy": "warning"}
    )
    assert view.checks_for(None) == view.checks_for("other") == site.checks
