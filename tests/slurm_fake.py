"""A small stateful stand-in for Slurm's commands, for unit tests of the slurm/jobs layer.

It speaks the exact formats clusterjob asks for (``parse.squeue_format()`` and friends), so
the real parsers run on its output. It also owns a virtual clock: the runner's sleeps and
timed-out commands advance it, so retry tests take no real time. The real Slurm is
exercised in tests/e2e/test_jobs_slurm.py.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from clusterjob.slurm import parse
from clusterjob.slurm.commands import SlurmClient, token_in_script
from clusterjob.slurm.runner import Runner, SlurmResult
from clusterjob.slurm.syntax import array_task_ids

NO_CONTROLLER = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


class FakeSlurm:
    def __init__(self, cluster: str = "fake", *, accounting: bool = True) -> None:
        self.cluster = cluster
        self.accounting = accounting
        self.jobs: dict[str, dict[str, str]] = {}
        self.forgotten: set[str] = set()  # ended longer than MinJobAge ago: sacct only
        self.unrecorded_end: set[str] = set()  # ended, slurmdbd not told yet: sacct says RUNNING
        self.forgotten_by_scontrol: set[str] = set()  # MinJobAge passed right after squeue ran
        self.sacct_nodes: dict[str, str] = {}  # job id -> the node list sacct shows instead
        self.next_id = 100
        self.calls: list[list[str]] = []
        self.sbatch_plan: list[str] = []  # per sbatch: ok | timeout_created | timeout | stderr
        self.down_calls = 0  # the next N calls find no controller
        self.now = 1000.0
        self.drained: dict[str, str] = {}  # node -> drain reason (`scontrol show node`)

    # the runner's view: exec, clock, sleep
    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def client(self) -> SlurmClient:
        return SlurmClient(Runner(self, sleep=self.sleep, clock=self.clock))

    def commands(self, name: str) -> list[list[str]]:
        return [c for c in self.calls if c[0] == name]

    def add_job(self, *, state: str = "PENDING", reason: str = "Priority", **fields: str) -> str:
        job_id = str(self.next_id)
        self.next_id += 1
        self.jobs[job_id] = self._fields(job_id, state, reason, **fields)
        return job_id

    def add_array(
        self,
        tasks: dict[int, tuple[str, str]],
        *,
        pending: str | None = None,
        reason: str = "JobArrayTaskLimit",
        **fields: str,
    ) -> str:
        """An array job as squeue/sacct show it: one row per started task (``ID_N``, state
        and exit code as given) and one ``ID_[spec]`` row for the tasks not started yet."""
        base = str(self.next_id)
        self.next_id += 1
        for n, (state, exit_code) in tasks.items():
            task_reason = "None" if state != "PENDING" else reason
            self.jobs[f"{base}_{n}"] = self._fields(
                f"{base}_{n}", state, task_reason, exit_code=exit_code, **fields
            )
        if pending:
            self.jobs[f"{base}_[{pending}]"] = self._fields(
                f"{base}_[{pending}]", "PENDING", reason, **fields
            )
        return base

    def _wanted(self, job_id: str, ids: Sequence[str] | None) -> bool:
        """Whether ``--jobs=ids`` selects the row ``job_id`` (an array id selects its tasks)."""
        return ids is None or job_id in ids or job_id.split("_", 1)[0] in ids

    def _fields(self, job_id: str, state: str, reason: str, **fields: str) -> dict[str, str]:
        return {
            "job_id": job_id,
            "cluster": self.cluster,
            "state": state,
            "reason": reason,
            "partition": "gpu",
            "nodes": "gpu1" if state != "PENDING" else "",
            "elapsed": "0:00",
            "time_limit": "1:00:00",
            "start": "N/A",
            "submit": time.strftime("%Y-%m-%dT%H:%M:%S"),  # Slurm prints local time
            "tres_per_node": "gres:gpu:a100:1",
            "user": "ana",
            "work_dir": "/home/ana/run",
            "stdout": "/home/ana/run/slurm-%j.out",
            "stderr": "/home/ana/run/slurm-%j.out",
            "comment": "",
            "name": "train",
            "exit_code": "0:0",
            **fields,
        }

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        cmd = list(cmd)
        self.calls.append(cmd)
        if self.down_calls > 0:
            self.down_calls -= 1
            return SlurmResult(tuple(cmd), 1, "", NO_CONTROLLER)
        handler = getattr(self, "_" + cmd[0])
        return handler(cmd, timeout)

    @staticmethod
    def _option(cmd: list[str], name: str) -> str | None:
        for arg in cmd:
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
        return None

    def _ok(self, cmd: list[str], stdout: str = "", stderr: str = "") -> SlurmResult:
        return SlurmResult(tuple(cmd), 0, stdout, stderr)

    def _sbatch(self, cmd: list[str], timeout: float) -> SlurmResult:
        script = Path(cmd[-1]).read_text()
        token = token_in_script(script) or ""
        if "--test-only" in cmd:
            return self._ok(
                cmd,
                stderr=f"sbatch: Job {self.next_id} to start at 2026-11-29T16:18:15 using 1 "
                "processors on nodes gpu1 in partition gpu\n",
            )
        plan = self.sbatch_plan.pop(0) if self.sbatch_plan else "ok"
        if plan in ("ok", "timeout_created"):
            fields = {"comment": f"clusterjob:{token}", "work_dir": self._option(cmd, "--chdir")}
            array = re.search(r"^#SBATCH --array=(\S+)", script, re.MULTILINE)
            if array:
                job_id = self.add_array({}, pending=array.group(1), **fields)  # type: ignore[arg-type]
            else:
                job_id = self.add_job(**fields)  # type: ignore[arg-type]
            if plan == "ok":
                return self._ok(cmd, f"{job_id}\n")
        if plan.startswith("timeout"):
            self.now += timeout
            raise subprocess.TimeoutExpired(cmd, timeout)
        return SlurmResult(tuple(cmd), 1, "", plan)

    def _line(self, job: dict[str, str], fields: Sequence[tuple[str, str]]) -> str:
        return parse.DELIMITER.join(job.get(name, "") for name, _ in fields)

    @staticmethod
    def _queued(job: dict[str, str]) -> dict[str, str]:
        """squeue prints the exit code as one wait status: ``3:0`` -> 768, ``0:9`` -> 9 (a
        value without ``:`` is printed as it is)."""
        code, colon, sig = job["exit_code"].partition(":")
        if not colon:
            return job
        return {**job, "exit_code": str(int(sig) if int(sig) else int(code) << 8)}

    def _squeue(self, cmd: list[str], timeout: float) -> SlurmResult:
        wanted = self._option(cmd, "--jobs")
        ids = wanted.split(",") if wanted else None
        lines = [
            self._line(self._queued(job), parse.SQUEUE_FIELDS)
            for job_id, job in self.jobs.items()
            if job_id not in self.forgotten and self._wanted(job_id, ids)
        ]
        for wanted in ids or ():  # a task not started yet, asked for by its id: its own line
            if wanted not in self.jobs and "_" in wanted:
                base, task = wanted.split("_", 1)
                for job_id, job in self.jobs.items():
                    if job_id.startswith(base + "_[") and int(task) in array_task_ids(
                        job_id.split("_", 1)[1]
                    ):
                        queued = self._queued({**job, "job_id": wanted})
                        lines.append(self._line(queued, parse.SQUEUE_FIELDS))
        known = [j for j in self.jobs if self._wanted(j, ids)]
        if ids is not None and len(ids) == 1 and not known and not lines:
            return SlurmResult(tuple(cmd), 1, "", "slurm_load_jobs error: Invalid job id specified")
        return self._ok(cmd, "".join(line + "\n" for line in lines))

    def _sacct(self, cmd: list[str], timeout: float) -> SlurmResult:
        if not self.accounting:
            return SlurmResult(tuple(cmd), 1, "", "Slurm accounting storage is disabled\n")
        ids = (self._option(cmd, "--jobs") or "").split(",")
        rows = []
        for job_id in [j for j in self.jobs if self._wanted(j, ids)]:
            job = self.jobs.get(job_id)
            if job is not None and job_id in self.unrecorded_end:
                running = {**job, "state": "RUNNING", "reason": "None", "exit_code": "0:0"}
                rows.append(self._line({**running, "end": "Unknown"}, parse.SACCT_FIELDS))
            elif job is not None:
                nodes = self.sacct_nodes.get(job_id, job["nodes"])
                rows.append(
                    self._line({**job, "nodes": nodes, "end": "Unknown"}, parse.SACCT_FIELDS)
                )
        return self._ok(cmd, "".join(r + "\n" for r in rows))

    def _scontrol(self, cmd: list[str], timeout: float) -> SlurmResult:
        if cmd[1:3] == ["show", "config"]:
            return self._ok(cmd, f"ClusterName             = {self.cluster}\n")
        if cmd[1:3] == ["show", "node"]:
            lines = [f"NodeName={n} State=IDLE+DRAIN Partitions=gpu Reason={why}\n"
                     for n, why in self.drained.items()]  # fmt: skip
            return self._ok(cmd, "".join(lines))
        job = self.jobs.get(cmd[-1])
        if job is None or cmd[-1] in self.forgotten | self.forgotten_by_scontrol:
            return SlurmResult(tuple(cmd), 1, "", "slurm_load_jobs error: Invalid job id specified")
        out = job["stdout"].replace("%j", job["job_id"])
        err = job["stderr"].replace("%j", job["job_id"])
        line = (
            f"JobId={job['job_id']} JobName={job['name']} JobState={job['state']} "
            f"Reason={job['reason']} Restarts={job.get('restarts', '0')} "
            f"ExitCode={job['exit_code']} WorkDir={job['work_dir']} "
            f"Comment={job['comment']} StdErr={err} StdIn=/dev/null StdOut={out} Power="
        )
        return self._ok(cmd, line + "\n")

    def _scancel(self, cmd: list[str], timeout: float) -> SlurmResult:
        """As scancel 22.05: exit 0 even for an unknown id, which only --verbose names."""
        verbose = "--verbose" in cmd or "-v" in cmd
        ids = [a for a in cmd[1:] if not a.startswith("-")]
        said = [f"scancel: Terminating job {job_id}" for job_id in ids] if verbose else []
        for job_id in ids:
            if job_id in self.jobs:
                self.jobs[job_id]["state"] = "CANCELLED"
            elif verbose:
                said.append(
                    f"scancel: error: Kill job error on job id {job_id}: Invalid job id specified"
                )
        return self._ok(cmd, stderr="".join(f"{line}\n" for line in said))
