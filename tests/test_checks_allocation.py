"""Table-driven tests of clusterjob.node.allocation: Slurm's GPU variables -> Allocation."""

from __future__ import annotations

import pytest

from clusterjob.node.allocation import (
    Context,
    allocation_from_env,
    parse_cuda_visible_devices,
    parse_index_list,
    task_cuda_visible_devices,
)

PROLOG, JOB = Context.PROLOG, Context.JOB


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ()),
        ("0", (0,)),
        ("0,2", (0, 2)),
        ("2,0", (2, 0)),
        ("0-3", (0, 1, 2, 3)),
        ("0-1,4", (0, 1, 4)),
        (" 1 , 3 ", (1, 3)),
    ],
)
def test_parse_index_list(text: str, expected: tuple[int, ...]) -> None:
    assert parse_index_list(text) == expected


@pytest.mark.parametrize("text", ["a", "0,,1", "3-1", "0,0", "-1", "NoDevFiles"])
def test_parse_index_list_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_index_list(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0,1", [("0", 0, None, False), ("1", 1, None, False)]),
        ("GPU-abc,2", [("GPU-abc", None, "GPU-abc", False), ("2", 2, None, False)]),
        ("MIG-1234", [("MIG-1234", None, None, True)]),
        ("MIG-GPU-abcd/1/0", [("MIG-GPU-abcd/1/0", None, None, True)]),
        ("0,-1,1", [("0", 0, None, False)]),  # CUDA stops at the first bad entry
        ("NoDevFiles", []),
        ("", []),
    ],
)
def test_parse_cuda_visible_devices(text: str, expected: list[tuple[object, ...]]) -> None:
    got = [(d.text, d.index, d.uuid, d.mig) for d in parse_cuda_visible_devices(text)]
    assert got == expected


# name -> (environ, context, (slots, source, uuids, renumbered, number of problems))
ENV_CASES: dict[str, tuple[dict[str, str], Context, tuple[object, ...]]] = {
    "no GPUs at all": ({}, PROLOG, (None, "", (), False, 0)),
    "prolog, SLURM_JOB_GPUS": (
        {"SLURM_JOB_GPUS": "2", "CUDA_VISIBLE_DEVICES": "2"},
        PROLOG,
        ((2,), "SLURM_JOB_GPUS", (), False, 0),
    ),
    "prolog, only CUDA_VISIBLE_DEVICES (global there)": (
        {"CUDA_VISIBLE_DEVICES": "1,3"},
        PROLOG,
        ((1, 3), "CUDA_VISIBLE_DEVICES", (), False, 0),
    ),
    "prolog ignores SLURM_STEP_GPUS": (
        {"SLURM_STEP_GPUS": "0", "SLURM_JOB_GPUS": "1,2"},
        PROLOG,
        ((1, 2), "SLURM_JOB_GPUS", (), False, 0),
    ),
    "job, no cgroup: global everywhere": (
        {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"},
        JOB,
        ((2, 3), "SLURM_JOB_GPUS", (), False, 0),
    ),
    "job, device cgroup: CUDA renumbered": (
        {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"},
        JOB,
        ((2, 3), "SLURM_JOB_GPUS", (), True, 0),
    ),
    "job step narrower than job": (
        {"SLURM_JOB_GPUS": "0,1,2,3", "SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1"},
        JOB,
        ((1,), "SLURM_STEP_GPUS", (), False, 0),
    ),
    "job, only CUDA_VISIBLE_DEVICES: ambiguous": (
        {"CUDA_VISIBLE_DEVICES": "0"},
        JOB,
        (None, "", (), False, 1),
    ),
    "job, UUIDs": (
        {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"},
        JOB,
        (None, "CUDA_VISIBLE_DEVICES", ("GPU-aaaa", "GPU-bbbb"), False, 0),
    ),
    "job, UUIDs beside SLURM_JOB_GPUS": (
        {"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "GPU-aaaa"},
        JOB,
        ((1,), "SLURM_JOB_GPUS", ("GPU-aaaa",), False, 0),
    ),
    "garbage SLURM_JOB_GPUS falls back": (
        {"SLURM_JOB_GPUS": "x", "CUDA_VISIBLE_DEVICES": "1"},
        PROLOG,
        ((1,), "CUDA_VISIBLE_DEVICES", (), False, 1),
    ),
    "CUDA_VISIBLE_DEVICES disagrees with Slurm": (
        {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "4,5"},
        JOB,
        ((2, 3), "SLURM_JOB_GPUS", (), False, 1),
    ),
    "CUDA_VISIBLE_DEVICES cut short by a bad entry": (
        {"SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,x,1"},
        JOB,
        ((0, 1), "SLURM_JOB_GPUS", (), False, 2),
    ),
}


@pytest.mark.parametrize("name", list(ENV_CASES))
def test_allocation_from_env(name: str) -> None:
    environ, context, expected = ENV_CASES[name]
    a = allocation_from_env(environ, context)
    assert (a.slots, a.source, a.uuids, a.renumbered, len(a.problems)) == expected


def test_mig_devices_recorded() -> None:
    a = allocation_from_env({"CUDA_VISIBLE_DEVICES": "MIG-1234"}, JOB)
    assert a.mig_devices == ("MIG-1234",)
    assert a.known


# name -> (environ, uuid -> bus id, expected export value or None)
TASK_CASES: dict[str, tuple[dict[str, str], dict[str, str] | None, str | None]] = {
    "already in order": ({"SLURM_JOB_GPUS": "0,2", "CUDA_VISIBLE_DEVICES": "0,2"}, None, None),
    "out of order": ({"SLURM_JOB_GPUS": "2,0", "CUDA_VISIBLE_DEVICES": "2,0"}, None, "0,2"),
    "renumbered in order": ({"SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1"}, None, None),
    "renumbered out of order": (
        {"SLURM_JOB_GPUS": "3,1", "CUDA_VISIBLE_DEVICES": "1,0"},
        None,
        "0,1",
    ),
    "unset: leave alone": ({"SLURM_JOB_GPUS": "1"}, None, None),
    "UUIDs out of bus order": (
        {"CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a"},
        {"GPU-a1": "0000:07:00.0", "GPU-b1": "0000:0b:00.0"},
        "GPU-a,GPU-b",
    ),
    "UUIDs in bus order": (
        {"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b1"},
        {"GPU-a1": "0000:07:00.0", "GPU-b1": "0000:0b:00.0"},
        None,
    ),
    "UUIDs without NVML": ({"CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a"}, None, None),
    "MIG: leave alone": ({"CUDA_VISIBLE_DEVICES": "MIG-2,MIG-1"}, None, None),
    "disagreeing with Slurm: leave alone": (
        {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "5,4"},
        None,
        None,
    ),
}


@pytest.mark.parametrize("name", list(TASK_CASES))
def test_task_cuda_visible_devices(name: str) -> None:
    environ, buses, expected = TASK_CASES[name]
    assert task_cuda_visible_devices(allocation_from_env(environ, JOB), buses) == expected
