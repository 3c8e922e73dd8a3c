"""Behaviours of the core that no test held until a bug was planted in each and went unnoticed.

Each test here was checked against its planted bug (it fails with the bug in place): the site
path's quoting in the job script, first come first served between ``run`` and ``run --wait``,
ticket numbers after a gap, the newest registry row for a reused job id, the model-mismatch
finding's expected/found, ``%N`` as the first node, resubmit's token check, array task ids as
job ids, ``avail``'s case-insensitive GRES type, and the Prolog's use of the site's deadline.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import test_render
from slurm_fake import FakeSlurm
from test_request import GRES_SITE
from trusted_tree import trusted_tmp_dir

from clusterjob import resources
from clusterjob.errors import ClusterjobError, UsageError
from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.jobs.avail import summarise
from clusterjob.jobs.logs import output_path
from clusterjob.jobs.registry import JobRecord, Registry
from clusterjob.jobs.status import status
from clusterjob.jobs.submit import resubmit, submit
from clusterjob.jobscript.render import RenderedJob, render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.node import prolog
from clusterjob.node.checks import Facts, run_checks
from clusterjob.site.loader import load_site
from clusterjob.site.nodemodel import NodeGpu
from clusterjob.slurm.parse import parse_scontrol_nodes
from clusterjob.workstation import claims, queue
from clusterjob.workstation.launch import acquire_gpus
from clusterjob.workstation.selection import GpuRequest, builtin_catalog

fake_bin = test_render.fake_bin  # the same stand-ins for python, srun and scontrol

SLURM_FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
A100_NAME, V100_NAME = "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def job_record(job_id: str, token: str, at: float, **fields: object) -> JobRecord:
    values: dict[str, object] = {
        "cluster": "lab",
        "site": "mllab",
        "job_name": "train",
        "script": "#!/bin/bash\n",
        "script_path": "",
        "command_line": "clusterjob submit --gpus 1 train.py",
        "work_dir": "/home/ana/run",
        "git_commit": None,
        "submitted_at": at,
        **fields,
    }
    return JobRecord(job_id=job_id, token=token, **values)  # type: ignore[arg-type]


# -- 1. the site path in the job script is quoted ------------------------------------------


def test_a_site_path_with_spaces_and_shell_syntax_reaches_the_preflight_literally(
    tmp_path: Path, fake_bin: Path
) -> None:
    """Unquoted, `set -e` would end the job at the export, and the $() would run."""
    site_file = tmp_path / "site dir $(touch pwned) 'x'" / "my site;.yaml"
    site = replace(GRES_SITE, source=site_file)
    rendered = render(
        site,
        resolve(site, JobRequest(script="train.py", model="A100")),
        python=str(fake_bin / "fake-python"),
        node_command=[str(fake_bin / "fake-clusterjob")],
    )
    preflight, _launch = test_render._run_script(rendered.script, tmp_path, fake_bin)
    assert preflight["argv"][1:] == ["preflight"]
    assert preflight["env"]["CLUSTERJOB_SITE"] == str(site_file.resolve())


# -- 2. and 3. the workstation queue: first come, first served -----------------------------


def _inventory(*names: str) -> GpuInventory:
    buses = ["0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0"]
    gpus = tuple(
        Gpu(index=i, bus_id=buses[i], name=n, uuid=f"GPU-{i}", memory_total=80 << 30)
        for i, n in enumerate(names)
    )
    return GpuInventory(gpus=gpus, driver_version="550", cuda_driver_version=12040)


def test_a_run_without_wait_does_not_jump_the_queue_of_waiting_runs(tmp_path: Path) -> None:
    lock_dir = claims.ensure_shared_dir(tmp_path / "locks")
    machine = _inventory(A100_NAME, A100_NAME)  # GPU-1 free: only the queue stands in the way
    busy = claims.HeldClaims()  # a waiter keeps its place while GPUs are claimed
    assert claims.try_claim(lock_dir, "GPU-0", busy)
    waiting = queue.take_ticket(queue.queue_dir(lock_dir), "python first.py")

    def run_now() -> object:
        return acquire_gpus(
            GpuRequest(1),
            ["python", "second.py"],
            lambda _inv: builtin_catalog(),
            lambda: machine,
            lock_dir=lock_dir,
            wait=False,
        )

    try:
        with pytest.raises(ClusterjobError, match=r"1 earlier run\(s\) are waiting in the queue"):
            run_now()
        assert [c.key for c in claims.current_claims(lock_dir)] == ["GPU-0"]
    finally:
        waiting.leave()
    acquired = run_now()  # the queue is empty again: the same run gets a GPU at once
    try:
        assert len(acquired.gpus) == 1  # type: ignore[attr-defined]
    finally:
        acquired.held.release_all()  # type: ignore[attr-defined]
        busy.release_all()


def _other_users_ticket(qdir: Path, number: int, command: str) -> tuple[Path, int]:
    """A live waiter of another run: its own ``<n>@<uid>.ticket``, locked by its holder (a
    ticket counts only when its owner is the uid its name says: here, us)."""
    path = qdir / f"{number:016d}@{os.geteuid()}{queue.TICKET_SUFFIX}"
    path.write_text(json.dumps({"user": "bob", "pid": 4242, "command": command, "since": 1.0}))
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return path, fd


def test_a_ticket_after_a_gap_numbers_after_the_highest_not_after_the_count(
    tmp_path: Path,
) -> None:
    """Tickets n (left) and bob's (live, a minute later on the clock, as after a clock set
    back): the next is bob's + 1, behind bob. Numbered by the clock or by count it could sort
    before bob's: both would be first."""
    qdir = queue.queue_dir(claims.ensure_shared_dir(tmp_path / "locks"))
    mine = queue.take_ticket(qdir, "python a.py")
    bobs = mine.number + 60 * 10**6
    _bob, bob_fd = _other_users_ticket(qdir, bobs, "python bob.py")
    try:
        mine.leave()
        late = queue.take_ticket(qdir, "python c.py")
        try:
            assert late.number == bobs + 1
            ahead = late.waiters_ahead(lambda: True, 0.0)
            assert [w.holder().command for w in ahead] == ["python bob.py"]  # type: ignore[union-attr]
        finally:
            late.leave()
    finally:
        os.close(bob_fd)


