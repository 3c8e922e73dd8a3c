"""`clusterjob site init`: the live cluster read in at most four Slurm calls, described as a
site file the loader takes; the readings are pure and fed here with recorded output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob.errors import SiteNotFound, UsageError
from clusterjob.site.compare import compare_sites
from clusterjob.site.init import (
    ClusterFacts,
    SlotPlan,
    apply_probes,
    describe,
    init_site,
    probe_nodes,
    render,
    slots_from_probe,
    validate_text,
    write_site,
)
from clusterjob.site.loader import load_site
from clusterjob.site.modelnames import autodetected_nvml_name, guess_mig, known_model
from clusterjob.site.nodeprobe import (
    ProbedGpu,
    ProbeJobs,
    ProbeOutcome,
    gpu_option,
    node_configurations,
    pick_node,
)
from clusterjob.slurm import parse
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.describe import (
    enforced,
    gpu_layouts,
    parse_sacctmgr_qos,
    partition_limits,
    sacctmgr_qos_command,
)
from clusterjob.slurm.runner import Runner, SlurmResult

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
NODE_FILES = sorted(FIXTURES.rglob("scontrol_show_node*.txt"))
PARTITION_FILES = sorted(FIXTURES.rglob("scontrol_show_partition*.txt"))
CONFIG_FILES = sorted(FIXTURES.rglob("scontrol_show_config*.txt"))
QOS_FILES = sorted(FIXTURES.rglob("sacctmgr_show_qos*.txt"))
LIKE = "sandbox_like_qoslab"  # `sandbox up --like` of QOSLAB_SITE, recorded (README)

QOSLAB_SITE = """\
site: qoslab
cluster_name: qoslab
gpu_request: {syntax: gres, type_required: true}
models:
  A100: {aliases: [a100], gres_type: a100, nvml_names: ["NVIDIA A100-PCIE-40GB"], memory_gb: 40}
  V100: {aliases: [v100], gres_type: v100, nvml_names: ["Tesla V100-SXM2-32GB"], memory_gb: 32}
partitions:
  gpu: {nodes: "ml-gpu[01-08]", time_limit: "3-00:00:00", default: true}
  debug: {nodes: "ml-gpu[07-08]", time_limit: "01:00:00"}
qos:
  debug: {max_time: "01:00:00", max_gpus_per_job: 2, max_nodes: 1}
  long: {max_time: "7-00:00:00", max_nodes: 4}
node_map:
  - nodes: "ml-gpu[01-04]"
    gpus: [{model: A100}, {model: A100}, {model: V100}, {model: V100}]
  - nodes: "ml-gpu[05-08]"
    gpus: [{model: V100}, {model: V100}, {model: A100}, {model: A100}]
