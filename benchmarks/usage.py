"""GPU usage sampler cost: CPU per sample on an 8-GPU node, and as a share of one core.

The sampler (``clusterjob sample-usage``, started in every GPU job) keeps NVML initialised
and, every ``CLUSTERJOB_USAGE_INTERVAL`` seconds (30 by default), reads each GPU's
utilisation, memory and power, folds them into running means/peaks and a bounded series, and
rewrites its record. Its cost per sample is CPU time, measured inside one child over the
stand-in NVML (process_time over many samples, the record written each time), beside the CPU
of the floor any Python NVML reader pays once, ``import pynvml; pynvml.nvmlInit()`` in a
fresh interpreter (children's rusage, less ``python3 -c pass``'s). The stand-in answers
faster than a driver does, so the per-sample figure is clusterjob's own share.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path

from benchmarks.common import PYTHON, REFERENCE, REFERENCE_NAME, Result, median
from benchmarks.prolog import NVML_CODE, NVML_NAME, prolog_env, standin_lib
from benchmarks.sitegen import BUS_IDS

TARGET_PERCENT = 0.5  # of one core, at the default interval

SAMPLER_CODE = """
import json, os, sys, time
from pathlib import Path
from clusterjob.gpu.nvml import UsageReader
from clusterjob.node.usage import UsageRecord, _alive, record_path
n = int(sys.argv[1])
reader = UsageReader()
record = UsageRecord("4242", "bench", 30.0, time.time())
path = record_path(Path(sys.argv[2]), "bench", "node")
for _ in range(20):  # warm: first calls, page cache
    record.add(reader.read(), time.time()); record.write(path)
start = time.process_time()
for _ in range(n):
    record.add(reader.read(), time.time()); record.write(path)
per_sample = (time.process_time() - start) / n
start = time.process_time()
for _ in range(n):
    _alive(os.getpid())
per_watch = (time.process_time() - start) / n
print(json.dumps({"per_sample": per_sample, "per_watch": per_watch,
                  "gpus": len(reader.handles), "bytes": path.stat().st_size}))
"""


def child_cpu(cmd: list[str], env: dict[str, str] | None) -> float:
    """User + system CPU seconds of one run of ``cmd`` (and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run(work: Path, *, quick: bool) -> Result:
    from clusterjob.node.usage import DEFAULT_INTERVAL, WATCH_SECONDS
    from clusterjob.sandbox.standin import StandinScenario, gpus_on_buses, h100, write_scenario

    result = Result("usage", "GPU usage sampler: CPU per sample (8x H100 node, stand-in NVML)")
    work.mkdir(parents=True, exist_ok=True)
    lib = standin_lib(work)
    node = "bench-node"
    scenario = write_scenario(
        work / "scenario.txt",
        StandinScenario(gpus=gpus_on_buses(h100, BUS_IDS["H100"], node=node)),
    )
    env = prolog_env(lib, scenario, node)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    repeats = 3 if quick else 11
    samples = 200 if quick else 2000

    floor, nvml, per_sample, per_watch = [], [], [], []
    info: dict[str, int] = {}
    for _ in range(repeats):  # interleaved: load shared alike
        floor.append(child_cpu(list(REFERENCE), env))
        nvml.append(child_cpu([PYTHON, "-c", NVML_CODE], env))
        out = subprocess.run(
            [PYTHON, "-c", SAMPLER_CODE, str(samples), str(work)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        data = json.loads(out.strip().splitlines()[-1])
        per_sample.append(data["per_sample"])
        per_watch.append(data["per_watch"])
        info = {"gpus": data["gpus"], "bytes": data["bytes"]}
    ref = max(median(nvml) - median(floor), 1e-9)
    sample = median(per_sample)
    result.add(
        f"{NVML_NAME}, less {REFERENCE_NAME}",
        ref * 1000,
        "ms CPU",
        note=f"median of {repeats}; once per job, the floor of any Python NVML reader",
    )
    result.add(
        f"one sample of {info.get('gpus', 0)} GPUs, record ({info.get('bytes', 0)} bytes) written",
        sample * 1000,
        "ms CPU",
        ratio=sample / ref,
        reference=f"{NVML_NAME}, less {REFERENCE_NAME}",
        note=f"median of {repeats} runs of {samples} samples each",
    )
    per_interval = sample + (DEFAULT_INTERVAL / WATCH_SECONDS) * median(per_watch)
    percent = per_interval / DEFAULT_INTERVAL * 100
    result.add(
        f"share of one core at the default interval ({DEFAULT_INTERVAL:g} s)",
        percent,
        "%",
        target=f"< {TARGET_PERCENT}%",
        met=percent < TARGET_PERCENT,
        note=f"one sample and {DEFAULT_INTERVAL / WATCH_SECONDS:g} checks that the job still "
        "runs, per interval; the start (import, nvmlInit) is once per job, as the row above",
    )
    return result
