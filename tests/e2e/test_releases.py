"""What changed between Slurm 22.05, 24.11 and 26.05, on the live release the sandbox runs.

The e2e suite runs once per release (`clusterjob sandbox exec --slurm R -- pytest -m slurm`);
each test here holds on all three and says which release shows what.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clusterjob.errors import SlurmError
from clusterjob.jobs.logs import output_path
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.status import StatusCache, status
from clusterjob.jobs.submit import Submitted, submit
from clusterjob.jobscript.render import RenderedJob
from clusterjob.sandbox.config import SANDBOX_NODES
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from clusterjob.slurm import parse
from clusterjob.slurm.commands import SlurmClient

from .conftest import Sandbox
from .test_jobs_slurm import tiny_job, wait_for

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def _client_env(sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(sandbox.layout.slurm_conf))
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture
def site(sandbox: Sandbox) -> Site:
    return load_site(sandbox.site_path)


def _at_least(release: str, version: tuple[int, int]) -> bool:
    return tuple(map(int, release.split("."))) >= version


def test_slurmd_runs_without_cgroups_from_24_05_through_cgroup_conf(
    sandbox: Sandbox, slurm_release: str
) -> None:
    """slurmd 24.11 and 26.05 refuse to start without a cgroup file system unless
    cgroup.conf says CgroupPlugin=disabled; 22.05 refuses that line."""
    conf = sandbox.layout.cgroup_conf
    if _at_least(slurm_release, (24, 5)):
        assert "CgroupPlugin=disabled" in conf.read_text().splitlines()
    else:
        assert not conf.exists()
    states = sandbox.run("sinfo", "-h", "-N", "-o", "%N %T").split("\n")
    assert len([s for s in states if s.strip()]) == len(SANDBOX_NODES)
    assert f"slurm-wlm {slurm_release}." in sandbox.run("slurmd", "-V")


def test_a_malformed_gpu_request_gets_the_site_hint(
    site: Site, sandbox: Sandbox, slurm_release: str, tmp_path: Path
) -> None:
    """22.05 calls it an invalid generic resource, 24.11 and 26.05 an invalid Trackable
    RESource: the hint naming this site's GPU types is there on both."""
    resolved, rendered = tiny_job(site, "true", gres="gpu:a100:two")
    with pytest.raises(SlurmError) as info:
        submit(site, resolved, rendered, client=SlurmClient(), workdir=tmp_path)
    message = str(info.value)
    if _at_least(slurm_release, (24, 11)):
        assert "Invalid Trackable RESource (TRES) specification" in message
    else:
        assert "Invalid generic resource (gres) specification" in message
    assert "a100 (A100)" in message and "--model" in message
    assert Registry().all() == []


def test_the_stderr_path_is_recorded_when_no_error_was_given(
    site: Site, sandbox: Sandbox, slurm_release: str, tmp_path: Path
) -> None:
    """squeue 24.11 and 26.05 print (null) for it: the registry must still record where
    stderr went (the stdout file), so `logs --err` finds it once Slurm forgets the job."""
    client = SlurmClient()
    resolved, rendered = tiny_job(site, "echo out; echo oops >&2")
    script = rendered.script.replace("--time=5", "--time=5\n#SBATCH --output=o-%j.txt")
    rendered = RenderedJob(script, rendered.sbatch_argv, rendered.token)
    result = submit(site, resolved, rendered, client=client, workdir=tmp_path)
    assert isinstance(result, Submitted)
    assert wait_for(result.job_id, {"COMPLETED"}, client) == "COMPLETED"
    (row,) = client.squeue_jobs([result.job_id])
    raw_stderr = sandbox.run("squeue", "-h", "-t", "all", "-j", result.job_id, "-O", "STDERR:0")
    raw_stderr = raw_stderr.strip()
    if _at_least(slurm_release, (24, 11)):
        assert raw_stderr == "(null)"
    else:
        assert raw_stderr == row.stdout
    assert row.stderr == row.stdout  # the parser's answer on every release
    deadline = time.monotonic() + 30
    record = None
    while time.monotonic() < deadline:  # status records the end and the paths
        status([result.job_id], client=client, cache=StatusCache(ttl=0))
        record = Registry().get(result.job_id)
        if record is not None and parse.is_final(record.state):
            break
        time.sleep(1)
    assert record is not None and record.stderr_path == str(tmp_path / f"o-{result.job_id}.txt")
    path = output_path(result.job_id, stderr=True, client=client)
    assert path == tmp_path / f"o-{result.job_id}.txt"
    assert "oops" in path.read_text()