"""


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def facts_of(
    nodes: str, partitions: str = "", config: str = "", qos: str | None = None
) -> ClusterFacts:
    return ClusterFacts(
        tuple(parse.parse_scontrol_nodes(nodes)),
        tuple(parse.parse_scontrol_partitions(partitions)),
        parse.parse_scontrol_config(config),
        None if qos is None else tuple(parse_sacctmgr_qos(qos)),
    )


def like_facts(release: str = "") -> ClusterFacts:
    """The recorded shaped cluster: Slurm 22.05 (``release`` ""), 24.11 ("2411"), 26.05."""
    suffix = f"_{release}" if release else ""
    qos = f"sacctmgr_show_qos_{release}_sandbox_like.txt" if release else (
        "sacctmgr_show_qos_sandbox_like.txt"
    )  # fmt: skip
    return facts_of(
        _read(FIXTURES / f"scontrol_show_node_detail_{LIKE}{suffix}.txt"),
        _read(FIXTURES / f"scontrol_show_partition_{LIKE}{suffix}.txt"),
        _read(FIXTURES / f"scontrol_show_config_{LIKE}{suffix}.txt"),
        _read(FIXTURES / qos),
    )


# --- every recording through the parsers ----------------------------------------------------


def test_there_are_recordings_of_each_kind() -> None:
    assert len(NODE_FILES) >= 10 and len(PARTITION_FILES) >= 4
    assert len(CONFIG_FILES) >= 4 and QOS_FILES
    assert any("real" in p.parts for p in NODE_FILES)


@pytest.mark.parametrize("path", NODE_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_recorded_node_listing_becomes_a_valid_site(path: Path) -> None:
    result = describe(facts_of(_read(path)))
    listed = sum(len(e.nodes) for e in gpu_layouts(result.facts.nodes))
    if not listed:  # no GPU on any node (init refuses: test_a_cluster_without_gpus_...)
        assert not result.plan.models and result.site is None
        return
    assert result.site is not None, [str(i) for i in result.issues]
    assert len(result.site.node_map.nodes) == listed


@pytest.mark.parametrize("path", PARTITION_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_recorded_partition_listing_is_read(path: Path) -> None:
    records = parse.parse_scontrol_partitions(_read(path))
    assert records
    for record in records:
        limits = partition_limits(record)
        assert limits.name == record.name
        assert limits.nodes or record.nodes in (None, "ALL")


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_recorded_config_is_read(path: Path) -> None:
    config = parse.parse_scontrol_config(_read(path))
    assert config["ClusterName"]
    assert enforced(config) == ()  # none of the recorded clusters enforces associations


@pytest.mark.parametrize("path", QOS_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_recorded_qos_listing_is_read(path: Path) -> None:
    assert [q.name for q in parse_sacctmgr_qos(_read(path))][0] == "normal"


def test_the_releases_read_the_shaped_cluster_alike() -> None:
    texts = {
        "\n".join(describe(like_facts(release)).text.splitlines()[1:])
        for release in ("", "2411", "2605")
    }
    assert len(texts) == 1


def test_each_release_describes_the_sandbox_alike() -> None:
    texts = set()
    for release in ("22.05", "24.11", "26.05"):
        d = FIXTURES / release
        facts = facts_of(
            _read(d / "scontrol_show_node_detail.txt"),
            _read(d / "scontrol_show_partition.txt"),
            _read(d / "scontrol_show_config.txt"),
        )
        result = describe(facts)
        assert result.site is not None
        texts.add("\n".join(result.text.splitlines()[1:]))  # the first line names the release
    assert len(texts) == 1
    site = result.site
    types = {"a100", "v100", "h100", "1g.10gb", "2g.20gb", "3g.40gb"}  # the recorded Gres=
    assert {m.gres_type for m in site.models} == types
    assert [p.name for p in site.partitions] == ["gpu", "suspect", "h100", "mig"]
    assert [m.name for m in site.models][:3] == ["A100", "V100", "H100"]
    mig = site.node_map.gpus("mig1")
    assert mig is not None and len(mig) == 1 and sorted(mig[0].mig or ()) == [
        "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"
    ]  # fmt: skip


# --- the sacctmgr reading ------------------------------------------------------------------


def test_sacctmgr_qos_recorded() -> None:
    debug, long = parse_sacctmgr_qos(_read(FIXTURES / "sacctmgr_show_qos_sandbox_like.txt"))[1:]
    assert (debug.name, debug.max_wall, debug.max_gpus_per_job, debug.max_nodes) == (
        "debug", "01:00:00", 2, 1
    )  # fmt: skip
    assert debug.max_tres_per_user == {"gres/gpu": "4"} and debug.max_jobs_per_user == 3
    assert (long.max_wall, long.max_gpus_per_job, long.max_nodes) == ("7-00:00:00", None, 4)


@pytest.mark.parametrize(
    "line, name",
    [
        ("normal|||||", "normal"),
        ("normal|||||\n", "normal"),
        ("Name|MaxWall|MaxTRES|MaxTRESPerNode|MaxTRESPU|MaxJobsPU", "Name"),
        ("debug|01:00:00|gres/gpu=2||||", "debug"),  # --parsable's trailing separator
        ("sacctmgr: warning: something", None),
        ("|||||", None),
    ],
)
def test_sacctmgr_qos_lines(line: str, name: str | None) -> None:
    found = parse_sacctmgr_qos(line)
    assert [q.name for q in found] == ([name] if name else [])


def test_the_qos_command_asks_for_the_parsed_fields() -> None:
    cmd = sacctmgr_qos_command()
    assert cmd[:2] == ["sacctmgr", "--noheader"] and "--parsable2" in cmd
    assert cmd[-1] == "format=Name,MaxWall,MaxTRES,MaxTRESPerNode,MaxTRESPU,MaxJobsPU"


@pytest.mark.parametrize(
    "value, words",
    [
        ("none", ()),
        ("associations", ("associations",)),
        ("associations,limits,qos", ("associations", "limits", "qos")),
        ("limits", ("limits", "associations")),
        ("safe,wckeys", ("safe", "wckeys", "associations")),
        ("", ()),
    ],
)
def test_enforced(value: str, words: tuple[str, ...]) -> None:
    assert enforced({"AccountingStorageEnforce": value}) == words


# --- model names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "word, model",
    [
        ("a100", "A100"),
        ("A100", "A100"),
        ("a100_80g", "A100-80GB"),
        ("a100-40gb", "A100-40GB"),
        ("nvidia_a100-sxm4-80gb", "A100-80GB"),
        ("nvidia_a100_80gb_pcie", "A100-80GB"),
        ("h100", "H100"),
        ("nvidia_h100_80gb_hbm3", "H100"),
        ("h200", "H200"),
        ("gh200", "GH200"),
        ("l40s", "L40S"),
        ("nvidia_l40s", "L40S"),
        ("l40", "L40"),
        ("l4", "L4"),
        ("v100", "V100"),
        ("v100-32g", "V100-32GB"),
        ("v100-16g", "V100-16GB"),
        ("tesla_v100-sxm2-32gb", "V100-32GB"),
        ("a10", "A10"),
        ("a40", "A40"),
        ("t4", "T4"),
        ("rtx_2080ti", "RTX-2080Ti"),
        ("mi250x", "MI250X"),
        ("MI300X", "MI300X"),
        ("gpu", None),
        ("hbm80g", None),
        ("p100x", "P100"),
        ("scratch", None),
    ],
)
def test_known_models(word: str, model: str | None) -> None:
    found = known_model(word)
    assert (found.name if found else None) == model


@pytest.mark.parametrize(
    "gres_type, nvml",
    [
        ("nvidia_a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB"),
        ("nvidia_h100_80gb_hbm3", "NVIDIA H100 80GB HBM3"),
        ("tesla_v100-sxm2-32gb", "Tesla V100-SXM2-32GB"),
        ("a100", None),
        ("nvidia_a100_3g.40gb", None),
    ],
)
def test_autodetected_nvml_names(gres_type: str, nvml: str | None) -> None:
    found = autodetected_nvml_name(gres_type)
    assert (found.casefold() if found else None) == (nvml.casefold() if nvml else None)


@pytest.mark.parametrize(
    "gres_type, nearby, parent, certain",
    [
        ("a100_3g.20gb", (), "A100-40GB", True),  # the type says its GPU
        ("3g.20gb", (), "A100-40GB", True),  # only an A100 40GB has it
        ("3g.40gb", ("h100",), "H100", False),  # an 80GB A100 or an H100: the cluster's
        ("3g.40gb", ("a100",), "A100-80GB", False),
        ("1g.18gb", (), "H200", True),
        ("a100", (), None, None),
    ],
)
def test_mig_guesses(
    gres_type: str, nearby: Sequence[str], parent: str | None, certain: bool | None
) -> None:
    guess = guess_mig(gres_type, nearby)
    got = (guess.parent, guess.certain) if guess else (None, None)
    assert got == (parent, certain)


# --- the description -----------------------------------------------------------------------


@pytest.mark.parametrize("release", ["", "2411", "2605"])
def test_a_like_cluster_gives_back_its_site_file(tmp_path: Path, release: str) -> None:
    result = describe(like_facts(release))
    assert result.site is not None and not [i for i in result.issues if not i.warning]
    (tmp_path / "qoslab.yaml").write_text(QOSLAB_SITE)
    written = load_site(tmp_path / "qoslab.yaml")
    differences = [str(d) for d in compare_sites(written, result.site)]
    # what Slurm's records do not say: its job_submit plugin's type rule (--probe asks)
    assert differences == ["type_required: true in the first, false in the second"]
    assert result.site.qos_limits("debug") is not None
    assert result.site.partition("gpu").default  # type: ignore[union-attr]
    assert "Left out: QoS without job limits: normal" in result.text


def test_an_enforcing_cluster_requires_an_account() -> None:
    facts = like_facts()
    config = dict(facts.config, AccountingStorageEnforce="associations,limits")
    result = describe(ClusterFacts(facts.nodes, facts.partitions, config, facts.qos))
    assert result.site is not None and result.site.account == "required"
    assert "AccountingStorageEnforce=associations,limits" in result.text


UNTYPED_NODES = """\
NodeName=n1 AvailableFeatures=h100,ib ActiveFeatures=h100,ib Gres=gpu:4 State=IDLE Partitions=train
NodeName=n2 AvailableFeatures=a100 ActiveFeatures=a100 Gres=gpu:8(S:0-1) State=IDLE Partitions=train
NodeName=c1 AvailableFeatures=cpu ActiveFeatures=cpu Gres=(null) State=IDLE Partitions=cpu
"""
UNTYPED_PARTITIONS = """\
PartitionName=train Default=NO MaxTime=14-00:00:00 Nodes=n[1-2] State=UP OverSubscribe=NO
PartitionName=cpu Default=YES MaxTime=UNLIMITED Nodes=c1 State=UP
"""


def test_untyped_gpus_are_told_apart_by_features() -> None:
    result = describe(facts_of(UNTYPED_NODES, UNTYPED_PARTITIONS, "ClusterName = farm\n"))
    site = result.site
    assert site is not None and site.gpu_syntax.name == "gres+constraint"
    assert [(m.name, m.gres_type, m.constraint) for m in site.models] == [
        ("H100", None, "h100"),
        ("A100", None, "a100"),
    ]
    assert [p.name for p in site.partitions] == ["train"]
    assert "partitions without GPU nodes: cpu" in result.text
    assert "QoS: no accounting" in result.text


def test_unknown_types_and_name_clashes_stay_loadable() -> None:
    nodes = (
        "NodeName=a1 Gres=gpu:a100:2,gpu:nvidia_a100-sxm4-80gb:2,gpu:weird_x:1 Partitions=p\n"
        "NodeName=a2 Gres=gpu:A100_80g:1 Partitions=p\n"
        "NodeName=a3 Gres=gpu:1 AvailableFeatures=(null) Partitions=p\n"
        "NodeName=a4 Gres=gpu:2 AvailableFeatures=big Partitions=p\n"
    )
    result = describe(facts_of(nodes, "PartitionName=p Default=YES MaxTime=1:00:00 Nodes=a[1-4]"))
    assert result.site is not None, [str(i) for i in result.issues]
    names = [m.name for m in result.site.models]
    assert len(names) == len({n.casefold() for n in names})
    assert "GUESS: GRES type 'weird_x' is no model clusterjob knows" in result.text.replace(
        "\n  # ", " "
    )


# --- reading the live cluster ------------------------------------------------------------------


class Replay:
    """Slurm's commands answered from the recordings; every call kept."""

    def __init__(self, accounting: bool = True) -> None:
        self.calls: list[list[str]] = []
        config = _read(FIXTURES / f"scontrol_show_config_{LIKE}.txt")
        if not accounting:
            config = config.replace("accounting_storage/slurmdbd", "accounting_storage/none")
        self.answers = {
            ("scontrol", "show", "node"): _read(FIXTURES / f"scontrol_show_node_detail_{LIKE}.txt"),
            ("scontrol", "show", "partition"): _read(
                FIXTURES / f"scontrol_show_partition_{LIKE}.txt"
            ),
            ("scontrol", "show", "config"): config,
            ("sacctmgr", "--noheader", "--parsable2"): _read(
                FIXTURES / "sacctmgr_show_qos_sandbox_like.txt"
            ),
        }

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        self.calls.append(list(cmd))
        return SlurmResult(tuple(cmd), 0, self.answers[tuple(cmd[:3])], "")


