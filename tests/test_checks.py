"""Table-driven tests of the pure preflight checks (the clusterjob.node.checks package).

Inventories here are built by hand: these are unit tests of the comparison logic. The same
scenarios run end to end over pynvml and the stand-in NVML library in test_hooks_nvml.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clusterjob.gpu.inventory import Gpu, GpuInventory, GpuProcess, MigDevice
from clusterjob.gpu.models import model_for_nvml_name
from clusterjob.node.allocation import Allocation, Context, allocation_from_env
from clusterjob.node.checks import CHECK_IDS, REGISTRY, Facts, Need, PreflightReport, run_checks
from clusterjob.node.checks.findings import Severity
from clusterjob.node.checks.registry import Observation, Registry, Stage
from clusterjob.node.report import render_table, summary_line
from clusterjob.site.nodemodel import NodeGpu

MODELS = {
    "A100": ("NVIDIA A100-SXM4-80GB",),
    "V100": ("Tesla V100-SXM2-32GB",),
    "H100": ("NVIDIA H100 80GB HBM3",),
}
A100, V100, H100 = "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3"
BUSES = ["0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0"]


def gpu(i: int, name: str, bus: str | None = None, **kw: object) -> Gpu:
    return Gpu(
        index=i,
        bus_id=bus or BUSES[i],
        name=name,
        uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000",
        minor=i,
        **kw,  # type: ignore[arg-type]
    )


def inv(*gpus: Gpu) -> GpuInventory:
    return GpuInventory(gpus=tuple(gpus), driver_version="550.54.15", cuda_driver_version=12040)


def slots(*models: str, bus_ids: bool = True) -> tuple[NodeGpu, ...]:
    return tuple(NodeGpu(i, m, BUSES[i] if bus_ids else None) for i, m in enumerate(models))


def alloc(*s: int) -> Allocation:
    return Allocation(slots=tuple(s), source="SLURM_JOB_GPUS")


MIXED_MAP = slots("A100", "A100", "V100", "V100")
HALVES = tuple(
    MigDevice(i, f"MIG-{i}1111111-2222-3333-4444-555555555555", f"{A100} MIG 3g.40gb", 40 * 2**30,
              i + 1, 0)
    for i in range(2)
)  # fmt: skip
MIXED_INV = inv(gpu(0, A100), gpu(1, A100), gpu(2, V100), gpu(3, V100))

# name -> (Facts fields, expected [(check_id, severity, slot)])
CASES: dict[str, tuple[dict[str, object], list[tuple[str, str, int | None]]]] = {
    "good mixed A100+V100 node": (dict(node_map=MIXED_MAP, inventory=MIXED_INV), []),
    "good node, job given both models, PCI order": (
        dict(
            node_map=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=alloc(1, 2),
            context=Context.JOB,
            cuda_device_order="PCI_BUS_ID",
        ),
        [],
    ),
    "two GPUs swapped": (
        dict(
            node_map=MIXED_MAP,
            inventory=inv(gpu(0, A100), gpu(1, V100), gpu(2, A100), gpu(3, V100)),
        ),
        [("model-mismatch", "error", 1), ("model-mismatch", "error", 2)],
    ),
    "two GPUs swapped, map without bus IDs": (
        dict(
            node_map=slots("A100", "A100", "V100", "V100", bus_ids=False),
            inventory=inv(gpu(0, A100), gpu(1, V100), gpu(2, A100), gpu(3, V100)),
        ),
        [("model-mismatch", "error", 1), ("model-mismatch", "error", 2)],
    ),
    "one GPU missing": (
        dict(node_map=MIXED_MAP, inventory=inv(gpu(0, A100), gpu(1, A100), gpu(3, V100))),
        [("gpu-count", "error", None), ("gpu-missing", "error", 2)],
    ),
    "extra GPU not in the map": (
        dict(
            node_map=slots("A100", "A100"),
            inventory=inv(gpu(0, A100), gpu(1, A100), gpu(2, V100)),
        ),
        [("gpu-count", "error", None), ("gpu-extra", "error", None)],
    ),
    "wrong model allocated": (
        dict(node_map=MIXED_MAP, inventory=MIXED_INV, allocation=alloc(2), expect_model="A100"),
        [("alloc-model", "error", 2)],
    ),
    "requested model matched case-insensitively": (
        dict(node_map=MIXED_MAP, inventory=MIXED_INV, allocation=alloc(0), expect_model="a100"),
        [],
    ),
    "fewer GPUs allocated than asked": (
        dict(node_map=MIXED_MAP, inventory=MIXED_INV, allocation=alloc(0), expect_count=2),
        [("alloc-count", "error", None)],
    ),
    "GPUs asked, none in the environment": (
        dict(node_map=MIXED_MAP, inventory=MIXED_INV, allocation=None, expect_count=1),
        [("alloc-count", "error", None)],
    ),
    "allocated index beyond the node": (
        dict(node_map=MIXED_MAP, inventory=MIXED_INV, allocation=alloc(0, 5)),
        [("alloc-slot", "error", None)],
    ),
    "minor != index, GPU not given to the job": (
        dict(
            node_map=MIXED_MAP,
            inventory=inv(
                gpu(0, A100),
                gpu(1, A100).replace(minor=2),
                gpu(2, V100).replace(minor=1),
                gpu(3, V100),
            ),
            allocation=alloc(0),
        ),
        [("gres-index", "warning", 1), ("gres-index", "warning", 2)],
    ),
    "minor != index, GPU given to the job": (
        dict(
            node_map=MIXED_MAP,
            inventory=inv(
                gpu(0, A100),
                gpu(1, A100).replace(minor=2),
                gpu(2, V100).replace(minor=1),
                gpu(3, V100),
            ),
            allocation=alloc(1),
        ),
        [("gres-index", "error", 1), ("gres-index", "warning", 2)],
    ),
    "GPU lost": (
        dict(
            node_map=MIXED_MAP,
            inventory=inv(
                gpu(0, A100), gpu(1, A100), gpu(2, V100).replace(lost=True), gpu(3, V100)
            ),
            allocation=alloc(0),
        ),
        [("gpu-lost", "error", 2)],
    ),
    "uncorrectable ECC on an allocated GPU": (
        dict(
            node_map=MIXED_MAP,
            inventory=inv(
                gpu(0, A100, ecc_uncorrectable_volatile=3), gpu(1, A100), gpu(2, V100), gpu(3, V100)
            ),
            allocation=alloc(0),
        ),
        [("ecc-uncorrectable", "error", 0)],
    ),
    "uncorrectable ECC on a GPU of another job": (
        dict(
            node_map=MIXED_MAP,
            inventory=inv(
                gpu(0, A100, ecc_uncorrectable_volatile=3), gpu(1, A100), gpu(2, V100), gpu(3, V100)
            ),
            allocation=alloc(1),
        ),
        [("ecc-uncorrectable", "warning", 0)],
    ),
    "uncorrectable ECC, allocation unknown": (
        dict(
            node_map=MIXED_MAP,
            inventory=inv(
                gpu(0, A100, ecc_uncorrectable_volatile=1), gpu(1, A100), gpu(2, V100), gpu(3, V100)
            ),
        ),
        [("ecc-uncorrectable", "error", 0)],
    ),
    "row remap pending and failed": (
        dict(
            node_map=MIXED_MAP,
            inventory=inv(
                gpu(0, A100, remapped_rows_pending=True),
                gpu(1, A100),
                gpu(2, V100, remapped_rows_failure=True),
                gpu(3, V100),
            ),
            allocation=alloc(0, 2),
        ),
        [("row-remap-pending", "warning", 0), ("row-remap-failure", "error", 2)],
    ),
    "8-GPU H100 node, all good, job given 8": (
        dict(
            node_map=tuple(NodeGpu(i, "H100", f"0000:{0x18 + 16 * i:02x}:00.0") for i in range(8)),
            inventory=inv(*(gpu(i, H100, f"0000:{0x18 + 16 * i:02x}:00.0") for i in range(8))),
            allocation=alloc(*range(8)),
            expect_model="H100",
            expect_count=8,
        ),
        [],
    ),
    "8-GPU H100 node, NVML index order differs from bus order": (
        dict(
            node_map=tuple(NodeGpu(i, "H100", f"0000:{0x18 + 16 * i:02x}:00.0") for i in range(8)),
            inventory=inv(
                *(
                    gpu(
                        7 - i,
                        H100,
                        f"0000:{0x18 + 16 * i:02x}:00.0",
                    )
                    for i in range(8)
                )
            ),
        ),
        # the minor numbers follow the NVML index here, so every slot's device file is wrong
        [("gres-index", "warning", s) for s in range(8)],
    ),
    "MIG change pending": (
        dict(
            node_map=MIXED_MAP,
            inventory=inv(
                gpu(0, A100, mig_current=False, mig_pending=True),
                gpu(1, A100),
                gpu(2, V100),
                gpu(3, V100),
            ),
            allocation=alloc(0),
        ),
        [("mig-pending", "error", 0)],
    ),
    "MIG enabled and settled is not a finding": (
        dict(
            node_map=MIXED_MAP,
            inventory=inv(
                gpu(0, A100, mig_current=True, mig_pending=True),
                gpu(1, A100),
                gpu(2, V100),
                gpu(3, V100),
            ),
            allocation=alloc(0),
        ),
        [],
    ),
    "cuda-order: mixed allocation, order unset": (
        dict(
            node_map=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=alloc(1, 2),
            context=Context.JOB,
            cuda_device_order=None,
        ),
        [("cuda-order", "error", None)],
    ),
    "cuda-order: mixed allocation, FASTEST_FIRST": (
        dict(
            node_map=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=alloc(1, 2),
            context=Context.JOB,
            cuda_device_order="FASTEST_FIRST",
        ),
        [("cuda-order", "error", None)],
    ),
    "cuda-order: one model allocated on a mixed node": (
        dict(
            node_map=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=alloc(2, 3),
            context=Context.JOB,
            cuda_device_order=None,
        ),
        [],
    ),
    "cuda-order not checked in the Prolog": (
        dict(
            node_map=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=alloc(1, 2),
            context=Context.PROLOG,
            cuda_device_order=None,
        ),
        [],
    ),
    "node not in the map": (
        dict(node_map=None, inventory=MIXED_INV, allocation=alloc(2), expect_model="A100"),
        [("node-unmapped", "warning", None), ("alloc-model", "error", 2)],
    ),
    "GPU of no site model": (
        dict(node_map=slots("A100"), inventory=inv(gpu(0, "NVIDIA GeForce RTX 4090"))),
        [("model-mismatch", "error", 0)],
    ),
    "board replaced (UUID differs)": (
        dict(
            node_map=(NodeGpu(0, "A100", BUSES[0], "GPU-old"),),
            inventory=inv(gpu(0, A100)),
        ),
        [("gpu-uuid", "warning", 0)],
    ),
    # -- links, clocks, leftovers (each: a pass case and a fail case) ----------------------
    "PCIe link at full width": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, pcie_link_width=16, pcie_link_width_max=16)),
        ),
        [],
    ),
    "PCIe link trained at x8 of x16": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, pcie_link_width=8, pcie_link_width_max=16)),
        ),
        [("pcie-degraded", "warning", 0)],
    ),
    "PCIe generation below max at idle is information": (
        dict(
            node_map=slots("A100"),
            inventory=inv(
                gpu(
                    0,
                    A100,
                    pcie_link_width=16,
                    pcie_link_width_max=16,
                    pcie_link_gen=1,
                    pcie_link_gen_max=4,
                )
            ),  # fmt: skip
        ),
        [("pcie-degraded", "info", 0)],
    ),
    "NVLinks as many as the map says": (
        dict(
            node_map=(NodeGpu(0, "H100", BUSES[0], nvlinks=18),),
            inventory=inv(gpu(0, H100, nvlink_active=(True,) * 18)),
            allocation=alloc(0),
        ),
        [],
    ),
    "NVLink down on the job's GPU, map says 18": (
        dict(
            node_map=(NodeGpu(0, "H100", BUSES[0], nvlinks=18),),
            inventory=inv(gpu(0, H100, nvlink_active=(True,) * 17 + (False,))),
            allocation=alloc(0),
        ),
        [("nvlink-down", "error", 0)],
    ),
    "NVLink down, map silent: a warning": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, nvlink_active=(True, False, True))),
            allocation=alloc(0),
        ),
        [("nvlink-down", "warning", 0)],
    ),
    "NVLink all inactive, map silent (PCIe board, no bridge): nothing": (
        dict(node_map=slots("A100"), inventory=inv(gpu(0, A100, nvlink_active=(False,) * 12))),
        [],
    ),
    "NVLink unknown, map says 18: nothing (unknown fact)": (
        dict(
            node_map=(NodeGpu(0, "H100", BUSES[0], nvlinks=18),),
            inventory=inv(gpu(0, H100)),
        ),
        [],
    ),
    "NVSwitch fabric registered": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, fabric_state="completed", fabric_status=0)),
        ),
        [],
    ),
    "NVSwitch fabric in progress": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, fabric_state="in_progress")),
        ),
        [("nvlink-fabric", "error", 0)],
    ),
    "NVSwitch fabric completed with an error, GPU of another job": (
        dict(
            node_map=slots("A100", "A100"),
            inventory=inv(gpu(0, A100, fabric_state="completed", fabric_status=999), gpu(1, A100)),
            allocation=alloc(1),
        ),
        [("nvlink-fabric", "warning", 0)],
    ),
    "idle GPU, clocks not held down": (
        dict(node_map=slots("A100"), inventory=inv(gpu(0, A100, clock_event_reasons=0x1))),
        [],
    ),
    "hardware slowdown at job start": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, clock_event_reasons=0x1 | 0x8)),
            allocation=alloc(0),
        ),
        [("clocks-throttled", "error", 0)],
    ),
    "software thermal slowdown only: a warning": (
        dict(node_map=slots("A100"), inventory=inv(gpu(0, A100, clock_event_reasons=0x20))),
        [("clocks-throttled", "warning", 0)],
    ),
    "GPU cool": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, temperature=40, temperature_slowdown=90)),
        ),
        [],
    ),
    "GPU near its slowdown temperature": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, temperature=86, temperature_slowdown=90)),
        ),
        [("gpu-hot", "warning", 0)],
    ),
    "no process on the job's GPU": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, processes=())),
            allocation=alloc(0),
        ),
        [],
    ),
    "a leftover process on the job's GPU": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, processes=(GpuProcess(4242, 2**30, "python"),))),
            allocation=alloc(0),
        ),
        [("gpu-busy", "error", 0)],
    ),
    "a process on a GPU in MIG mode belongs to a slice: not a leftover": (
        dict(
            node_map=slots("A100"),
            inventory=inv(
                gpu(
                    0, A100, mig_current=True, mig_pending=True, processes=(GpuProcess(7, 1, None),)
                )
            ),
            allocation=alloc(0),
        ),
        [],
    ),
    "a process on another job's GPU is that job's": (
        dict(
            node_map=slots("A100", "A100"),
            inventory=inv(
                gpu(0, A100, processes=(GpuProcess(4242, 2**30, "python"),)), gpu(1, A100)
            ),
            allocation=alloc(1),
        ),
        [],
    ),
    "a process on the job's GPU, inside the job: a warning": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, processes=(GpuProcess(4242, None, None),))),
            allocation=alloc(0),
            context=Context.JOB,
            cuda_device_order="PCI_BUS_ID",
        ),
        [("gpu-busy", "warning", 0)],
    ),
    "power limit at the default": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, power_limit=400_000, power_limit_default=400_000)),
        ),
        [],
    ),
    "power limit below the default": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, power_limit=250_000, power_limit_default=400_000)),
        ),
        [("power-capped", "warning", 0)],
    ),
    "no page retirement pending": (
        dict(node_map=slots("V100"), inventory=inv(gpu(0, V100, retired_pages_pending=False))),
        [],
    ),
    "page retirement pending": (
        dict(node_map=slots("V100"), inventory=inv(gpu(0, V100, retired_pages_pending=True))),
        [("retired-pages-pending", "warning", 0)],
    ),
    "persistence mode on": (
        dict(node_map=slots("A100"), inventory=inv(gpu(0, A100, persistence_mode=True))),
        [],
    ),
    "persistence mode off": (
        dict(node_map=slots("A100"), inventory=inv(gpu(0, A100, persistence_mode=False))),
        [("persistence-off", "warning", 0)],
    ),
    "driver at the site's minimum": (
        dict(node_map=MIXED_MAP, inventory=MIXED_INV, driver_min="550.54.15"),
        [],
    ),
    "driver older than the site's minimum": (
        dict(node_map=MIXED_MAP, inventory=MIXED_INV, driver_min="550.90.07"),
        [("driver-version", "error", None)],
    ),
    "driver minimum, driver version unknown: nothing": (
        dict(
            node_map=MIXED_MAP,
            inventory=GpuInventory(MIXED_INV.gpus, None, None),
            driver_min="550.90.07",
        ),
        [],
    ),
    "CUDA version at the site's minimum": (
        dict(node_map=MIXED_MAP, inventory=MIXED_INV, cuda_min="12.4"),
        [],
    ),
    "CUDA version below the site's minimum": (
        dict(node_map=MIXED_MAP, inventory=MIXED_INV, cuda_min="12.6"),
        [("driver-version", "error", None)],
    ),
    "site turns a warning check into an error": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, persistence_mode=False)),
            severity={"persistence-off": "error"},
        ),
        [("persistence-off", "error", 0)],
    ),
    "site turns an error check into a warning": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, clock_event_reasons=0x8)),
            allocation=alloc(0),
            severity={"clocks-throttled": "warning"},
        ),
        [("clocks-throttled", "warning", 0)],
    ),
    "site turns a check off": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, processes=(GpuProcess(1, None, None),))),
            allocation=alloc(0),
            severity={"gpu-busy": "off"},
        ),
        [],
    ),
    "job's CPUs on the GPU's NUMA node": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, cpu_affinity="0-15,32-47")),
            allocation=alloc(0),
            job_cpus=frozenset({3, 4}),
        ),
        [],
    ),
    "job's CPUs all on the other NUMA node": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, cpu_affinity="0-15,32-47")),
            allocation=alloc(0),
            job_cpus=frozenset({16, 17, 48}),
        ),
        [("numa-affinity", "warning", 0)],
    ),
    "far GPU of another job is not the job's concern": (
        dict(
            node_map=slots("A100", "A100"),
            inventory=inv(gpu(0, A100, cpu_affinity="0-15"), gpu(1, A100, cpu_affinity="16-31")),
            allocation=alloc(1),
            job_cpus=frozenset({16}),
        ),
        [],
    ),
    "job's CPUs unknown (the Prolog): no NUMA check": (
        dict(
            node_map=slots("A100"),
            inventory=inv(gpu(0, A100, cpu_affinity="0-15")),
            allocation=alloc(0),
        ),
        [],
    ),
    "MIG slices as the map says": (
        dict(
            node_map=(NodeGpu(0, "A100", BUSES[0], mig=("3g.40gb", "3g.40gb")),),
            inventory=inv(gpu(0, A100, mig_current=True, mig_pending=True, mig_devices=HALVES)),
            allocation=Allocation(slots=None, mig_devices=(HALVES[1].uuid or "",), source="CVD"),
        ),
        [("alloc-env", "info", None)],
    ),
    "MIG off where the map lists slices": (
        dict(
            node_map=(NodeGpu(0, "A100", BUSES[0], mig=("3g.40gb", "3g.40gb")),),
            inventory=inv(gpu(0, A100, mig_current=False, mig_pending=False)),
        ),
        [("mig-mode", "error", 0)],
    ),
    "MIG on where the map says off, on another job's GPU": (
        dict(
            node_map=(NodeGpu(0, "A100", BUSES[0], mig=()), NodeGpu(1, "A100", BUSES[1])),
            inventory=inv(
                gpu(0, A100, mig_current=True, mig_pending=True, mig_devices=()), gpu(1, A100)
            ),
            allocation=alloc(1),
        ),
        [("mig-mode", "warning", 0)],
    ),
    "MIG mode change pending: mig-pending says it, not mig-mode": (
        dict(
            node_map=(NodeGpu(0, "A100", BUSES[0], mig=("3g.40gb",)),),
            inventory=inv(gpu(0, A100, mig_current=False, mig_pending=True)),
        ),
        [("mig-pending", "error", 0)],
    ),
    "MIG slices other than the map's": (
        dict(
            node_map=(NodeGpu(0, "A100", BUSES[0], mig=("1g.10gb",) * 7),),
            inventory=inv(gpu(0, A100, mig_current=True, mig_pending=True, mig_devices=HALVES)),
        ),
        [("mig-layout", "error", 0)],
    ),
    "MIG slices NVML could not list: unknown": (
        dict(
            node_map=(NodeGpu(0, "A100", BUSES[0], mig=("1g.10gb",) * 7),),
            inventory=inv(gpu(0, A100, mig_current=True, mig_pending=True)),
            allocation=Allocation(slots=None, mig_devices=("MIG-nope",), source="CVD"),
        ),
        [("alloc-env", "info", None)],
    ),
    "job given a MIG device the node does not have": (
        dict(
            node_map=(NodeGpu(0, "A100", BUSES[0]),),
            inventory=inv(gpu(0, A100, mig_current=True, mig_pending=True, mig_devices=HALVES)),
            allocation=Allocation(slots=None, mig_devices=("MIG-0000-gone",), source="CVD"),
        ),
        [("alloc-env", "info", None), ("alloc-mig", "error", None)],
    ),
    "job given a MIG slice of the profile it asked for": (
        dict(
            models={**MODELS, "A100-3g.40gb": (f"{A100} MIG 3g.40gb",)},
            node_map=(NodeGpu(0, "A100", BUSES[0]),),
            inventory=inv(gpu(0, A100, mig_current=True, mig_pending=True, mig_devices=HALVES)),
            allocation=Allocation(slots=None, mig_devices=(HALVES[0].uuid or "",), source="CVD"),
            expect_model="a100-3g.40gb",
        ),
        [("alloc-env", "info", None)],
    ),
    "job given a MIG slice of another profile than it asked for": (
        dict(
            models={**MODELS, "A100-1g.10gb": (f"{A100} MIG 1g.10gb",)},
            node_map=(NodeGpu(0, "A100", BUSES[0]),),
            inventory=inv(gpu(0, A100, mig_current=True, mig_pending=True, mig_devices=HALVES)),
            allocation=Allocation(slots=None, mig_devices=(HALVES[0].uuid or "",), source="CVD"),
            expect_model="A100-1g.10gb",
        ),
        [("alloc-env", "info", None), ("alloc-model", "error", 0)],
    ),
    "job given a MIG device in the older MIG-GPU-<uuid>/gi/ci form": (
        dict(
            node_map=(NodeGpu(0, "A100", BUSES[0]),),
            inventory=inv(gpu(0, A100, mig_current=True, mig_pending=True, mig_devices=HALVES)),
            allocation=Allocation(
                slots=None,
                mig_devices=("MIG-GPU-00000000-aaaa-bbbb-cccc-000000000000/2/0",),
                source="CVD",
            ),
        ),
        [("alloc-env", "info", None)],
    ),
    "error override keeps another job's GPU a warning, and information information": (
        dict(
            node_map=slots("A100", "A100"),
            inventory=inv(
                gpu(0, A100, fabric_state="in_progress"),
                gpu(1, A100, pcie_link_gen=1, pcie_link_gen_max=4),
            ),
            allocation=alloc(1),
            severity={"nvlink-fabric": "error", "pcie-degraded": "error"},
        ),
        [("nvlink-fabric", "warning", 0), ("pcie-degraded", "info", 1)],
    ),
}


def check(kw: dict[str, object]) -> PreflightReport:
    args: dict[str, object] = dict(node="gpu2", models=MODELS)
    args.update(kw)
    return run_checks(Facts(**args))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(CASES))
def test_check_table(name: str) -> None:
    kw, expected = CASES[name]
    report = check(kw)
    got = [(f.check_id, f.severity.value, f.slot) for f in report.findings]
    assert got == expected
    assert report.ok == (not any(sev == "error" for _, sev, _ in expected))
    assert all(f.check_id in CHECK_IDS for f in report.findings)
    assert all("\n" not in f.message and f.message.startswith("gpu2") for f in report.findings)


def test_swapped_message_names_node_slot_bus_expected_found() -> None:
    report = check(CASES["two GPUs swapped"][0])
    assert [f.message for f in report.errors] == [
        "gpu2: slot 1 (0000:0b:00.0): expected A100, found Tesla V100-SXM2-32GB (V100) -- "
        "boards swapped or node map wrong",
        "gpu2: slot 2 (0000:48:00.0): expected V100, found NVIDIA A100-SXM4-80GB (A100) -- "
        "boards swapped or node map wrong",
    ]
    assert [(r.slot, r.status) for r in report.rows] == [
        (0, "ok"),
        (1, "model-mismatch"),
        (2, "model-mismatch"),
        (3, "ok"),
    ]


def test_missing_by_bus_id_names_the_missing_slot() -> None:
    report = check(CASES["one GPU missing"][0])
    missing = [f for f in report.findings if f.check_id == "gpu-missing"][0]
    assert missing.message == (
        "gpu2: slot 2 (0000:48:00.0): expected V100, found nothing -- GPU missing or fallen "
        "off the bus"
    )
    assert (missing.bus_id, missing.expected, missing.found) == ("0000:48:00.0", "V100", None)


def test_health_finding_fields() -> None:
    report = check(CASES["uncorrectable ECC on an allocated GPU"][0])
    (f,) = report.findings
    assert f.message == (
        "gpu2: slot 0 (0000:07:00.0): NVIDIA A100-SXM4-80GB: 3 uncorrectable ECC error(s) "
        "since the last reset"
    )
    assert f.to_dict()["severity"] == "error"


def test_uuid_allocation_resolved_against_inventory() -> None:
    a = allocation_from_env({"CUDA_VISIBLE_DEVICES": "GPU-00000002-aaaa"}, Context.JOB)
    report = check(
        dict(
            node_map=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=a,
            expect_model="A100",
            expect_count=1,
        )
    )
    assert report.allocated_slots == (2,)
    assert [f.check_id for f in report.findings] == ["alloc-model"]


def test_unknown_uuid_is_an_error() -> None:
    a = allocation_from_env({"CUDA_VISIBLE_DEVICES": "GPU-deadbeef"}, Context.JOB)
    report = check(dict(node_map=MIXED_MAP, inventory=MIXED_INV, allocation=a))
    assert [f.check_id for f in report.errors] == ["alloc-slot"]


def test_model_for_nvml_name_is_exact_and_case_insensitive() -> None:
    assert model_for_nvml_name("tesla v100-sxm2-32gb", MODELS) == "V100"
    assert model_for_nvml_name("Tesla V100-SXM2-16GB", MODELS) is None
    assert model_for_nvml_name(None, MODELS) is None


def test_table_render() -> None:
    report = check(
        dict(
            node_map=MIXED_MAP,
            inventory=inv(gpu(0, A100), gpu(1, V100), gpu(2, A100), gpu(3, V100)),
            allocation=alloc(1),
        )
    )
    assert render_table(report).splitlines() == [
        "SLOT  BUS ID        EXPECTED  FOUND                         STATUS",
        "0     0000:07:00.0  A100      NVIDIA A100-SXM4-80GB (A100)  ok",
        "1*    0000:0b:00.0  A100      Tesla V100-SXM2-32GB (V100)   model-mismatch",
        "2     0000:48:00.0  V100      NVIDIA A100-SXM4-80GB (A100)  model-mismatch",
        "3     0000:4c:00.0  V100      Tesla V100-SXM2-32GB (V100)   ok",
        "error: model-mismatch: gpu2: slot 1 (0000:0b:00.0): expected A100, found Tesla "
        "V100-SXM2-32GB (V100) -- boards swapped or node map wrong",
        "error: model-mismatch: gpu2: slot 2 (0000:48:00.0): expected V100, found NVIDIA "
        "A100-SXM4-80GB (A100) -- boards swapped or node map wrong",
        "preflight gpu2: FAILED (2 error(s), 0 warning(s))",
    ]


def test_summary_line_ok() -> None:
    report = check(dict(node_map=MIXED_MAP, inventory=MIXED_INV))
    assert summary_line(report) == "preflight gpu2: OK (4 GPU slot(s))"


# -- the registry ----------------------------------------------------------------------------

# The check ids log readers rely on: renaming or dropping one is a breaking change.
DOCUMENTED_IDS = {
    "node-unmapped",
    "gpu-count",
    "gpu-missing",
    "gpu-extra",
    "model-mismatch",
    "gpu-uuid",
    "gres-index",
    "alloc-slot",
    "alloc-model",
    "alloc-count",
    "alloc-env",
    "cuda-order",
    "gpu-lost",
    "ecc-uncorrectable",
    "row-remap-pending",
    "row-remap-failure",
    "mig-pending",
    "pcie-degraded",
    "nvlink-down",
    "nvlink-fabric",
    "clocks-throttled",
    "gpu-hot",
    "gpu-busy",
    "persistence-off",
    "driver-version",
    "numa-affinity",
    "mig-mode",
    "mig-layout",
    "alloc-mig",
    "power-capped",
    "retired-pages-pending",
}
RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}


def test_registry_ids_are_the_documented_ids_and_each_check_has_a_severity() -> None:
    assert len(CHECK_IDS) == len(set(CHECK_IDS))
    assert set(CHECK_IDS) == DOCUMENTED_IDS
    for c in REGISTRY.checks:
        assert isinstance(c.severity, Severity), c
        assert isinstance(c.stage, Stage) and c.needs <= set(Need), c
    stages = [c.stage for c in REGISTRY.checks]
    assert stages == sorted(stages)


@pytest.mark.parametrize("name", list(CASES))
def test_findings_never_exceed_their_checks_severity(name: str) -> None:
    """... or the severity the site gave the check in its place."""
    kw = CASES[name][0]
    site = dict(kw.get("severity", {}))  # type: ignore[call-overload]
    worst = {}
    for c in REGISTRY.checks:
        worst[c.id] = max(RANK[c.severity], worst.get(c.id, 0))
    for f in check(kw).findings:
        limit = RANK[Severity(site[f.check_id])] if f.check_id in site else worst[f.check_id]
        assert RANK[f.severity] <= limit, f


def test_a_new_check_is_one_registered_function() -> None:
    registry = Registry()

    @registry.check("fan-speed", Severity.WARNING, stage=Stage.HEALTH)
    def fan_speed(facts: Facts, gpu: object) -> Iterator[Observation]:
        yield Observation(f"{facts.node}: {getattr(gpu, 'bus_id', '?')}: fan slow", found="slow")

    @registry.check("wants-count", Severity.ERROR, stage=Stage.MAP, needs={Need.EXPECT_COUNT})
    def wants_count(facts: Facts) -> Iterator[Observation]:
        yield Observation(f"{facts.node}: never without expect_count")

    report = run_checks(
        Facts(node="gpu2", node_map=MIXED_MAP, models=MODELS, inventory=MIXED_INV),
        registry,
    )
    assert registry.ids == ("wants-count", "fan-speed")
    assert [(f.check_id, f.severity, f.message) for f in report.findings] == [
        ("fan-speed", Severity.WARNING, f"gpu2: {bus}: fan slow") for bus in BUSES
    ]
    assert [r.status for r in report.rows] == ["ok"] * 4  # no slot named: the rows stay ok


def test_the_site_schema_knows_every_check_id() -> None:
    """site/model.py lists the ids the site file may name (it sits below the registry)."""
    from clusterjob.site.nodemodel import NODE_CHECK_IDS

    assert sorted(NODE_CHECK_IDS) == sorted(CHECK_IDS)


def test_mig_profile_message_names_what_was_asked_and_given() -> None:
    report = check(CASES["job given a MIG slice of another profile than it asked for"][0])
    assert [f.message for f in report.errors] == [
        f"gpu2: slot 0 (0000:07:00.0): job asked for A100-1g.10gb, was given MIG device "
        f"{HALVES[0].uuid}: {A100} MIG 3g.40gb (not a model of this site)"
    ]
