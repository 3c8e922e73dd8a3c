"""The real local Slurm cluster for end-to-end tests (`clusterjob sandbox up`).

The session fixture reuses a sandbox that is already up (CI brings it up first) or brings
one up; it is left running afterwards (`clusterjob sandbox down` stops it). It needs root,
as the sandbox does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterjob.api.cluster import Cluster
from clusterjob.jobs.status import JobStatus
from clusterjob.sandbox import cluster
from clusterjob.sandbox.config import Layout
from clusterjob.slurm.parse import is_final


@dataclass
class Sandbox:
    """Handle on the running sandbox: where it lives, the client environment, job helpers."""

    state_dir: Path
    env: dict[str, str]  # os.environ plus SLURM_CONF (and CLUSTERJOB_SANDBOX_DIR)
    workdir: Path  # where Slurm commands run, so jobs' slurm-%j.out never land in the checkout

    @property
    def layout(self) -> Layout:
        return Layout(self.state_dir)

    @property
    def site_path(self) -> Path:
        return self.layout.site_yaml

    def run(self, *cmd: str, timeout: float = 30, check: bool = True) -> str:
        """Run a Slurm client command against the sandbox; return its stdout."""
        proc = subprocess.run(
            list(cmd), env=self.env, cwd=self.workdir, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout

    def sbatch(self, *args: str) -> str:
        """Submit with sbatch; return the job id."""
        return self.run("sbatch", "--parsable", *args).strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o` as a dict (JobState, Reason, NodeList, ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id)
        fields: dict[str, str] = {}
        for word in out.split():
            key, sep, value = word.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def wait_job(
        self, job_id: str, timeout: float = 60, between: Callable[[], object] | None = None
    ) -> dict[str, str]:
        """Poll until the job is finished (or held after a failed launch); return its fields.
        ``between``: called before each look."""
        deadline = time.monotonic() + timeout
        while True:
            if between is not None:
                between()
            fields = self.job(job_id)
            state = fields.get("JobState", "")
            # A job whose Prolog failed is requeued and held: PENDING with reason
            # launch_failed_requeued_held. It shows that reason already while COMPLETING (the
            # requeue under way, seen in a CI run), so it counts as settled only once PENDING.
            held = state == "PENDING" and "held" in fields.get("Reason", "").lower()
            if is_final(state) or held:
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {state} after {timeout}s: {fields}")
            time.sleep(0.3)

    def node(self, name: str) -> dict[str, str]:
        """`scontrol show node -o` as a dict (State, Reason, Gres, ...)."""
        out = self.run("scontrol", "show", "node", "-o", name)
        fields: dict[str, str] = {}
        rest = out.strip()
        # Reason= runs to the end of its words ("Prolog error [root@...]"): split on " Key=".
        for part in (" " + rest).split(" "):
            key, sep, value = part.partition("=")
            if sep and key[:1].isupper():
                fields[key] = value
                last = key
            elif fields:
                fields[last] += " " + part
        return fields

    def resume(self, node: str, timeout: float = 30) -> None:
        """Return a drained node to service (after a test that made the Prolog fail), and wait
        until slurmctld has heard from it again (right after a resume sinfo shows `idle*`)."""
        self.run("scontrol", "update", f"nodename={node}", "state=resume")
        deadline = time.monotonic() + timeout
        while True:
            state = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T").strip()
            if state and not state.endswith("*") and "drain" not in state:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"node {node} still {state!r} {timeout}s after resume")
            time.sleep(0.3)


def clusterjob_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180):
    """The real `clusterjob` command, as a separate process."""
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


Cli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def cj(sandbox: Sandbox, tmp_path: Path) -> Cli:
    """`clusterjob ARGS...` as a user runs it: its own process, the sandbox's SLURM_CONF and
    CLUSTERJOB_SITE, its own registry, cwd tmp_path. The status cache is off, so polls see news."""
    env = dict(os.environ, **cluster.client_env(sandbox.state_dir))
    env["CLUSTERJOB_DATA_DIR"] = str(tmp_path / "data")
    env["CLUSTERJOB_STATUS_CACHE_SECONDS"] = "0"

    def run(*args: str, extra_env: dict[str, str] | None = None, timeout: float = 180):
        return subprocess.run(
            [sys.executable, "-m", "clusterjob", *args],
            env={**env, **(extra_env or {})}, cwd=tmp_path,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    return run


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    if os.geteuid() != 0:
        pytest.skip("the Slurm sandbox needs root (it starts munged, MariaDB and Slurm)")
    state_dir = cluster.resolve_state_dir()
    if not cluster.status(state_dir).up:
        cluster.up(state_dir)
    env = dict(os.environ, **cluster.client_env(state_dir))
    env["CLUSTERJOB_SANDBOX_DIR"] = str(state_dir)
    yield Sandbox(state_dir, env, tmp_path_factory.mktemp("slurm-cwd"))


# Daemons of the sandbox that had died and were started again, said at the end of the run.
RESTARTED: list[str] = []


@pytest.fixture(autouse=True)
def _daemons_running(request: pytest.FixtureRequest) -> None:
    """Before each test on the sandbox: every one of its daemons still runs, or is started
    again (``start_dead_daemons``) and said so, here and at the end of the run."""
    if "sandbox" not in request.fixturenames:
        return
    dead = start_dead_daemons(request.getfixturevalue("sandbox"))
    if not dead:
        return
    said = f"sandbox: {', '.join(dead)} had died; started again before {request.node.nodeid}"
    RESTARTED.append(said)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(said, yellow=True)


# srun's words when the node's slurmd dropped a step's launch: it died handling it (an abort
# after reading the request, as seen in CI; killed with the request unread: the reset).
_LAUNCH_LOST = re.compile(
    r"Task launch for StepId=\S+ failed on node (\S+): "
    r"(?:Zero Bytes were transmitted or received|Connection reset by peer)$",
    re.M,
)


def launch_lost_to_dead_slurmd(out: str, restarted: list[str]) -> str | None:
    """The node whose slurmd died under this job's step launch, or None: srun said it lost
    the launch on that node, and the node's slurmd is among the daemons started again
    (``RESTARTED``). Slurm 22.05.8's slurmd was seen to abort ("double free or corruption")
    while two steps of one job were launched on it at once; the job in flight fails with it,
    through no fault of the job's."""
    for node in _LAUNCH_LOST.findall(out):  # findall: the node, the one group
        daemon = re.compile(rf"\bslurmd-{re.escape(node)} ")
        if any(said.startswith("sandbox: ") and daemon.search(said) for said in restarted):
            return node
    return None