@pytest.mark.parametrize("accounting, calls", [(True, 4), (False, 3)])
def test_init_asks_slurm_at_most_four_times(accounting: bool, calls: int) -> None:
    replay = Replay(accounting)
    result = init_site(SlurmClient(Runner(replay)))
    assert len(replay.calls) == result.facts.calls == calls
    assert [c[0] for c in replay.calls].count("sacctmgr") == (1 if accounting else 0)
    assert result.site is not None and bool(result.site.qos) is accounting


def test_write_site_refuses_to_replace_without_force(tmp_path: Path) -> None:
    out = tmp_path / "site.yaml"
    write_site(out, "a: 1\n")
    with pytest.raises(UsageError, match="exists; give --force"):
        write_site(out, "a: 2\n")
    write_site(out, "a: 2\n", force=True)
    assert out.read_text() == "a: 2\n"
    with pytest.raises(UsageError, match="cannot write"):
        write_site(tmp_path / "missing" / "site.yaml", "a: 1\n")


def test_the_command_without_slurm_is_one_line(tmp_path: Path) -> None:
    env = {
        "PATH": str(tmp_path),
        "SLURM_CONF": str(tmp_path / "nothing.conf"),
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", "site", "init"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


class NoGpus(Replay):
    def __init__(self) -> None:
        super().__init__()
        self.answers[("scontrol", "show", "node")] = "NodeName=c1 Gres=(null) Partitions=cpu\n"


def test_a_cluster_without_gpus_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="no node of qoslab lists a GPU"):
        init_site(SlurmClient(Runner(NoGpus())))


