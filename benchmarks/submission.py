"""Submission: N jobs through ``clusterjob submit`` against the same N through plain sbatch.

Runs on a real Slurm (the local sandbox: SLURM_CONF and its site file). Every job is tiny
and starts no earlier than an hour from now (``--begin=now+1hour``), so nothing runs; all
of them carry one job name unique to this run and are cancelled by that name at the end,
whatever happens. Plain sbatch submits the very script clusterjob renders, so the
difference is clusterjob's own work: load the site, render, record in the registry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks.common import REFERENCE, REFERENCE_NAME, Result, clusterjob_command, median
from benchmarks.slurm_load import count_calls, wrap_clients

TARGET_RATIO = 1.5
SANDBOX_SITE = "/var/lib/clusterjob-sandbox/site.yaml"


def run(work: Path, *, quick: bool, jobs: int | None = None) -> Result:
    result = Result("submission", "Submission through clusterjob vs plain sbatch")
    site = os.environ.get("CLUSTERJOB_BENCH_SITE", SANDBOX_SITE)
    if shutil.which("sbatch") is None or not Path(site).is_file():
        result.notes.append(f"skipped: needs sbatch on PATH and a site file ({site})")
        return result
    n = jobs or (10 if quick else 200)
    name = f"cjbench-{os.getpid()}-{int(time.time())}"
    script = work / "tiny.py"
    script.write_text("print('tiny')\n")
    log = work / "submit-calls.log"
    bin_dir = work / "submit-wrappers"
    wrap_clients(bin_dir, log)
    env = dict(os.environ)
    env["CLUSTERJOB_DATA_DIR"] = str(work / "submit-data")
    counted = dict(env, PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    model = os.environ.get("CLUSTERJOB_BENCH_MODEL", "A100")
    cj = [*clusterjob_command(), "submit", str(script), "--gpus", "1", "--model", model,
          "--site", site, "--job-name", name, "--sbatch-arg=--begin=now+1hour"]  # fmt: skip
    rendered = subprocess.run(
        [*cj, "--dry-run"], env=env, capture_output=True, text=True, check=True
    ).stdout
    plain_script = work / "plain.sh"
    plain_script.write_text(rendered)
    plain = ["sbatch", "--parsable", f"--chdir={work}", str(plain_script)]

    times: dict[str, list[float]] = {"clusterjob submit": [], "sbatch": [], REFERENCE_NAME: []}
    try:
        for i in range(n):
            order = [("clusterjob submit", cj), ("sbatch", plain), (REFERENCE_NAME, REFERENCE)]
            if i % 2:
                order.reverse()
            for label, cmd in order:
                start = time.perf_counter()
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                times[label].append(time.perf_counter() - start)
                if done.returncode != 0:
                    raise RuntimeError(f"{label} failed ({done.returncode}): {done.stderr}")
        for _ in range(3):  # apart from the timed runs: the wrappers cost a shell each
            subprocess.run(cj, env=counted, capture_output=True, check=True)
    finally:
        subprocess.run(["scancel", f"--name={name}"], capture_output=True, check=False)
    cj_median, sb_median = median(times["clusterjob submit"]), median(times["sbatch"])
    result.add("plain sbatch, per job", sb_median * 1000, "ms", note=f"median of {n}")
    result.add(
        "clusterjob submit, per job",
        cj_median * 1000,
        "ms",
        ratio=cj_median / sb_median,
        reference="plain sbatch, per job",
        target=f"<= {TARGET_RATIO}x",
        met=cj_median / sb_median <= TARGET_RATIO,
        note=f"median of {n}, interleaved with sbatch",
    )
    floor = median(times[REFERENCE_NAME])
    result.add(
        f"{REFERENCE_NAME} (the floor of any Python command)",
        floor * 1000,
        "ms",
        ratio=floor / sb_median,
        reference="plain sbatch, per job",
        note="starting the interpreter alone, interleaved with the submissions",
    )
    result.add(
        "clusterjob submit against the Python floor",
        cj_median * 1000,
        "ms",
        ratio=cj_median / floor,
        reference=REFERENCE_NAME,
    )
    total_cj, total_sb = sum(times["clusterjob submit"]), sum(times["sbatch"])
    result.add(
        f"{n} jobs, total wall time through clusterjob",
        total_cj,
        "s",
        ratio=total_cj / total_sb,
        reference=f"{n} jobs through plain sbatch ({total_sb:.1f} s)",
    )
    calls = count_calls(log)
    result.add(
        "Slurm client calls per clusterjob submit",
        sum(calls.values()) / 3,
        "calls",
        note="over 3 submits: " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())),
    )
    result.notes.append(f"site {site}; model {model}; all jobs cancelled by name {name}")
    return result
