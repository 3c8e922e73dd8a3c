"""GPU usage per job under a real slurmd: the job's sampler reads the stand-in NVML while the
job runs; with one of its two GPUs made busy mid-job (the node's scenario rewritten, as the
Epilog's tests do for faults) and the other left idle, `show` and `status --json` give each
GPU's figures and flag the idle one.

h1 (partition h100, 8 GPUs) is used: the node other tests use least. The scenario is restored
whatever happens.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from clusterjob.node.allocation import parse_index_list
from clusterjob.pci import normalise_bus_id

from .conftest import Cli, Sandbox

pytestmark = pytest.mark.slurm

NODE = "h1"
GIB = 1024**3
FLAG_WAIT = """\
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.2)
"""


def _running(cj: Cli, job: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        (row,) = json.loads(cj("status", "--json", job).stdout)
        if row["state"] == "RUNNING":
            return
        assert row["state"] in ("PENDING", "CONFIGURING"), row
        assert time.monotonic() < deadline, row
        time.sleep(1)


def _job_slots(sandbox: Sandbox, job: str) -> tuple[int, ...]:
    out = sandbox.run("scontrol", "show", "job", "-d", job)
    m = re.search(r"GRES=\S*\(IDX:([\d,-]+)\)", out)
    assert m, out
    return parse_index_list(m[1])


def _set(text: str, index: int, key: str, value: int) -> str:
    line = re.compile(rf"^gpu\.{index}\.{key} = .*$", re.M)
    new = f"gpu.{index}.{key} = {value}"
    return line.sub(new, text) if line.search(text) else text + new + "\n"


def test_a_busy_and_an_idle_gpu_are_told_apart(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    scenario = sandbox.layout.scenario(NODE)
    good = scenario.read_text()
    script = tmp_path / "wait.py"
    script.write_text(FLAG_WAIT)
    flag = tmp_path / "flag"
    done = cj("submit", str(script), "--gpus", "2", "--model", "H100", "--partition", "h100",
              "--time", "5", "--", str(flag),
              extra_env={"CLUSTERJOB_USAGE_INTERVAL": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    match = re.search(r"Submitted job (\d+)", done.stdout)
    assert match, done.stdout
    job = match[1]
    try:
        _running(cj, job)
        # GRES index i is the i-th GPU in PCI order; the scenario numbers GPUs its own way
        buses = {int(i): b for i, b in re.findall(r"^gpu\.(\d+)\.bus_id = (\S+)$", good, re.M)}
        by_pci = sorted(buses, key=lambda i: normalise_bus_id(buses[i]))
        busy_slot, idle_slot = _job_slots(sandbox, job)
        busy, idle = by_pci[busy_slot], by_pci[idle_slot]
        text = _set(good, busy, "utilization", 90)
        text = _set(text, busy, "memory_used", 10 * GIB)
        text = _set(text, busy, "power_usage", 450_000)
        scenario.write_text(_set(text, idle, "utilization", 0))
        time.sleep(5)  # five samples or so of the busy GPU at 90%
        flag.write_text("")
        waited = cj("wait", job, "--timeout", "120")
        assert waited.returncode == 0, waited

        (row,) = json.loads(cj("status", "--json", job).stdout)
        usage = {u["bus_id"]: u for u in row["gpu_usage"]}
        busy_bus, idle_bus = normalise_bus_id(buses[busy]), normalise_bus_id(buses[idle])
        assert set(usage) == {busy_bus, idle_bus}, row["gpu_usage"]
        b, i = usage[busy_bus], usage[idle_bus]
        assert (b["node"], b["idle"], b["util_peak"]) == (NODE, False, 90), b
        assert b["util_mean"] > 5 and b["memory_peak"] == 10 * GIB and b["power_peak_w"] == 450
        assert (i["idle"], i["util_peak"], i["util_mean"]) == (True, 0, 0), i
        assert i["samples"] >= 2 and len(b["series"]) >= 2, row

        table = cj("status", job).stdout
        assert (
            f"{job}: 1 of 2 GPU(s) stayed idle (mean utilisation under 5%): "
            f"{NODE} {idle_bus} (mean 0%)"
        ) in table, table
        shown = cj("show", job).stdout.splitlines()
        lines = [line for line in shown if NODE in line and "util mean" in line]
        assert any(f"{NODE} {busy_bus}: util mean" in x and "peak 90%" in x for x in lines), shown
        assert any(f"IDLE {NODE} {idle_bus}: util mean 0% peak 0%" in x for x in lines), shown
        # each GPU's line is followed by its utilisation over the job, one mark per sample
        at = {bus: next(n for n, x in enumerate(shown) if f"{NODE} {bus}:" in x)
              for bus in (busy_bus, idle_bus)}  # fmt: skip
        busy_spark = shown[at[busy_bus] + 1].split()[0]
        idle_spark = shown[at[idle_bus] + 1].split()[0]
        assert busy_spark.endswith("▇") and set(idle_spark) == {"▁"}, shown  # 90% and 0%
        details = json.loads(cj("show", job, "--json").stdout)
        assert {u["bus_id"] for u in details["gpu_usage"]} == {busy_bus, idle_bus}
    finally:
        scenario.write_text(good)
        cj("cancel", job)


def test_every_node_of_a_multi_node_job_is_sampled_beside_its_steps(
    cj: Cli, sandbox: Sandbox
) -> None:
    """The sampler of a 2-node job is an `srun --overlap` step on each node: the job's own
    srun step still starts at once, and both nodes' GPUs are in the record."""
    done = cj("submit", "--gpus", "1", "--model", "A100", "--nodes", "2", "--launcher", "srun",
              "--time", "5", "--", "python3", "-c", "import time; time.sleep(4)",
              extra_env={"CLUSTERJOB_USAGE_INTERVAL": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    match = re.search(r"Submitted job (\d+)", done.stdout)
    assert match, done.stdout
    job = match[1]
    try:
        waited = cj("wait", job, "--timeout", "120")
        assert waited.returncode == 0, waited
        (row,) = json.loads(cj("status", "--json", job).stdout)
        nodes = sorted(u["node"] for u in row["gpu_usage"])
        assert nodes == ["gpu1", "gpu2"], row
        assert all(u["samples"] >= 2 for u in row["gpu_usage"]), row
    finally:
        cj("cancel", job)