# --- the fallback: a cluster without a site file ---------------------------------------------


def test_the_description_is_cached_per_cluster_for_a_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterjob.site.initcache import MAX_AGE_SECONDS, described_site_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    texts = iter(["site: one\n", "site: two\n"])
    clock = [1e9]

    def describe() -> str:
        return next(texts)

    path = described_site_file("lab", describe=describe, now=lambda: clock[0])
    assert path == tmp_path / "cache" / "clusterjob" / "described" / "lab.yaml"
    assert path.read_text() == "site: one\n" and (path.stat().st_mode & 0o077) == 0
    clock[0] = path.stat().st_mtime + MAX_AGE_SECONDS - 60
    assert described_site_file("lab", describe=describe, now=lambda: clock[0]).read_text() == (
        "site: one\n"
    )  # fresh: Slurm is not asked again
    clock[0] += 120
    assert described_site_file("lab", describe=describe, now=lambda: clock[0]).read_text() == (
        "site: two\n"
    )
    with pytest.raises(SiteNotFound, match="cannot name a cached site file"):
        described_site_file("../etc", describe=describe)


def test_discovery_ends_with_the_description(tmp_path: Path) -> None:
    from clusterjob.errors import SlurmError
    from clusterjob.site.discovery import find_site

    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    described = tmp_path / "described.yaml"
    found = find_site(
        None, environ=env, cluster_name="nowhere", etc_dir=tmp_path, describe=lambda n: described
    )
    assert found == described

    def failing(name: str) -> Path:
        raise SlurmError(["scontrol", "show", "node"], 1, "slurm_load_node error")

    with pytest.raises(SiteNotFound) as info:
        find_site(None, environ=env, cluster_name="nowhere", etc_dir=tmp_path, describe=failing)
    assert "`clusterjob site init` of nowhere (" in str(info.value)
    with pytest.raises(SiteNotFound) as info:  # without describe: as before
        find_site(None, environ=env, cluster_name="nowhere", etc_dir=tmp_path)
    assert "site init" not in str(info.value)


