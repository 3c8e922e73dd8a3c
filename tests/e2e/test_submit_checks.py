"""On the real cluster: what Slurm would take and get wrong is refused before sbatch.

Slurm 22.05 takes `--dependency afterok:ID` on a job it does not know and starts the job at
once; clusterjob refuses it, and takes one on a job Slurm knows. A node or model that does
not exist is named as such (with the name meant, for a slip)."""

from __future__ import annotations

import pytest

from .conftest import Cli, Sandbox
from .test_faults import TINY, TRAIN, job_name, slurm_jobs

__all__ = ["job_name"]  # the fixture, shared with test_faults

pytestmark = pytest.mark.slurm


def test_a_dependency_on_an_unknown_job_is_refused_and_a_known_one_taken(
    cj: Cli, sandbox: Sandbox, job_name: str
) -> None:
    site = ("--site", str(sandbox.site_path), "--job-name", job_name)
    unknown = str(int(sandbox.sbatch("--hold", "--wrap", "true", "-J", job_name)) + 100000)
    refused = cj("submit", TRAIN, *site, *TINY, "-d", f"afterok:{unknown}")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr == (
        f"clusterjob: error: --dependency afterok:{unknown}: Slurm knows no job {unknown} "
        "(neither queued nor in accounting); Slurm would drop the dependency and start this "
        "job at once\n"
    )
    (held,) = slurm_jobs(sandbox, job_name)  # only the job made here by hand
    taken = cj("submit", TRAIN, *site, *TINY, "-d", f"afterok:{held}", "--parsable")
    assert taken.returncode == 0, taken.stderr
    job = taken.stdout.strip()
    assert sandbox.job(job)["Dependency"] == f"afterok:{held}(unfulfilled)"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--gpus", "1", "--model", "A100", "--nodelist", "gpu9"),
         "--nodelist: no node gpu9 at site sandbox; its nodes: gpu[1-3],h1,mig1"),
        (("--gpus", "1", "--model", "A100", "--exclude", "gpu[1,9]"),
         "--exclude: no node gpu9 at site sandbox; its nodes: gpu[1-3],h1,mig1"),
        (("--gpus", "1", "--model", "A10O"),
         "unknown GPU model 'A10O' at site sandbox (did you mean A100?); this site has: "),
    ],
)  # fmt: skip
def test_a_node_or_model_that_does_not_exist_is_named(
    cj: Cli, sandbox: Sandbox, job_name: str, options: tuple[str, ...], message: str
) -> None:
    done = cj("submit", TRAIN, "--site", str(sandbox.site_path), *options, "--job-name", job_name)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"clusterjob: error: {message}"), done.stderr
    assert slurm_jobs(sandbox, job_name) == {}
