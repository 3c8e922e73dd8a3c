"""read_inventory through the real pynvml over the stand-in libnvidia-ml.so.1, in a child."""

from __future__ import annotations

import ctypes.util
import os
import time
from pathlib import Path

import pytest
from standin_fixtures import inventory_in_child, run_python

from clusterjob.errors import NvmlError
from clusterjob.gpu.inventory import (
    Gpu,
    GpuInventory,
    GpuProcess,
    clock_event_names,
    cpu_list,
    parse_cpu_list,
)
from clusterjob.sandbox.standin import (
    GIB,
    StandinScenario,
    a100,
    gpus_on_buses,
    h100,
    v100,
    write_scenario,
)

pytestmark = pytest.mark.nvml


def _inventory(lib: Path, scenario: StandinScenario | Path | None, tmp_path: Path, **kw):
    result = inventory_in_child(lib.parent, scenario, tmp_path, **kw)
    assert isinstance(result, GpuInventory), f"expected an inventory, got {result!r}"
    return result


def _error(lib: Path, scenario: StandinScenario | Path | None, tmp_path: Path, **kw) -> NvmlError:
    result = inventory_in_child(lib.parent, scenario, tmp_path, **kw)
    assert isinstance(result, NvmlError), f"expected an NvmlError, got {result!r}"
    return result


def test_mixed_a100_v100_node(standin_lib, tmp_path):
    scenario = StandinScenario(
        gpus=(
            a100("00000000:07:00.0", 0),
            a100("0000:0B:00.0", 1),
            v100("0000:48:00.0", 2),
            v100("0000:4c:00.0", 3),
        ),
        driver_version="535.161.08",
        cuda_driver_version=12020,
    )
    inv = _inventory(standin_lib, scenario, tmp_path)

    assert inv.driver_version == "535.161.08"
    assert inv.cuda_driver_version == 12020
    assert [g.bus_id for g in inv.gpus] == [
        "0000:07:00.0",
        "0000:0b:00.0",
        "0000:48:00.0",
        "0000:4c:00.0",
    ]
    assert [g.name for g in inv.gpus] == ["NVIDIA A100-SXM4-80GB"] * 2 + [
        "Tesla V100-SXM2-32GB"
    ] * 2
    assert [g.index for g in inv.gpus] == [0, 1, 2, 3]
    assert [g.minor for g in inv.gpus] == [0, 1, 2, 3]
    assert [g.memory_total for g in inv.gpus] == [80 * GIB, 80 * GIB, 32 * GIB, 32 * GIB]
    for written, read in zip(scenario.gpus, inv.gpus, strict=True):
        assert read.uuid == written.uuid and read.uuid.startswith("GPU-")
        assert read.serial == written.serial
        assert read.lost is False
        assert read.persistence_mode is True
        assert read.ecc_uncorrectable_volatile == 0
        assert read.memory_used == 0
        assert read.processes == ()
    a, v = inv.gpus[0], inv.gpus[2]
    assert (a.mig_current, a.mig_pending) == (False, False)
    assert (a.remapped_rows_pending, a.remapped_rows_failure) == (False, False)
    # A V100 has neither MIG nor row remapping: unknown, not an error.
    assert (v.mig_current, v.mig_pending) == (None, None)
    assert (v.remapped_rows_pending, v.remapped_rows_failure) == (None, None)
    assert inv.by_bus_id("0000:48:00.0") == v


def test_inventory_is_in_pci_order_whatever_the_nvml_order(standin_lib, tmp_path):
    """NVML index order is not promised: the inventory is sorted by bus ID, indices kept."""
    scenario = StandinScenario(
        gpus=(v100("0000:b1:00.0", 0), a100("0000:1a:00.0", 1), a100("0000:3d:00.0", 2))
    )
    inv = _inventory(standin_lib, scenario, tmp_path)
    assert [(g.bus_id, g.index) for g in inv.gpus] == [
        ("0000:1a:00.0", 1),
        ("0000:3d:00.0", 2),
        ("0000:b1:00.0", 0),
    ]


def test_minor_number_is_not_the_index(standin_lib, tmp_path):
    scenario = StandinScenario(
        gpus=(a100("0000:07:00.0", 0, minor=2), a100("0000:0b:00.0", 1, minor=0))
    )
    inv = _inventory(standin_lib, scenario, tmp_path)
    assert [(g.index, g.minor) for g in inv.gpus] == [(0, 2), (1, 0)]


