"""What a failed `sandbox up` says about a daemon that stopped: the cause, not only the end."""

from __future__ import annotations

from pathlib import Path

from clusterjob.sandbox import host

# slurmd 24.11 on a machine without a cgroup file system (CgroupPlugin not disabled)
SLURMD_NO_CGROUPS = """\
[2026-11-30T10:00:00.001] debug:  Log file re-opened
[2026-11-30T10:00:00.002] error: cgroup namespace 'freezer' not mounted. aborting
[2026-11-30T10:00:00.003] error: No filesystem mounted on /sys/fs/cgroup
[2026-11-30T10:00:00.004] error: unable to create cgroup namespace
[2026-11-30T10:00:00.005] fatal: slurmd initialization failed
"""


def test_the_first_of_the_errors_before_the_end_is_said_with_it(tmp_path: Path) -> None:
    log = tmp_path / "slurmd.log"
    log.write_text(SLURMD_NO_CGROUPS)
    said = host.last_error_line(log)
    assert said.startswith("[2026-11-30T10:00:00.002] error: cgroup namespace 'freezer'")
    assert said.endswith("fatal: slurmd initialization failed")


def test_a_lone_error_and_a_log_without_one(tmp_path: Path) -> None:
    log = tmp_path / "d.log"
    log.write_text("started\nerror: bind: Address already in use\nexiting\n")
    assert host.last_error_line(log) == "error: bind: Address already in use"
    log.write_text("started\nstopping\n")
    assert host.last_error_line(log) == "stopping"
    assert host.last_error_line(tmp_path / "none.log") == "no log written"
