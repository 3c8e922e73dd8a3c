"""``clusterjob run`` between users who do not trust each other, with real Unix users.

Two unprivileged users (created for the test, then removed) share one stand-in workstation
and a lock dir root created (``install -d -m 1777``). One runs jobs; the other tries what the
security review tried: deleting claims, planting FIFOs and junk where claim and ticket files
go, holding the selection lock, hard-linking a claim name to someone's file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir
from unix_users import UnixUser, unix_user

from clusterjob.sandbox.standin import StandinScenario, a100, gpus_on_buses, write_scenario

pytestmark = pytest.mark.nvml

REPO = Path(__file__).resolve().parents[1]
SCENARIO = StandinScenario(gpus=gpus_on_buses(a100, ["0000:07:00.0", "0000:0b:00.0"]))
KEYS = [g.uuid for g in SCENARIO.gpus]


@dataclass
class Box:
    """The shared machine: stand-in NVML readable by all, and a root-made 1777 lock dir."""

    root: Path
    lib_dir: Path
    scenario: Path
    locks: Path

    def env(self) -> dict[str, str]:
        return {
            "LD_LIBRARY_PATH": str(self.lib_dir),
            "FAKE_NVML_SCENARIO": str(self.scenario),
            "PYTHONPATH": str(REPO),
            "CLUSTERJOB_LOCK_DIR": str(self.locks),
        }

    def run(
        self, user: UnixUser, *args: str, timeout: float = 40
    ) -> subprocess.CompletedProcess[str]:
        return user.run(
            [sys.executable, "-m", "clusterjob", *args], env=self.env(), timeout=timeout
        )

    def start(self, user: UnixUser, *args: str) -> subprocess.Popen[bytes]:
        return user.popen([sys.executable, "-m", "clusterjob", *args], env=self.env())


@pytest.fixture(scope="module")
def alice() -> Iterator[UnixUser]:
    with unix_user("cjali") as u:
        yield u


@pytest.fixture(scope="module")
def mallory() -> Iterator[UnixUser]:
    with unix_user("cjmal") as u:
        yield u


@pytest.fixture
def box(standin_lib: Path) -> Iterator[Box]:
    for root in trusted_tmp_dir():
        lib_dir = root / "lib"
        lib_dir.mkdir()
        shutil.copy(standin_lib, lib_dir / standin_lib.name)
        (lib_dir / standin_lib.name).chmod(0o755)
        scenario = write_scenario(root / "scenario.txt", SCENARIO)
        scenario.chmod(0o644)
        locks = root / "locks"
        locks.mkdir()
        locks.chmod(0o1777)
        (root / "marks").mkdir()
        (root / "marks").chmod(0o1777)
        yield Box(root, lib_dir, scenario, locks)


def holding(box: Box, user: UnixUser, gpus: int = 2) -> subprocess.Popen[bytes]:
    """``user`` runs a job that holds ``gpus`` GPUs until killed; returns once it holds them."""
    mark = box.root / "marks" / f"held-{user.name}"
    proc = box.start(
        user, "run", "--gpus", str(gpus), "--", "sh", "-c", f": > {mark}; exec sleep 60"
    )
    deadline = time.monotonic() + 30
    while not mark.exists():
        assert proc.poll() is None, "the holding run ended early"
        assert time.monotonic() < deadline, "the holding run never started"
        time.sleep(0.05)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(10)


def holding_file(
    box: Box, user: UnixUser, path: Path, text: dict[str, object]
) -> subprocess.Popen[bytes]:
    """``user`` writes ``text`` (JSON) to ``path`` and holds its lock, with no run behind it."""
    ready = box.root / "marks" / f"ready-{path.name}"
    proc = user.popen(
        [
            sys.executable,
            "-c",
            "import fcntl, json, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, sys.argv[2].encode())\n"
            "open(sys.argv[3], 'w').close()\n"
            "time.sleep(120)\n",
            str(path),
            json.dumps(text),
            str(ready),
        ]
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert proc.poll() is None, "the lock holder ended early"
        assert time.monotonic() < deadline, "the lock holder never started"
        time.sleep(0.05)
    return proc


# -- 4. claims survive the other user; the lock dir is not one user's to control ------------


def test_another_user_cannot_delete_a_held_claim_and_take_the_gpu(
    box: Box, alice: UnixUser, mallory: UnixUser
) -> None:
    """The review's attack: mallory used the GPUs first (so the shared claim files were hers),
    deleted them while alice's job held the GPUs, and got both GPUs."""
    assert box.run(mallory, "run", "--gpus", "2", "--", "true").returncode == 0
    job = holding(box, alice)
    try:
        mallory.run(["sh", "-c", f"rm -f {box.locks}/*.claim"])
        grab = box.run(mallory, "run", "--gpus", "1", "--", "true")
        assert grab.returncode == 1, grab.stderr
        assert "claimed by" in grab.stderr and alice.name in grab.stderr
    finally:
        stop(job)