# -- 4. and 8. the registry: a reused job id, array task ids ---------------------------------


def test_a_reused_job_id_is_the_newest_submission(tmp_path: Path) -> None:
    """A rebuilt cluster numbers from 1 again: `status 7`, `logs 7`, `resubmit 7` mean the job
    submitted last with that id, not the one from before the rebuild."""
    reg = Registry(tmp_path / "jobs.sqlite")
    reg.add(job_record("7", "other-cluster", at=50.0, cluster="elsewhere"))
    reg.add(job_record("7", "before-rebuild", at=100.0))
    reg.add(job_record("7", "after-rebuild", at=200.0))
    assert reg.get("7").token == "after-rebuild"  # type: ignore[union-attr]
    assert reg.get("7", "lab").token == "after-rebuild"  # type: ignore[union-attr]
    assert reg.get("7", "elsewhere").token == "other-cluster"  # type: ignore[union-attr]


@pytest.mark.parametrize(("typed", "job_id"), [("123_4", "123_4"), (" 42 ", "42"), ("7", "7")])
def test_array_task_ids_and_plain_ids_are_job_ids(tmp_path: Path, typed: str, job_id: str) -> None:
    assert Registry(tmp_path / "jobs.sqlite").resolve_id(typed) == job_id


# -- 5. model-mismatch says which model was expected and which was found ---------------------


def test_model_mismatch_finding_names_expected_and_found_the_right_way_round() -> None:
    """The Prolog's JSON log and `preflight --json` carry these fields, not only the line."""
    buses = ["0000:07:00.0", "0000:0b:00.0"]
    facts = Facts(
        node="gpu2",
        node_map=(NodeGpu(0, "A100", buses[0]), NodeGpu(1, "V100", buses[1])),
        models={"A100": (A100_NAME,), "V100": (V100_NAME,)},
        inventory=GpuInventory(
            gpus=tuple(
                Gpu(index=i, bus_id=b, name=A100_NAME, uuid=f"GPU-{i}", minor=i)
                for i, b in enumerate(buses)
            ),
            driver_version="550.54.15",
            cuda_driver_version=12040,
        ),
    )
    [finding] = [f for f in run_checks(facts).findings if f.check_id == "model-mismatch"]
    assert (finding.slot, finding.bus_id) == (1, buses[1])
    assert (finding.expected, finding.found) == ("V100", A100_NAME)
    assert finding.to_dict()["expected"] == "V100"
    assert finding.to_dict()["found"] == A100_NAME


# -- 6. %N in an output path is the job's first node -----------------------------------------


@pytest.mark.parametrize("nodes", ["gpu[3-4]", "gpu3,h1"])
def test_percent_n_in_the_output_path_is_the_first_node(data: Path, nodes: str) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job_id = slurm.add_job(state="RUNNING", reason="None", nodes=nodes, stdout="/logs/%N-%j.out")
    job = slurm.jobs[job_id]
    registry.add(job_record(job_id, f"tok{job_id}", time.time(), cluster=slurm.cluster,
                            job_name=job["name"]))  # fmt: skip
    status(client=slurm.client(), registry=registry)  # records the expanded path
    slurm.forgotten.add(job_id)  # from now on only the recorded path says where it is
    assert output_path(job_id, client=slurm.client()) == Path(f"/logs/gpu3-{job_id}.out")


# -- 7. a script without its token is never submitted (again) --------------------------------


