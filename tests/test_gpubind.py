"""GPU binding where the scheduler names no GPUs (Grid Engine): the booking read from
``qstat -j``, the choice by model in PCI order, and real claims in a temporary lock dir held
by a forked holder that lets go when the job's process ends or the epilog says so."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterjob.errors import PreflightFailed
from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.gpubind import binding as gb
from clusterjob.gpubind.choice import (
    NotEnoughFreeGpus,
    check_model_here,
    choose_gpus,
    host_gpus,
    resolve_model,
    visible_devices,
)
from clusterjob.gridengine.parse import parse_qstat_j
from clusterjob.gridengine.prolog import GpuBooking, PrologExit, gpu_booking, job_key
from clusterjob.site.nodeview import load_node_view

SITE = Path(__file__).resolve().parent.parent / "site_configs" / "gelab.yaml"
A100_BUSES = ("0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0")

QSTAT_J = """==============================================================
job_number:                 17
exec_file:                  job_scripts/17
owner:                      alice
job_name:                   two
hard resource_list:         gpu={gpu},gpu_type=a100,h=host1
scheduling info:            (Collecting of scheduler job information is turned off)
"""


def _inventory(
    name: str = "NVIDIA A100-SXM4-80GB", buses: tuple[str, ...] = A100_BUSES
) -> GpuInventory:
    # NVML's index order deliberately not the bus order: positions must follow the bus
    gpus = tuple(
        Gpu(index=len(buses) - 1 - i, bus_id=bus, name=name, uuid=f"GPU-{i:04d}",
            memory_total=80 * 1024**3)
        for i, bus in enumerate(buses)
    )  # fmt: skip
    return GpuInventory(gpus=gpus, driver_version="550.54.15", cuda_driver_version=12040)


@pytest.mark.parametrize(
    ("gpu", "booking"),
    [
        ("2", GpuBooking(2, "a100")),
        ("2.000000", GpuBooking(2, "a100")),
        ("0", GpuBooking(0, "a100")),
    ],
)
def test_the_booking_is_what_qstat_says_the_scheduler_counted(
    gpu: str, booking: GpuBooking
) -> None:
    assert gpu_booking(parse_qstat_j(QSTAT_J.format(gpu=gpu))) == booking


def test_a_job_without_gpus_books_none_and_a_bad_count_is_refused() -> None:
    detail = parse_qstat_j(QSTAT_J.replace("gpu={gpu},gpu_type=a100,", ""))
    assert gpu_booking(detail) == GpuBooking(0, None)
    for bad in ("1.5", "-1", "two"):
        with pytest.raises(ValueError, match="gpu="):
            gpu_booking(parse_qstat_j(QSTAT_J.format(gpu=bad)))


def test_job_keys_and_exit_codes_are_grid_engines() -> None:
    assert job_key("17", "undefined") == "17"
    assert job_key("17", "3") == "17.3"
    assert (PrologExit.RUN, PrologExit.REQUEUE, PrologExit.JOB_ERROR) == (0, 99, 100)


def test_models_resolve_by_name_or_gpu_type_and_follow_the_node_map() -> None:
    view = load_node_view(SITE, "ge-a01")
    assert resolve_model(view, "a100") == "A100"
    assert resolve_model(view, "H100") == "H100"
    assert resolve_model(view, "v100") is None
    gpus = host_gpus(view, _inventory())
    assert [(g.position, g.gpu.bus_id, g.model) for g in gpus] == [
        (i, bus, "A100") for i, bus in enumerate(A100_BUSES)
    ]
    check_model_here(view, "A100", 4, "17")
    with pytest.raises(PreflightFailed, match=r"gives ge-a01 A100 x4.*qconf -me ge-a01"):
        check_model_here(view, "H100", 1, "17")


def test_the_choice_takes_free_gpus_of_the_model_in_pci_order() -> None:
    gpus = host_gpus(load_node_view(SITE, "ge-a01"), _inventory())
    assert visible_devices(choose_gpus(gpus, "A100", 2, set())) == "0,1"
    assert visible_devices(choose_gpus(gpus, "A100", 2, {"GPU-0000", "GPU-0002"})) == "1,3"
    assert visible_devices(choose_gpus(gpus, None, 1, {"GPU-0000"})) == "1"
    with pytest.raises(NotEnoughFreeGpus, match=r"2 A100 GPUs wanted, 1 free of 4 .*GPU 0 "):
        choose_gpus(gpus, "A100", 2, {"GPU-0000", "GPU-0001", "GPU-0002"})
    with pytest.raises(NotEnoughFreeGpus, match="0 free of 0"):
        choose_gpus(gpus, "H100", 1, set())


def _wait(predicate: object, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_two_jobs_get_disjoint_gpus_and_a_job_end_or_the_epilog_frees_them(
    tmp_path: Path,
) -> None:
    lock_dir = tmp_path / "locks"
    env = {"CLUSTERJOB_LOCK_DIR": str(lock_dir)}
    view = load_node_view(SITE, "ge-a01")
    inv = _inventory()
    jobs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in "ab"]
    try:
        first = gb.bind(view, env, job="1", count=2, model_spec="a100", watch_pid=jobs[0].pid,
                        inventory=inv)  # fmt: skip
        said: list[str] = []
        second = gb.bind(view, env, job="2", count=2, model_spec="a100", watch_pid=jobs[1].pid,
                         inventory=inv, say=said.append)  # fmt: skip
        assert {first.devices, second.devices} == {"0,1", "2,3"}
        # the preflight's table of the check that passed, for the job's output: the host's
        # slots, the job's two (marked *) among them
        (table,) = said
        assert table.splitlines()[-1].startswith("preflight ge-a01: OK (4 GPU slot(s)"), table
        assert [ln.split()[0] for ln in table.splitlines() if "*" in ln.split()[0]] == [
            f"{i}*" for i in second.devices.split(",")
        ], table
        assert gb.current_binding("1", env) == first
        assert first.exports() == (
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID\nexport CUDA_VISIBLE_DEVICES="
            + first.devices
            + "\n"
        )
        with pytest.raises(NotEnoughFreeGpus):
            gb.bind(view, env, job="3", count=1, model_spec="a100", watch_pid=jobs[0].pid,
                    inventory=inv)  # fmt: skip
        jobs[0].kill()  # job 1 ends any way at all: its holder lets go
        jobs[0].wait()
        assert _wait(lambda: gb.current_binding("1", env) is None)
        third = gb.bind(view, env, job="3", count=2, model_spec="A100", watch_pid=jobs[1].pid,
                        inventory=inv)  # fmt: skip
        assert third.devices == first.devices
        assert gb.release("2", env) and gb.release("3", env)  # the epilog
        assert gb.current_binding("2", env) is None
        assert not gb.release("2", env)
        assert sorted(p.name for p in lock_dir.glob("job-*")) == []
        last = gb.bind(view, env, job="4", count=4, model_spec="a100", watch_pid=jobs[1].pid,
                       inventory=inv)  # fmt: skip
        assert last.devices == "0,1,2,3"
        gb.release("4", env)
    finally:
        for job in jobs:
            job.kill()
            job.wait()


def test_a_host_whose_gpus_are_not_the_node_maps_is_refused_before_any_claim(
    tmp_path: Path,
) -> None:
    env = {"CLUSTERJOB_LOCK_DIR": str(tmp_path / "locks")}
    view = load_node_view(SITE, "ge-h01")  # an H100 host, by the node map
    with pytest.raises(PreflightFailed, match="asks for 2 A100 GPU"):
        gb.bind(view, env, job="5", count=2, model_spec="a100", watch_pid=1,
                inventory=_inventory())  # fmt: skip
    # NVML shows V100s where the map says A100: the preflight on the chosen GPUs says so
    with pytest.raises(PreflightFailed, match="fail the preflight"):
        gb.bind(load_node_view(SITE, "ge-a02"), env, job="6", count=1,
                model_spec="a100", watch_pid=1,
                inventory=_inventory("Tesla V100-SXM2-32GB"))  # fmt: skip
    assert list((tmp_path / "locks").glob("job-*")) == []
    with pytest.raises(PreflightFailed, match="does not know"):
        gb.bind(view, env, job="7", count=1, model_spec="b200", watch_pid=1, inventory=_inventory())


def test_the_sandbox_site_maps_each_host_to_its_stand_ins_and_the_queue_runs_the_hooks(
    tmp_path: Path,
) -> None:
    from clusterjob.sandbox import gridengine

    site = tmp_path / "site.yaml"
    site.write_text(gridengine.sandbox_site())
    for h in gridengine.HOSTS:
        view = load_node_view(site, h.name)
        assert [(g.model, g.bus_id) for g in view.gpus or ()] == [
            (h.gpu_type.upper(), bus) for bus in gridengine.bus_ids(h)
        ]
        assert resolve_model(view, h.gpu_type) == h.gpu_type.upper()
    lay = gridengine.layout(tmp_path)
    assert f"bind-gpus --site {lay.site_file}" in gridengine.hook_script("bind-gpus", lay)
    queue = gridengine.queue_config(prolog="root@/p", epilog="root@/e")
    assert "prolog               root@/p\n" in queue and "epilog               root@/e\n" in queue
    assert "prolog               NONE\n" in gridengine.queue_config()
