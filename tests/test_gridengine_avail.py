"""``clusterjob avail`` on a Grid Engine site: free GPUs from the ``gpu`` consumable that one
``qhost -F gpu,gpu_type`` reports per host (recorded on the local Grid Engine cluster), totals
from the site's node map, in the same rows as on Slurm."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterjob.errors import UsageError
from clusterjob.gridengine.commands import GridEngineClient
from clusterjob.jobs.avail import ModelFree, availability, controlled_availability
from clusterjob.jobscript.control import GridEngineControl, HostGpus
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from tests.test_gridengine_runner import Commands, recorded, runner

# The local cluster's hosts (tests/fixtures/gridengine/README.md) as a site names them.
SITE = """\
site: gesandbox
scheduler: gridengine
node_command: /opt/clusterjob/bin/clusterjob
models:
  A100:
    aliases: [a100]
    gres_type: a100
    nvml_names: ["NVIDIA A100-SXM4-80GB"]
    memory_gb: 80
  V100:
    aliases: [v100]
    gres_type: v100
    nvml_names: ["Tesla V100-SXM2-32GB"]
    memory_gb: 32
partitions:
  all.q:
    nodes: "host[1-3]"
    default: true
  big.q:
    nodes: "host[1-2]"
node_map:
  - nodes: "host[1-2]"
    gpus:
      - {model: A100, bus_id: "0000:10:00.0"}
      - {model: A100, bus_id: "0000:20:00.0"}
      - {model: A100, bus_id: "0000:30:00.0"}
      - {model: A100, bus_id: "0000:40:00.0"}
  - nodes: "host3"
    gpus:
      - {model: V100, bus_id: "0000:10:00.0"}
      - {model: V100, bus_id: "0000:20:00.0"}
"""


@pytest.fixture
def site(tmp_path: Path) -> Site:
    path = tmp_path / "gesandbox.yaml"
    path.write_text(SITE)
    return load_site(path)


def control(qhost: str) -> tuple[GridEngineControl, Commands]:
    fake = Commands({"qhost": [(0, recorded(qhost), "")]})
    return GridEngineControl(GridEngineClient(runner(fake))), fake


def test_qhost_gpu_value_is_what_is_left() -> None:
    """A 2-GPU job runs on host1: qhost shows hc:gpu=2 there, the 4 less what is booked."""
    ge, fake = control("qhost-F-gpu-in-use.txt")
    assert ge.gpu_hosts() == [
        HostGpus("host1", "a100", 2),
        HostGpus("host2", "a100", 4),
        HostGpus("host3", "v100", 2),
    ]
    assert fake.seen == [["qhost", "-F", "gpu,gpu_type"]]


def test_rows_by_partition_and_model_with_one_qhost(site: Site) -> None:
    ge, fake = control("qhost-F-gpu-in-use.txt")
    result = controlled_availability(site, ge, model=None, gpus=None, partition=None)
    assert result.rows == (
        ModelFree("all.q", "A100", 6, 8, 4, ("host1", "host2")),
        ModelFree("all.q", "V100", 2, 2, 2, ("host3",)),
        ModelFree("big.q", "A100", 6, 8, 4, ("host1", "host2")),
    )
    assert result.skipped == () and result.estimate is None
    assert len(fake.seen) == 1


def test_model_and_partition_filters(site: Site) -> None:
    ge, fake = control("qhost-F-gpu.txt")
    result = controlled_availability(site, ge, model="v100", gpus=None, partition="all.q")
    assert result.rows == (ModelFree("all.q", "V100", 2, 2, 2, ("host3",)),)
    with pytest.raises(UsageError, match="unknown GPU model 'h100'"):
        controlled_availability(site, ge, model="h100", gpus=None, partition=None)
    assert len(fake.seen) == 1  # the unknown model was refused before qhost


def test_no_start_estimate_on_grid_engine(site: Site) -> None:
    ge, fake = control("qhost-F-gpu.txt")
    with pytest.raises(UsageError, match="runs Grid Engine, which gives no start estimate"):
        controlled_availability(site, ge, model=None, gpus=2, partition=None)
    assert fake.seen == []


def test_availability_goes_through_the_backend_not_slurm(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``availability`` (what ``clusterjob avail`` calls) asks the site's backend; it never
    builds a Slurm client for a Grid Engine site."""
    ge, fake = control("qhost-F-gpu.txt")
    monkeypatch.setattr("clusterjob.jobscript.backends.GridEngineBackend.control", lambda _: ge)

    def no_slurm(*args: object, **kwargs: object) -> None:
        raise AssertionError("Slurm called for a Grid Engine site")

    monkeypatch.setattr("clusterjob.jobs.avail.SlurmClient", no_slurm)
    result = availability(site, avoided=["host2 (preflight failed 2h ago)"])
    assert [(r.partition, r.model, r.free, r.total) for r in result.rows] == [
        ("all.q", "A100", 8, 8),
        ("all.q", "V100", 2, 2),
        ("big.q", "A100", 8, 8),
    ]
    assert result.avoided == ("host2 (preflight failed 2h ago)",)
    assert fake.seen == [["qhost", "-F", "gpu,gpu_type"]]


def test_a_host_outside_the_node_map_counts_what_qhost_shows(site: Site) -> None:
    from clusterjob.jobs.avail import host_free

    entry = host_free(site, HostGpus("host9", "a100", 3))
    assert (entry.model, entry.total, entry.free, entry.partitions) == ("A100", 3, 3, ())