def test_two_site_files_compared_field_by_field() -> None:
    from clusterjob.resources import site_configs_dir

    mllab = load_site(site_configs_dir() / "mllab.yaml")
    hpc = load_site(site_configs_dir() / "hpccentre.yaml")
    assert compare_sites(mllab, mllab) == []
    said = [d.said("mllab", "hpccentre") for d in compare_sites(mllab, hpc)]
    assert said[0] == "syntax: gres in mllab, gpus-per-node in hpccentre"
    assert "model GRES type a100: only in mllab (A100)" in said
    assert "model GRES type nvidia_l40s: only in hpccentre (L40S)" in said
    assert "partition gpu-long: only in hpccentre (g[025-032])" in said
    assert "partition.time_limit gpu: 3-00:00:00 in mllab, 2-00:00:00 in hpccentre" in said


def test_mig_slices_go_onto_their_gpus() -> None:
    nodes = (
        "NodeName=m1 Gres=gpu:a100:2,gpu:a100_3g.20gb:2,gpu:a100_1g.5gb:4 Partitions=p\n"
        "NodeName=m2 Gres=gpu:1g.18gb:7 Partitions=p\n"
    )
    result = describe(facts_of(nodes, "PartitionName=p Default=YES MaxTime=1:00:00 Nodes=m[1-2]"))
    site = result.site
    assert site is not None, [str(i) for i in result.issues]
    by_type = {m.gres_type: m.name for m in site.models}
    assert by_type == {
        "a100": "A100",
        "a100_3g.20gb": "A100-3g.20gb",
        "a100_1g.5gb": "A100-1g.5gb",
        None: "H200",  # the GPU 1g.18gb slices are cut from: no GRES of its own
        "1g.18gb": "H200-1g.18gb",
    }
    m1 = site.node_map.gpus("m1") or ()
    assert [(g.model, g.mig) for g in m1] == [
        ("A100", None),
        ("A100", None),
        ("A100", ("3g.20gb", "3g.20gb", "1g.5gb")),  # 7 compute slices, largest first
        ("A100", ("1g.5gb", "1g.5gb", "1g.5gb")),
    ]
    assert [len(g.mig or ()) for g in site.node_map.gpus("m2") or ()] == [7]
    assert "gres_type_overlap: true" in result.text  # a100 is in a100_3g.20gb


