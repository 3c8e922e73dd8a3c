"""MIG in the site schema: slice models tied to their parent GPU by NVML name, slices in the
node map (with their GPU instance ids), what validation knows of them, the gres.conf and
``Gres=`` strings they give, and the per-job cap; loaded from a real YAML file."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterjob.errors import UsageError
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.admin import gres_conf_lines, mig_cap_minors, node_gres_strings
from clusterjob.site.loader import load_site, validate_site_file
from clusterjob.site.model import Site
from clusterjob.site.nodemodel import gres_units

SITE = """\
site: migsite
gpu_request: {syntax: gres, type_required: true}
models:
  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"], memory_gb: 80}
  A100-3g.40gb:
    gres_type: mig_3g.40gb
    nvml_names: ["NVIDIA A100-SXM4-80GB MIG 3g.40gb"]
  A100-1g.10gb:
    aliases: [1g]
    gres_type: mig_1g.10gb
    nvml_names: ["NVIDIA A100-SXM4-80GB MIG 1g.10gb"]
    max_per_job: 2
partitions:
  mig: {nodes: "m[1-2]", default: true}
  auto: {nodes: "a1"}
node_map:
  - nodes: "m[1-2]"
    gpus:
      - {model: A100, bus_id: "0000:07:00.0", mig: ["3g.40gb@1", "1g.10gb@7", "1g.10gb@8"]}
      - {model: A100, bus_id: "0000:0b:00.0"}
  - nodes: a1
    gpus:
      - {model: A100, bus_id: "0000:07:00.0", mig: [3g.40gb, 2g.20gb]}
"""


@pytest.fixture
def site_file(tmp_path: Path) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(SITE, encoding="utf-8")
    return path


@pytest.fixture
def site(site_file: Path) -> Site:
    return load_site(site_file)


def test_slices_are_read_with_their_gpu_instances(site: Site) -> None:
    first, second = site.node_map.gpus("m1") or ()
    assert first.mig == ("3g.40gb", "1g.10gb", "1g.10gb") and first.mig_gi == (1, 7, 8)
    assert second.mig is None and second.mig_gi is None
    only = (site.node_map.gpus("a1") or ())[0]
    assert only.mig == ("3g.40gb", "2g.20gb") and only.mig_gi is None


def test_gres_indices_count_the_slices_then_the_whole_gpus(site: Site) -> None:
    units = gres_units(site.node_map.gpus("m1") or ())
    assert [(u.index, u.slot.slot, u.slice, u.profile, u.gpu_instance) for u in units] == [
        (0, 0, 0, "3g.40gb", 1),
        (1, 0, 1, "1g.10gb", 7),
        (2, 0, 2, "1g.10gb", 8),
        (3, 1, None, None, None),
    ]
    assert site.gres_models("m1") == ("A100-3g.40gb", "A100-1g.10gb", "A100-1g.10gb", "A100")
    # A profile without a model of its own is named by its parent and profile.
    assert site.gres_models("a1") == ("A100-3g.40gb", "A100 MIG 2g.20gb")


def test_a_slice_model_is_found_by_its_parents_nvml_name(site: Site) -> None:
    found = site.slice_model("A100", "1g.10gb")
    assert found is not None and found.name == "A100-1g.10gb" and found.max_per_job == 2
    assert site.slice_model("A100", "2g.20gb") is None


def test_a_profile_no_model_stands_for_is_a_warning(site_file: Path) -> None:
    loaded, issues = validate_site_file(site_file)
    assert loaded is not None
    assert [(i.line, i.key_path, i.message, i.warning) for i in issues] == [
        (
            23,
            "node_map[1].gpus[0].mig",
            "no model stands for A100 2g.20gb slices (one with nvml_names "
            "['NVIDIA A100-SXM4-80GB MIG 2g.20gb']): jobs cannot ask for them by model",
            True,
        )
    ]


def test_cap_minors_follow_the_drivers_mig_minors_layout() -> None:
    # /proc/driver/nvidia-caps/mig-minors: gpu0/gi0/access 3, gpu0/gi0/ci0/access 4,
    # gpu0/gi1/access 12, gpu0/gi1/ci0/access 13, ..., gpu31/gi14/ci7/access 4322.
    assert mig_cap_minors(0, 0) == (3, 4)
    assert mig_cap_minors(0, 1) == (12, 13)
    assert mig_cap_minors(31, 14, 7) == (4314, 4322)


def test_gres_conf_names_each_slices_device_files(site: Site) -> None:
    caps = "/dev/nvidia-caps/nvidia-cap"
    assert gres_conf_lines(site) == [
        f"NodeName=m[1-2] Name=gpu Type=mig_3g.40gb MultipleFiles=/dev/nvidia0,{caps}12,{caps}13",
        f"NodeName=m[1-2] Name=gpu Type=mig_1g.10gb MultipleFiles=/dev/nvidia0,{caps}66,{caps}67",
        f"NodeName=m[1-2] Name=gpu Type=mig_1g.10gb MultipleFiles=/dev/nvidia0,{caps}75,{caps}76",
        "NodeName=m[1-2] Name=gpu Type=a100 File=/dev/nvidia1",
        "# a1: MIG slices without GPU instance ids (mig: [PROFILE@GI]) in the node map; NVML "
        "names their device files",
        "NodeName=a1 AutoDetect=nvml",
    ]
    assert node_gres_strings(site) == {
        "m1": "gpu:mig_3g.40gb:1,gpu:mig_1g.10gb:2,gpu:a100:1",
        "m2": "gpu:mig_3g.40gb:1,gpu:mig_1g.10gb:2,gpu:a100:1",
        "a1": "gpu:mig_3g.40gb:1,gpu:2g.20gb:1",
    }


def test_a_job_asks_for_slices_by_their_model(site: Site) -> None:
    job = resolve(site, JobRequest("train.py", model="1g", gpus=2))
    assert job.gres.options == ("--gres=gpu:mig_1g.10gb:2",)
    assert job.partition.name == "mig" and job.eligible_nodes == ("m1", "m2")


def test_slices_per_job_are_capped_by_the_model(site: Site) -> None:
    with pytest.raises(UsageError) as caught:
        resolve(site, JobRequest("train.py", model="A100-1g.10gb", gpus=1, nodes=3))
    assert str(caught.value) == (
        "a job may have at most 2 A100-1g.10gb at this site, asked for 3: ask for fewer, or "
        "for whole GPUs"
    )


def test_a_node_has_as_many_slices_of_a_profile_as_its_map_lists(site: Site) -> None:
    with pytest.raises(UsageError) as caught:
        resolve(site, JobRequest("train.py", model="A100-3g.40gb", gpus=2, partition="mig"))
    assert "A100-3g.40gb: at most 1 per node (nodes m[1-2])" in str(caught.value)