def finish_despite_dying_slurmd(
    sandbox: Sandbox, job_id: str, output: Path, script: Path, timeout: float
) -> tuple[dict[str, str], str]:
    """The fields and output of the job ``script`` (submitted with ``--output=OUTPUT``) once
    it ended. A job whose step launch a node's slurmd lost as it died
    (``launch_lost_to_dead_slurmd``) is submitted once more, unchanged, and that is said at
    the end of the run; a second such loss, or any other failure, is the job's."""
    checked = 0.0

    def restart_dead() -> None:  # a job on a node whose slurmd died stays COMPLETING
        nonlocal checked
        if time.monotonic() - checked < 5:
            return
        checked = time.monotonic()
        dead = start_dead_daemons(sandbox)
        if dead:
            RESTARTED.append(f"sandbox: {', '.join(dead)} had died; started again by job {job_id}")

    for attempt in range(2):
        fields = sandbox.wait_job(job_id, timeout=timeout, between=restart_dead)
        out = output.read_text() if output.exists() else ""
        if attempt or fields.get("JobState") == "COMPLETED":
            break
        node = launch_lost_to_dead_slurmd(out, RESTARTED)
        if node is None:
            break
        again = sandbox.sbatch(f"--output={output}", str(script))
        RESTARTED.append(
            f"sandbox: job {job_id} lost a step launch on {node} to its dying slurmd; "
            f"submitted again as job {again}"
        )
        job_id = again
    return fields, out


def start_dead_daemons(sandbox: Sandbox) -> list[str]:
    """The sandbox's daemons that had died (each with its log), started again as `clusterjob
    sandbox up` starts what is not running. Slurm 22.05's slurmd was seen to die of a
    segmentation fault in the middle of a run (a NULL read, in the kernel's log); its node was
    then DOWN, "Not responding", and every later test that needed it failed."""
    dead = [
        f"{d.name} (its log: {d.log})" if d.log else d.name
        for d in cluster.daemon_statuses(sandbox.layout)
        if not d.alive
    ]
    if dead:
        cluster.up(sandbox.state_dir)
    return dead


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if RESTARTED:
        terminalreporter.section("sandbox daemons started again during the run")
        for said in RESTARTED:
            terminalreporter.write_line(said)


@pytest.fixture(scope="session")
def slurm_release(sandbox: Sandbox) -> str:
    """The Slurm release the sandbox runs (``22.05``, ``24.11``, ``26.05``): the e2e tests run
    on each (`clusterjob sandbox exec --slurm R -- pytest -m slurm`); where the releases
    differ, a test asks this."""
    release = cluster.slurm_release()
    assert release is not None, "no slurmd here"
    return release


# A requeued job made to start at once can be refused by slurmd ("Job credential revoked",
# seen on 24.11): the first attempt's credential is revoked at the requeue's second, and a new
# one made in that same second counts as revoked too. A few seconds later is safe, and still
# much sooner than the restart delay Slurm imposes (cred_expire, 120 s by default).
REQUEUED_START = "StartTime=now+5"


@pytest.fixture
def here(sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's shell on the login node: the sandbox's Slurm and site, the registry the `cj`
    fixture's commands use, no status cache, cwd a fresh directory."""
    for key, value in cluster.client_env(sandbox.state_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0")
    monkeypatch.delenv("CLUSTERJOB_HOST", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def until(what: str, check, timeout: float = 120):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.3)


def one(cluster: Cluster, job_id: str) -> JobStatus:
    (row,) = cluster.status([job_id])
    return row