class Probed(Replay):
    """Replay, and sbatch --test-only as the sandbox answered: a typed request accepted, an
    untyped one refused by its job_submit plugin (recorded)."""

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        if cmd[0] != "sbatch":
            return super().__call__(cmd, timeout, input)
        self.calls.append(list(cmd))
        script = input or Path(cmd[-1]).read_text()
        if "--gres=gpu:1\n" in script:
            said = _read(FIXTURES / "sbatch_test_only_err_job_submit_lua.stderr.txt")
            return SlurmResult(tuple(cmd), 1, "", said)
        return SlurmResult(
            tuple(cmd), 0, "", _read(FIXTURES / "sbatch_test_only_sandbox.stderr.txt")
        )


def test_probe_finds_the_syntax_and_the_type_rule() -> None:
    replay = Probed()
    result = init_site(SlurmClient(Runner(replay)), probe=True)
    site = result.site
    assert site is not None and site.gpu_syntax.name == "gres" and site.type_required
    tried = [c for c in replay.calls if c[0] == "sbatch"]
    assert len(tried) == 2 and all("--test-only" in c for c in tried)
    assert "You must always specify a type" in result.text


# --- probe jobs: the PCI bus order of each node configuration ------------------------------

PROBED_NODES = """\
NodeName=g1 CPUTot=16 RealMemory=64000 State=IDLE Gres=gpu:a100:2,gpu:v100:2 Partitions=gpu
NodeName=g2 CPUTot=16 RealMemory=64000 State=MIXED Gres=gpu:a100:2,gpu:v100:2 Partitions=gpu
NodeName=g3 CPUTot=16 RealMemory=64000 State=IDLE Gres=gpu:a100:2,gpu:v100:2 Partitions=suspect
NodeName=g4 CPUTot=32 State=DOWN+NOT_RESPONDING Gres=gpu:h100:2 Partitions=gpu Reason=dead [root]
NodeName=g5 CPUTot=64 RealMemory=64000 State=ALLOCATED Gres=gpu:h100:2 Partitions=gpu
NodeName=g6 CPUTot=16 RealMemory=64000 State=IDLE Gres=gpu:mystery:1 Partitions=gpu
"""
PROBED_PARTITIONS = (
    "PartitionName=gpu Default=YES MaxTime=1:00:00 Nodes=g[1-2,4-6]\n"
    "PartitionName=suspect MaxTime=1:00:00 Nodes=g3\n"
)
# What `site probe --json` answers on each node: V100s before A100s in PCI bus order.
ANSWERS = {
    "a100-v100": [
        ("Tesla V100-SXM2-32GB", "0000:07:00.0"),
        ("Tesla V100-SXM2-32GB", "0000:0b:00.0"),
        ("NVIDIA A100-SXM4-80GB", "0000:81:00.0"),
        ("NVIDIA A100-SXM4-80GB", "0000:82:00.0"),
    ],
    "mystery": [("NVIDIA B300 SXM6", "0000:19:00.0")],
}


class ProbeSlurm(FakeSlurm):
    """FakeSlurm whose jobs run on the node they are pinned to: pending once, running once,
    then completed with ``site probe --json``'s answer in their output file; a job pinned
    to a node in ``busy`` stays pending, one on a node in ``held`` is held as after a
    failed Prolog."""

    def __init__(self, busy: Sequence[str] = (), held: Sequence[str] = ()) -> None:
        super().__init__("lab")
        self.busy = set(busy)
        self.held = set(held)
        self.scripts: dict[str, str] = {}

    def _sbatch(self, cmd: list[str], timeout: float) -> SlurmResult:
        done = super()._sbatch(cmd, timeout)
        if done.returncode == 0 and "--test-only" not in cmd:
            self.scripts[done.stdout.strip()] = Path(cmd[-1]).read_text()
        return done

    def _squeue(self, cmd: list[str], timeout: float) -> SlurmResult:
        for job_id, script in self.scripts.items():
            job = self.jobs[job_id]
            node = re.search(r"--nodelist=(\S+)", script)
            assert node is not None
            if node.group(1) in self.busy or job["state"] in ("COMPLETED", "CANCELLED"):
                job["reason"] = "Resources"
                continue
            if node.group(1) in self.held:
                job.update(state="PENDING", reason="launch_failed_requeued_held")
                continue
            if job["state"] == "PENDING":
                job.update(state="RUNNING", reason="None")
                continue
            gpus = ANSWERS["mystery" if node.group(1) == "g6" else "a100-v100"]
            record = {"node": node.group(1), "gpus": [
                {"slot": i, "model": None, "nvml_name": n, "bus_id": b, "uuid": None}
                for i, (n, b) in enumerate(gpus)
            ]}  # fmt: skip
            out = re.search(r"--output=(\S+)", script)
            assert out is not None
            Path(out.group(1).replace("%j", job_id)).write_text(json.dumps(record))
            job["state"] = "COMPLETED"
        return super()._squeue(cmd, timeout)


