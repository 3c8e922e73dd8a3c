"""The Epilog under a real slurmd: a GPU that falls off the bus during a job drains the node
with a reason naming the Xid, the GPU and the job, and `clusterjob status`/`wait` say the GPU
failed, not the program; a program that raises says so and nothing of hardware.

The stand-in NVML's scenario of the node is switched while the job runs (the test restores it
and resumes the node, whatever happens). h1 (partition h100) is used: the node other tests
use least.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from clusterjob.sandbox.standin import scenario_text

from .conftest import Cli, Sandbox

pytestmark = pytest.mark.slurm

NODE = "h1"
FLAG_WAIT = """\
import os, sys, time
flag = sys.argv[1]
while not os.path.exists(flag):
    time.sleep(0.2)
raise SystemExit(open(flag).read().strip() or "crashed")
"""


@pytest.fixture
def wired(sandbox: Sandbox) -> Sandbox:
    conf = sandbox.layout.slurm_conf.read_text().splitlines()
    if not any(line.startswith("Epilog=") for line in conf):
        pytest.skip("this sandbox runs no Epilog: `clusterjob sandbox up` it again from here")
    return sandbox


def _submit(cj: Cli, tmp_path: Path, flag: Path) -> str:
    script = tmp_path / "crash.py"
    script.write_text(FLAG_WAIT)
    done = cj("submit", str(script), "--gpus", "1", "--model", "H100", "--partition", "h100",
              "--time", "5", "--", str(flag))  # fmt: skip
    assert done.returncode == 0, done.stderr
    match = re.search(r"Submitted job (\d+)", done.stdout)
    assert match, done.stdout
    return match.group(1)


def _running(cj: Cli, job: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        (row,) = json.loads(cj("status", "--json", job).stdout)
        if row["state"] == "RUNNING":
            return
        assert row["state"] in ("PENDING", "CONFIGURING"), row
        assert time.monotonic() < deadline, row
        time.sleep(1)


def _job_gpu(sandbox: Sandbox, job: str) -> int:
    out = sandbox.run("scontrol", "show", "job", "-d", job)
    m = re.search(r"GRES=\S*\(IDX:(\d+)\)", out)
    assert m, out
    return int(m[1])


def test_a_gpu_that_falls_off_the_bus_is_named_and_drains_the_node(
    cj: Cli, wired: Sandbox, tmp_path: Path
) -> None:
    sandbox = wired
    scenario = sandbox.layout.scenario(NODE)
    good = scenario.read_text()
    flag = tmp_path / "flag"
    job = _submit(cj, tmp_path, flag)
    try:
        _running(cj, job)
        slot = _job_gpu(sandbox, job)
        # every GPU of the node reports Xid 79 from now on: the job's is among them
        count = len(re.findall(r"^gpu\.\d+\.name = ", good, re.M))
        scenario.write_text(good + "".join(f"gpu.{i}.xid = 79\n" for i in range(count)))
        flag.write_text("CUDA error: unspecified launch failure")
        waited = cj("wait", job, "--timeout", "120")
        assert waited.returncode != 0
        bus = re.search(rf"^gpu\.{slot}\.bus_id = (\S+)$", good, re.M)
        assert bus, good
        said = f"Xid 79 (GPU fell off the bus) on gpu{slot} {bus[1]}"
        assert f"hardware: {said} on node {NODE} during the job" in waited.stdout, waited
        node = sandbox.node(NODE)
        assert "DRAIN" in node["State"], node
        assert node["Reason"].startswith(f"clusterjob: {said} during job {job}"), node
        (row,) = json.loads(cj("status", "--json", job).stdout)
        assert row["hardware"] == f"{said} on node {NODE}", row
        assert row["explanation"].startswith(f"hardware: {said}"), row
        shown = cj("status", job).stdout
        assert f"{job}: hardware: {said}" in shown, shown
        details = cj("show", job).stdout
        assert f"hardware:       {said} on node {NODE} during the job, not your program" in (
            details.splitlines()
        ), details
        assert json.loads(cj("show", job, "--json").stdout)["hardware"] == f"{said} on node {NODE}"
    finally:
        scenario.write_text(good)
        cj("cancel", job)
        if "DRAIN" in sandbox.node(NODE)["State"]:
            sandbox.resume(NODE)


def test_a_program_that_raises_says_so_and_nothing_of_hardware(
    cj: Cli, wired: Sandbox, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    flag.write_text("ValueError: bad batch")
    job = _submit(cj, tmp_path, flag)
    waited = cj("wait", job, "--timeout", "120")
    assert waited.returncode == 1, waited
    assert waited.stdout.strip() == f"{job} FAILED (exit 1)", waited.stdout
    (row,) = json.loads(cj("status", "--json", job).stdout)
    assert (row["state"], row["exit_code"], row["hardware"]) == ("FAILED", 1, None), row
    assert "DRAIN" not in wired.node(NODE)["State"]
    # the Epilog looked, and wrote its record
    records = [
        json.loads(line)
        for line in wired.layout.prolog_log.with_name("epilog.jsonl").read_text().splitlines()
        if f'"job_id": "{job}"' in line
    ]
    assert [(r["outcome"], r["action"]) for r in records] == [("ok", "pass")], records


def test_scenario_text_knows_xids() -> None:
    """The line the test above appends is the stand-in's own format."""
    from clusterjob.sandbox.standin import StandinScenario, h100

    text = scenario_text(StandinScenario((h100("0000:07:00.0", 0, xids=(79,)),)))
    assert "gpu.0.xid = 79\n" in text
