"""The slurm/jobs layer against the real local Slurm cluster (`clusterjob sandbox up`).

Clients find the cluster through SLURM_CONF, as on a login node: the fixture below sets it
to the sandbox's (brought up by the session fixture when it is not running).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clusterjob.errors import SlurmError, UsageError
from clusterjob.jobs.cancel import cancel
from clusterjob.jobs.logs import follow, output_path
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.status import StatusCache, status
from clusterjob.jobs.submit import Submitted, TestOnlyResult, submit
from clusterjob.jobscript.render import RenderedJob
from clusterjob.jobscript.request import JobRequest, new_token, resolve
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.runner import Runner

from .conftest import Sandbox

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def _slurm_conf(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(sandbox.layout.slurm_conf))


@pytest.fixture(scope="module")
def site(sandbox: Sandbox) -> Site:
    return load_site(sandbox.site_path)


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def tiny_job(site: Site, body: str, *, gres: str = "gpu:a100:1") -> tuple[object, RenderedJob]:
    """A minimal job script carrying a token the way render writes it."""
    token = new_token()
    resolved = resolve(site, JobRequest(script="tiny.py", gpus=1, model="A100", token=token))
    script = (
        "#!/bin/bash\n"
        "#SBATCH --job-name=cj-slurm-test\n"
        f"#SBATCH --comment=clusterjob:{token}\n"
        f"#SBATCH --gres={gres}\n"
        "#SBATCH --time=5\n"
        f"{body}\n"
    )
    return resolved, RenderedJob(script=script, sbatch_argv=["sbatch"], token=token)


def wait_for(job_id: str, states: set[str], client: SlurmClient, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        rows = status([job_id], client=client, cache=StatusCache(ttl=0))
        state = rows[0].state
        if state in states:
            return state
        time.sleep(1)
    raise AssertionError(f"job {job_id} stayed {state}, wanted one of {states}")


def test_cluster_name_matches_the_site(site: Site) -> None:
    assert SlurmClient().cluster_name() == site.cluster_name


def test_submit_status_sacct_and_logs(site: Site, data: Path, tmp_path: Path) -> None:
    client = SlurmClient()
    resolved, rendered = tiny_job(site, 'echo "hello from $SLURM_JOB_ID"; echo oops >&2')
    result = submit(site, resolved, rendered, client=client, workdir=tmp_path)
    assert isinstance(result, Submitted)
    assert result.cluster == site.cluster_name

    # the job is found by its token (what a timed-out sbatch relies on)
    found = client.find_job_by_comment(rendered.token)
    assert found is not None and found.job_id == result.job_id

    assert wait_for(result.job_id, {"COMPLETED"}, client) == "COMPLETED"
    # accounting (slurmdbd) catches up a moment later
    deadline = time.monotonic() + 60
    accounted = None
    while time.monotonic() < deadline:
        rows = client.sacct_jobs([result.job_id]) or []
        accounted = rows[0] if rows else None
        if accounted is not None and accounted.state == "COMPLETED":
            break
        time.sleep(1)
    assert accounted is not None and accounted.state == "COMPLETED"
    assert accounted.exit_code == 0
    assert accounted.cluster == site.cluster_name
    assert "gres/gpu" in (accounted.alloc_tres or "")

    record = Registry().get(result.job_id)
    assert record is not None and record.state == "COMPLETED"

    out = output_path("last", client=client)
    assert out == tmp_path / f"slurm-{result.job_id}.out"
    assert f"hello from {result.job_id}" in out.read_text()
    chunks = list(follow(out, finished=lambda: True, check_every=0))
    assert "hello from" in "".join(chunks)


def test_cancel_a_running_job(site: Site, data: Path, tmp_path: Path) -> None:
    client = SlurmClient()
    resolved, rendered = tiny_job(site, "sleep 300")
    result = submit(site, resolved, rendered, client=client, workdir=tmp_path)
    try:
        assert wait_for(result.job_id, {"RUNNING"}, client) == "RUNNING"
    finally:
        cancel([result.job_id], client=client)
    assert wait_for(result.job_id, {"CANCELLED"}, client) == "CANCELLED"


def test_cancel_of_an_unknown_job_says_so(data: Path) -> None:
    """The real scancel exits 0 for a job id slurmctld does not know; cancel must not."""
    with pytest.raises(UsageError, match=r"^unknown job 99999999: Slurm has no such job"):
        cancel(["99999999"], client=SlurmClient())


def test_status_of_several_jobs_is_at_most_two_calls(site: Site, data: Path, tmp_path) -> None:
    submitter = SlurmClient()
    ids = []
    for _ in range(3):
        resolved, rendered = tiny_job(site, "true")
        ids.append(submit(site, resolved, rendered, client=submitter, workdir=tmp_path))
    counting = SlurmClient(Runner())
    rows = status(client=counting, cache=StatusCache(ttl=0))
    assert {r.job_id for r in rows} >= {s.job_id for s in ids}
    assert counting.runner.calls <= 2
    for s in ids:
        wait_for(s.job_id, {"COMPLETED"}, submitter)


def test_test_only_estimates_without_submitting(site: Site, data: Path, tmp_path) -> None:
    client = SlurmClient()
    resolved, rendered = tiny_job(site, "true")
    result = submit(site, resolved, rendered, test_only=True, client=client, workdir=tmp_path)
    assert isinstance(result, TestOnlyResult)
    assert result.estimate.partition in {p.name for p in site.partitions}
    assert client.find_job_by_comment(rendered.token) is None
    assert Registry().all() == []


def test_real_sbatch_errors_get_site_hints(site: Site, data: Path, tmp_path: Path) -> None:
    client = SlurmClient()
    resolved, rendered = tiny_job(site, "true", gres="gpu:nosuchtype:1")
    with pytest.raises(SlurmError) as info:
        submit(site, resolved, rendered, client=client, workdir=tmp_path)
    message = str(info.value)
    assert "Requested node configuration is not available" in message
    assert "a100 (A100)" in message
    script = rendered.script.replace("--time=5", "--time=5\n#SBATCH --partition=nope")
    bad_partition = RenderedJob(script, rendered.sbatch_argv, rendered.token)
    with pytest.raises(SlurmError, match="partitions at site"):
        submit(site, resolved, bad_partition, client=client, workdir=tmp_path)
    assert Registry().all() == []