def _probe_facts() -> ClusterFacts:
    return facts_of(PROBED_NODES, PROBED_PARTITIONS, "ClusterName = lab\n")


def test_nodes_alike_are_one_configuration() -> None:
    facts = _probe_facts()
    configs = node_configurations(facts.nodes, gpu_layouts(facts.nodes))
    # g1-g2 alike; g3 in another partition; g4 and g5 differ in CPUs
    assert [c.hostlist for c in configs] == ["g[1-2]", "g3", "g4", "g5", "g6"]
    assert [c.layout for c in configs] == [0, 0, 1, 1, 2]
    each = node_configurations(facts.nodes, gpu_layouts(facts.nodes), each_node=True)
    assert [c.hostlist for c in each] == ["g1", "g2", "g3", "g4", "g5", "g6"]
    assert pick_node(configs[0], facts.nodes) == ("g1", "")  # idle before mixed
    node, why = pick_node(configs[2], facts.nodes)
    assert node is None and "DOWN+NOT_RESPONDING: dead" in why


@pytest.mark.parametrize(
    "syntax, gpus, option",
    [
        ("gres", [("a100", 2), ("v100", 2)], "--gres=gpu:a100:2,gpu:v100:2"),
        ("gres+constraint", [(None, 4)], "--gres=gpu:4"),
        ("gpus-per-node", [("a100", 2), ("v100", 2)], "--gpus-per-node=a100:2,v100:2"),
        ("gpus", [("h100", 8)], "--gpus=h100:8"),
    ],
)
def test_a_probe_job_asks_for_all_of_its_nodes_gpus(
    syntax: str, gpus: list[tuple[str | None, int]], option: str
) -> None:
    assert gpu_option(gpus, syntax) == option


def test_probe_jobs_fill_the_node_map_one_job_per_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    slurm = ProbeSlurm(busy=["g5"])
    seen: list[str] = []
    options = ProbeJobs(
        timeout=60, clock=slurm.clock, sleep=slurm.sleep,
        progress=lambda p: seen.append(f"{p.done}/{p.total} {p.events[-1]}"),
    )  # fmt: skip
    facts = _probe_facts()
    plan, outcomes = probe_nodes(slurm.client(), facts, describe(facts).plan, options)
    # one job per configuration with a usable node: g[1-2] (on g1), g3, g5, g6; g4 is down
    sbatch = [c for c in slurm.commands("sbatch") if "--test-only" not in c]
    assert len(sbatch) == 4
    scripts = list(slurm.scripts.values())
    assert "#SBATCH --nodelist=g1\n" in scripts[0] and "--gres=gpu:a100:2,gpu:v100:2" in scripts[0]
    assert "#SBATCH --partition=suspect\n" in scripts[1]  # g3's own partition
    assert all("site probe --json" in s.replace("'", "") for s in scripts)
    assert slurm.commands("scancel") and slurm.jobs["102"]["state"] == "CANCELLED"  # g5
    assert seen[-1].startswith("5/5 ") and any("g5: job 102 cancelled" in s for s in seen)
    text = render(plan)
    site, issues = validate_text(text)
    assert site is not None, [str(i) for i in issues]
    # g1-g3 answered alike: one entry, in PCI bus order, with the bus IDs
    assert [(e.nodes, [(s.model, s.bus_id) for s in e.slots]) for e in plan.node_map][0] == (
        "g[1-3]",
        [("V100", "0000:07:00.0"), ("V100", "0000:0b:00.0"),
         ("A100", "0000:81:00.0"), ("A100", "0000:82:00.0")],
    )  # fmt: skip
    assert [g.bus_id for g in site.node_map.gpus("g2") or ()] == [
        "0000:07:00.0", "0000:0b:00.0", "0000:81:00.0", "0000:82:00.0"
    ]  # fmt: skip
    assert [g.bus_id for g in site.node_map.gpus("g4") or ()] == [None, None]
    # the unknown GRES type takes the NVML name its node reported
    assert site.model("mystery") is not None
    assert site.model("mystery").nvml_names == ("NVIDIA B300 SXM6",)  # type: ignore[union-attr]
    assert [line.split(":")[0] for line in plan.not_probed] == ["g4", "g5"]
    assert "# Not probed (no bus IDs): g4: no usable node (DOWN+NOT_RESPONDING: dead" in text
    assert "# Not probed (no bus IDs): g5: job 102 still pending (Resources) after 60 s" in text
    assert not list((tmp_path / "data").iterdir())  # the jobs' files are removed


