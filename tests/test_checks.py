"""Table-driven tests of the pure preflight checks (clusterjob.node.checks).

Inventories here are built by hand: these are unit tests of the comparison logic. The same
scenarios run end to end over pynvml and the stand-in NVML library in test_hooks_nvml.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.node.allocation import Allocation, Context, allocation_from_env
from clusterjob.node.checks import CHECK_IDS, PreflightReport, model_of, run_checks
from clusterjob.node.report import render_table, summary_line
from clusterjob.site.model import NodeGpu

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
MIXED_INV = inv(gpu(0, A100), gpu(1, A100), gpu(2, V100), gpu(3, V100))

# name -> (kwargs for run_checks, expected [(check_id, severity, slot)])
CASES: dict[str, tuple[dict[str, object], list[tuple[str, str, int | None]]]] = {
    "good mixed A100+V100 node": (dict(expected=MIXED_MAP, inventory=MIXED_INV), []),
    "good node, job given both models, PCI order": (
        dict(
            expected=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=alloc(1, 2),
            check_cuda_order=True,
            cuda_device_order="PCI_BUS_ID",
        ),
        [],
    ),
    "two GPUs swapped": (
        dict(
            expected=MIXED_MAP,
            inventory=inv(gpu(0, A100), gpu(1, V100), gpu(2, A100), gpu(3, V100)),
        ),
        [("model-mismatch", "error", 1), ("model-mismatch", "error", 2)],
    ),
    "two GPUs swapped, map without bus IDs": (
        dict(
            expected=slots("A100", "A100", "V100", "V100", bus_ids=False),
            inventory=inv(gpu(0, A100), gpu(1, V100), gpu(2, A100), gpu(3, V100)),
        ),
        [("model-mismatch", "error", 1), ("model-mismatch", "error", 2)],
    ),
    "one GPU missing": (
        dict(expected=MIXED_MAP, inventory=inv(gpu(0, A100), gpu(1, A100), gpu(3, V100))),
        [("gpu-count", "error", None), ("gpu-missing", "error", 2)],
    ),
    "extra GPU not in the map": (
        dict(
            expected=slots("A100", "A100"),
            inventory=inv(gpu(0, A100), gpu(1, A100), gpu(2, V100)),
        ),
        [("gpu-count", "error", None), ("gpu-extra", "error", None)],
    ),
    "wrong model allocated": (
        dict(expected=MIXED_MAP, inventory=MIXED_INV, allocation=alloc(2), expect_model="A100"),
        [("alloc-model", "error", 2)],
    ),
    "requested model matched case-insensitively": (
        dict(expected=MIXED_MAP, inventory=MIXED_INV, allocation=alloc(0), expect_model="a100"),
        [],
    ),
    "fewer GPUs allocated than asked": (
        dict(expected=MIXED_MAP, inventory=MIXED_INV, allocation=alloc(0), expect_count=2),
        [("alloc-count", "error", None)],
    ),
    "GPUs asked, none in the environment": (
        dict(expected=MIXED_MAP, inventory=MIXED_INV, allocation=None, expect_count=1),
        [("alloc-count", "error", None)],
    ),
    "allocated index beyond the node": (
        dict(expected=MIXED_MAP, inventory=MIXED_INV, allocation=alloc(0, 5)),
        [("alloc-slot", "error", None)],
    ),
    "minor != index, GPU not given to the job": (
        dict(
            expected=MIXED_MAP,
            inventory=inv(
                gpu(0, A100),
                replace(gpu(1, A100), minor=2),
                replace(gpu(2, V100), minor=1),
                gpu(3, V100),
            ),
            allocation=alloc(0),
        ),
        [("gres-index", "warning", 1), ("gres-index", "warning", 2)],
    ),
    "minor != index, GPU given to the job": (
        dict(
            expected=MIXED_MAP,
            inventory=inv(
                gpu(0, A100),
                replace(gpu(1, A100), minor=2),
                replace(gpu(2, V100), minor=1),
                gpu(3, V100),
            ),
            allocation=alloc(1),
        ),
        [("gres-index", "error", 1), ("gres-index", "warning", 2)],
    ),
    "GPU lost": (
        dict(
            expected=MIXED_MAP,
            inventory=inv(
                gpu(0, A100), gpu(1, A100), replace(gpu(2, V100), lost=True), gpu(3, V100)
            ),
            allocation=alloc(0),
        ),
        [("gpu-lost", "error", 2)],
    ),
    "uncorrectable ECC on an allocated GPU": (
        dict(
            expected=MIXED_MAP,
            inventory=inv(
                gpu(0, A100, ecc_uncorrectable_volatile=3), gpu(1, A100), gpu(2, V100), gpu(3, V100)
            ),
            allocation=alloc(0),
        ),
        [("ecc-uncorrectable", "error", 0)],
    ),
    "uncorrectable ECC on a GPU of another job": (
        dict(
            expected=MIXED_MAP,
            inventory=inv(
                gpu(0, A100, ecc_uncorrectable_volatile=3), gpu(1, A100), gpu(2, V100), gpu(3, V100)
            ),
            allocation=alloc(1),
        ),
        [("ecc-uncorrectable", "warning", 0)],
    ),
    "uncorrectable ECC, allocation unknown": (
        dict(
            expected=MIXED_MAP,
            inventory=inv(
                gpu(0, A100, ecc_uncorrectable_volatile=1), gpu(1, A100), gpu(2, V100), gpu(3, V100)
            ),
        ),
        [("ecc-uncorrectable", "error", 0)],
    ),
    "row remap pending and failed": (
        dict(
            expected=MIXED_MAP,
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
            expected=tuple(NodeGpu(i, "H100", f"0000:{0x18 + 16 * i:02x}:00.0") for i in range(8)),
            inventory=inv(*(gpu(i, H100, f"0000:{0x18 + 16 * i:02x}:00.0") for i in range(8))),
            allocation=alloc(*range(8)),
            expect_model="H100",
            expect_count=8,
        ),
        [],
    ),
    "8-GPU H100 node, NVML index order differs from bus order": (
        dict(
            expected=tuple(NodeGpu(i, "H100", f"0000:{0x18 + 16 * i:02x}:00.0") for i in range(8)),
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
            expected=MIXED_MAP,
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
            expected=MIXED_MAP,
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
            expected=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=alloc(1, 2),
            check_cuda_order=True,
            cuda_device_order=None,
        ),
        [("cuda-order", "error", None)],
    ),
    "cuda-order: mixed allocation, FASTEST_FIRST": (
        dict(
            expected=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=alloc(1, 2),
            check_cuda_order=True,
            cuda_device_order="FASTEST_FIRST",
        ),
        [("cuda-order", "error", None)],
    ),
    "cuda-order: one model allocated on a mixed node": (
        dict(
            expected=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=alloc(2, 3),
            check_cuda_order=True,
            cuda_device_order=None,
        ),
        [],
    ),
    "cuda-order not checked in the Prolog": (
        dict(
            expected=MIXED_MAP,
            inventory=MIXED_INV,
            allocation=alloc(1, 2),
            check_cuda_order=False,
            cuda_device_order=None,
        ),
        [],
    ),
    "node not in the map": (
        dict(expected=None, inventory=MIXED_INV, allocation=alloc(2), expect_model="A100"),
        [("node-unmapped", "warning", None), ("alloc-model", "error", 2)],
    ),
    "GPU of no site model": (
        dict(expected=slots("A100"), inventory=inv(gpu(0, "NVIDIA GeForce RTX 4090"))),
        [("model-mismatch", "error", 0)],
    ),
    "board replaced (UUID differs)": (
        dict(
            expected=(NodeGpu(0, "A100", BUSES[0], "GPU-old"),),
            inventory=inv(gpu(0, A100)),
        ),
        [("gpu-uuid", "warning", 0)],
    ),
}


def check(kw: dict[str, object]) -> PreflightReport:
    args: dict[str, object] = dict(node="gpu2", models=MODELS)
    args.update(kw)
    return run_checks(**args)  # type: ignore[arg-type]


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
            expected=MIXED_MAP,
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
    report = check(dict(expected=MIXED_MAP, inventory=MIXED_INV, allocation=a))
    assert [f.check_id for f in report.errors] == ["alloc-slot"]


def test_model_of_is_exact_and_case_insensitive() -> None:
    assert model_of("tesla v100-sxm2-32gb", MODELS) == "V100"
    assert model_of("Tesla V100-SXM2-16GB", MODELS) is None
    assert model_of(None, MODELS) is None


def test_table_render() -> None:
    report = check(
        dict(
            expected=MIXED_MAP,
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
    report = check(dict(expected=MIXED_MAP, inventory=MIXED_INV))
    assert summary_line(report) == "preflight gpu2: OK (4 GPU slot(s))"
