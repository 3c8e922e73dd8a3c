"""Several sandboxes started at the same moment each get a block of ports of their own.

Nothing binds a block until the daemons start, seconds after it is chosen: two `sandbox up`s
at once used to find the same block free, and the second failed in MariaDB ("Address already
in use"), its `ports` file keeping the taken block.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from clusterjob.sandbox import cluster
from clusterjob.sandbox.config import Layout

# A range far from the sandboxes' own (26800-27099), so a running one is not in the way.
RANGE = range(46800, 46900, 20)


def _choose(state_dir: str, claims: str, start: object, out: object) -> None:
    cluster.PORT_CLAIMS = Path(claims)
    start.wait(timeout=30)  # type: ignore[attr-defined]
    ports = cluster._choose_ports(Layout(Path(state_dir)), RANGE)
    out.put((state_dir, ports.slurmctld))  # type: ignore[attr-defined]


def _states(tmp_path: Path, n: int) -> list[Path]:
    states = [tmp_path / f"sandbox{i}" for i in range(n)]
    for s in states:
        (s / "pids").mkdir(parents=True)
    return states


def test_three_sandboxes_started_at_once_take_three_blocks(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(3), ctx.Queue()
    states = _states(tmp_path, 3)
    procs = [
        ctx.Process(target=_choose, args=(str(s), str(tmp_path / "claims"), start, out))
        for s in states
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    chosen = dict(out.get(timeout=5) for _ in states)
    assert len(set(chosen.values())) == 3, chosen
    for state, base in chosen.items():  # each recorded its own, and holds the claim
        assert (Path(state) / "ports").read_text().strip() == str(base)
        assert (tmp_path / "claims" / str(base)).read_text().strip() == state


def test_a_claim_lapses_when_its_sandbox_is_purged_and_is_kept_across_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "PORT_CLAIMS", tmp_path / "claims")
    first, second = _states(tmp_path, 2)
    taken = cluster._choose_ports(Layout(first), RANGE).slurmctld
    assert cluster._choose_ports(Layout(second), RANGE).slurmctld != taken
    assert cluster._choose_ports(Layout(first), RANGE).slurmctld == taken  # its own again
    (first / "ports").unlink()  # `down --purge`
    third = _states(tmp_path / "later", 1)[0]
    assert cluster._choose_ports(Layout(third), RANGE).slurmctld == taken