def test_a_lock_dir_another_user_owns_is_refused(
    box: Box, alice: UnixUser, mallory: UnixUser
) -> None:
    """Whoever owns the lock dir could delete every claim in it (and chmod everyone out)."""
    theirs = box.root / "marks" / "theirs"
    env_dir = str(theirs)
    made = mallory.run(["mkdir", "-m", "1777", env_dir])
    assert made.returncode == 0, made.stderr
    done = alice.run(
        [sys.executable, "-m", "clusterjob", "run", "--", "true"],
        env={**box.env(), "CLUSTERJOB_LOCK_DIR": env_dir},
        timeout=40,
    )
    assert done.returncode == 1
    assert f"GPU lock dir {theirs} belongs to {mallory.name}" in done.stderr


# -- 5. FIFOs, held locks and junk cannot hang or break anyone's run -------------------------


def test_fifos_where_claims_and_tickets_go_do_not_hang_runs(
    box: Box, alice: UnixUser, mallory: UnixUser
) -> None:
    names = [f"{k}.claim" for k in KEYS] + [f"{k}@{alice.uid}.claim" for k in KEYS]
    names += [f"{n:012d}.ticket" for n in range(1, 4)] + [f"000000000001@{alice.uid}.ticket"]
    for name in names:
        assert mallory.run(["mkfifo", "-m", "666", str(box.locks / name)]).returncode == 0
    start = time.monotonic()
    done = box.run(alice, "run", "--gpus", "2", "--", "true", timeout=30)
    assert done.returncode == 0, done.stderr
    assert f"warning: ignoring {len(names)} file(s) in {box.locks} that are not GPU" in done.stderr
    waited = box.run(alice, "run", "--wait", "3", "--", "true", timeout=30)
    assert waited.returncode == 0, waited.stderr
    listed = box.run(alice, "gpus", timeout=30)
    assert listed.returncode == 0, listed.stderr
    assert time.monotonic() - start < 25


def test_holding_the_selection_lock_cannot_hang_runs(
    box: Box, alice: UnixUser, mallory: UnixUser
) -> None:
    lock = box.locks / ".selection.lock"
    squatter = mallory.popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, time\n"
            f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o644)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "time.sleep(120)\n",
        ]
    )
    try:
        while not lock.exists():
            time.sleep(0.05)
        time.sleep(0.3)
        start = time.monotonic()
        job = holding(box, mallory, gpus=2)  # every GPU busy: alice must wait, then give up
        try:
            gave_up = box.run(alice, "run", "--wait", "3", "--", "true", timeout=60)
        finally:
            stop(job)
        assert gave_up.returncode == 1, gave_up.stderr
        assert "gave up after waiting 3s" in gave_up.stderr
        assert time.monotonic() - start < 30
        ok = box.run(alice, "run", "--", "true", timeout=60)
        assert ok.returncode == 0, ok.stderr
        assert box.run(alice, "gpus", timeout=60).returncode == 0
    finally:
        stop(squatter)


@pytest.mark.parametrize("junk", ["mode 0600", "mode 000", "symlink", "directory"])
def test_junk_claim_files_do_not_make_free_gpus_busy(
    box: Box, alice: UnixUser, mallory: UnixUser, junk: str
) -> None:
    for key in KEYS:
        for name in (f"{key}.claim", f"{key}@{alice.uid}.claim", f"{key}@{mallory.uid}.claim"):
            path = str(box.locks / name)
            if junk.startswith("mode"):
                mode = junk.split()[1]
                cmd = ["sh", "-c", f"echo junk > {path} && chmod {mode} {path}"]
            elif junk == "symlink":
                cmd = ["ln", "-s", "/etc/shadow", path]
            else:
                cmd = ["mkdir", path]
            made = mallory.run(cmd)
            assert made.returncode == 0, made.stderr
    done = box.run(alice, "run", "--gpus", "2", "--", "true")
    assert done.returncode == 0, done.stderr
    if junk in ("symlink", "directory"):
        assert "warning: ignoring" in done.stderr


# -- 12. a claim file is truncated only when it is ours alone -------------------------------


def test_claim_name_hard_linked_to_a_users_file_is_not_truncated(box: Box, alice: UnixUser) -> None:
    """On a host with fs.protected_hardlinks=0 any user can make these links; made here by
    the test (as root) on this host, which protects hard links."""
    precious = box.root / "marks" / "alice-notes"
    precious.write_text("do not lose\n")
    os.chown(precious, alice.uid, alice.gid)
    for key in KEYS:
        for name in (f"{key}.claim", f"{key}@{alice.uid}.claim"):
            os.link(precious, box.locks / name)
    done = box.run(alice, "run", "--gpus", "2", "--", "true")
    assert done.returncode == 0, done.stderr
    assert precious.read_text() == "do not lose\n"


# -- 8. another user's text never drives our terminal ---------------------------------------


