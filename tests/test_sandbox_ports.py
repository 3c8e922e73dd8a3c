"""Several sandboxes started at the same moment each get a block of ports of their own.

Nothing binds a block until the daemons start, seconds after it is chosen: two `sandbox up`s
at once used to find the same block free, and the second failed in MariaDB ("Address already
in use"), its `ports` file keeping the taken block.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import replace
from pathlib import Path

import pytest

from clusterjob.sandbox import cluster, host, shape
from clusterjob.sandbox.config import DEFAULT_SHAPE, Layout, SandboxNode

# A range far from the sandboxes' own (26800-27399), so a running one is not in the way.
RANGE = range(46800, 46900, 20)


@pytest.fixture(autouse=True)
def _every_port_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the claims, not the kernel's ports: 46800-46899 lies in Linux's
    ephemeral range, where any outgoing connection of the moment may hold one, and a CI run
    saw a block skipped for that. The three-at-once test's spawned processes, which do not
    see this patch, make the same one themselves (``_choose``)."""
    monkeypatch.setattr(host, "port_free", lambda port: True)


def _choose(state_dir: str, claims: str, start: object, out: object) -> None:
    # As _every_port_free: a CI run, with two more Slurm releases' tests beside it holding
    # ephemeral ports, found no 20 free ports in 3 of the 5 blocks, and failed this test.
    host.port_free = lambda port: True  # type: ignore[assignment]
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
        assert (tmp_path / "claims" / str(base)).read_text().split()[0] == state


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


def _wide(state: Path, nodes: int) -> None:
    """Give the sandbox in ``state`` a shape of ``nodes`` slurmds."""
    template = DEFAULT_SHAPE.nodes[0]
    many = tuple(
        SandboxNode(f"n{i}", template.partition, template.mapped, template.physical, 16, 64000)
        for i in range(nodes)
    )
    shape.record(Layout(state), replace(DEFAULT_SHAPE, nodes=many, like="wide.yaml"), "{}\n")


def test_a_sandbox_of_more_than_ten_nodes_claims_consecutive_blocks_no_other_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "PORT_CLAIMS", tmp_path / "claims")
    small, wide, other = _states(tmp_path, 3)
    _wide(wide, 25)  # 10 + 25 ports: two blocks of 20
    first = cluster._choose_ports(Layout(small), RANGE)
    ports = cluster._choose_ports(Layout(wide), RANGE)
    assert len(set(ports.slurmd.values())) == 25
    assert min(ports.all()) == first.slurmctld + 20  # the next two blocks, not overlapping
    assert max(ports.all()) < first.slurmctld + 60
    claims = sorted(int(c.name) for c in (tmp_path / "claims").glob("[0-9]*"))
    assert claims == [first.slurmctld, first.slurmctld + 20, first.slurmctld + 40]
    third = cluster._choose_ports(Layout(other), RANGE)  # the wide one's second block is taken
    assert third.slurmctld == first.slurmctld + 60
    (wide / "ports").unlink()  # purged: both its blocks lapse
    later = _states(tmp_path / "later", 1)[0]
    _wide(later, 25)
    assert cluster._choose_ports(Layout(later), RANGE).slurmctld == first.slurmctld + 20


def test_a_sandbox_wider_than_the_range_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "PORT_CLAIMS", tmp_path / "claims")
    (state,) = _states(tmp_path, 1)
    _wide(state, 30)
    with pytest.raises(cluster.ClusterjobError, match="no free run of 40 ports"):
        cluster._choose_ports(Layout(state), range(46800, 46830, 20))
