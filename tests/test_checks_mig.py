"""Node checks where the map puts a GPU in MIG mode: GRES indices count its slices, a slice
given by index is found by its GPU instance (or position), and the job's GPUs are the GPUs
its slices are on. Pure: Facts in, findings out (the pynvml path is in test_hooks_nvml.py)."""

from __future__ import annotations

from test_checks import A100, BUSES, MODELS, gpu, inv

from clusterjob.gpu.inventory import GpuInventory, GpuProcess, MigDevice
from clusterjob.node.allocation import Allocation, Context
from clusterjob.node.checks import Facts, run_checks
from clusterjob.site.nodemodel import NodeGpu

SLICES = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
MAP = (NodeGpu(0, "A100", BUSES[0], mig=SLICES, mig_gi=(1, 2, 3, 4)), NodeGpu(1, "A100", BUSES[1]))


def migs(*profiles: str, first_gi: int = 1) -> tuple[MigDevice, ...]:
    return tuple(
        MigDevice(k, f"MIG-{k}0000000-1111-2222-3333-444444444444", f"{A100} MIG {p}", None,
                  first_gi + k, 0)
        for k, p in enumerate(profiles)
    )  # fmt: skip


def facts(inventory: GpuInventory, *indices: int, **kw: object) -> Facts:
    return Facts(
        node="gpu2",
        node_map=MAP,
        models={**MODELS, **{f"A100-{p}": (f"{A100} MIG {p}",) for p in SLICES}},
        inventory=inventory,
        allocation=Allocation(slots=indices, source="SLURM_JOB_GPUS"),
        context=Context.JOB,
        **kw,  # type: ignore[arg-type]
    )


def sliced(devices: tuple[MigDevice, ...], **kw: object) -> GpuInventory:
    fields: dict[str, object] = {"mig_current": True, "mig_pending": True, **kw}
    return inv(gpu(0, A100, None, mig_devices=devices, **fields), gpu(1, A100))


def found(f: Facts) -> list[tuple[str, str, int | None]]:
    return [(x.check_id, x.severity.value, x.slot) for x in run_checks(f).findings]


def test_a_slice_index_is_the_gpu_it_is_on() -> None:
    f = facts(sliced(migs(*SLICES)), 3, 4)
    assert f.allocated_set == {0, 1}  # slice 3 of GPU 0, and GPU 1 whole (GRES index 4)
    assert [s for s, _ in f.job_gpus] == [1]
    assert [(p.named, p.device and p.device.gpu_instance) for p in f.job_slices] == [
        ("GRES index 3", 4)
    ]
    assert found(f) == []


def test_slices_are_found_by_their_gpu_instance_not_their_position() -> None:
    devices = tuple(  # NVML's first MIG device is instance 2, its second instance 1
        MigDevice(k, f"MIG-{k}", f"{A100} MIG {p}", None, gi, 0)
        for k, (p, gi) in enumerate(zip(SLICES, (2, 1, 4, 3), strict=True))
    )
    given = facts(sliced(devices), 0, expect_model="A100-2g.20gb")  # the map's 3g.40gb@1
    piece = given.job_slices[0]
    assert piece.device is not None and piece.device.gpu_instance == 1
    assert found(given) == []  # NVML's instance 1 is a 2g.20gb slice, as the job asked
    asked = facts(sliced(devices), 0, expect_model="A100-3g.40gb")
    assert found(asked) == [("alloc-model", "error", 0)]


def test_a_slice_nvml_does_not_list_is_an_error_on_the_job() -> None:
    f = facts(sliced(migs("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb", first_gi=2)), 0)
    assert [
        (x.check_id, x.message) for x in run_checks(f).findings if x.check_id == "alloc-mig"
    ] == [
        (
            "alloc-mig",
            "gpu2: slot 0 (0000:07:00.0): job was given GRES index 0, the node map's 3g.40gb slice "
            "(GPU instance 1), but NVML lists no such MIG device -- recreate the slices or fix "
            "the node map and gres.conf",
        )
    ]


def test_the_count_is_of_gres_indices() -> None:
    f = facts(sliced(migs(*SLICES)), 2, 3, expect_count=2)
    assert found(f) == []


def test_a_leftover_process_on_a_sliced_gpu_belongs_to_some_slice() -> None:
    f = facts(sliced(migs(*SLICES), processes=(GpuProcess(7, 1, "python3", "bob"),)), 0)
    f = f.replace(context=Context.PROLOG)
    assert found(f) == []  # gpu-busy skips GPUs in MIG mode: another job's slice may be busy
