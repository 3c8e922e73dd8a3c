"""The ticket queue of ``clusterjob run --wait`` in process: names, numbers, order, and which
tickets count as waiters (tests/test_security_workstation.py plays the other user for real).

flock belongs to an open file, so a ticket locked through a second descriptor of this process
is held as another process would hold it.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterjob.errors import ClusterjobError
from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.workstation import claims, queue
from clusterjob.workstation.launch import Acquired, acquire_gpus
from clusterjob.workstation.queue import QueueWatch, Waiter
from clusterjob.workstation.selection import GpuRequest, builtin_catalog

UID = os.geteuid()
ME = pwd.getpwuid(UID).pw_name
OTHER_UID = 4242
A100 = "NVIDIA A100-SXM4-80GB"
CLAIMED, NOTHING_CLAIMED = (lambda: True), (lambda: False)


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    return claims.ensure_shared_dir(tmp_path / "locks")


@pytest.fixture
def planted(lock_dir: Path) -> Iterator[list[int]]:
    """Descriptors of tickets planted (and maybe locked) by the test; closed after it."""
    fds: list[int] = []
    yield fds
    for fd in fds:
        os.close(fd)


def plant(lock_dir: Path, fds: list[int], name: str, *, locked: bool = True) -> Path:
    """A ticket file that nothing waits behind: written, and locked when ``locked``."""
    path = lock_dir / name
    path.write_text(json.dumps({"user": "root", "pid": 1, "command": "planted", "since": 1.0}))
    fd = os.open(path, os.O_RDONLY)
    fds.append(fd)
    if locked:
        fcntl.flock(fd, fcntl.LOCK_EX)
    return path


def ticket_name(number: int, uid: int = UID) -> str:
    return f"{number:0{queue.NUMBER_DIGITS}d}@{uid}{queue.TICKET_SUFFIX}"


def clock_number() -> int:
    return time.time_ns() // 1000


# -- names and numbers -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("0000000000000007@1000.ticket", (7, 1000)),
        ("000000000007@1000.ticket", (7, 1000)),  # 12 digits, as numbered before
        (f"{'9' * 19}@0.ticket", (10**19 - 1, 0)),
        (f"{'9' * 20}@0.ticket", None),  # wider than any number: int() never sees a long string
        ("7.ticket", None),  # no owner in the name: nobody's ticket
        ("x7@0.ticket", None),
        ("7@1000@0.ticket", None),
        ("@0.ticket", None),
        ("7@.ticket", None),
        ("\u00b2@0.ticket", None),  # a digit to str.isdigit(), not to int()
        ("7@0.claim", None),
    ],
)
def test_ticket_names(name: str, parsed: tuple[int, int] | None) -> None:
    assert queue.parse_ticket_name(name) == parsed


def test_a_ticket_file_says_who_waits_and_is_0644(lock_dir: Path) -> None:
    before = clock_number()
    old = os.umask(0o077)
    try:
        ticket = queue.take_ticket(lock_dir, "python " + "x" * 400)
    finally:
        os.umask(old)
    try:
        assert before <= ticket.number <= clock_number()  # numbered by the clock, in µs
        assert stat.S_IMODE(ticket.path.stat().st_mode) == 0o644
        assert re.fullmatch(rf"\d{{16}}@{UID}\.ticket", ticket.path.name)
        holder = claims.read_holder(ticket.path)
        assert holder == claims.Holder(ME, os.getpid(), ("python " + "x" * 400)[:300], holder.since)  # type: ignore[union-attr]
        assert time.time() - 60 < holder.since <= time.time()  # type: ignore[union-attr]
        assert [p.name for p in lock_dir.iterdir()] == [ticket.path.name]  # no temporary left
    finally:
        ticket.leave()


def test_queue_order_and_dead_tickets(lock_dir: Path, planted: list[int]) -> None:
    dead = plant(lock_dir, planted, ticket_name(5), locked=False)  # a waiter killed by SIGKILL
    first = queue.take_ticket(lock_dir, "python a.py")
    second = queue.take_ticket(lock_dir, "python b.py")
    assert first.number < second.number
    assert first.waiters_ahead(CLAIMED, 0.0) == [] and not dead.exists()
    [ahead] = second.waiters_ahead(CLAIMED, 0.0)
    assert ahead.path == first.path
    assert ahead.holder() == claims.Holder(ME, os.getpid(), "python a.py", ahead.holder().since)  # type: ignore[union-attr]
    assert [w.path for w in queue.waiters(lock_dir)] == [first.path, second.path]
    first.leave()
    assert second.waiters_ahead(CLAIMED, 0.0) == [] and len(queue.waiters(lock_dir)) == 1
    second.leave()
    assert list(lock_dir.iterdir()) == []


def test_a_ticket_comes_after_the_last_live_one_even_one_from_later_on_the_clock(
    lock_dir: Path, planted: list[int]
) -> None:
    """Numbers only grow while the queue is not empty, whatever the clock did meanwhile."""
    soon = clock_number() + 600 * 10**6
    plant(lock_dir, planted, ticket_name(soon))
    mine = queue.take_ticket(lock_dir, "python a.py")
    try:
        assert mine.number == soon + 1
        assert [w.number for w in mine.waiters_ahead(CLAIMED, 0.0)] == [soon]
    finally:
        mine.leave()


@pytest.mark.parametrize("number", [10**18 - 1, 10**19 - 1])
def test_a_number_planted_far_in_the_future_is_no_ticket_and_leaves_room(
    lock_dir: Path, planted: list[int], number: int
) -> None:
    """Numbered after it, the next ticket would be wider than any name read (and so nobody's
    waiter): every run after it would be first, and first come, first served would be gone."""
    far = plant(lock_dir, planted, ticket_name(number))
    first = queue.take_ticket(lock_dir, "python a.py")
    second = queue.take_ticket(lock_dir, "python b.py")
    try:
        assert first.number < second.number < 10**17
        assert [w.path for w in queue.waiters(lock_dir)] == [first.path, second.path]
        assert [w.path for w in second.waiters_ahead(CLAIMED, 0.0)] == [first.path]
        assert far.exists()
    finally:
        first.leave()
        second.leave()


def test_a_ticket_not_owned_by_the_uid_its_name_says_is_no_waiter(
    lock_dir: Path, planted: list[int]
) -> None:
    plant(lock_dir, planted, ticket_name(1, OTHER_UID))  # ours, named as someone else's
    assert queue.waiters(lock_dir) == []
    mine = queue.take_ticket(lock_dir, "python a.py")
    try:
        assert mine.waiters_ahead(CLAIMED, 0.0) == []
    finally:
        mine.leave()


def test_a_ticket_taken_meanwhile_is_never_replaced(
    lock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two takers that listed the queue at the same moment: the link fails, the next free
    number is tried."""
    monkeypatch.setattr(queue, "_clock_number", lambda: 5)
    one = queue.take_ticket(lock_dir, "python one.py")
    two = queue.take_ticket(lock_dir, "python two.py")
    three = queue.take_ticket(lock_dir, "python three.py")
    assert (one.number, two.number, three.number) == (5, 6, 7)
    two.leave()
    monkeypatch.setattr(queue, "waiters", lambda _qdir: [])  # a listing taken before any
    late = queue.take_ticket(lock_dir, "python late.py")
    try:
        assert late.number == 6
        assert claims.read_holder(one.path).command == "python one.py"  # type: ignore[union-attr]
        assert claims.read_holder(three.path).command == "python three.py"  # type: ignore[union-attr]
    finally:
        for t in (one, three, late):
            t.leave()