def test_eight_gpu_h100_node(standin_lib, tmp_path):
    buses = [f"0000:{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]
    scenario = StandinScenario(
        gpus=gpus_on_buses(h100, buses, node="gpu-h01"), driver_version="550.90.07"
    )
    inv = _inventory(standin_lib, scenario, tmp_path)
    assert len(inv.gpus) == 8
    assert [g.bus_id for g in inv.gpus] == buses
    assert {g.name for g in inv.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert [g.index for g in inv.gpus] == list(range(8))
    assert all(g.memory_total == 81559 * 1024**2 for g in inv.gpus)
    assert len({g.uuid for g in inv.gpus}) == 8
    assert inv.driver_version == "550.90.07"


def test_unsupported_fields_are_none(standin_lib, tmp_path):
    gpu = a100(
        "0000:07:00.0",
        0,
        unsupported=("ecc", "remap", "mig", "serial", "persistence", "memory", "minor", "pcie",
                     "temperature", "clocks", "nvlink", "fabric", "affinity", "power",
                     "retired"),
    )  # fmt: skip
    inv = _inventory(standin_lib, StandinScenario(gpus=(gpu,)), tmp_path)
    (g,) = inv.gpus
    assert g == Gpu(
        index=0,
        bus_id="0000:07:00.0",
        name="NVIDIA A100-SXM4-80GB",
        uuid=gpu.uuid,
        processes=(),
    )


def test_board_without_serial_and_no_name_or_uuid(standin_lib, tmp_path):
    gpu = a100("0000:07:00.0", 0, serial=None, unsupported=("name", "uuid", "processes"))
    (g,) = _inventory(standin_lib, StandinScenario(gpus=(gpu,)), tmp_path).gpus
    assert (g.serial, g.name, g.uuid, g.processes) == (None, None, None, None)
    assert g.memory_total == 80 * GIB and g.lost is False


def test_ecc_remap_mig_persistence_values(standin_lib, tmp_path):
    scenario = StandinScenario(
        gpus=(
            a100("0000:07:00.0", 0, ecc_uncorrectable=3, remapped_pending=True),
            a100("0000:0b:00.0", 1, remapped_failure=True, persistence=False),
            a100("0000:48:00.0", 2, mig_current=True),
            a100("0000:4c:00.0", 3, mig_pending=True, memory_used=5 * GIB),
        )
    )
    g0, g1, g2, g3 = _inventory(standin_lib, scenario, tmp_path).gpus
    assert g0.ecc_uncorrectable_volatile == 3
    assert (g0.remapped_rows_pending, g0.remapped_rows_failure) == (True, False)
    assert (g1.remapped_rows_pending, g1.remapped_rows_failure) == (False, True)
    assert g1.persistence_mode is False and g0.persistence_mode is True
    assert (g2.mig_current, g2.mig_pending) == (True, False)
    assert (g3.mig_current, g3.mig_pending) == (False, True)
    assert g3.memory_used == 5 * GIB


def test_running_processes(standin_lib, tmp_path):
    gpu = a100(
        "0000:07:00.0",
        0,
        processes=((4242, 20 * GIB, "python train.py"), (4300, 1 * GIB, "nvtop")),
    )
    (g,) = _inventory(standin_lib, StandinScenario(gpus=(gpu,)), tmp_path).gpus
    assert g.processes == (
        GpuProcess(pid=4242, used_memory=20 * GIB, name="python train.py"),
        GpuProcess(pid=4300, used_memory=1 * GIB, name="nvtop"),
    )


# Calls addressing a GPU, in read_inventory's order: 1 handle, 2 PCI info, 3 name, 4 UUID,
# 5 serial, 6 minor, 7 memory, 8 MIG, 9 ECC, 10 remapped rows, 11 persistence, 12 processes.
@pytest.mark.parametrize(
    ("lost_after", "expect_read"),
    [
        (2, {}),
        (4, {"name": "NVIDIA A100-SXM4-80GB", "uuid": True}),
        (8, {"name": "NVIDIA A100-SXM4-80GB", "uuid": True, "minor": 1, "mig_current": False}),
    ],
)
def test_gpu_lost_midway_keeps_what_was_read(standin_lib, tmp_path, lost_after, expect_read):
    lost = a100("0000:0b:00.0", 1, lost_after_calls=lost_after)
    scenario = StandinScenario(gpus=(a100("0000:07:00.0", 0), lost, a100("0000:48:00.0", 2)))
    inv = _inventory(standin_lib, scenario, tmp_path)
    healthy0, g, healthy2 = inv.gpus
    assert not healthy0.lost and not healthy2.lost
    assert healthy2.processes == ()  # reading went on after the lost GPU
    assert g.lost is True
    assert g.bus_id == "0000:0b:00.0"
    assert g.name == expect_read.get("name")
    assert g.uuid == (lost.uuid if expect_read.get("uuid") else None)
    assert g.minor == expect_read.get("minor")
    assert g.mig_current == expect_read.get("mig_current")
    assert g.ecc_uncorrectable_volatile is None and g.processes is None


@pytest.mark.parametrize("lost_after", [0, 1])
def test_gpu_lost_before_its_bus_id_is_known(standin_lib, tmp_path, lost_after):
    scenario = StandinScenario(
        gpus=(a100("0000:07:00.0", 0), a100("0000:0b:00.0", 1, lost_after_calls=lost_after))
    )
    err = _error(standin_lib, scenario, tmp_path)
    assert err.kind == "gpu_lost"
    assert "index 1" in str(err) and "reset" in str(err)


@pytest.mark.parametrize(
    ("init_error", "kind", "words"),
    [
        ("driver_not_loaded", "driver_not_loaded", "driver is not loaded"),
        ("library_mismatch", "version_mismatch", "reboot"),
        ("no_permission", "no_permission", "/dev/nvidia"),
        ("unknown", "unknown", "Unknown Error"),
    ],
)
def test_init_errors_map_to_kinds(standin_lib, tmp_path, init_error, kind, words):
    scenario = StandinScenario(gpus=(a100("0000:07:00.0", 0),), init_error=init_error)
    err = _error(standin_lib, scenario, tmp_path)
    assert err.kind == kind
    assert words in str(err)


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="a real libnvidia-ml is installed on this machine: the loader would find it",
)
def test_library_absent(tmp_path):
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    err = _error(empty / "libnvidia-ml.so.1", None, tmp_path)
    assert err.kind == "library_not_found"
    assert "libnvidia-ml.so.1 not found" in str(err)
    assert "NVIDIA driver installed" in str(err)


def test_node_without_scenario_looks_like_no_driver(standin_lib, tmp_path):
    err = _error(standin_lib, tmp_path / "missing.txt", tmp_path)
    assert err.kind == "driver_not_loaded"


def test_scenario_per_slurm_node(standin_lib, tmp_path):
    write_scenario(tmp_path / "node-a1.nvml", StandinScenario(gpus=(a100("0000:07:00.0", 0),)))
    write_scenario(tmp_path / "node-b1.nvml", StandinScenario(gpus=(v100("0000:3b:00.0", 0),)))
    pattern = tmp_path / "node-%n.nvml"
    for node, name in (("a1", "NVIDIA A100-SXM4-80GB"), ("b1", "Tesla V100-SXM2-32GB")):
        inv = _inventory(standin_lib, pattern, tmp_path, extra_env={"SLURMD_NODENAME": node})
        assert [g.name for g in inv.gpus] == [name]


def test_hung_gpu_times_out_instead_of_blocking(standin_lib, tmp_path):
    scenario = StandinScenario(
        gpus=(a100("0000:07:00.0", 0), a100("0000:0b:00.0", 1, hang_seconds=30))
    )
    start = time.monotonic()
    err = _error(standin_lib, scenario, tmp_path, timeout=1.0)
    assert time.monotonic() - start < 20  # the child did not wait for the hung call
    assert err.kind == "timeout"
    assert "within 1s" in str(err)


def test_slow_gpu_within_timeout_still_reads(standin_lib, tmp_path):
    slow = a100("0000:07:00.0", 0, hang_seconds=0.01)
    inv = _inventory(standin_lib, StandinScenario(gpus=(slow,)), tmp_path, timeout=30)
    assert inv.gpus[0].name == "NVIDIA A100-SXM4-80GB"


def test_empty_node(standin_lib, tmp_path):
    inv = _inventory(standin_lib, StandinScenario(gpus=()), tmp_path)
    assert inv.gpus == () and inv.driver_version == "550.54.15"


def test_link_clock_and_fabric_values(standin_lib, tmp_path):
    """The NVML answers as the checks read them, through the real pynvml structures."""
    scenario = StandinScenario(
        gpus=(
            h100("0000:18:00.0", 0, pcie_width=8, pcie_gen=2, nvlinks_down=(0, 17)),
            h100("0000:2a:00.0", 1, fabric_state="completed", fabric_status=999,
                 clocks_event_reasons=0x48, temperature=71, temperature_slowdown=87),
            v100("0000:3a:00.0", 2),
        )
    )  # fmt: skip
    g0, g1, g2 = _inventory(standin_lib, scenario, tmp_path).gpus
    assert (g0.pcie_link_width, g0.pcie_link_width_max) == (8, 16)
    assert (g0.pcie_link_gen, g0.pcie_link_gen_max) == (2, 5)
    assert g0.nvlink_active == (False,) + (True,) * 16 + (False,)
    assert (g0.fabric_state, g0.fabric_status) == ("completed", 0)
    assert (g1.fabric_state, g1.fabric_status) == ("completed", 999)
    assert g1.clock_event_reasons == 0x48
    assert clock_event_names(g1.clock_event_reasons) == ("hw_slowdown", "hw_thermal")
    assert (g1.temperature, g1.temperature_slowdown) == (71, 87)
    assert (g0.power_limit, g0.power_limit_default, g0.retired_pages_pending) == (
        700_000,
        700_000,
        False,
    )
    assert g2.nvlink_active == (True,) * 6  # SXM2: six links
    assert (g2.fabric_state, g2.fabric_status) == (None, None)  # no NVSwitch fabric to ask


def test_cpu_affinity_as_a_cpu_list(standin_lib, tmp_path):
    """NVML is asked for as many CPUs as this machine has configured (a GPU cannot be near
    a CPU that does not exist): the stand-in's list is cut there too."""
    n = os.sysconf("SC_NPROCESSORS_CONF")
    scenario = StandinScenario(
        gpus=(
            h100("0000:18:00.0", 0, cpu_affinity=f"0,{n - 1},{n + 64}"),
            h100("0000:2a:00.0", 1),  # unset: every configured CPU
        )
    )
    g0, g1 = _inventory(standin_lib, scenario, tmp_path).gpus
    assert g0.cpu_affinity == ("0" if n == 1 else f"0,{n - 1}" if n > 2 else "0-1")
    assert g1.cpu_affinity == ("0" if n == 1 else f"0-{n - 1}")


def test_cpu_lists_round_trip():
    assert cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert parse_cpu_list("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("") == frozenset() and cpu_list(()) == ""


def test_mig_devices_listed_only_in_mig_mode(standin_lib, tmp_path):
    slices = (("3g.40gb", "MIG-11111111-2222-3333-4444-555555555555"),
              ("1g.10gb", "MIG-66666666-2222-3333-4444-555555555555"))  # fmt: skip
    scenario = StandinScenario(
        gpus=(
            a100("0000:07:00.0", 0, mig_current=True, mig_pending=True, mig_devices=slices),
            a100("0000:0b:00.0", 1, mig_devices=slices[:1]),  # MIG off: NVML lists none
            a100("0000:48:00.0", 2, mig_current=True, unsupported=("mig",)),
        )
    )
    g0, g1, g2 = _inventory(standin_lib, scenario, tmp_path).gpus
    assert g0.mig_devices is not None
    assert [(m.index, m.profile, m.uuid, m.gpu_instance, m.compute_instance)
            for m in g0.mig_devices] == [
        (0, "3g.40gb", slices[0][1], 1, 0),
        (1, "1g.10gb", slices[1][1], 2, 0),
    ]  # fmt: skip
    assert g0.mig_devices[0].name == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert g0.mig_devices[0].memory_total == 40 * GIB
    assert g1.mig_devices is None
    assert (g2.mig_current, g2.mig_devices) == (None, None)


def test_an_older_pynvml_without_the_newer_bindings_gives_unknown_facts(standin_lib, tmp_path):
    """A binding an older nvidia-ml-py lacks is an unknown fact (the oldest release the pin
    allows is run for real in tests/test_dependency_floors.py)."""
    code = (
        "import pynvml\n"
        "for name in ('nvmlDeviceGetCurrentClocksEventReasons', 'nvmlDeviceGetGpuFabricInfo',\n"
        "             'nvmlDeviceGetCpuAffinity',\n"
        "             'nvmlDeviceGetMaxMigDeviceCount'):\n"
        "    delattr(pynvml, name)\n"
        "from clusterjob.gpu.nvml import read_nvml\n"
        "(g,) = read_nvml().gpus\n"
        "print(g.clock_event_reasons, g.fabric_state, g.cpu_affinity, g.mig_devices,\n"
        "      g.nvlink_active is not None)\n"
    )
    scenario = StandinScenario(
        gpus=(
            h100("0000:18:00.0", 0, clocks_event_reasons=0x8, mig_current=True, mig_pending=True),
        )
    )
    done = run_python(code, standin_lib.parent, scenario, tmp_path)
    assert done.returncode == 0, done.stderr
    # the older ThrottleReasons name still answers; the rest is unknown
    assert done.stdout.split() == ["8", "None", "None", "None", "True"]
