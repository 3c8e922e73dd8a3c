"""Every finding of the check table (test_checks.CASES) word for word: message, slot, bus
ID, expected and found, as the Prolog's JSON log and ``preflight --json`` carry them, and
the table ``preflight`` prints.

The golden file is regenerated only on purpose: ``CLUSTERJOB_REGEN_GOLDEN=1 pytest
tests/test_checks_exact.py``, then review its diff.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_checks import A100, CASES, H100, MIXED_INV, MIXED_MAP, V100, check, gpu, inv, slots
from test_checks_mig import MAP, migs, sliced
from test_render_golden import assert_golden

from clusterjob.gpu.inventory import GpuProcess, MigDevice
from clusterjob.node.allocation import Allocation, Context, allocation_from_env
from clusterjob.node.report import render_table, summary_line
from clusterjob.site.nodemodel import NodeGpu

GOLDEN = Path(__file__).parent / "golden" / "check-findings.json"


def job(env: dict[str, str], **kw: object) -> dict[str, object]:
    """Facts of a job on the mixed node, its GPUs as the environment names them."""
    facts: dict[str, object] = dict(
        node_map=MIXED_MAP,
        inventory=MIXED_INV,
        allocation=allocation_from_env(env, Context.JOB),
        context=Context.JOB,
    )
    facts.update(kw)
    return facts


X16: dict[str, object] = {"pcie_link_width": 16, "pcie_link_width_max": 16}
SLICE_MODELS = {f"A100-{p}": (f"{A100} MIG {p}",) for p in ("3g.40gb", "2g.20gb", "1g.10gb")}
SHARED_UUIDS = MIXED_INV.replace(
    gpus=tuple(g.replace(uuid="GPU-dup") if g.index >= 2 else g for g in MIXED_INV.gpus),
)
ON_GPU_1 = (MigDevice(0, "MIG-on-gpu1", f"{A100} MIG 3g.40gb", None, 1, 0),)

# More scenarios, for the checks the table above leaves without a finding
MORE: dict[str, dict[str, object]] = {
    "a UUID in CUDA_VISIBLE_DEVICES that is no GPU of this node": job(
        {"CUDA_VISIBLE_DEVICES": "GPU-ffffffff-0000-0000-0000-000000000000"}
    ),
    "a UUID that two GPUs of this node report": {
        **job({"CUDA_VISIBLE_DEVICES": "GPU-dup"}),
        "inventory": SHARED_UUIDS,
    },
    "a MIG device on a node without MIG devices": job(
        {"CUDA_VISIBLE_DEVICES": "MIG-aaaaaaaa-1111-2222-3333-444444444444"}
    ),
    "a MIG device this node does not list": {
        **job({"CUDA_VISIBLE_DEVICES": "MIG-aaaaaaaa-1111-2222-3333-444444444444"}),
        "node_map": MAP,
        "inventory": sliced(migs("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")),
        "models": {"A100": (A100,), **SLICE_MODELS},
    },
    "a MIG device on the GPU next to it": {
        **job({"CUDA_VISIBLE_DEVICES": "MIG-on-gpu1"}),
        "node_map": MAP,
        "inventory": inv(gpu(0, A100), gpu(1, A100, mig_current=True, mig_devices=ON_GPU_1)),
        "models": {"A100": (A100,), **SLICE_MODELS},
    },
    "MIG switching on at the next reset, on the job's GPU": job(
        {"SLURM_JOB_GPUS": "0"},
        inventory=inv(
            gpu(0, A100, mig_current=False, mig_pending=True),
            gpu(1, A100, mig_current=True, mig_pending=False),
            gpu(2, V100, mig_current=False, mig_pending=False),
            gpu(3, V100),
        ),
    ),
    "two hardware clock reasons on a GPU the job was not given": job(
        {"SLURM_JOB_GPUS": "1"},
        inventory=inv(gpu(0, A100, clock_event_reasons=0x8 | 0x40), gpu(1, A100)),
        node_map=slots("A100", "A100"),
    ),
    "two NVLink links down, on a GPU the job was not given": job(
        {"SLURM_JOB_GPUS": "1"},
        node_map=(
            NodeGpu(0, "H100", "0000:07:00.0", nvlinks=4),
            NodeGpu(1, "H100", "0000:0b:00.0"),
        ),
        inventory=inv(gpu(0, H100, nvlink_active=(True, False, True, False)), gpu(1, H100)),
    ),
    "three links of four up, none expected by the map": {
        "node_map": slots("A100"),
        "inventory": inv(gpu(0, A100, nvlink_active=(True, True, False, True))),
    },
    "all links up": {
        "node_map": slots("A100"),
        "inventory": inv(gpu(0, A100, nvlink_active=(True, True, True, True))),
    },
    "two processes on an idle GPU, one without a name or user": {
        "node_map": slots("A100"),
        "inventory": inv(
            gpu(0, A100, processes=(GpuProcess(11, 2**30, "python"), GpuProcess(12, None, None)))
        ),
    },
    "a driver whose version NVML cannot name, and an old CUDA": {
        "node_map": MIXED_MAP,
        "inventory": MIXED_INV.replace(driver_version=None, cuda_driver_version=11080),
        "driver_min": "550",
        "cuda_min": "12.1",
    },
    "CUDA 12.4 where 12.4 is the minimum": {
        "node_map": MIXED_MAP,
        "inventory": MIXED_INV,
        "cuda_min": "12.4",
        "driver_min": "550.54.15",
    },
    "a GPU exactly at the hot margin": {
        "node_map": slots("A100"),
        "inventory": inv(gpu(0, A100, temperature=85, temperature_slowdown=90)),
    },
    "a GPU one degree under the hot margin": {
        "node_map": slots("A100"),
        "inventory": inv(gpu(0, A100, temperature=84, temperature_slowdown=90)),
    },
    "PCIe at its top generation, and one below it": {
        "node_map": slots("A100", "A100"),
        "inventory": inv(
            gpu(0, A100, pcie_link_gen=4, pcie_link_gen_max=4, **X16),
            gpu(1, A100, pcie_link_gen=3, pcie_link_gen_max=4, **X16),
        ),
    },
    "power capped on one GPU, no default known for the other": {
        "node_map": slots("A100", "A100"),
        "inventory": inv(
            gpu(0, A100, power_limit=300_000),
            gpu(1, A100, power_limit=300_000, power_limit_default=400_000),
        ),
    },
    "a job expecting GPUs with no GPU variable set": {
        "node_map": MIXED_MAP,
        "inventory": MIXED_INV,
        "allocation": allocation_from_env({}, Context.JOB),
        "context": Context.JOB,
        "expect_count": 2,
    },
    "a slice given by GRES index that NVML does not list": {
        "node_map": MAP,
        "models": {"A100": (A100,), **SLICE_MODELS},
        "inventory": sliced(migs("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb", first_gi=2)),
        "allocation": Allocation(slots=(0,), source="SLURM_JOB_GPUS"),
        "context": Context.JOB,
    },
    "a driver that supports CUDA 12.0 where 12.1 is the minimum": {
        "node_map": MIXED_MAP,
        "inventory": MIXED_INV.replace(cuda_driver_version=12000),
        "cuda_min": "12.1",
    },
    "GPU variables that cannot be read": job(
        {"SLURM_JOB_GPUS": "0,x", "CUDA_VISIBLE_DEVICES": "0,1"}
    ),
}


def test_every_finding_of_the_check_table_word_for_word() -> None:
    cases = {}
    for name, (kw, _) in [*CASES.items(), *((n, (kw, None)) for n, kw in MORE.items())]:
        report = check(kw)
        cases[name] = {
            "findings": [f.to_dict() for f in report.findings],
            "summary": summary_line(report),
            "table": render_table(report).splitlines(),
        }
    assert_golden(GOLDEN, json.dumps(cases, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