def test_a_probe_answer_that_is_not_slurms_gres_is_not_used() -> None:
    slots = (SlotPlan("A100"), SlotPlan("A100"))
    nvml = {"A100": ["NVIDIA A100-SXM4-80GB"]}
    one = [ProbedGpu("NVIDIA A100-SXM4-80GB", "0000:07:00.0")]
    got, _, why = slots_from_probe(slots, one, nvml)
    assert got is None and "NVML shows 1 GPUs (A100), Slurm's Gres 2 (A100, A100)" in why
    got, _, why = slots_from_probe(slots, [ProbedGpu("Tesla T4", "0000:07:00.0")] * 2, nvml)
    assert got is None and "'Tesla T4' is no model" in why


def test_untyped_gpus_that_nvml_tells_apart_get_a_model_each() -> None:
    """lonestar6's shape: A100 and H100 nodes, both untyped `gpu:N` with no feature, are one
    model to Slurm; the probe reads two NVML names, and the H100 nodes get a model of their
    own (c3, another configuration of c2's layout, joins it), bus IDs and all."""
    facts = facts_of(
        "NodeName=c1 CPUTot=16 RealMemory=64000 State=IDLE Gres=gpu:3 Partitions=a100\n"
        "NodeName=c2 CPUTot=16 RealMemory=64000 State=IDLE Gres=gpu:2 Partitions=h100\n"
        "NodeName=c3 CPUTot=32 RealMemory=64000 State=IDLE Gres=gpu:2 Partitions=h100\n",
        "PartitionName=a100 Default=YES Nodes=c1\nPartitionName=h100 Nodes=c[2-3]\n",
        "ClusterName = ls\n",
    )
    a100 = [ProbedGpu("NVIDIA A100-PCIE-40GB", f"0000:{b}:00.0") for b in ("06", "41", "81")]
    h100 = [ProbedGpu("NVIDIA H100 PCIe", f"0000:{b}:00.0") for b in ("41", "c1")]
    configs = node_configurations(facts.nodes, gpu_layouts(facts.nodes))
    assert [c.hostlist for c in configs] == ["c1", "c2", "c3"]
    outcomes = [
        ProbeOutcome(c, c.nodes[0], str(100 + i), tuple(a100 if c.nodes == ("c1",) else h100))
        for i, c in enumerate(configs)
    ]
    plan = apply_probes(describe(facts).plan, outcomes)
    assert plan.not_probed == []
    site, issues = validate_text(render(plan))
    assert site is not None, issues
    assert [(m.name, m.nvml_names) for m in site.models] == [
        ("GPU", ("NVIDIA A100-PCIE-40GB",)),
        ("GPU-2", ("NVIDIA H100 PCIe",)),
    ]
    for node, model, gpus in (("c1", "GPU", a100), ("c2", "GPU-2", h100), ("c3", "GPU-2", h100)):
        slots = site.node_map.gpus(node) or ()
        assert [(g.model, g.bus_id) for g in slots] == [(model, g.bus_id) for g in gpus], node
    assert [e.nodes for e in plan.node_map] == ["c1", "c[2-3]"]


def test_a_probe_job_the_prolog_refused_is_cancelled_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    slurm = ProbeSlurm(held=["g3"])
    start = slurm.now
    options = ProbeJobs(timeout=600, clock=slurm.clock, sleep=slurm.sleep)
    facts = _probe_facts()
    plan, _ = probe_nodes(slurm.client(), facts, describe(facts).plan, options)
    assert slurm.now - start < 60  # not left to the timeout
    g3 = [line for line in plan.not_probed if line.startswith("g3:")]
    assert g3 and "held (launch_failed_requeued_held): the node's Prolog refused it" in g3[0]
    assert slurm.jobs["101"]["state"] == "CANCELLED"
    assert [e.nodes for e in plan.node_map][:2] == ["g[1-2]", "g3"]  # g3 keeps Slurm's slots
