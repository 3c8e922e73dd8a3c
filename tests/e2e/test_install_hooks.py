"""`clusterjob site install-hooks` on the real local cluster: the wrappers it writes are the
ones slurmd runs as Prolog and TaskProlog, and a real job passes through them.

The sandbox writes its hooks through the same code with its stand-in NVML variables, so the
command given those variables as --env writes the very same bytes: `--check` finds the live
wrappers as it would write them, and writing them again (new files, renamed into place)
changes nothing for the other jobs running meanwhile.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clusterjob import __version__
from clusterjob.sandbox import config
from clusterjob.sandbox.config import Layout

from .conftest import Sandbox, clusterjob_cli

pytestmark = pytest.mark.slurm


def _install_hooks(layout: Layout, *more: str) -> list[str]:
    return [
        "site", "install-hooks", "--site", str(layout.site_yaml),
        "--prefix", str(layout.hooks_dir), "--cache-dir", str(layout.cache_dir),
        "--python", str(config.hook_python(layout)),  # one every job's user can run
        *(f"--env={name}={value}" for name, value in config.standin_env(layout)), *more,
    ]  # fmt: skip


def _prolog_records(layout: Layout, job_id: str) -> list[dict[str, object]]:
    records = []
    for line in layout.prolog_log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("job_id") == job_id:
            records.append(record)
    return records


def test_install_hooks_wrappers_run_a_real_job(sandbox: Sandbox, tmp_path: Path) -> None:
    layout = sandbox.layout
    prolog = layout.hooks_dir / "clusterjob-prolog"
    task_prolog = layout.hooks_dir / "clusterjob-task-prolog"
    conf = layout.slurm_conf.read_text().splitlines()
    assert f"Prolog={prolog}" in conf and f"TaskProlog={task_prolog}" in conf

    checked = clusterjob_cli(*_install_hooks(layout, "--check"),
                             env={**sandbox.env, "SLURMD_NODENAME": "gpu1"})  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"runs clusterjob {__version__}" in checked.stdout
    assert "NVML: 4 GPU(s) on this machine" in checked.stdout  # gpu1's stand-in GPUs
    assert "slurm.conf: Prolog=, TaskProlog= and Epilog= name these wrappers" in checked.stdout

    before = {p: p.stat().st_ino for p in (prolog, task_prolog)}
    written = clusterjob_cli(*_install_hooks(layout), env=sandbox.env)
    assert written.returncode == 0, written.stderr
    assert f"wrote {prolog} (root, 0755)" in written.stdout
    assert f"Prolog={prolog}" in written.stdout.splitlines()
    assert all(p.stat().st_ino != inode for p, inode in before.items())  # written anew

    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\nenv | grep -E '^(CUDA_DEVICE_ORDER|FAKE_NVML_SCENARIO)=' | sort\n"
    )
    out = tmp_path / "out.txt"
    job_id = sandbox.sbatch(
        "-p", "gpu", "-w", "gpu1", "--gres=gpu:a100:1", "-A", "sandbox", "-o", str(out),
        "-J", "install-hooks-e2e", str(script),
    )  # fmt: skip
    fields = sandbox.wait_job(job_id, timeout=120)
    assert fields["JobState"] == "COMPLETED", fields
    # The TaskProlog ran: its exports reached the job's task.
    assert out.read_text().splitlines() == [
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        f"FAKE_NVML_SCENARIO={layout.scenario('gpu1')}",
    ]
    # The Prolog ran, checked the GPUs, and logged which clusterjob it was.
    (record,) = _prolog_records(layout, job_id)
    assert (record["node"], record["outcome"], record["version"]) == ("gpu1", "ok", __version__)


def test_site_diff_names_a_node_whose_prolog_ran_another_version(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """The real Prolog's log, plus one record as an older clusterjob on gpu2 would write it."""
    log = tmp_path / "prolog.jsonl"
    shutil.copy(sandbox.layout.prolog_log, log)
    old = {"node": "gpu2", "time": "2026-01-01T00:00:00+0000", "version": "0.0.1"}
    with log.open("a") as f:
        f.write(json.dumps(old) + "\n")
    env = {**sandbox.env, "CLUSTERJOB_SITE": str(sandbox.site_path)}
    done = clusterjob_cli("site", "diff", "--prolog-log", str(log), "--json", env=env)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and not report["in_sync"]
    assert {"node": "gpu2", "version": "0.0.1", "time": old["time"]} in report["version_skew"]
    assert all(s["node"] != "gpu1" for s in report["version_skew"])  # ran this version above
