"""A job's life after submit, on the real local Slurm cluster: arrays and sweeps, wait,
scripting output, safe preemption and requeue, resubmit with changes, status --watch.

Each test drives the real `clusterjob` command in its own process (the `cj` fixture), as a
researcher types it; Slurm calls are counted with a logging wrapper in front of the real
command where the test is about their number.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterjob.jobs.registry import Registry
from clusterjob.jobs.status import StatusCache, status
from clusterjob.jobs.submit import Submitted, submit
from clusterjob.jobscript.render import RenderedJob
from clusterjob.jobscript.request import JobRequest, new_token, resolve
from clusterjob.sandbox import cluster
from clusterjob.site.loader import load_site
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.runner import Runner

from .conftest import REQUEUED_START, Cli, Sandbox

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")


def submit_json(cj: Cli, sandbox: Sandbox, *args: str) -> dict:
    proc = cj("submit", "--site", str(sandbox.site_path), "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def status_json(cj: Cli, *args: str) -> list[dict]:
    proc = cj("status", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait(cj: Cli, *jobs: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return cj("wait", "--interval", "1", "--timeout", str(timeout), *jobs, timeout=timeout + 30)


def counting(tmp_path: Path, *tools: str) -> tuple[dict[str, str], Path]:
    """PATH with a wrapper per tool that logs each call, then runs the real command."""
    bin_dir = tmp_path / "counting-bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "slurm-calls.log"
    for tool in tools:
        real = shutil.which(tool)
        assert real, tool
        (bin_dir / tool).write_text(f'#!/bin/sh\necho {tool} >> {log}\nexec {real} "$@"\n')
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def calls(log: Path, tool: str) -> int:
    return log.read_text().split().count(tool) if log.exists() else 0


# --- arrays -----------------------------------------------------------------------------------


def test_array_with_a_failing_task(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    """A 10-task array whose task 3 exits 7: FAILED with the summary, each task's state,
    `logs ID_3`, `wait` exits non-zero."""
    script = tmp_path / "task.py"
    script.write_text(
        "import os, sys\n"
        "task = os.environ['SLURM_ARRAY_TASK_ID']\n"
        "print('hello from task', task, flush=True)\n"
        "sys.exit(7 if task == '3' else 0)\n"
    )
    job = submit_json(cj, sandbox, str(script), "--gpus", "1", "--model", "A100",
                      "--array", "0-9%4")  # fmt: skip
    assert job["tasks"] == 10
    done = wait(cj, job["job_id"])
    assert done.returncode == 7, (done.stdout, done.stderr)
    (row,) = status_json(cj, job["job_id"], "--tasks")
    assert (row["state"], row["exit_code"]) == ("FAILED", 7), row
    assert row["tasks_summary"] == "10 tasks: 9 COMPLETED, 1 FAILED (exit 7)", row
    tasks = {t["job_id"]: t for t in row["tasks"]}
    assert len(tasks) == 10
    three = tasks[f"{job['job_id']}_3"]
    assert (three["state"], three["exit_code"], three["site"]) == ("FAILED", 7, "sandbox")
    assert all(t["reason"] is None for t in tasks.values() if t["state"] == "COMPLETED"), tasks
    out = cj("logs", f"{job['job_id']}_3")
    assert out.returncode == 0 and "hello from task 3" in out.stdout, out.stderr
    assert cj("logs", job["job_id"], "--task", "3").stdout == out.stdout
    whole = cj("logs", job["job_id"])
    assert whole.returncode == 2 and "array of 10 tasks" in whole.stderr
    assert "4294967294" not in whole.stderr
    (task,) = status_json(cj, f"{job['job_id']}_3")
    assert (task["state"], task["site"]) == ("FAILED", "sandbox"), task
    table = cj("status", job["job_id"]).stdout
    assert re.search(rf"^{job['job_id']}\s+FAILED \(7\)", table, re.M), table
    assert "10 tasks: 9 COMPLETED, 1 FAILED (exit 7)" in table


def test_a_thousand_task_arrays_status_is_two_slurm_calls(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(sandbox.layout.slurm_conf))
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    site = load_site(sandbox.site_path)
    token = new_token()
    resolved = resolve(site, JobRequest(script="t.py", gpus=1, model="A100", token=token))
    script = (
        "#!/bin/bash\n#SBATCH --array=0-999%8\n#SBATCH --job-name=cj-thousand\n"
        f"#SBATCH --comment=clusterjob:{token}\n#SBATCH --gres=gpu:a100:1\n#SBATCH --time=5\n"
        "true\n"
    )
    result = submit(site, resolved, RenderedJob(script, ["sbatch"], token), workdir=tmp_path)
    assert isinstance(result, Submitted)
    try:
        deadline = time.monotonic() + 60
        while True:  # until some tasks ended (sacct has them) while most still wait
            client = SlurmClient(Runner())
            (row,) = status([result.job_id], tasks=True, client=client, cache=StatusCache(ttl=0))
            assert client.runner.calls <= 2, client.runner.calls
            if "COMPLETED" in (row.tasks_summary or "") or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert len(row.tasks) == 1000
        assert row.tasks_summary and row.tasks_summary.startswith("1000 tasks: "), row
        assert "PENDING" in row.tasks_summary
        assert Registry().get(result.job_id) is not None
    finally:
        SlurmClient().scancel([result.job_id])


# --- sweeps -----------------------------------------------------------------------------------


def test_sweep_is_one_array_job_with_each_tasks_arguments(
    cj: Cli, sandbox: Sandbox, tmp_path: Path
) -> None:
    env, log = counting(tmp_path, "sbatch")
    proc = cj("submit", "--site", str(sandbox.site_path), "--json", TRAIN, "--gpus", "1",
              "--model", "A100", "--sweep", "lr=1e-4,3e-4", "--sweep", "bs=32,64", "--array",
              "%2", "--", "--epochs", "1", extra_env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)
    assert calls(log, "sbatch") == 1 and job["tasks"] == 4
    assert wait(cj, job["job_id"]).returncode == 0
    (row,) = status_json(cj, job["job_id"], "--tasks")
    assert row["tasks_summary"] == "4 tasks: 4 COMPLETED", row
    params = [t["params"] for t in row["tasks"]]
    assert params == ["--lr=1e-4 --bs=32", "--lr=1e-4 --bs=64", "--lr=3e-4 --bs=32",
                      "--lr=3e-4 --bs=64"]  # fmt: skip
    for n, expected in enumerate(params):
        out = cj("logs", f"{job['job_id']}_{n}").stdout
        argv = re.findall(r"^argv\[\d+\]='([^']*)'$", out, re.M)
        assert argv == ["--epochs", "1", *expected.split()], out


def test_params_file_with_five_lines_runs_five_tasks(
    cj: Cli, sandbox: Sandbox, tmp_path: Path
) -> None:
    params = tmp_path / "params.txt"
    params.write_text(
        "# one task per line\n--lr 1e-4\n--lr 3e-4 --name 'two words'\n"
        '["--name", "$(touch pwned)"]\n--exit-code 0\n\n--lr=1\n'
    )
    job = submit_json(cj, sandbox, TRAIN, "--gpus", "1", "--model", "V100",
                      "--params", str(params))  # fmt: skip
    assert job["tasks"] == 5
    assert wait(cj, job["job_id"]).returncode == 0
    out = cj("logs", f"{job['job_id']}_1").stdout
    assert re.findall(r"^argv\[\d+\]='([^']*)'$", out, re.M) == ["--lr", "3e-4", "--name",
                                                                  "two words"]  # fmt: skip
    out = cj("logs", f"{job['job_id']}_2").stdout
    assert "argv[1]='$(touch pwned)'" in out
    assert not (tmp_path / "pwned").exists()


# --- scripting: wait, --json, --parsable, last in --dependency ------------------------------


def test_wait_json_parsable_and_dependency_on_last(cj: Cli, sandbox: Sandbox) -> None:
    first = submit_json(cj, sandbox, TRAIN, "--gpus", "1", "--model", "A100", "--",
                        "--exit-code", "3")  # fmt: skip
    assert set(first) >= {"job_id", "cluster", "script_path", "sbatch_command"}
    assert first["cluster"] == "sandbox" and Path(first["script_path"]).is_file()
    assert first["sbatch_command"].startswith("sbatch --parsable")
    second = cj("submit", "--site", str(sandbox.site_path), "--parsable", TRAIN, "--gpus", "1",
                "--model", "A100", "-d", "afterany:last")  # fmt: skip
    assert second.returncode == 0, second.stderr
    second_id = second.stdout.strip()
    assert re.fullmatch(r"\d+", second_id), second.stdout
    script = Path(json.loads(cj("show", second_id, "--json").stdout)["script_path"]).read_text()
    assert f"#SBATCH --dependency=afterany:{first['job_id']}\n" in script
    assert wait(cj, first["job_id"]).returncode == 3
    assert wait(cj, second_id).returncode == 0
    bad = cj("submit", "--site", str(sandbox.site_path), TRAIN, "--gpus", "1", "-d",
             "afterok:last~99")  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr


# --- safe preemption --------------------------------------------------------------------------

CHECKPOINTING = """\
import os, pathlib, signal, subprocess, sys, time

