"""MIG on the real local cluster: node mig1 has one A100 in MIG mode, a GRES index per slice
(gres.conf ``MultipleFiles=`` records written by ``site gres-conf``'s code, GRES types that
are the profiles). Its GPU instances 2 and 3 are a 1g.10gb and a 2g.20gb slice, where the
node map says 2g.20gb and 1g.10gb: the Prolog passes (the same set of profiles), and a job's
preflight finds the slice Slurm gave it by the map's GPU instance and checks its profile.
"""

from __future__ import annotations

import re

import pytest

from clusterjob.sandbox.standin import mig_uuid_for

from .conftest import Cli, Sandbox
from .test_end_to_end import TRAIN, finished, logs, submit, wait_status

pytestmark = pytest.mark.slurm


def test_a_job_on_a_mig_slice_runs_with_its_slice_checked(cj: Cli, sandbox: Sandbox) -> None:
    job = submit(cj, sandbox, TRAIN, "--gpus", "1", "--model", "A100-3g.40gb", "-p", "mig")
    row = wait_status(cj, job, finished)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), row
    assert "gres/gpu:3g.40gb=1" in row["gpus"].split(","), row
    out = logs(cj, job)
    assert re.search(r"^preflight mig1: OK \(1 GPU slot\(s\)\)$", out, re.M), out
    # The TaskProlog gave CUDA the slice itself (GPU instance 1: NVML's first MIG device),
    # not Slurm's GRES index 0, which CUDA would take for the whole GPU.
    assert f"CUDA_VISIBLE_DEVICES={mig_uuid_for('mig1', 0, 0)}" in out.splitlines(), out


def test_a_job_given_another_slice_profile_is_refused_naming_both(
    cj: Cli, sandbox: Sandbox
) -> None:
    job = submit(cj, sandbox, TRAIN, "--gpus", "1", "--model", "A100-2g.20gb", "-p", "mig")
    row = wait_status(cj, job, finished)
    assert row["state"] == "FAILED" and row["exit_code"] != 0, row
    given = mig_uuid_for("mig1", 0, 1)  # GPU instance 2: a 1g.10gb slice
    assert (
        "error: alloc-model: mig1: slot 0 (0000:07:00.0): job asked for A100-2g.20gb, was "
        f"given MIG device GRES index 1 ({given}): NVIDIA A100-SXM4-80GB MIG 1g.10gb "
        "(A100-1g.10gb)"
    ) in logs(cj, job).splitlines()
    # The node is not to blame for what gres.conf says: it stays in service.
    state = sandbox.run("sinfo", "-h", "-n", "mig1", "-o", "%T").strip()
    assert not state.startswith(("drain", "down")), state
