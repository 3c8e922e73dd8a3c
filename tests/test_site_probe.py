"""``site probe``: real pynvml over the stand-in NVML in a child process (LD_LIBRARY_PATH is
read at process start), and ``--merge`` keeping comments and key order (exact text)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from clusterjob.errors import ConfigError, UsageError
from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.sandbox.standin import StandinScenario, a100, v100
from clusterjob.site.loader import load_site
from clusterjob.site.probe import ProbedNode, describe, entry_yaml, merge_file, merge_text
from tests.standin_fixtures import run_python

SITE = """\
# Lab site: hand-kept; comments must survive a merge.
site: lab
gpu_request:
  syntax: gres
  type_required: true
models:
  A100:
    gres_type: a100
    nvml_names: ["NVIDIA A100-SXM4-80GB"]  # SXM4 boards only
  V100:
    gres_type: v100
    nvml_names: ["Tesla V100-SXM2-32GB"]
partitions:
  gpu:
    nodes: "n[1-3]"
    default: true
node_map:
  # the three mixed nodes were bought together
  - nodes: "n[1-3]"
    gpus:
      - {model: A100, bus_id: "0000:07:00.0"}
      - {model: A100, bus_id: "0000:0b:00.0"}
      - {model: V100, bus_id: "0000:48:00.0"}  # slot 2
      - {model: V100, bus_id: "0000:4c:00.0"}
prolog:
  on_error: drain
