"""The Grid Engine sandbox's pure parts: its host layout, the configuration it gives qconf,
the host-side wrappers, and the preload that makes each execution host connect from its own
address (compiled and tried for real on the loopback network)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import clusterjob.cli.app as cli
from clusterjob.sandbox import gridengine
from clusterjob.sandbox.gridengine import HOSTS, Layout


def test_each_host_has_its_own_name_address_and_execd_port() -> None:
    names = [h.name for h in HOSTS]
    addresses = [h.address for h in HOSTS]
    ports = [h.execd_port for h in HOSTS]
    assert len(set(names)) == len(set(addresses)) == len(set(ports)) == 3
    assert gridengine.MASTER not in names
    assert "127.0.0.1" not in addresses  # the master's: clients connect from it
    assert gridengine.QMASTER_PORT not in ports
    # two hosts with a100, one with another model: the wrong-model host of later tests
    assert [(h.gpus, h.gpu_type) for h in HOSTS] == [(4, "a100"), (4, "a100"), (2, "v100")]


def test_hosts_file_puts_the_master_on_the_loopback_address_clients_come_from() -> None:
    lines = gridengine.hosts_file().splitlines()
    assert lines[0] == "127.0.0.1 master localhost"
    assert lines[1:] == ["127.0.0.2 host1", "127.0.0.3 host2", "127.0.0.4 host3"]


def test_edit_config_replaces_keys_appends_missing_ones_and_drops_comments() -> None:
    shown = "# Version: 8.1.9\n#\nmin_uid                1000\nmin_gid                1000\n"
    shown += "prolog none\n"
    edited = gridengine.edit_config(shown, {"min_uid": "0", "flush_time": "1"})
    assert edited.splitlines() == [
        f"{'min_uid':<32} 0",
        "min_gid                1000",
        "prolog none",
        f"{'flush_time':<32} 1",
    ]


def test_the_global_and_scheduler_changes_are_the_ones_a_busy_small_machine_needs() -> None:
    assert gridengine.GLOBAL_CHANGES["min_uid"] == gridengine.GLOBAL_CHANGES["min_gid"] == "0"
    assert "flush_time=00:00:01" in gridengine.GLOBAL_CHANGES["reporting_params"]
    assert gridengine.SCHEDULER_CHANGES["schedule_interval"] == "0:0:1"


def test_gpu_complexes_are_added_once() -> None:
    shown = (
        "#name shortcut type relop requestable consumable default urgency\n"
        "#-------\n"
        "arch a RESTRING == YES NO NONE 0\n"
    )
    once = gridengine.complexes(shown)
    assert gridengine.complexes(once) == once
    rows = [line.split() for line in once.splitlines()]
    assert rows[0][0] == "arch"
    assert rows[1] == ["gpu", "gpu", "INT", "<=", "YES", "YES", "0", "0"]
    assert rows[2] == ["gpu_type", "gpu_type", "STRING", "==", "YES", "NO", "NONE", "0"]


def test_exechost_offers_its_gpus_as_complex_values() -> None:
    text = gridengine.exechost_config(HOSTS[2])
    assert "hostname              host3\n" in text
    assert "complex_values        gpu=2,gpu_type=v100\n" in text


def test_queue_spans_the_host_group_without_load_thresholds() -> None:
    queue = dict(line.split(None, 1) for line in gridengine.queue_config().splitlines())
    assert queue["qname"] == "all.q"
    assert queue["hostlist"] == "@allhosts"
    assert queue["load_thresholds"] == "NONE"
    assert queue["slots"] == str(gridengine.SLOTS_PER_HOST)
    assert all(queue[f"{k}_vmem"] == "INFINITY" for k in ("s", "h"))
    assert gridengine.hostgroup_config() == "group_name @allhosts\nhostlist host1 host2 host3\n"


def test_each_execd_gets_its_address_and_its_own_stand_in_gpus(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    env = gridengine.execd_env(HOSTS[1], lay)
    assert env[gridengine.SOURCE_ADDRESS_ENV] == "127.0.0.3"
    assert env["SGE_EXECD_PORT"] == "6452"
    assert "LD_PRELOAD" not in env  # Grid Engine drops it from jobs: /etc/ld.so.preload inside
    assert env["FAKE_NVML_SCENARIO"] == str(tmp_path / "nvml/host2.scenario")


def test_the_namespace_mounts_its_own_proc_and_binds_state_over_the_cached_root(
    tmp_path: Path,
) -> None:
    lay = Layout(tmp_path / "state")
    lines = gridengine.holder_script(lay).splitlines()
    root = str(lay.root)
    assert lines[:3] == ["set -e", "hostname master", "ip link set lo up"]
    assert f"mount -t proc proc {root}/proc" in lines
    mounts = [line.split()[-2:] for line in lines if line.startswith("mount --bind ")]
    assert mounts == [
        [str(lay.spool), f"{root}/var/spool/gridengine"],
        [str(lay.common), f"{root}/var/lib/gridengine/default/common"],
        [str(lay.hosts), f"{root}/etc/hosts"],
        ["/tmp", f"{root}/tmp"],  # before the state dir, which may lie under /tmp
        [str(lay.state_dir), f"{root}{lay.state_dir}"],
        [str(lay.lib_dir / "libnvidia-ml.so.1"), f"{root}{gridengine.NVML_INSIDE}"],
        [str(lay.ld_so_preload), f"{root}/etc/ld.so.preload"],
    ]
    assert lines[-1].startswith(f"exec chroot {root} /bin/bash -c ")


def test_qhost_loads_leave_out_the_header_and_global() -> None:
    shown = (
        "HOSTNAME                ARCH         NCPU NSOC NCOR NTHR  LOAD  MEMTOT  MEMUSE\n"
        "-------------------------------------------------------------------------------\n"
        "global                  -               -    -    -    -     -       -       -\n"
        "host1                   lx-amd64        2    1    2    2  0.51    7.7G  901.0M\n"
        "host3                   -               -    -    -    -     -       -       -\n"
    )
    assert gridengine.parse_qhost_loads(shown) == (("host1", "0.51"), ("host3", "-"))


def test_wrapper_is_a_valid_script_that_enters_the_namespace(tmp_path: Path) -> None:
    text = gridengine.wrapper_script("qsub", Layout(tmp_path))
    assert text.startswith("#!/bin/sh\n")
    assert f"cat {tmp_path}/namespace.pid" in text
    assert 'nsenter -t "$pid" -m -u -i -n -p -r -w' in text
    assert "SGE_QMASTER_PORT=6444" in text
    assert '"$PWD" qsub "$@"' in text
    script = tmp_path / "qsub"
    script.write_text(text)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    down = subprocess.run(["sh", str(script), "-b", "y", "true"], capture_output=True, text=True)
    assert down.returncode == 2
    assert "the Grid Engine sandbox is not up" in down.stderr


def test_env_prints_the_wrappers_first_on_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sandbox", "env", "--scheduler", "gridengine", "--state-dir", str(tmp_path)]
    assert cli.run(argv) == 0
    assert capsys.readouterr().out.splitlines() == [
        f'export PATH={tmp_path}/bin:"$PATH"',
        f"export CLUSTERJOB_GE_SANDBOX_JOBS={tmp_path}/jobs",
    ]


@pytest.mark.parametrize("option", [["--slurm", "24.11"], ["--like", "x.yaml"]])
def test_slurm_only_options_are_refused_with_gridengine(
    option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.run(["sandbox", "up", "--scheduler", "gridengine", *option]) == 2
    assert "--scheduler gridengine takes no --" in capsys.readouterr().err


def test_the_slurm_release_variable_does_not_stop_gridengine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERJOB_SANDBOX_SLURM", "24.11")
    argv = ["sandbox", "env", "--scheduler", "gridengine", "--state-dir", str(tmp_path)]
    assert cli.run(argv) == 0
    assert capsys.readouterr().out.startswith(f"export PATH={tmp_path}/bin:")


def test_an_unknown_scheduler_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(["sandbox", "status", "--scheduler", "pbs"]) == 2
    assert "--scheduler pbs: valid are slurm, gridengine" in capsys.readouterr().err


_PEER = """
import socket, sys
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
client = socket.create_connection(server.getsockname())
conn, peer = server.accept()
print(peer[0])
"""


def test_preload_makes_loopback_connections_come_from_the_hosts_address(tmp_path: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler to build the preload")
    lib = gridengine.build_preload(tmp_path / "preload.so")
    assert gridengine.build_preload(lib) == lib  # reused while newer than its source

    def peer(**env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", _PEER], env={"LD_PRELOAD": str(lib), **env},
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return done.stdout.strip()

    assert peer() == "127.0.0.1"
    assert peer(**{gridengine.SOURCE_ADDRESS_ENV: "127.0.0.3"}) == "127.0.0.3"
    # a name that is not an address leaves the socket as the system binds it
    assert peer(**{gridengine.SOURCE_ADDRESS_ENV: "host2"}) == "127.0.0.1"
    assert socket.gethostname()  # the test ran on this machine's own loopback network
