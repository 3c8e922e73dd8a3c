"""Typed Slurm operations on top of the one runner: each is one batched command.

``SlurmClient`` is what the core (``clusterjob.jobs``) talks to. Tests build it with a
``Runner`` around a fake ``exec``; production code uses ``SlurmClient()``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from clusterjob.errors import (
    SlurmError,
    SlurmTransientError,
    SlurmUnavailable,
    SubmissionUncertain,
)
from clusterjob.slurm import parse
from clusterjob.slurm.parse import (
    AccountedJob,
    ControlJob,
    NodeRecord,
    PartitionRecord,
    QueuedJob,
    StartEstimate,
    SubmittedJobId,
)
from clusterjob.slurm.runner import Runner

if TYPE_CHECKING:
    from clusterjob.slurm.describe import QosRecord

COMMENT_PREFIX = "clusterjob:"  # render writes `#SBATCH --comment=clusterjob:<token>`
SBATCH_TIMEOUT = 30.0  # one sbatch attempt: three MessageTimeouts of a busy controller
SUBMIT_WINDOW = 120.0  # all sbatch attempts and token look-ups together
QUERY_TIMEOUT = 30.0
QUERY_WINDOW = 60.0


def _ids(job_ids: Iterable[str]) -> list[str]:
    return sorted(set(job_ids), key=lambda j: (len(j), j))


def _invalid_job_id(exc: SlurmError) -> bool:
    return "Invalid job id specified" in exc.stderr


class SlurmClient:
    """Slurm's commands as typed calls. One ``Runner`` counts and bounds every call."""

    def __init__(self, runner: Runner | None = None) -> None:
        self.runner = runner or Runner()

    def _query(self, cmd: list[str], *, window: float = QUERY_WINDOW) -> str:
        deadline = self.runner.clock() + window
        return self.runner.run(cmd, timeout=QUERY_TIMEOUT, deadline=deadline, retry=True).stdout

    # --- submission -----------------------------------------------------------------------

    @property
    def remote(self) -> bool:
        """Whether Slurm runs on another machine (over ssh): scripts then go by stdin."""
        return self.runner.transport.remote

    def _script_argv(
        self, cmd: list[str], script_path: str | Path, script: str | None
    ) -> tuple[list[str], str | None]:
        """(argv, stdin): a remote sbatch reads the script from stdin (the file is here)."""
        if self.remote and script is not None:
            return cmd, script
        return [*cmd, str(script_path)], None

    def sbatch_test_only(
        self, script_path: str | Path, *, workdir: str | Path, script: str | None = None
    ) -> StartEstimate:
        """``sbatch --test-only``: Slurm validates the job and estimates a start; no job.

        A refusal is sbatch's own ``SlurmError``; the jobs layer words it for the site.
        """
        cmd, stdin = self._script_argv(
            ["sbatch", "--test-only", f"--chdir={workdir}"], script_path, script
        )
        result = self.runner.run(
            cmd,
            input=stdin,
            timeout=SBATCH_TIMEOUT,
            deadline=self.runner.clock() + QUERY_WINDOW,
            retry=True,  # nothing is created, so retrying is always safe
        )
        try:
            return parse.parse_test_only(result.stderr + result.stdout)
        except ValueError as exc:
            raise SlurmError(cmd, result.returncode, str(exc)) from None

    def sbatch(
        self,
        script_path: str | Path,
        *,
        token: str,
        workdir: str | Path,
        window: float = SUBMIT_WINDOW,
        script: str | None = None,
    ) -> SubmittedJobId:
        """Submit once, even when sbatch times out.

        A timed-out sbatch may still have created the job (the controller read the request
        and the reply was lost; seen on 22.05 with a stalled slurmctld). So before every
        retry the job is looked up by its ``--comment`` token, twice with a pause between
        (the controller may still be processing the request). Without a successful look-up
        nothing is resubmitted. A refusal is sbatch's own ``SlurmError``, raised at once;
        the jobs layer words it for the site.
        """
        cmd, stdin = self._script_argv(
            ["sbatch", "--parsable", f"--chdir={workdir}"], script_path, script
        )
        deadline = self.runner.clock() + window
        attempt = 0
        while True:
            try:
                result = self.runner.run(
                    cmd, timeout=SBATCH_TIMEOUT, deadline=deadline, retry=False, input=stdin
                )
            except SlurmTransientError as exc:
                last = exc
            else:
                try:
                    return parse.parse_job_id(result.stdout)
                except ValueError as exc:
                    raise SlurmError(cmd, result.returncode, str(exc)) from None
            for look in range(2):
                found = self._lookup_token(cmd, token, deadline, last)
                if found is not None:  # an array's rows are ID_N / ID_[..]: the job is ID
                    return SubmittedJobId(found.job_id.split("_", 1)[0], found.cluster or None)
                if look == 0:
                    self.runner.sleep(self.runner.backoff(attempt, deadline - self.runner.clock()))
            if self.runner.clock() >= deadline:
                raise SlurmUnavailable(
                    cmd,
                    last.returncode,
                    last.stderr,
                    hint=f"no job was created (none has comment {COMMENT_PREFIX}{token}); "
                    "it is safe to submit again later",
                ) from last
            attempt += 1

    def _lookup_token(
        self, cmd: list[str], token: str, deadline: float, cause: SlurmError
    ) -> QueuedJob | None:
        try:
            found = self.find_jobs_by_comment(token, deadline=deadline)
        except SlurmError as exc:
            raise SubmissionUncertain(
                cmd,
                cause.returncode,
                cause.stderr,
                hint=f"sbatch may or may not have created the job and Slurm cannot be asked "
                f"({exc.stderr.splitlines()[0] if exc.stderr else exc}); before submitting "
                f"again, look for comment {COMMENT_PREFIX}{token} with "
                "`squeue --me --Format=JobID,Comment`",
            ) from exc
        return found[0] if found else None

    # --- queries --------------------------------------------------------------------------

    def squeue_jobs(self, job_ids: Iterable[str]) -> list[QueuedJob]:
        """Every listed job Slurm still holds in memory (pending, running, recently ended),
        in ONE squeue call whatever the number of ids."""
        return parse.parse_squeue(self.squeue_output(job_ids))

    def squeue_output(self, job_ids: Iterable[str]) -> str:
        """squeue's raw answer for ``squeue_jobs`` (what the status cache keeps)."""
        ids = _ids(job_ids)
        if not ids:
            return ""
        cmd = ["squeue", "--noheader", "--states=all", f"--jobs={','.join(ids)}"]
        cmd.append(f"--Format={parse.squeue_format()}")
        try:
            return self._query(cmd)
        except SlurmError as exc:
            if _invalid_job_id(exc):  # a lone unknown id is an error; several are not
                return ""
            raise

    def find_jobs_by_comment(self, token: str, *, deadline: float | None = None) -> list[QueuedJob]:
        """This user's jobs whose comment carries ``token``, oldest first."""
        cmd = ["squeue", "--noheader", "--states=all", "--me"]
        cmd.append(f"--Format={parse.squeue_format()}")
        if deadline is None:
            out = self._query(cmd)
        else:
            out = self.runner.run(
                cmd,
                timeout=QUERY_TIMEOUT,
                deadline=max(deadline, self.runner.clock() + 1),
                retry=True,
            ).stdout
        wanted = COMMENT_PREFIX + token
        jobs = [j for j in parse.parse_squeue(out) if j.comment == wanted]
        return sorted(jobs, key=lambda j: (len(j.job_id), j.job_id))

    def find_job_by_comment(self, token: str) -> QueuedJob | None:
        found = self.find_jobs_by_comment(token)
        return found[0] if found else None

    def sacct_jobs(self, job_ids: Iterable[str]) -> list[AccountedJob] | None:
        """Finished (and other) jobs from accounting in ONE call; None without accounting."""
        out = self.sacct_output(job_ids)
        return None if out is None else parse.parse_sacct(out)

    def sacct_output(self, job_ids: Iterable[str]) -> str | None:
        ids = _ids(job_ids)
        if not ids:
            return ""
        cmd = [
            "sacct",
            "--noheader",
            "--parsable2",
            f"--delimiter={parse.DELIMITER}",
            "--allocations",
            f"--jobs={','.join(ids)}",
            f"--format={parse.sacct_format()}",
        ]
        try:
            return self._query(cmd)
        except SlurmError as exc:
            if "accounting storage is disabled" in (exc.stderr or "").lower():
                return None
            raise

    def scontrol_job(self, job_id: str) -> ControlJob | None:
        """The live record (expanded output paths, exit code); None once Slurm forgot it
        (``MinJobAge`` after the end, 300 s by default)."""
        try:
            out = self._query(["scontrol", "show", "job", "-o", job_id])
        except SlurmError as exc:
            if _invalid_job_id(exc):
                return None
            raise
        jobs = parse.parse_scontrol_jobs(out)
        return jobs[0] if jobs else None

    def job_output_paths(self, job_id: str) -> tuple[str | None, str | None] | None:
        job = self.scontrol_job(job_id)
        return None if job is None else (job.stdout, job.stderr)

    def scancel(self, job_ids: Sequence[str]) -> list[str]:
        """Ask Slurm to cancel; the ids it does not know. scancel exits 0 even for those
        (22.05) and names them only with ``--verbose``, on stderr."""
        if not job_ids:
            return []
        deadline = self.runner.clock() + QUERY_WINDOW
        cmd = ["scancel", "--verbose", *job_ids]
        result = self.runner.run(cmd, timeout=QUERY_TIMEOUT, deadline=deadline, retry=True)
        return parse.parse_scancel_unknown(result.stderr)

    def srun_pty(self, options: Sequence[str], command: Sequence[str], env: dict[str, str]) -> int:
        """``srun --pty OPTIONS COMMAND`` on this terminal (an interactive session), ``env``
        added to the environment; its exit status. Not through the runner's timeouts: a
        person decides when it ends. On a remote cluster: ``ssh -t`` to the login node."""
        return self.runner.transport.interactive(["srun", "--pty", *options, *command], env)

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as name -> value."""
        return parse.parse_scontrol_config(self._query(["scontrol", "show", "config"]))

    def qos(self) -> list[QosRecord]:
        """Every QoS with its limits (``sacctmgr show qos``; needs accounting)."""
        from clusterjob.slurm import describe  # only `site init` asks: not at submit's start

        return describe.parse_sacctmgr_qos(self._query(describe.sacctmgr_qos_command()))

    def cluster_name(self) -> str:
        """This cluster's ``ClusterName`` (site discovery matches it against site configs)."""
        config = self.config()
        name = config.get("ClusterName")
        if not name:
            raise SlurmError(["scontrol", "show", "config"], 0, "no ClusterName in the config")
        return name

    def nodes(self, names: str | None = None) -> list[NodeRecord]:
        """Nodes with Gres, GresUsed, State and Reason (``scontrol show node -o -d``)."""
        cmd = ["scontrol", "show", "node", "-o", "-d"]
        if names:
            cmd.append(names)
        return parse.parse_scontrol_nodes(self._query(cmd))

    def partitions(self) -> list[PartitionRecord]:
        """Every partition with its node hostlist (``scontrol show partition -o``)."""
        return parse.parse_scontrol_partitions(self._query(["scontrol", "show", "partition", "-o"]))


_TOKEN = re.compile(r"^#SBATCH\s+--comment[= ]\"?clusterjob:([0-9A-Za-z_-]+)", re.MULTILINE)


def token_in_script(script: str) -> str | None:
    """The submission token a rendered script carries in its ``--comment``."""
    m = _TOKEN.search(script)
    return m.group(1) if m else None
