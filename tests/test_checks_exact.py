"""Every finding of the check table (test_checks.CASES) word for word: message, slot, bus
ID, expected and found, as the Prolog's JSON log and ``preflight --json`` carry them, and
the table ``preflight`` prints.

The golden file is regenerated only on purpose: ``CLUSTERJOB_REGEN_GOLDEN=1 pytest
tests/test_checks_exact.py``, then review its diff.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from test_checks import A100, CASES, MIXED_INV, MIXED_MAP, V100, check, gpu, inv
from test_checks_mig import MAP, migs, sliced
from test_render_golden import assert_golden

from clusterjob.gpu.inventory import MigDevice
from clusterjob.node.allocation import Context, allocation_from_env
from clusterjob.node.report import render_table, summary_line

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


SLICE_MODELS = {f"A100-{p}": (f"{A100} MIG {p}",) for p in ("3g.40gb", "2g.20gb", "1g.10gb")}
SHARED_UUIDS = replace(
    MIXED_INV,
    gpus=tuple(replace(g, uuid="GPU-dup") if g.index >= 2 else g for g in MIXED_INV.gpus),
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
