"""``clusterjob run`` end to end: real child processes, real pynvml over the stand-in NVML,
real flock claims in a temporary lock dir.

Every run is a separate ``python -m clusterjob run`` process (LD_LIBRARY_PATH must be set at
process start for the stand-in), so concurrency, SIGKILL and exec are the real thing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

import clusterjob
from clusterjob.sandbox.standin import (
    GIB,
    StandinProcess,
    StandinScenario,
    a100,
    gpus_on_buses,
    h100,
    standin_env,
    v100,
    write_scenario,
)
from clusterjob.workstation.claims import current_claims

pytestmark = pytest.mark.nvml

_PACKAGE_ROOT = str(Path(clusterjob.__file__).resolve().parent.parent)
FOUR_A100 = StandinScenario(
    gpus=gpus_on_buses(a100, ["0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0"])
)


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    err: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.err.read_text()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)


class Machine:
    """One stand-in workstation: its scenario, its lock dir, and a way to start runs on it."""

    def __init__(self, lib: Path, tmp_path: Path, scenario: StandinScenario) -> None:
        self.tmp = tmp_path
        self.scenario = scenario
        self.lock_dir = tmp_path / "locks"
        scenario_path = write_scenario(tmp_path / "scenario.txt", scenario)
        env = dict(os.environ)
        for var in ("SLURMD_NODENAME", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
            env.pop(var, None)
        env.update(standin_env(lib.parent, scenario_path))
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + old if old else "")
        env["CLUSTERJOB_LOCK_DIR"] = str(self.lock_dir)
        self.env = env
        self.started = 0

    def start(self, *args: str) -> Started:
        """A run in the background; its output goes to files (pipes could fill and block)."""
        self.started += 1
        out = self.tmp / f"run{self.started}.out"
        err = self.tmp / f"run{self.started}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(
                [sys.executable, "-m", "clusterjob", "run", *args], env=self.env, stdout=o, stderr=e
            )
        return Started(proc, err)

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "clusterjob", "run", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def uuid(self, bus_prefix: str) -> str:
        return next(g.uuid for g in self.scenario.gpus if g.bus_id.startswith(bus_prefix))


def wait_for(path: Path, run: Started, timeout: float = 20) -> str:
    """The text the command wrote to ``path`` once it runs (it has then been exec'd)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        if run.proc.poll() is not None:
            raise AssertionError(f"run ended early ({run.proc.returncode}): {run.stderr()}")
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


ENV_DUMP = 'echo "$CUDA_DEVICE_ORDER $CUDA_VISIBLE_DEVICES $CLUSTERJOB_GPU_BUS_IDS"'


@pytest.fixture
def machine(standin_lib, tmp_path):
    def make(scenario: StandinScenario = FOUR_A100) -> Machine:
        return Machine(standin_lib, tmp_path, scenario)

    return make


def test_mixed_node_gets_the_asked_model_by_pci_order_not_cudas_fastest_first(machine):
    # PCI order: V100 (0000:1a) before H100 (0000:3b) before V100 (0000:88). CUDA's default
    # FASTEST_FIRST numbers the H100 as device 0, so a bare CUDA_VISIBLE_DEVICES=0 would put
    # a V100 job on the H100. NVML lists them in yet another order here.
    scenario = StandinScenario(
        gpus=(
            h100("0000:3b:00.0", 0),
            v100("0000:88:00.0", 1),
            v100("0000:1a:00.0", 2),
        )
    )
    m = machine(scenario)
    done = m.run("--gpus", "1", "--model", "v100", "--", "sh", "-c", ENV_DUMP)
    assert done.returncode == 0, done.stderr
    order, visible, bus_ids = done.stdout.split()
    assert order == "PCI_BUS_ID"
    assert visible == m.uuid("0000:1a")  # the V100 first in bus order, named by UUID
    assert bus_ids == "0000:1a:00.0"
    done = m.run("--gpus", "2", "--model", "V100", "--", "sh", "-c", ENV_DUMP)
    assert done.stdout.split()[1] == f"{m.uuid('0000:1a')},{m.uuid('0000:88')}"


def test_model_memory_and_processes_decide_which_gpu(machine):
    gpus = (
        a100("0000:07:00.0", 0, processes=(StandinProcess(4242, 2 * GIB, "python"),)),
        a100("0000:0b:00.0", 1, memory_used=70 * GIB),
        v100("0000:0c:00.0", 2),
        a100("0000:0d:00.0", 3, memory_used=10 * GIB),
    )
    m = machine(StandinScenario(gpus=gpus))
    done = m.run("--model", "A100", "--min-free-mem", "40G", "--", "sh", "-c", ENV_DUMP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[2] == "0000:0d:00.0"
    shared = m.run("--model", "A100", "--allow-shared", "--", "sh", "-c", ENV_DUMP)
    assert shared.stdout.split()[2] == "0000:0b:00.0"  # no process; lowest bus among those
    busy = m.run("--gpus", "3", "--model", "A100", "--", "true")
    assert busy.returncode == 1
    assert "GPU 0 (0000:07:00.0) in use by 1 compute process (pid 4242 python)" in busy.stderr
    assert "use --wait" in busy.stderr


def test_impossible_requests_exit_2_naming_what_exists(machine):
    m = machine(StandinScenario(gpus=(a100("0000:07:00.0", 0), v100("0000:0c:00.0", 1))))
    unknown = m.run("--model", "Z9000", "--", "true")
    assert unknown.returncode == 2
    assert "unknown GPU model 'Z9000'" in unknown.stderr
    assert "1x A100 (NVIDIA A100-SXM4-80GB), 1x V100 (Tesla V100-SXM2-32GB)" in unknown.stderr
    too_many = m.run("--gpus", "2", "--model", "a100", "--", "true")
    assert too_many.returncode == 2 and "only 1 A100 GPU here" in too_many.stderr
    assert "Traceback" not in unknown.stderr + too_many.stderr


def test_site_config_describing_this_machine_gives_its_aliases(machine, tmp_path):
    host = socket.gethostname().split(".")[0]
    site = tmp_path / "site.yaml"
    site.write_text(
        f"""site: lab
gpu_request: {{syntax: gres}}
models:
  BIG:
    aliases: [chonky]
    gres_type: a100
    nvml_names: ["NVIDIA A100-SXM4-80GB"]
  OLD:
    aliases: [vintage]
    gres_type: v100
    nvml_names: ["Tesla V100-SXM2-32GB"]
node_map:
  - nodes: "{host}"
    gpus:
      - {{model: OLD, bus_id: "0000:07:00.0"}}
      - {{model: BIG, bus_id: "0000:0c:00.0"}}
"""
    )
    m = machine(StandinScenario(gpus=(v100("0000:07:00.0", 0), a100("0000:0c:00.0", 1))))
    done = m.run("--site", str(site), "--model", "chonky", "--", "sh", "-c", ENV_DUMP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[2] == "0000:0c:00.0"
    wrong = m.run("--site", str(site), "--model", "A100", "--", "true")
    assert wrong.returncode == 2 and "1x OLD" in wrong.stderr and "site lab" in wrong.stderr


def test_exit_code_passes_through(machine):
    assert machine().run("--", "sh", "-c", "exit 7").returncode == 7


def test_run_execs_the_command_so_signals_reach_it_and_a_kill_releases_the_gpu(machine, tmp_path):
    m = machine()
    pid_file = tmp_path / "pid"
    holder = m.start("--gpus", "4", "--", "sh", "-c", f"echo $$ > {pid_file}; exec sleep 60")
    try:
        assert int(wait_for(pid_file, holder)) == holder.pid  # same process: exec, no wrapper
        [*held] = current_claims(m.lock_dir)
        assert len(held) == 4 and {c.holder.pid for c in held} == {holder.pid}
        busy = m.run("--", "true")
        assert busy.returncode == 1
        assert "GPU 0 (0000:07:00.0) claimed by" in busy.stderr
        assert f"pid {holder.pid}" in busy.stderr and "sh -c" in busy.stderr
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    finally:
        holder.kill()
    assert current_claims(m.lock_dir) == []
    after = m.run("--gpus", "4", "--", "true")
    assert after.returncode == 0, after.stderr

    term = m.start("--", "sleep", "60")
    time.sleep(0.1)
    while not current_claims(m.lock_dir) and term.proc.poll() is None:
        time.sleep(0.05)
    term.send_signal(signal.SIGTERM)
    assert term.wait(10) == -signal.SIGTERM  # sleep itself died of SIGTERM


def test_wait_timeout_gives_up_with_a_clear_message(machine, tmp_path):
    m = machine()
    mark = tmp_path / "mark"
    holder = m.start("--gpus", "4", "--", "sh", "-c", f"echo > {mark}; exec sleep 60")
    try:
        wait_for(mark, holder)
        started = time.monotonic()
        gave_up = m.run("--wait", "1", "--", "true")
        assert time.monotonic() - started < 15
    finally:
        holder.kill()
    assert gave_up.returncode == 1
    assert "gave up after waiting 1s for 1 A100 GPU" in gave_up.stderr
    assert "claimed by" in gave_up.stderr
    assert "waiting (first in queue)" in gave_up.stderr  # the status line (not a tty: lines)


def test_eight_waiting_runs_share_four_gpus_without_overlap(machine, tmp_path):
    m = machine()
    log = tmp_path / "log"
    record = (
        f'echo "$$ $CUDA_VISIBLE_DEVICES start $(date +%s.%N)" >> {log}; sleep 1; '
        f'echo "$$ $CUDA_VISIBLE_DEVICES end $(date +%s.%N)" >> {log}'
    )
    runs = [m.start("--gpus", "1", "--wait", "60", "--", "sh", "-c", record) for _ in range(8)]
    for run in runs:
        run.wait(90)
    assert [r.proc.returncode for r in runs] == [0] * 8, [r.stderr() for r in runs]

    spans: dict[str, dict[str, float]] = defaultdict(dict)
    gpu_of: dict[str, str] = {}
    for line in log.read_text().splitlines():
        pid, gpu, event, when = line.split()
        spans[pid][event] = float(when)
        gpu_of[pid] = gpu
    assert len(spans) == 8 and all(set(s) == {"start", "end"} for s in spans.values())
    assert set(gpu_of.values()) <= {g.uuid for g in FOUR_A100.gpus}
    by_gpu: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for pid, s in spans.items():
        by_gpu[gpu_of[pid]].append((s["start"], s["end"]))
    for gpu, intervals in by_gpu.items():
        intervals.sort()
        for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
            assert start >= end, f"two holders of {gpu} at once"
    events = sorted((t, +1 if e == "start" else -1) for s in spans.values() for e, t in s.items())
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak <= 4
    assert len(by_gpu) >= 2  # the waiters really spread over the GPUs


def test_waiters_are_served_first_come_first_served(machine, tmp_path):
    m = machine()
    mark, log = tmp_path / "mark", tmp_path / "log"
    holder = m.start("--gpus", "4", "--", "sh", "-c", f"echo > {mark}; exec sleep 60")
    try:
        wait_for(mark, holder)
        entry = f'echo "%s start $(date +%%s.%%N)" >> {log}; sleep 0.5; echo "%s end" >> {log}'
        first = m.start("--gpus", "4", "--wait", "--", "sh", "-c", entry % ("big", "big"))
        time.sleep(1.0)  # the big one holds the first ticket
        second = m.start("--gpus", "1", "--wait", "--", "sh", "-c", entry % ("small", "small"))
        time.sleep(1.0)
        holder.kill()
        assert first.wait(30) == 0 and second.wait(30) == 0
    finally:
        holder.kill()
    lines = [line.split()[:2] for line in log.read_text().splitlines()]
    # The 1-GPU run could have squeezed in while the 4-GPU run waited; FIFO says it must not.
    assert lines == [["big", "start"], ["big", "end"], ["small", "start"], ["small", "end"]]