def test_claim_holder_text_cannot_send_escape_sequences(
    box: Box, alice: UnixUser, mallory: UnixUser
) -> None:
    """The holder is named by the claim file's owner; what the text says is shown escaped."""
    evil = "\x1b]0;pwned\x07\x1b[2J"
    claim = box.locks / f"{KEYS[0]}@{mallory.uid}.claim"
    holder = holding_file(box, mallory, claim, {"user": evil, "pid": 1, "command": evil})
    try:
        busy = box.run(alice, "run", "--gpus", "2", "--", "true")
        listed = box.run(alice, "gpus")
    finally:
        stop(holder)
    assert busy.returncode == 1
    assert f"claimed by {mallory.name} (pid 1, since ?: \\x1b]0;pwned\\x07\\x1b[2J)" in busy.stderr
    for out in (busy.stdout, busy.stderr, listed.stdout, listed.stderr):
        assert "\x1b" not in out and "\x07" not in out


def test_error_lines_escape_control_characters(capsys: pytest.CaptureFixture[str]) -> None:
    """Slurm's stderr reaches the user inside error messages: printed escaped."""
    from clusterjob.cli.outcome import err

    err("sbatch: error: \x1b[31mred\x1b[0m\x9b2J done\tok\nnext")
    assert capsys.readouterr().err == (
        "clusterjob: sbatch: error: \\x1b[31mred\\x1b[0m\\x9b2J done\tok\nnext\n"
    )


# -- 13. a ticket in the queue counts only as a waiting run ---------------------------------

FAKE_ROOT = {"user": "root", "pid": 1, "command": "/sbin/init", "since": 0}


def test_a_planted_ticket_with_nothing_behind_it_refuses_and_hangs_no_run(
    box: Box, alice: UnixUser, mallory: UnixUser
) -> None:
    """The review's attack: mallory locks a ticket of her own that says it is root's, and
    never claims anything. Runs used to be refused with every GPU free, and waiters to wait
    forever behind 'root pid 1'."""
    ticket = box.locks / f"{1:016d}@{mallory.uid}.ticket"
    squatter = holding_file(box, mallory, ticket, FAKE_ROOT)
    try:
        start = time.monotonic()
        now = box.run(alice, "run", "--gpus", "2", "--", "true", timeout=60)
        assert now.returncode == 0, now.stderr
        assert "earlier run(s) wait in the queue though no GPU is claimed" in now.stderr
        waited = box.run(alice, "run", "--gpus", "2", "--wait", "40", "--", "true", timeout=60)
        assert waited.returncode == 0, waited.stderr
        assert f"(first: {mallory.name} pid 1)" in waited.stderr
        assert "first: root" not in waited.stderr
        assert time.monotonic() - start < 45
        assert squatter.poll() is None  # still holding its lock: passed, not outlived
    finally:
        stop(squatter)


def test_a_waiter_is_named_by_its_ticket_files_owner(
    box: Box, alice: UnixUser, mallory: UnixUser
) -> None:
    """While GPUs are claimed a waiter keeps its place (a real run of mallory's waiting for
    both GPUs would too); the refusal names who waits by the ticket's owner, not its text."""
    job = holding(box, mallory, gpus=1)
    ticket = box.locks / f"{1:016d}@{mallory.uid}.ticket"
    squatter = holding_file(box, mallory, ticket, FAKE_ROOT)
    try:
        refused = box.run(alice, "run", "--gpus", "1", "--", "true")
    finally:
        stop(squatter)
        stop(job)
    assert refused.returncode == 1, refused.stderr
    assert (
        f"1 earlier run(s) are waiting in the queue (first: {mallory.name} pid 1;" in refused.stderr
    )
    assert "first: root" not in refused.stderr


def test_an_eighteen_digit_ticket_does_not_end_first_come_first_served(
    box: Box, alice: UnixUser, mallory: UnixUser
) -> None:
    """mallory leaves a dead ticket numbered 10**18 - 1 that nobody else may remove. A ticket
    numbered after it had 19 digits, which the queue does not read: every waiter was invisible
    and any later run went first."""
    job = holding(box, mallory, gpus=1)  # (a run of hers would clear her dead tickets first)
    planted = box.locks / f"{'9' * 18}@{mallory.uid}.ticket"
    assert mallory.run(["sh", "-c", f"echo '{{}}' > {planted}"]).returncode == 0
    big = box.start(alice, "run", "--gpus", "2", "--wait", "60", "--", "true")
    try:
        deadline = time.monotonic() + 30
        while not list(box.locks.glob(f"*@{alice.uid}.ticket")):
            assert big.poll() is None, "the waiting run ended early"
            assert time.monotonic() < deadline, "the waiting run never took a ticket"
            time.sleep(0.05)
        later = box.run(alice, "run", "--gpus", "1", "--", "true")
        assert later.returncode == 1, later.stderr
        assert "1 earlier run(s) are waiting in the queue" in later.stderr
        stop(job)
        assert big.wait(30) == 0  # the GPUs went to the run that came first
    finally:
        stop(job)
        stop(big)
    assert planted.exists()