@pytest.fixture
def mllab_job() -> tuple[object, object, RenderedJob]:
    site = load_site(resources.site_configs_dir() / "mllab.yaml")
    train = str(Path(__file__).resolve().parent.parent / "examples" / "train.py")
    resolved = resolve(site, JobRequest(script=train, gpus=1, model="a100"))
    return site, resolved, render(site, resolved)


def test_resubmit_same_script_refuses_a_recorded_script_without_its_token(data: Path) -> None:
    """Without the token a timed-out sbatch cannot be looked up: it would be sent twice."""
    slurm = FakeSlurm()
    registry = Registry()
    registry.add(job_record("5", "abc123", time.time(), script="#!/bin/bash\necho hi\n"))
    with pytest.raises(UsageError, match="recorded script has no clusterjob:abc123 comment"):
        resubmit("5", same_script=True, client=slurm.client(), registry=registry)
    assert slurm.commands("sbatch") == []


def test_submit_refuses_a_script_that_lost_its_token_comment(data: Path, mllab_job) -> None:
    site, resolved, rendered = mllab_job
    stripped = replace(
        rendered, script=rendered.script.replace(f"--comment=clusterjob:{rendered.token}", "")
    )
    slurm = FakeSlurm()
    with pytest.raises(UsageError, match="does not carry `#SBATCH --comment=clusterjob:"):
        submit(site, resolved, stripped, client=slurm.client())  # type: ignore[arg-type]
    assert slurm.commands("sbatch") == []
    assert Registry().all() == []


# -- 9. avail matches GRES types whatever their case -----------------------------------------


def test_avail_matches_a_gres_type_case_insensitively(tmp_path: Path) -> None:
    """The site says `nvidia_a100`, Slurm's gres.conf says `NVIDIA_A100`: the same GPUs."""
    site_file = tmp_path / "site.yaml"
    text = (SLURM_FIXTURES / "sandbox_site.yaml").read_text()
    site_file.write_text(text.replace("gres_type: a100", "gres_type: nvidia_a100"))
    site = load_site(site_file)
    recorded = (SLURM_FIXTURES / "scontrol_show_node_detail_sandbox_h1_busy.txt").read_text()
    nodes = parse_scontrol_nodes(recorded.replace("gpu:a100", "gpu:NVIDIA_A100"))
    rows = {(r.partition, r.model): (r.free, r.total) for r in summarise(site, nodes).rows}
    assert rows[("gpu", "A100")] == (4, 4)
    assert not any(model == "NVIDIA_A100" for _, model in rows)
    only = summarise(site, nodes, model="a100")
    assert {(r.partition, r.model) for r in only.rows} == {("gpu", "A100"), ("suspect", "A100")}


# -- the Prolog uses the site's deadline -----------------------------------------------------


@pytest.fixture
def trusted_dir() -> Iterator[Path]:
    yield from trusted_tmp_dir()


@pytest.mark.parametrize(("configured", "expected"), [("7.5", 7.5), (None, 20.0)])
def test_the_prolog_reads_nvml_within_the_sites_deadline_seconds(
    trusted_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    configured: str | None,
    expected: float,
) -> None:
    text = (SLURM_FIXTURES / "sandbox_site.yaml").read_text()
    text = text.replace("  deadline_seconds: 20\n", "")
    if configured is not None:
        text = text.replace("prolog:\n", f"prolog:\n  deadline_seconds: {configured}\n")
    site_file = trusted_dir / "site.yaml"
    site_file.write_text(text)
    site_file.chmod(0o644)
    seen: list[tuple[float | None, float | None]] = []

    def read_inventory(
        timeout: float | None = None,
        *,
        isolate: bool = False,
        deadline: float | None = None,
        started: object = None,
    ) -> GpuInventory:
        seen.append((timeout, deadline))
        return _inventory(A100_NAME, A100_NAME, V100_NAME, V100_NAME)  # gpu1 as mapped

    monkeypatch.setattr(prolog, "read_inventory", read_inventory)
    try:
        code = prolog.run_prolog(
            {"SLURMD_NODENAME": "gpu1", "SLURM_JOB_ID": "9"},
            site=str(site_file),
            cache_dir=str(trusted_dir / "cache"),
            log=str(trusted_dir / "prolog.jsonl"),
        )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)
    assert code == 0
    [(timeout, deadline)] = seen
    assert deadline == expected
    assert timeout is not None and expected - 2 < timeout <= expected
    logged = json.loads((trusted_dir / "prolog.jsonl").read_text())
    assert logged["outcome"] == "ok"


def test_a_deadline_given_on_the_command_line_wins_over_the_sites() -> None:
    run = prolog.PrologRun(node="gpu1", job_id=None, log_override=None, deadline_override=3.0)
    run.policy = prolog.DEFAULT_POLICY.replace(deadline_seconds=11.0)
    assert run.deadline == 3.0
    run.deadline_override = None
    assert run.deadline == 11.0
    assert 10.0 < run.remaining() <= 11.0
