"""Slurm load: how many squeue/sacct/scontrol calls ``clusterjob status`` makes.

Each Slurm client is shadowed on PATH by a wrapper that logs its name and then runs the
real command, so the count is what the controller sees. The registry is seeded in a
temporary CLUSTERJOB_DATA_DIR with 1, 100 and 1,000 tracked jobs (ids Slurm does not know,
so they stay live and every ``status`` has to ask about all of them: the worst case).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks.common import Result, clusterjob_command

CLIENTS = ("squeue", "sacct", "scontrol", "sbatch", "scancel", "sinfo")
TARGET_CALLS = 2


def wrap_clients(bin_dir: Path, log: Path) -> list[str]:
    """Write logging wrappers for the Slurm clients found on PATH; return the wrapped names."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapped = []
    for name in CLIENTS:
        real = shutil.which(name)
        if real is None:
            continue
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\necho "{name}" >> "{log}"\nexec "{real}" "$@"\n')
        wrapper.chmod(0o755)
        wrapped.append(name)
    return wrapped


def count_calls(log: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    if log.exists():
        for line in log.read_text().split():
            counts[line] = counts.get(line, 0) + 1
    log.unlink(missing_ok=True)
    return counts


def seed_registry(data_dir: Path, jobs: int, cluster: str) -> None:
    from clusterjob.jobs.registry import REGISTRY_FILE, JobRecord, Registry

    now = time.time()
    records = [
        JobRecord(
            job_id=str(60_000_000 + i),
            cluster=cluster,
            site="bench",
            token=f"bench{i:06d}",
            job_name=f"train-{i}",
            script="#!/bin/bash\n",
            script_path=str(data_dir / f"job-{i}.sh"),
            command_line="clusterjob submit train.py --gpus 8",
            work_dir=str(data_dir),
            git_commit=None,
            submitted_at=now - 60 + i * 0.01,
            state="PENDING",
        )
        for i in range(jobs)
    ]
    Registry(data_dir / REGISTRY_FILE).add(*records)


def run(work: Path, *, quick: bool) -> Result:
    result = Result("slurm_load", "Slurm load of `clusterjob status`")
    if shutil.which("squeue") is None:
        result.notes.append("skipped: no Slurm clients (squeue) on PATH")
        return result
    log = work / "slurm-calls.log"
    bin_dir = work / "slurm-wrappers"
    wrapped = wrap_clients(bin_dir, log)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    cmd = [*clusterjob_command(), "status"]
    cluster = os.environ.get("CLUSTERJOB_BENCH_CLUSTER", "sandbox")
    sizes = (1, 20) if quick else (1, 100, 1_000)

    def status(data: Path) -> tuple[dict[str, int], int]:
        env["CLUSTERJOB_DATA_DIR"] = str(data)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        return count_calls(log), done.returncode

    for n in sizes:
        data = work / f"status-data-{n}"
        seed_registry(data, n, cluster)
        counts, code = status(data)
        slurm = sum(counts.get(c, 0) for c in ("squeue", "sacct", "scontrol"))
        result.add(
            f"Slurm calls, one `status`, {n:,} tracked jobs",
            slurm,
            "calls",
            target=f"<= {TARGET_CALLS}",
            met=slurm <= TARGET_CALLS,
            note=_describe(counts) + (f"; exit {code}" if code else ""),
        )
    n = sizes[-1] if quick else 100
    data = work / "status-data-repeat"
    seed_registry(data, n, cluster)
    total: dict[str, int] = {}
    start = time.monotonic()
    for _ in range(10):
        counts, _code = status(data)
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
    elapsed = time.monotonic() - start
    slurm = sum(total.get(c, 0) for c in ("squeue", "sacct", "scontrol"))
    result.add(
        f"Slurm calls, 10 `status` in a row, {n:,} tracked jobs",
        slurm,
        "calls",
        target=f"<= {TARGET_CALLS}",
        met=slurm <= TARGET_CALLS,
        note=f"{_describe(total)}; the 10 calls took {elapsed:.1f} s (status cache: 10 s)",
    )
    result.notes.append(f"wrapped clients: {', '.join(wrapped)}")
    return result


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no Slurm call"