"""

A = "NVIDIA A100-SXM4-80GB"
V = "Tesla V100-SXM2-32GB"
U = "GPU-{:08x}-0000-4000-8000-000000000000"


def inventory(*gpus: tuple[str, str]) -> GpuInventory:
    return GpuInventory(
        gpus=tuple(
            Gpu(index=i, bus_id=bus, name=name, uuid=U.format(i))
            for i, (name, bus) in enumerate(gpus)
        ),
        driver_version="550.54.15",
        cuda_driver_version=12040,
    )


MIXED = inventory(
    (A, "0000:07:00.0"), (A, "0000:0b:00.0"), (V, "0000:48:00.0"), (V, "0000:4c:00.0")
)
SWAPPED = inventory(
    (V, "0000:07:00.0"), (A, "0000:0b:00.0"), (A, "0000:48:00.0"), (V, "0000:4c:00.0")
)


@pytest.fixture
def site_file(tmp_path: Path) -> Path:
    path = tmp_path / "lab.yaml"
    path.write_text(SITE)
    return path


def slot(model: str, bus_id: str, i: int) -> str:
    """One merged slot line as the merge writes it."""
    return f'      - {{model: {model}, bus_id: "{bus_id}", uuid: "{U.format(i)}"}}\n'


def probed(inv: GpuInventory, node: str, site_file: Path) -> ProbedNode:
    return describe(inv, node, load_site(site_file))


# --- printing the entry -----------------------------------------------------------------------


def test_entry_with_site_models(site_file):
    assert entry_yaml(probed(SWAPPED, "n2", site_file)) == (
        "  - nodes: n2\n"
        "    gpus:\n"
        + slot("V100", "0000:07:00.0", 0)
        + slot("A100", "0000:0b:00.0", 1)
        + slot("A100", "0000:48:00.0", 2)
        + slot("V100", "0000:4c:00.0", 3)
    )


def test_entry_without_site_names_nvml_and_says_to_define_a_model():
    text = entry_yaml(describe(inventory((A, "0000:07:00.0")), "n9", None))
    assert text == (
        "  - nodes: n9\n"
        "    gpus:\n"
        '      - {model: "NVIDIA A100-SXM4-80GB", bus_id: "0000:07:00.0", uuid: '
        '"GPU-00000000-0000-4000-8000-000000000000"}  # define a model with nvml_names: '
        '["NVIDIA A100-SXM4-80GB"] and write its name here\n'
    )


# --- merging ----------------------------------------------------------------------------------


def test_merge_same_gpus_on_shared_entry_changes_nothing(site_file):
    result = merge_file(site_file, probed(MIXED, "n2", site_file))
    assert result.action == "unchanged"
    assert site_file.read_text() == SITE


def test_merge_splits_node_out_of_hostlist_keeping_comments(site_file):
    site_file.chmod(0o640)
    result = merge_file(site_file, probed(SWAPPED, "n2", site_file))
    assert result.action == "split"
    assert site_file.read_text() == SITE.replace(
        '  - nodes: "n[1-3]"\n    gpus:\n',
        '  - nodes: "n[1,3]"\n    gpus:\n',
    ).replace(
        "prolog:\n",
        "  - nodes: n2\n"
        "    gpus:\n"
        + slot("V100", "0000:07:00.0", 0)
        + slot("A100", "0000:0b:00.0", 1)
        + slot("A100", "0000:48:00.0", 2)
        + slot("V100", "0000:4c:00.0", 3)
        + "prolog:\n",
    )
    assert stat.S_IMODE(site_file.stat().st_mode) == 0o640
    assert sorted(p.name for p in site_file.parent.iterdir()) == ["lab.yaml"]  # no temp left
    site = load_site(site_file)
    assert [g.model for g in site.node_map.gpus("n2")] == ["V100", "A100", "A100", "V100"]
    assert [g.model for g in site.node_map.gpus("n3")] == ["A100", "A100", "V100", "V100"]


def test_merge_updates_single_node_entry_in_place(site_file):
    merge_file(site_file, probed(SWAPPED, "n2", site_file))
    # the same node probed again: uuids match, nothing to write
    assert merge_file(site_file, probed(SWAPPED, "n2", site_file)).action == "unchanged"
    # its board replaced: slot 0 gets the new UUID, in place, style kept
    swapped = inventory(
        (V, "0000:07:00.0"), (A, "0000:0b:00.0"), (A, "0000:48:00.0"), (V, "0000:4c:00.0")
    )
    board = GpuInventory(
        gpus=(Gpu(0, "0000:07:00.0", V, U.format(0xBEEF)), *swapped.gpus[1:]),
        driver_version=None,
        cuda_driver_version=None,
    )
    before = site_file.read_text()
    assert merge_file(site_file, probed(board, "n2", site_file)).action == "updated"
    assert site_file.read_text() == before.replace(U.format(0), U.format(0xBEEF))


def test_merge_appends_unknown_node(site_file):
    one = inventory((A, "0000:07:00.0"))
    new_text, action = merge_text(SITE, probed(one, "n7", site_file))
    assert action == "appended"
    assert new_text == SITE.replace(
        "prolog:\n",
        "  - nodes: n7\n    gpus:\n" + slot("A100", "0000:07:00.0", 0) + "prolog:\n",
    )


def test_merge_refuses_gpu_without_model(site_file):
    unknown = inventory(("NVIDIA H100 80GB HBM3", "0000:18:00.0"))
    with pytest.raises(UsageError, match="'NVIDIA H100 80GB HBM3', which no model"):
        merge_file(site_file, probed(unknown, "n1", site_file))
    assert site_file.read_text() == SITE


def test_merge_refuses_a_result_the_loader_rejects(site_file):
    """A UUID already given to another node's GPU: the loader says no, nothing is written."""
    merge_file(site_file, probed(SWAPPED, "n2", site_file))
    before = site_file.read_text()
    with pytest.raises(ConfigError) as info:
        merge_file(site_file, probed(SWAPPED, "n4", site_file))
    assert "is already given to n2 slot 0" in str(info.value)
    assert str(site_file) in str(info.value) and "merge not written" in str(info.value)
    assert site_file.read_text() == before
    assert sorted(p.name for p in site_file.parent.iterdir()) == ["lab.yaml"]


# --- the command over the stand-in NVML ---------------------------------------------------------


@pytest.fixture(scope="module")
def lib_dir(standin_lib: Path) -> Path:
    return standin_lib.parent


