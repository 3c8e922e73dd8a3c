"""GPU usage per job: the in-job sampler (clusterjob.node.usage) over the stand-in NVML, its
bounded series, and what status/show make of its records (clusterjob.jobs.usage)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from standin_fixtures import _PACKAGE_ROOT

from clusterjob import envvars
from clusterjob.gpu.nvml import GpuUsage as NvmlReading
from clusterjob.jobs import private_files
from clusterjob.jobs.usage import (
    GpuUsage,
    idle_note,
    read_usage,
    sparkline,
    task_summaries,
    usage_lines,
)
from clusterjob.node import usage as node_usage
from clusterjob.node.usage import (
    SERIES_POINTS,
    GpuSeries,
    UsageRecord,
    job_bus_ids,
    record_path,
    run_sampler,
    sample_interval,
)
from clusterjob.sandbox.standin import GIB, StandinScenario, h100, scenario_text, standin_env

BUS = ("0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0")


def test_series_stays_bounded_and_keeps_the_shape() -> None:
    """A week at 1 s: still at most SERIES_POINTS points, the busy first half still visible."""
    g = GpuSeries(BUS[0])
    for i in range(7 * 24 * 3600 // 60):  # a week of one sample a minute
        g.add(100 if i < 5040 else 0, 8 * GIB, 400_000)
    points = g.series()
    assert len(points) <= SERIES_POINTS
    assert points[0] == 100.0 and points[-1] == 0.0
    assert g.util_peak == 100 and g.memory_peak == 8 * GIB
    d = g.to_dict(60.0)
    assert d["util_mean"] == 50.0 and d["power_mean_w"] == 400.0
    assert d["series_step_s"] == g.width * 60.0


def test_interval_from_the_environment() -> None:
    assert sample_interval({}) == 30.0
    assert sample_interval({envvars.USAGE_INTERVAL: "1"}) == 1.0
    assert sample_interval({envvars.USAGE_INTERVAL: "0"}) == 0.0
    assert sample_interval({envvars.USAGE_INTERVAL: "0.001"}) == node_usage.MIN_INTERVAL
    assert sample_interval({envvars.USAGE_INTERVAL: "soon"}) == 30.0


def test_job_gpus_are_its_gres_indices_in_pci_order() -> None:
    every = (BUS[2], BUS[0], BUS[1])
    assert job_bus_ids({"SLURM_JOB_GPUS": "0,2"}, every) == (BUS[0], BUS[2])
    assert job_bus_ids({}, every) == every


def test_node_side_data_dir_is_the_registrys(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ({envvars.DATA_DIR: "/d"}, {"XDG_DATA_HOME": "/x"}, {}):
        monkeypatch.delenv(envvars.DATA_DIR, raising=False)
        monkeypatch.delenv("XDG_DATA_HOME", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert node_usage.data_dir(os.environ) == private_files.data_dir()


def test_sampler_writes_after_each_sample_and_marks_the_end(tmp_path: Path) -> None:
    now = [1000.0]
    lives = iter([True] * 12 + [False] * 10)
    path = record_path(tmp_path, "tok", "gpu1")
    record = UsageRecord("42", "gpu1", 1.0, now[0])

    def sleep(s: float) -> None:
        now[0] += s

    run_sampler(
        record,
        path,
        lambda: [node_usage_reading(BUS[0], 90), node_usage_reading(BUS[1], 0)],
        alive=lambda: next(lives),
        clock=lambda: now[0],
        sleep=sleep,
    )
    data = json.loads(path.read_text())
    assert data["ended"] is True
    assert [g["samples"] for g in data["gpus"]] == [4, 4]
    usage = read_usage("tok", tmp_path)
    assert [(u.bus_id, u.util_mean, u.idle) for u in usage] == [
        (BUS[0], 90.0, False),
        (BUS[1], 0.0, True),
    ]


def _gpu(bus: str, mean: float, samples: int = 5, task: str | None = None) -> GpuUsage:
    from clusterjob.jobs.usage import is_idle

    return GpuUsage("gpu1", bus, samples, mean, int(mean), GIB, GIB, 100.0, 120.0,
                    is_idle(mean, samples), (0.0, 50.0, 100.0), 30.0, task)  # fmt: skip


def test_idle_needs_two_samples_under_five_percent() -> None:
    assert _gpu(BUS[0], 4.9).idle and not _gpu(BUS[0], 5.0).idle
    assert not _gpu(BUS[0], 0.0, samples=1).idle


def test_what_status_and_show_say() -> None:
    usage = (_gpu(BUS[0], 95.0), _gpu(BUS[1], 0.0))
    assert idle_note(usage) == (
        "1 of 2 GPU(s) stayed idle (mean utilisation under 5%): gpu1 0000:2a:00.0 (mean 0%)"
    )
    assert idle_note(usage[:1]) is None
    lines = usage_lines(usage)
    assert lines[0].startswith("gpu1 0000:18:00.0: util mean 95% peak 95%, memory mean 1.0 GiB")
    assert lines[2].startswith("IDLE gpu1 0000:2a:00.0: util mean 0%")
    assert lines[1] == "  ▁▅█ (one mark per 30s)"
    assert sparkline([0, 14, 29, 43, 57, 71, 86, 100]) == "▁▂▃▄▅▆▇█"
    sweep = (_gpu(BUS[0], 80.0, task="0"), _gpu(BUS[0], 1.0, task="1"))
    assert task_summaries(sweep) == [
        "task 0: 1 GPU(s), util mean 80%",
        "task 1: 1 GPU(s), util mean 1%, 1 of 1 idle",
    ]
    assert usage_lines(sweep) == task_summaries(sweep)


def test_status_rows_carry_the_usage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterjob.jobs.status import JobStatus
    from clusterjob.jobs.usage import with_usage

    monkeypatch.setenv(envvars.DATA_DIR, str(tmp_path))
    record = UsageRecord("7", "gpu1", 1.0, 0.0)
    for t in (1.0, 2.0):
        record.add([node_usage_reading(BUS[0], 0)], t)
    record.write(record_path(tmp_path, "tok7", "gpu1"))

    class Rec:
        job_id, token = "7", "tok7"

    row = JobStatus("7", "c", "n", "RUNNING", None, "", "gpu1", None, None, None, "s", "squeue")
    (shown,) = with_usage([row], [Rec()])  # type: ignore[list-item]
    assert shown.gpu_usage[0].idle
    assert shown.to_dict()["gpu_usage"][0]["bus_id"] == BUS[0]  # type: ignore[index]


def node_usage_reading(bus: str, util: int) -> NvmlReading:
    return NvmlReading(bus, util, GIB, 50_000)


@pytest.mark.nvml
def test_sample_usage_over_the_standin_sees_a_scenario_rewritten_mid_job(
    standin_lib: Path, tmp_path: Path
) -> None:
    """The real command, the real pynvml and the stand-in: one GPU busy, one idle, and the
    busy one's load changed while the sampler runs."""
    scenario = tmp_path / "node.txt"
    gpus = (h100(BUS[0], 0, utilization=90, memory_used=9 * GIB), h100(BUS[1], 1))
    scenario.write_text(scenario_text(StandinScenario(gpus=gpus)))
    env = dict(os.environ)
    env.update(standin_env(standin_lib.parent, scenario))
    env.update({
        "PYTHONPATH": _PACKAGE_ROOT,
        envvars.DATA_DIR: str(tmp_path / "data"),
        envvars.TOKEN: "tokA",
        envvars.USAGE_INTERVAL: "0.2",
        "SLURMD_NODENAME": "gpu1",
        "SLURM_JOB_ID": "99",
        "SLURM_JOB_GPUS": "0,1",
    })  # fmt: skip
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    sampler = subprocess.Popen(
        [sys.executable, "-m", "clusterjob", "sample-usage", str(job.pid)], env=env
    )
    path = record_path(tmp_path / "data", "tokA", "gpu1")
    deadline = time.monotonic() + 20
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.8)
    busier = (h100(BUS[0], 0, utilization=100, memory_used=9 * GIB, power_usage=650_000), gpus[1])
    scenario.write_text(scenario_text(StandinScenario(gpus=busier)))
    job.wait()
    assert sampler.wait(timeout=20) == 0
    data = json.loads(path.read_text())
    assert data["ended"] and data["error"] is None and data["job_id"] == "99"
    busy, idle = read_usage("tokA", tmp_path / "data")
    assert (busy.bus_id, idle.bus_id) == BUS[:2]
    assert busy.util_peak == 100 and 90 < (busy.util_mean or 0) < 100
    assert busy.power_peak_w == 650.0 and busy.memory_peak == 9 * GIB
    assert idle.idle and idle.util_mean == 0.0 and idle.samples >= 2
    assert not busy.idle


def test_sample_usage_without_nvml_never_fails_the_job(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": _PACKAGE_ROOT,
        envvars.DATA_DIR: str(tmp_path),
        envvars.TOKEN: "tokB",
        "FAKE_NVML_SCENARIO": "",
        "LD_LIBRARY_PATH": str(tmp_path),  # no libnvidia-ml.so.1 here
        "SLURMD_NODENAME": "gpu1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", "sample-usage", str(os.getpid())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "")
    data = json.loads(record_path(tmp_path, "tokB", "gpu1").read_text())
    assert data["error"] and data["ended"] and data["gpus"] == []
