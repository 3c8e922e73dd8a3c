"""Workstation GPU choice as pure functions: model names, memory, processes, claims, order."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from clusterjob.cli.workstation import WAIT_FOREVER, fill_wait_value
from clusterjob.errors import ClusterjobError, UsageError
from clusterjob.gpu.inventory import Gpu, GpuInventory, GpuProcess
from clusterjob.site.gpu_syntax import syntax_named
from clusterjob.site.model import GpuModel, NodeMap, Site
from clusterjob.site.nodemodel import NodeGpu
from clusterjob.workstation import claims
from clusterjob.workstation.known_models import known_model, known_model_for_nvml_name
from clusterjob.workstation.launch import Acquired, command_environment, parse_timeout
from clusterjob.workstation.selection import (
    GIB,
    GpuRequest,
    builtin_catalog,
    busy_message,
    choose_gpus,
    gpus_for_request,
    parse_size,
    pci_positions,
    site_catalog,
)


def gpu(
    bus: str,
    name: str = "NVIDIA A100-SXM4-80GB",
    *,
    index: int = 0,
    used_gib: float = 0,
    total_gib: int = 80,
    procs: int = 0,
    uuid: str | None = "",
) -> Gpu:
    return Gpu(
        index=index,
        bus_id=f"0000:{bus}:00.0",
        name=name,
        uuid=f"GPU-{bus}" if uuid == "" else uuid,
        memory_total=total_gib * GIB,
        memory_used=int(used_gib * GIB),
        processes=tuple(GpuProcess(1000 + i, GIB, "python") for i in range(procs)),
    )


def inventory(*gpus: Gpu) -> GpuInventory:
    return GpuInventory(
        gpus=tuple(sorted(gpus, key=lambda g: g.bus_id)),
        driver_version="550",
        cuda_driver_version=12040,
    )


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("Tesla V100S-PCIE-32GB", "V100"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA GeForce RTX 3090 Ti", "RTX 3090 Ti"),
        ("GeForce GTX 1080 Ti", "1080 Ti"),
        ("NVIDIA GeForce GTX 1080 Ti", "1080 Ti"),
        ("NVIDIA RTX A6000", "A6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("Quadro RTX 6000", "RTX 6000"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L4", "L4"),
        ("Tesla T4", "T4"),
        ("NVIDIA Some Future Card", None),
    ],
)
def test_builtin_table_matches_whole_names_not_substrings(nvml_name, model):
    found = known_model_for_nvml_name(nvml_name)
    assert (found.name if found else None) == model


@pytest.mark.parametrize(
    ("typed", "model"),
    [
        ("a100", "A100"),
        ("RTX 3090", "RTX 3090"),
        ("rtx-3090", "RTX 3090"),
        ("3090", "RTX 3090"),
        ("3090ti", "RTX 3090 Ti"),
        ("1080ti", "1080 Ti"),
        ("1080 Ti", "1080 Ti"),
        ("rtx a6000", "A6000"),
        ("l40s", "L40S"),
        ("nonsense", None),
    ],
)
def test_typed_model_names_and_aliases(typed, model):
    found = known_model(typed)
    assert (found.name if found else None) == model


def test_idle_gpus_win_in_pci_bus_order_whatever_the_nvml_index():
    inv = inventory(
        gpu("3b", index=0, procs=1), gpu("1a", index=3), gpu("88", index=1), gpu("07", index=2)
    )
    model, candidates = gpus_for_request(inv, builtin_catalog(), GpuRequest(2, "A100"))
    choice = choose_gpus(candidates, GpuRequest(2, "A100"), {})
    assert model == "A100"
    assert [g.bus_id[5:7] for g in choice.chosen] == ["07", "1a"]
    assert [g.bus_id[5:7] for g, _ in choice.passed_over] == ["3b"]


def test_model_memory_and_processes_each_rule_a_gpu_out():
    inv = inventory(
        gpu("07", procs=2),
        gpu("0b", used_gib=70),
        gpu("0c", "Tesla V100-SXM2-32GB", total_gib=32),
        gpu("0d", used_gib=10),
    )
    request = GpuRequest(1, "a100", min_free_mem=40 * GIB)
    _, candidates = gpus_for_request(inv, builtin_catalog(), request)
    assert len(candidates) == 3  # the V100 is not an A100
    choice = choose_gpus(candidates, request, {})
    assert [g.bus_id for g in choice.chosen] == ["0000:0d:00.0"]
    reasons = dict((g.bus_id[5:7], r) for g, r in choice.passed_over)
    assert "2 compute processes" in reasons["07"] and "pid 1000 python" in reasons["07"]
    assert reasons["0b"] == "only 10.0 GiB free"


def test_claimed_gpus_are_never_shared_even_with_allow_shared():
    inv = inventory(gpu("07"), gpu("0b", procs=3), gpu("0c", procs=1))
    request = GpuRequest(1, "A100", allow_shared=True)
    _, candidates = gpus_for_request(inv, builtin_catalog(), request)
    choice = choose_gpus(candidates, request, {"GPU-07": "alice (pid 1)"})
    assert [g.uuid for g in choice.chosen] == ["GPU-0c"]  # fewest processes, not the claimed one
    busy = choose_gpus(candidates, GpuRequest(3, "A100", allow_shared=True), {"GPU-07": "alice"})
    assert not busy.ok
    msg = busy_message("A100", GpuRequest(3, "A100"), busy, pci_positions(inv))
    assert msg.startswith("no 3 A100 GPUs free now: GPU 0 (0000:07:00.0) claimed by alice")


def test_without_allow_shared_a_gpu_with_processes_is_busy():
    inv = inventory(gpu("07", procs=1), gpu("0b", procs=1))
    request = GpuRequest(1, "A100")
    _, candidates = gpus_for_request(inv, builtin_catalog(), request)
    choice = choose_gpus(candidates, request, {})
    assert not choice.ok
    assert "GPU 1 (0000:0b:00.0) in use by 1 compute process" in busy_message(
        "A100", request, choice, pci_positions(inv)
    )


def test_requests_this_machine_can_never_serve_are_usage_errors():
    inv = inventory(gpu("07"), gpu("0b"), gpu("0c", "Tesla V100-SXM2-32GB", total_gib=32))
    with pytest.raises(UsageError, match=r"unknown GPU model 'H900'.*2x A100 .*1x V100"):
        gpus_for_request(inv, builtin_catalog(), GpuRequest(1, "H900"))
    with pytest.raises(UsageError, match=r"no H200 GPU on this machine; .*2x A100"):
        gpus_for_request(inv, builtin_catalog(), GpuRequest(1, "h200"))
    with pytest.raises(UsageError, match=r"only 2 A100 GPUs here"):
        gpus_for_request(inv, builtin_catalog(), GpuRequest(3, "A100"))
    with pytest.raises(UsageError, match=r"several GPU models"):
        gpus_for_request(inv, builtin_catalog(), GpuRequest(1))
    with pytest.raises(UsageError, match=r"--min-free-mem 40.0 GiB: only 0 V100"):
        gpus_for_request(inv, builtin_catalog(), GpuRequest(1, "V100", min_free_mem=40 * GIB))


def test_unknown_card_is_asked_for_by_its_nvml_name():
    inv = inventory(gpu("07", "NVIDIA Prototype X1"))
    model, gpus = gpus_for_request(inv, builtin_catalog(), GpuRequest(1, "nvidia prototype x1"))
    assert model == "NVIDIA Prototype X1" and len(gpus) == 1


def _site(node: str, slots: tuple[NodeGpu, ...]) -> Site:
    big = GpuModel("BIG", ("big", "a100-80"), "a100", ("NVIDIA A100-SXM4-80GB",), 80)
    old = GpuModel("OLD", ("old",), "v100", ("Tesla V100-SXM2-32GB",), 32)
    return Site(
        name="lab",
        cluster_name=None,
        source=Path("lab.yaml"),
        gpu_syntax=syntax_named("gres"),
        type_required=True,
        models=(big, old),
        partitions=(),
        node_map=NodeMap({node: slots}),
    )


def test_a_site_describing_this_machine_gives_its_models_and_aliases():
    inv = inventory(gpu("07"), gpu("0b", "Tesla V100-SXM2-32GB", total_gib=32))
    site = _site("ws01", (NodeGpu(0, "BIG"), NodeGpu(1, "OLD", bus_id="0000:0b:00.0")))
    catalog = site_catalog(site, ("ws01", "ws01.lab.example"), inv)
    assert catalog.source == "site lab, node ws01"
    model, gpus = gpus_for_request(inv, catalog, GpuRequest(1, "a100-80"))
    assert model == "BIG" and [g.bus_id for g in gpus] == ["0000:07:00.0"]
    with pytest.raises(UsageError, match=r"1x BIG .*1x OLD .*site lab, node ws01"):
        gpus_for_request(inv, catalog, GpuRequest(1, "H100"))
    elsewhere = site_catalog(site, ("other",), inv)
    assert elsewhere.source.startswith("built-in model table (site lab has no node other)")


@pytest.mark.parametrize(
    ("text", "size"),
    [("20G", 20 * GIB), ("20GB", 20 * GIB), ("20GiB", 20 * GIB), ("512m", 512 * 1024**2)],
)
def test_sizes(text, size):
    assert parse_size(text) == size


def test_a_bare_number_is_not_a_size():
    with pytest.raises(UsageError, match="with a unit"):
        parse_size("20")


def test_wait_timeouts():
    assert parse_timeout(None) is None
    assert parse_timeout("90") == 90
    assert parse_timeout("10m") == 600
    assert parse_timeout("1.5h") == 5400
    with pytest.raises(UsageError):
        parse_timeout("soon")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--wait", "--", "x"], ["--wait", WAIT_FOREVER, "--", "x"]),
        (["--wait", "60", "--", "x"], ["--wait", "60", "--", "x"]),
        (["--wait", "--gpus", "2", "x"], ["--wait", WAIT_FOREVER, "--gpus", "2", "x"]),
        (["--gpus", "2", "--wait"], ["--gpus", "2", "--wait", WAIT_FOREVER]),
        (["--wait", "python", "t.py"], ["--wait", WAIT_FOREVER, "python", "t.py"]),
        (["--wait", "soon", "--", "x"], ["--wait", "soon", "--", "x"]),  # then: a clear error
        # the command's own --wait is the command's business
        (["--gpus", "1", "--", "x", "--wait"], ["--gpus", "1", "--", "x", "--wait"]),
        (["--model", "--wait", "x"], ["--model", "--wait", "x"]),
    ],
)
def test_bare_wait_gets_a_value_and_the_command_is_untouched(args, expected):
    assert fill_wait_value(args) == expected


def test_environment_names_the_chosen_cards_by_uuid():
    inv = inventory(gpu("07"), gpu("0b", uuid=None), gpu("0c"))
    chosen = (inv.gpus[1], inv.gpus[2])
    acquired = Acquired("A100", chosen, claims.HeldClaims(), pci_positions(inv))
    env = command_environment(acquired, {"CUDA_VISIBLE_DEVICES": "0", "HOME": "/h"})
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["CUDA_VISIBLE_DEVICES"] == "1,GPU-0c"  # no UUID from NVML: its PCI position
    assert env["CLUSTERJOB_GPU_BUS_IDS"] == "0000:0b:00.0,0000:0c:00.0"
    assert env["HOME"] == "/h"


def test_claims_are_exclusive_and_a_file_without_a_holder_is_free(tmp_path):
    lock_dir = claims.ensure_shared_dir(tmp_path / "locks")
    assert stat.S_IMODE(os.stat(lock_dir).st_mode) == 0o1777
    stale = claims.claim_path(lock_dir, "GPU-aa")
    stale.write_text('{"user": "ghost", "pid": 1, "command": "old", "since": 0}\n')
    mine, other = claims.HeldClaims(), claims.HeldClaims()
    assert claims.try_claim(lock_dir, "GPU-aa", mine)  # stale text, no lock: free
    claims.write_holder(mine, "GPU-aa", "python train.py")
    assert not claims.try_claim(lock_dir, "GPU-aa", other)  # another open file: excluded
    [held] = claims.current_claims(lock_dir)
    assert held.key == "GPU-aa" and held.holder is not None
    assert held.holder.pid == os.getpid() and held.holder.command == "python train.py"
    mine.release_all()
    assert claims.current_claims(lock_dir) == []
    assert claims.try_claim(lock_dir, "GPU-aa", other)
    other.release_all()


def test_new_claim_files_are_mode_0644_whatever_the_umask(tmp_path):
    """Each user claims through files of their own: readable by all (who holds a GPU), written
    by their owner only (they were 0666 and shared before; another user could then rewrite
    or delete them)."""
    lock_dir = claims.ensure_shared_dir(tmp_path / "locks")
    old = os.umask(0o077)
    try:
        held = claims.HeldClaims()
        assert claims.try_claim(lock_dir, "GPU-cc", held)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(claims.claim_path(lock_dir, "GPU-cc")).st_mode) == 0o644
    held.release_all()


def test_lock_dir_choice(tmp_path):
    assert claims.default_lock_dir({"CLUSTERJOB_LOCK_DIR": str(tmp_path)}) == tmp_path
    assert claims.default_lock_dir({}) in (claims.SYSTEM_LOCK_DIR, claims.FALLBACK_LOCK_DIR)
    file = tmp_path / "not-a-dir"
    file.write_text("")
    with pytest.raises(ClusterjobError, match="not a directory"):
        claims.ensure_shared_dir(file)