def test_a_failed_link_leaves_no_temporary_and_says_why(
    lock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(src: object, dst: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(queue.os, "link", refuse)
    with pytest.raises(PermissionError):
        queue.take_ticket(lock_dir, "python a.py")
    assert list(lock_dir.iterdir()) == []


def test_leaving_twice_or_after_the_file_went_is_harmless(lock_dir: Path) -> None:
    ticket = queue.take_ticket(lock_dir, "python a.py")
    ticket.path.unlink()  # cleaned up by someone else already
    ticket.leave()
    assert ticket.fd < 0
    ticket.leave()
    assert ticket.fd < 0


def test_litter_that_cannot_be_removed_does_not_stop_the_queue(lock_dir: Path) -> None:
    (lock_dir / ticket_name(1)).mkdir()  # not a waiter, and unlink fails
    os.mkfifo(lock_dir / ticket_name(2))  # not a waiter, never opened so as to block
    ticket = queue.take_ticket(lock_dir, "python a.py")
    try:
        assert ticket.waiters_ahead(CLAIMED, 0.0) == []
        assert [w.path for w in queue.waiters(lock_dir)] == [ticket.path]
    finally:
        ticket.leave()


# -- who keeps their place --------------------------------------------------------------------


def waiter(n: int) -> Waiter:
    name = ticket_name(n)
    return Waiter(n, Path(name), (name, 1, n))


def test_waiters_keep_their_place_while_gpus_are_claimed() -> None:
    watch = QueueWatch.of([waiter(1), waiter(2)])
    present = [waiter(1), waiter(2), waiter(3)]  # 3 came after us: never ahead
    for now in (0.0, 100.0, 10_000.0):
        assert watch.still_ahead(present, CLAIMED, now) == present[:2]
    assert not watch.quiet
    assert watch.still_ahead(present[1:], CLAIMED, 10_001.0) == [waiter(2)]  # 1 got its GPUs


def test_waiters_that_take_nothing_while_nothing_is_claimed_lose_their_place() -> None:
    """Quiet spells add up (claims coming and going between them do not reset them); then
    every waiter ahead is passed, for good."""
    idle = queue.IDLE_WAITER_S
    present = [waiter(1), waiter(2)]
    watch = QueueWatch.of(present)
    assert watch.still_ahead(present, NOTHING_CLAIMED, 0.0) == present and watch.quiet
    assert watch.still_ahead(present, NOTHING_CLAIMED, idle / 2) == present
    assert watch.still_ahead(present, CLAIMED, idle / 2 + 1) == present and not watch.quiet
    assert watch.still_ahead(present, NOTHING_CLAIMED, idle) == present  # a new quiet spell
    assert watch.still_ahead(present, NOTHING_CLAIMED, idle * 1.5 - 0.5) == present
    assert watch.still_ahead(present, NOTHING_CLAIMED, idle * 1.5 + 0.5) == []
    assert watch.still_ahead(present, CLAIMED, idle * 2) == [] and not watch.quiet


def test_a_ticket_planted_after_we_looked_never_gets_ahead_of_us() -> None:
    """A lower number under a new name, or a new file under an old name, is not who was there."""
    watch = QueueWatch.of([waiter(5)])
    replaced = Waiter(5, waiter(5).path, (waiter(5).path.name, 1, 99))
    asked: list[bool] = []

    def claimed() -> bool:
        asked.append(True)
        return True

    assert watch.still_ahead([waiter(1), replaced], claimed, 0.0) == []
    assert asked == []  # nobody ahead: no need to look at the claims
    assert watch.still_ahead([waiter(5)], claimed, 1.0) == []  # gone once, gone for good


# -- a run without --wait and the queue --------------------------------------------------------


def inventory(count: int = 2) -> GpuInventory:
    buses = ["0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0"]
    gpus = tuple(
        Gpu(index=i, bus_id=buses[i], name=A100, uuid=f"GPU-{i}", memory_total=80 << 30)
        for i in range(count)
    )
    return GpuInventory(gpus=gpus, driver_version="550", cuda_driver_version=12040)


def run_now(lock_dir: Path) -> Acquired:
    machine = inventory()
    return acquire_gpus(
        GpuRequest(1),
        ["python", "now.py"],
        lambda _inv: builtin_catalog(),
        lambda: machine,
        lock_dir=lock_dir,
        wait=False,
    )


def test_a_run_without_wait_gives_way_to_waiters_while_gpus_are_claimed(lock_dir: Path) -> None:
    """GPU-1 is free, but an earlier run waits (for GPU-0 too, say): first come, first served."""
    held = claims.HeldClaims()
    assert claims.try_claim(lock_dir, "GPU-0", held)
    waiting = queue.take_ticket(lock_dir, "python first.py")
    try:
        with pytest.raises(ClusterjobError) as refused:
            run_now(lock_dir)
        assert str(refused.value) == (
            "no 1 A100 GPU for you now: 1 earlier run(s) are waiting in the queue (first: "
            f"{ME} pid {os.getpid()}; first come, first served): use --wait to queue"
        )
        assert [c.key for c in claims.current_claims(lock_dir)] == ["GPU-0"]
    finally:
        waiting.leave()
    acquired = run_now(lock_dir)  # the queue is empty again: the same run gets a GPU at once
    try:
        assert [g.uuid for g in acquired.gpus] == ["GPU-1"]
    finally:
        acquired.held.release_all()
        held.release_all()


@pytest.mark.parametrize("claim", [None, "GPU-7"], ids=["nothing claimed", "no such GPU"])
def test_a_run_without_wait_passes_waiters_that_take_nothing_while_nothing_is_claimed(
    lock_dir: Path,
    planted: list[int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    claim: str | None,
) -> None:
    """A locked ticket with no run behind it (and a claim on a GPU this machine lacks, which
    holds nothing) refuses nobody for longer than IDLE_WAITER_S."""
    monkeypatch.setattr(queue, "IDLE_WAITER_S", 0.6)
    held = claims.HeldClaims()
    if claim:
        assert claims.try_claim(lock_dir, claim, held)
    plant(lock_dir, planted, ticket_name(1))
    started = time.monotonic()
    acquired = run_now(lock_dir)
    try:
        assert 0.6 <= time.monotonic() - started < 5
        assert [g.uuid for g in acquired.gpus] == ["GPU-0"]
        assert capsys.readouterr().err == (
            "clusterjob: 1 earlier run(s) wait in the queue though no GPU is claimed: letting "
            "them go first for up to 0.6s\n"
        )
    finally:
        acquired.held.release_all()
        held.release_all()


def test_a_run_without_wait_goes_at_once_when_the_queue_is_empty(lock_dir: Path) -> None:
    started = time.monotonic()
    acquired = run_now(lock_dir)
    acquired.held.release_all()
    assert time.monotonic() - started < queue.IDLE_WAITER_S / 2
