"""`sandbox up` on a half-dead sandbox: a slurmd that runs but whose node slurmctld no longer
takes (munged was dead long enough for slurmctld to mark it down, not responding) is
restarted, which registers it again. `up` used to wait two minutes for a registration that
never came ("slurmd-gpu1 not registered with slurmctld in time"), and only `down` then `up`
recovered. Seen for real on the local cluster (munged killed, 150 s, then `up`: back in 25 s);
here the daemons are real processes and slurmctld's answers are scripted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clusterjob.sandbox import cluster, host
from clusterjob.sandbox.config import SANDBOX_NODES, Layout


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Layout:
    layout = Layout(tmp_path)
    layout.pid_dir.mkdir()
    layout.log_dir.mkdir()
    daemon = tmp_path / "slurmd"
    daemon.write_text("#!/bin/sh\nexec sleep 600\n")
    daemon.chmod(0o755)
    monkeypatch.setattr(host, "which", lambda name: str(daemon))
    monkeypatch.setattr(cluster, "REGISTER_GRACE_S", 0.5)
    return layout


def _stop_all(layout: Layout) -> None:
    for rec in host.list_pids(layout.pid_dir):
        host.stop(rec, layout.pid_dir, timeout=5)


def test_a_running_slurmd_slurmctld_does_not_take_is_restarted(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = cluster._slurm_env(layout)
    before = {n.name: cluster._spawn_slurmd(layout, n.name, env) for n in SANDBOX_NODES}
    sick = SANDBOX_NODES[0].name
    started: dict[str, float] = {}

    def scontrol_node(_: Layout, node: str) -> dict[str, str]:
        rec = host.read_pid(layout.pid_dir, f"slurmd-{node}")
        if node == sick and rec is not None and rec.pid == before[node].pid:
            return {"State": "DOWN*", "SlurmdStartTime": "2026-01-01T00:00:00"}
        stamp = time.strftime(
            "%Y-%m-%dT%H:%M:%S", time.localtime(started.setdefault(node, time.time()))
        )
        return {"State": "IDLE", "SlurmdStartTime": stamp}

    monkeypatch.setattr(cluster, "_scontrol_node", scontrol_node)
    said: list[str] = []
    try:
        cluster._ensure_slurmds(layout, time.monotonic() + 20, said.append)
        after = {n.name: host.read_pid(layout.pid_dir, f"slurmd-{n.name}") for n in SANDBOX_NODES}
        assert after[sick] is not None and after[sick].pid != before[sick].pid
        assert not before[sick].alive() and after[sick].alive()
        assert all(after[n].pid == before[n].pid for n in before if n != sick)  # type: ignore[union-attr]
        assert said == [f"slurmd for {sick} runs but slurmctld does not take it; restarting it"]
    finally:
        _stop_all(layout)


def test_a_slurmd_slurmctld_never_takes_fails_saying_its_state(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "_scontrol_node", lambda _l, _n: {"State": "DOWN*"})
    try:
        with pytest.raises(
            cluster.ClusterjobError, match=r"not registered with slurmctld in time: state down\*"
        ):
            cluster._ensure_slurmds(layout, time.monotonic() + 2, lambda _: None)
    finally:
        _stop_all(layout)