# NVML enumerates these out of bus order; the entry must come out in PCI bus order.
SCENARIO = StandinScenario(
    gpus=(
        v100("0000:48:00.0", 0, node="n2"),
        a100("0000:0b:00.0", 1, node="n2"),
        a100("0000:07:00.0", 2, node="n2"),
        v100("0000:4c:00.0", 3, node="n2"),
    )
)

CLI = "import sys\nfrom clusterjob.cli.app import run\nsys.exit(run({argv!r}))\n"


@pytest.fixture(autouse=True)
def no_site_from_environment(monkeypatch):
    """Children inherit os.environ: keep a developer's site or Slurm config out of them."""
    monkeypatch.delenv("CLUSTERJOB_SITE", raising=False)
    monkeypatch.delenv("SLURM_CONF", raising=False)


def cli(argv, lib_dir, tmp_path):
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    return run_python(CLI.format(argv=list(argv)), lib_dir, SCENARIO, tmp_path, extra_env=env)


@pytest.mark.nvml
def test_probe_command_prints_bus_order(lib_dir, site_file, tmp_path):
    done = cli(["site", "probe", "--site", str(site_file), "--node", "n2"], lib_dir, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "# node_map entry for n2 (site lab); paste under node_map:"
    assert [line.split(",")[0] for line in lines[3:]] == [
        "      - {model: A100",
        "      - {model: A100",
        "      - {model: V100",
        "      - {model: V100",
    ]
    assert [line.split('"')[1] for line in lines[3:]] == [
        "0000:07:00.0",
        "0000:0b:00.0",
        "0000:48:00.0",
        "0000:4c:00.0",
    ]
    assert SCENARIO.gpus[2].uuid in lines[3]  # the GPU NVML calls index 2 is slot 0


@pytest.mark.nvml
def test_probe_command_without_site_and_json(lib_dir, tmp_path):
    done = cli(["site", "probe", "--node", "n2"], lib_dir, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "(no site config found)" in done.stdout
    assert 'model: "NVIDIA A100-SXM4-80GB"' in done.stdout
    assert "# define a model with nvml_names" in done.stdout
    done = cli(["site", "probe", "--node", "n2", "--json"], lib_dir, tmp_path)
    data = json.loads(done.stdout)
    assert data["site"] is None
    assert [(g["slot"], g["model"], g["bus_id"]) for g in data["gpus"]] == [
        (0, None, "0000:07:00.0"),
        (1, None, "0000:0b:00.0"),
        (2, None, "0000:48:00.0"),
        (3, None, "0000:4c:00.0"),
    ]


@pytest.mark.nvml
def test_probe_command_merge(lib_dir, site_file, tmp_path):
    """The stand-in's n2 matches the shared entry: unchanged; as n9 it is appended."""
    done = cli(["site", "probe", "--node", "n2", "--merge", str(site_file)], lib_dir, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{site_file}: node map entry already matches; nothing written"
    assert site_file.read_text() == SITE
    done = cli(["site", "probe", "--node", "n9", "--merge", str(site_file)], lib_dir, tmp_path)
    assert done.returncode == 0, done.stderr
    text = site_file.read_text()
    assert text.startswith(SITE.split("prolog:")[0] + "  - nodes: n9\n    gpus:\n")
    assert text.endswith("prolog:\n  on_error: drain\n")
    assert [g.uuid for g in load_site(site_file).node_map.gpus("n9")] == [
        SCENARIO.gpus[i].uuid for i in (2, 1, 0, 3)
    ]


@pytest.mark.nvml
def test_probe_command_no_nvml_is_one_line(lib_dir, tmp_path):
    done = cli(["site", "probe", "--node", "n2"], lib_dir, tmp_path)
    assert done.returncode == 0
    broken = run_python(
        CLI.format(argv=["site", "probe", "--node", "n2"]),
        tmp_path / "nowhere",
        StandinScenario(),
        tmp_path,
        extra_env={"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "c")},
    )
    assert broken.returncode == 5
    assert broken.stderr.count("\n") == 1 and "Traceback" not in broken.stderr