checkpoint = pathlib.Path("checkpoint-" + os.environ["SLURM_JOB_ID"])


def on_usr1(signum, frame):
    print("got USR1: checkpointing and requeueing", flush=True)
    checkpoint.write_text("step 42")
    subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
    time.sleep(120)  # Slurm ends this attempt


signal.signal(signal.SIGUSR1, on_usr1)
if checkpoint.exists():
    print("resumed from", checkpoint.read_text(), flush=True)
    sys.exit(0)
print("first attempt, working", flush=True)
while True:
    time.sleep(1)
"""


def test_single_node_signal_and_requeue_keep_both_attempts(
    cj: Cli, sandbox: Sandbox, tmp_path: Path
) -> None:
    program = tmp_path / "ckpt.py"
    program.write_text(CHECKPOINTING)
    proc = cj("submit", "--site", str(sandbox.site_path), "--parsable", str(program), "--gpus",
              "1", "--model", "V100", "--time", "1", "--signal", "USR1@5", "--requeue")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "sent as B:USR1@5" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    job = proc.stdout.strip()
    try:
        deadline = time.monotonic() + 150
        while True:  # the requeued job waits for Slurm's restart delay
            (row,) = status_json(cj, job)
            if row["restarts"]:
                break
            assert time.monotonic() < deadline, row
            time.sleep(2)
        assert row["state"] == "PENDING" and row["restarts"] == 1, row
        assert row["explanation"].startswith("requeued (restart 1), eligible at "), row
        # Slurm makes a requeued job wait about two minutes; what is under test is that the
        # second attempt appends to the same log, so let it start sooner.
        sandbox.run("scontrol", "update", f"JobId={job}", REQUEUED_START)
        assert wait(cj, job, timeout=300).returncode == 0
        out = cj("logs", job).stdout
        assert "first attempt, working" in out and "got USR1" in out, out
        assert "resumed from step 42" in out, out
        separators = re.findall(r"^=== clusterjob: attempt (\d) of job \d+ on .*===$", out, re.M)
        assert separators == ["1", "2"], out
    finally:
        cj("cancel", job)


# --- resubmit, show, status --watch -----------------------------------------------------------


def test_resubmit_with_new_arguments_and_more_gpus(cj: Cli, sandbox: Sandbox) -> None:
    first = submit_json(cj, sandbox, TRAIN, "--gpus", "1", "--model", "A100", "--", "--lr", "1")
    assert wait(cj, first["job_id"]).returncode == 0
    changed = cj("resubmit", first["job_id"], "--json", "--", "--new-arg")
    assert changed.returncode == 0, changed.stderr
    again = json.loads(changed.stdout)
    bigger = json.loads(cj("resubmit", first["job_id"], "--gpus", "2", "--json").stdout)
    same = json.loads(cj("resubmit", first["job_id"], "--same-script", "--json").stdout)
    for job in (again, bigger, same):
        assert wait(cj, job["job_id"]).returncode == 0
    argv = re.findall(r"^argv\[\d+\]='([^']*)'$", cj("logs", again["job_id"]).stdout, re.M)
    assert argv == ["--new-arg"]
    assert re.search(r"^CUDA_VISIBLE_DEVICES=0,1$", cj("logs", bigger["job_id"]).stdout, re.M)
    argv = re.findall(r"^argv\[\d+\]='([^']*)'$", cj("logs", same["job_id"]).stdout, re.M)
    assert argv == ["--lr", "1"]
    old = Path(first["script_path"]).read_text()
    new = Path(same["script_path"]).read_text()
    assert new == old.replace(
        old.split("clusterjob:")[1].split()[0], new.split("clusterjob:")[1].split()[0]
    )
    shown = json.loads(cj("show", bigger["job_id"], "--json").stdout)
    assert shown["resubmit_of"] == first["job_id"]
    bad = cj("resubmit", first["job_id"], "--same-script", "--gpus", "2")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr


def test_show_prints_the_provenance(cj: Cli, sandbox: Sandbox) -> None:
    job = submit_json(cj, sandbox, TRAIN, "--gpus", "1", "--model", "A100")
    out = cj("show", job["job_id"])
    assert out.returncode == 0, out.stderr
    for key in ("command line:", "working dir:", "git commit:", "site:", "token:",
                "script:", "sbatch command:"):  # fmt: skip
        assert key in out.stdout, out.stdout
    assert job["script_path"] in out.stdout
    wait(cj, job["job_id"])


def test_status_watch_costs_one_squeue_per_refresh(
    cj: Cli, sandbox: Sandbox, tmp_path: Path
) -> None:
    job = submit_json(cj, sandbox, TRAIN, "--gpus", "1", "--model", "A100", "--", "--sleep", "60")
    env, log = counting(tmp_path, "squeue", "sacct", "scontrol")
    full = dict(os.environ, **cluster.client_env(sandbox.state_dir))
    full.update(CLUSTERJOB_DATA_DIR=str(tmp_path / "data"), CLUSTERJOB_STATUS_CACHE_SECONDS="0",
                PATH=env["PATH"])  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while status_json(cj, job["job_id"])[0]["state"] != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(1)
        log.unlink(missing_ok=True)
        leader, follower = pty.openpty()
        watcher = subprocess.Popen(
            [sys.executable, "-m", "clusterjob", "status", "--watch", "--interval", "1",
             job["job_id"]],
            stdin=follower, stdout=follower, stderr=follower, env=full, cwd=tmp_path,
        )  # fmt: skip
        os.close(follower)
        seen = b""
        deadline = time.monotonic() + 60
        while seen.count(b"JOBID") < 3 or not seen.endswith(b"\n"):
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([leader], [], [], 1)
            if ready:
                seen += os.read(leader, 65536)
        watcher.terminate()
        watcher.wait(10)
        os.close(leader)
        refreshes = seen.count(b"JOBID")
        assert b"\x1b[H\x1b[2J" in seen  # refreshed in place on a terminal
        assert calls(log, "squeue") == refreshes, (refreshes, log.read_text())
        assert calls(log, "sacct") == 0 and calls(log, "scontrol") == 0
    finally:
        cj("cancel", job["job_id"])
