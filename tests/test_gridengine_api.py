"""The Python API on a Grid Engine site: ``Cluster.submit`` of a command goes to qsub,
``Job.result()`` and ``Cluster.wait`` follow it through the backend (qstat, then qacct), and
nothing asks Slurm. A stateful fake Grid Engine answers from recorded output."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from clusterjob.api.cluster import Cluster
from clusterjob.gridengine.commands import GridEngineClient
from clusterjob.gridengine.runner import GridEngineResult, Runner
from clusterjob.jobscript.control import GridEngineControl
from tests.test_gridengine_avail import SITE
from tests.test_gridengine_runner import recorded


class FakeGridEngine:
    """One job: qsub makes it (id 20, as recorded), qstat lists it running ``running`` times,
    then qacct has its end (exit 0, recorded)."""

    def __init__(self, running: int = 2, accounted: str = "qacct-j-completed.txt") -> None:
        self.running = running
        self.accounted = accounted
        self.seen: list[list[str]] = []
        self.submitted = False

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> GridEngineResult:
        self.seen.append(list(cmd))
        out = self._answer(cmd[0])
        return GridEngineResult(tuple(cmd), 0, out, "")

    def _answer(self, program: str) -> str:
        if program == "qsub":
            self.submitted = True
            return recorded("qsub-plain.txt")
        if program == "qstat":
            if self.submitted and self.running > 0:
                self.running -= 1
                return recorded("qstat-xml-running.xml").replace(">9<", ">20<")
            return recorded("qstat-xml-empty.xml")
        if program == "qacct":
            return recorded(self.accounted)
        raise AssertionError(f"unexpected command {program}")


def no_slurm(cmd: Sequence[str], timeout: float, input: str | None) -> object:
    raise AssertionError(f"Slurm called for a Grid Engine site: {list(cmd)}")


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Cluster, FakeGridEngine]:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0")
    monkeypatch.chdir(tmp_path)
    site = tmp_path / "gesandbox.yaml"
    site.write_text(SITE)
    fake = FakeGridEngine()
    control = GridEngineControl(GridEngineClient(Runner(fake)))
    monkeypatch.setattr(
        "clusterjob.jobscript.backends.GridEngineBackend.control", lambda _: control
    )
    return Cluster(str(site), host="", exec=no_slurm, poll_interval=0.05), fake


def test_a_command_job_goes_to_qsub_and_its_future_follows_qstat_then_qacct(
    cluster: tuple[Cluster, FakeGridEngine],
) -> None:
    api, fake = cluster
    job = api.submit(["true"], gpus=1, model="a100")
    assert job.id == "20"
    assert fake.seen[0][0] == "qsub"
    row = job.wait(timeout=30)
    assert (row.state, row.exit_code) == ("COMPLETED", 0)
    assert job.result(timeout=30).state == "COMPLETED"
    assert {cmd[0] for cmd in fake.seen} <= {"qsub", "qstat", "qacct"}
    assert api.slurm_calls == 0


def test_cluster_wait_follows_the_job_through_the_backend(
    cluster: tuple[Cluster, FakeGridEngine],
) -> None:
    api, fake = cluster
    job = api.submit(["true"])
    result = api.wait([job.id], interval=0.05, timeout=30)
    assert result.exit_code == 0 and not result.timed_out
    assert api.slurm_calls == 0


def test_a_failed_job_fails_its_future(cluster: tuple[Cluster, FakeGridEngine]) -> None:
    from clusterjob.errors import JobFailed

    api, fake = cluster
    fake.accounted = "qacct-j-exit3.txt"
    job = api.submit(["false"])
    with pytest.raises(JobFailed, match=f"^job {job.id} "):
        job.result(timeout=30)
    assert job.last_status is not None and job.last_status.exit_code == 3
    assert api.slurm_calls == 0


def test_retry_bad_node_is_refused_in_one_line_before_qsub(
    cluster: tuple[Cluster, FakeGridEngine],
) -> None:
    """A retry resubmits through sbatch with the node excluded: refused, not sent to Slurm."""
    from clusterjob.errors import UsageError

    api, fake = cluster
    with pytest.raises(UsageError, match="Grid Engine, where clusterjob cannot ask for --retry"):
        api.submit(["true"], retry_bad_node=1)
    assert fake.seen == [] and api.slurm_calls == 0


def test_test_only_is_refused_in_one_line(cluster: tuple[Cluster, FakeGridEngine]) -> None:
    from clusterjob.errors import UsageError

    api, fake = cluster
    with pytest.raises(UsageError, match="--test-only is Slurm's"):
        api.submit_test_only(["true"])
    assert fake.seen == [] and api.slurm_calls == 0
