"""prolog, task-prolog, preflight and gpus end to end (and the Epilog where it shares the
Prolog's deadline): ``python -m clusterjob`` in a child, the unmodified pynvml over the
stand-in libnvidia-ml.so.1, real site files. Exit codes and exact output lines are what
slurmd, the job script and a person see."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir

from clusterjob.gpu.inventory import cpu_list
from clusterjob.sandbox.standin import (
    StandinScenario,
    a100,
    h100,
    mig_uuid_for,
    v100,
    write_scenario,
)

pytestmark = pytest.mark.nvml

REPO = Path(__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
HOOKS = ("prolog", "epilog")  # the root hooks whose exit status is a verdict on the node
NODE = "gpu2"
BUSES = ("0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0")
MIXED = ("A100", "A100", "V100", "V100")


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """The Prolog trusts no path through sticky /tmp: these trees live under a root-owned dir."""
    yield from trusted_tmp_dir()


def site_yaml(
    models: tuple[str, ...] = MIXED,
    *,
    on_error: str = "drain",
    deadline: float = 10,
    log: str = "/nonexistent/prolog.jsonl",
    nodes: str = "gpu[1-2]",
    buses: tuple[str, ...] = BUSES,
    nvlinks: int | None = None,
    checks: str = "",
    partition_checks: str = "",
    slot_extra: dict[int, str] | None = None,
    extra_models: str = "",
) -> str:
    links = "" if nvlinks is None else f", nvlinks: {nvlinks}"
    extra = slot_extra or {}
    gpus = "\n".join(
        f'      - {{model: {m}, bus_id: "{b}"{links}{extra.get(i, "")}}}'
        for i, (m, b) in enumerate(zip(models, buses, strict=True))
    )
    return f"""\
site: lab-test
cluster_name: lab-test
gpu_request:
  syntax: gres
  type_required: true
models:
  A100:
    aliases: [a100]
    gres_type: a100
    nvml_names: ["NVIDIA A100-SXM4-80GB"]
    memory_gb: 80
  V100:
    aliases: [v100]
    gres_type: v100
    nvml_names: ["Tesla V100-SXM2-32GB"]
    memory_gb: 32
  H100:
    aliases: [h100]
    gres_type: h100
    nvml_names: ["NVIDIA H100 80GB HBM3"]
    memory_gb: 80
{extra_models}partitions:
  gpu:
    nodes: "{nodes}"
    default: true
{partition_checks}node_map:
  - nodes: "{nodes}"
    gpus:
{gpus}
prolog:
  on_error: {on_error}
  deadline_seconds: {deadline}
  log: {log}
{checks}"""


class Node:
    """One stand-in node: a trusted site file, a scenario, a log and a cache directory."""

    def __init__(self, tmp: Path, lib_dir: Path) -> None:
        self.tmp = tmp
        self.lib_dir = lib_dir
        self.etc = tmp / "etc"
        self.etc.mkdir(mode=0o755, exist_ok=True)
        self.site = self.etc / "site.yaml"
        self.log = tmp / "log" / "prolog.jsonl"
        self.cache = tmp / "cache"
        self.scenario_path = tmp / "scenario.txt"

    def setup(self, scenario: StandinScenario, **site_kw: object) -> Node:
        site_kw.setdefault("log", str(self.log))
        self.site.write_text(site_yaml(**site_kw))  # type: ignore[arg-type]
        self.site.chmod(0o644)
        write_scenario(self.scenario_path, scenario)
        return self

    def run(
        self, *args: str, env: dict[str, str] | None = None, cpus: set[int] | None = None
    ) -> subprocess.CompletedProcess:
        """``python -m clusterjob ARGS`` on this node; ``-c CODE`` runs CODE instead."""
        full = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": PYTHONPATH,
            "LD_LIBRARY_PATH": str(self.lib_dir),
            "FAKE_NVML_SCENARIO": str(self.scenario_path),
            "SLURMD_NODENAME": NODE,
            "SLURM_JOB_ID": "1234",
            **(env or {}),
        }
        command = list(args) if args[:1] == ("-c",) else ["-m", "clusterjob", *args]
        return subprocess.run(
            [sys.executable, *command],
            env=full,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
        )

    def prolog(self, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return self.run(
            "prolog", "--site", str(self.site), "--cache-dir", str(self.cache), *extra, env=env
        )

    def hook_args(self, kind: str) -> list[str]:
        """``prolog`` or ``epilog`` and its arguments as the wrapper slurmd runs gives them;
        the Epilog reads an empty kernel log of the test's, not this machine's."""
        args = [kind, "--site", str(self.site), "--cache-dir", str(self.cache)]
        if kind == "epilog":
            kernel = self.tmp / "kern.log"
            kernel.touch()
            args += ["--kernel-log", str(kernel)]
        return args

    def hook(self, kind: str, *extra: str) -> subprocess.CompletedProcess:
        """The Prolog, or the Epilog after a job given GPUs 2 and 3."""
        return self.run(*self.hook_args(kind), *extra, env=self.hook_env(kind))

    @staticmethod
    def hook_env(kind: str) -> dict[str, str]:
        return {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"} if kind == "epilog" else {}

    def log_records(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def node(tmp_path: Path, standin_lib: Path) -> Node:
    return Node(tmp_path, standin_lib.parent)


def mixed(**per_gpu: dict) -> StandinScenario:
    """The good mixed node: A100, A100, V100, V100 in bus order; per_gpu overrides by index."""
    makers = (a100, a100, v100, v100)
    return StandinScenario(
        gpus=tuple(
            makers[i](b, i, node=NODE, **per_gpu.get(str(i), {})) for i, b in enumerate(BUSES)
        )
    )


SWAPPED = StandinScenario(
    gpus=(
        a100(BUSES[0], 0, node=NODE),
        v100(BUSES[1], 1, node=NODE),
        a100(BUSES[2], 2, node=NODE),
        v100(BUSES[3], 3, node=NODE),
    )
)
SWAP_LINE = (
    "gpu2: slot 1 (0000:0b:00.0): expected A100, found Tesla V100-SXM2-32GB (V100) -- "
    "boards swapped or node map wrong"
)


# -- prolog ------------------------------------------------------------------------------


def test_prolog_good_node_passes_and_logs(node: Node) -> None:
    node.setup(mixed())
    done = node.prolog(env={"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    (rec,) = node.log_records()
    assert (rec["node"], rec["job_id"], rec["outcome"], rec["action"]) == (
        NODE,
        "1234",
        "ok",
        "pass",
    )
    assert rec["findings"] == []


def test_prolog_swapped_boards_drain_with_one_line(node: Node) -> None:
    node.setup(SWAPPED)
    done = node.prolog(env={"SLURM_JOB_GPUS": "0"})
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"clusterjob prolog: model-mismatch: {SWAP_LINE} (+1 more error(s))"
    ]
    (rec,) = node.log_records()
    assert (rec["outcome"], rec["action"], rec["reason"]) == ("failed", "drain", SWAP_LINE)
    assert [f["check_id"] for f in rec["findings"]] == ["model-mismatch", "model-mismatch"]


def test_prolog_log_flag_overrides_policy(node: Node) -> None:
    node.setup(mixed())
    other = node.tmp / "elsewhere" / "p.jsonl"
    assert node.prolog("--log", str(other)).returncode == 0
    assert len(other.read_text().splitlines()) == 1
    assert not node.log.exists()


def test_prolog_env_does_not_redirect_config(node: Node) -> None:
    """CLUSTERJOB_SITE names a config under which the node would pass; it must be ignored."""
    node.setup(SWAPPED)
    passing = node.tmp / "user" / "site.yaml"
    passing.parent.mkdir()
    passing.write_text(site_yaml(("A100", "V100", "A100", "V100"), log=str(node.log)))
    done = node.prolog(env={"CLUSTERJOB_SITE": str(passing)})
    assert done.returncode == 1
    assert "model-mismatch" in done.stderr


def test_prolog_invalid_config_drains_naming_the_file(node: Node) -> None:
    node.setup(mixed())
    node.site.write_text(node.site.read_text().replace("syntax: gres", "syntax: gress"))
    done = node.prolog()
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"clusterjob prolog: gpu2: GPUs not checked: site config: {node.site}:")
    assert line.endswith("-- draining (on_error=drain, site policy unknown)")


def test_prolog_does_not_use_user_writable_cache_dir(node: Node) -> None:
    """A cache dir others can write is not used (and is no reason to drain every job, which
    is what a user who made it first could otherwise cause): the site file is read instead."""
    node.setup(mixed())
    node.cache.mkdir(mode=0o777)
    node.cache.chmod(0o777)
    done = node.prolog()
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"clusterjob prolog: warning: cache not used: refusing {node.cache}: "
        f"directory {node.cache} is group/world-writable (mode 0777)"
    ]
    assert list(node.cache.iterdir()) == []


def test_prolog_unmapped_node_passes_with_warning(node: Node) -> None:
    node.setup(mixed(), nodes="gpu[7-8]")
    done = node.prolog()
    assert done.returncode == 0
    assert done.stderr.splitlines() == [
        "clusterjob prolog: warning: node-unmapped: gpu2: not in the site's node map -- only "
        "the job's own request and GPU health are checked (4 GPU(s) found)"
    ]


@pytest.mark.parametrize(
    ("scenario", "line"),
    [
        (
            mixed(**{"2": {"lost_after_calls": 2}}),  # handle and bus ID read, then lost
            "gpu-lost: gpu2: slot 2 (0000:48:00.0): NVML says GPU is lost -- reset or reboot "
            "the node",
        ),
        (
            mixed(**{"0": {"ecc_uncorrectable": 4}}),
            "ecc-uncorrectable: gpu2: slot 0 (0000:07:00.0): NVIDIA A100-SXM4-80GB: 4 "
            "uncorrectable ECC error(s) since the last reset",
        ),
        (
            mixed(**{"0": {"remapped_failure": True}}),
            "row-remap-failure: gpu2: slot 0 (0000:07:00.0): NVIDIA A100-SXM4-80GB: row "
            "remapping failed -- the GPU needs service",
        ),
        (
            mixed(**{"0": {"mig_pending": True}}),
            "mig-pending: gpu2: slot 0 (0000:07:00.0): NVIDIA A100-SXM4-80GB: MIG mode is "
            "off, on pending a GPU reset",
        ),
        (
            StandinScenario(gpus=mixed().gpus[:2] + mixed().gpus[3:]),
            "gpu-count: gpu2: expected 4 GPU(s), found 3 (+1 more error(s))",
        ),
    ],
    ids=["lost", "ecc", "remap-failure", "mig-pending", "missing"],
)
def test_prolog_unhealthy_gpu_drains(node: Node, scenario: StandinScenario, line: str) -> None:
    node.setup(scenario)
    done = node.prolog(env={"SLURM_JOB_GPUS": "0"})
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"clusterjob prolog: {line}"]


def test_prolog_gpu_lost_before_bus_id_drains_even_with_on_error_pass(node: Node) -> None:
    node.setup(mixed(**{"2": {"lost_after_calls": 0}}), on_error="pass")
    done = node.prolog()
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "clusterjob prolog: gpu-lost: gpu2: GPU at NVML index 2 is lost (fell off the bus) "
        "before its PCI bus ID could be read: check dmesg for Xid 79, then reset the GPU or "
        "reboot the node"
    ]
    (rec,) = node.log_records()
    assert (rec["outcome"], rec["action"]) == ("failed", "drain")


def test_prolog_minor_mismatch_on_allocated_gpu_drains(node: Node) -> None:
    node.setup(mixed(**{"0": {"minor": 1}, "1": {"minor": 0}}))
    done = node.prolog(env={"SLURM_JOB_GPUS": "1"})
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "clusterjob prolog: gres-index: gpu2: slot 1 (0000:0b:00.0): GRES index 1 is "
        "/dev/nvidia0 (minor 0) -- with gres.conf File=/dev/nvidia1 this slot's job gets "
        "another GPU; use AutoDetect=nvml or list File= in bus order"
    ]


@pytest.mark.parametrize(
    ("on_error", "rc", "line"),
    [
        (
            "drain",
            1,
            "clusterjob prolog: gpu2: GPUs not checked: NVML: NVIDIA driver is not loaded on "
            "this node (NVML: Driver Not Loaded): check 'lsmod | grep nvidia' and dmesg, or "
            "load it with 'modprobe nvidia' -- draining (on_error=drain)",
        ),
        (
            "pass",
            0,
            "clusterjob prolog: warning: gpu2: GPUs not checked: NVML: NVIDIA driver is not "
            "loaded on this node (NVML: Driver Not Loaded): check 'lsmod | grep nvidia' and "
            "dmesg, or load it with 'modprobe nvidia' -- passing (on_error=pass)",
        ),
    ],
)
def test_prolog_nvml_unavailable_follows_policy(
    node: Node, on_error: str, rc: int, line: str
) -> None:
    node.setup(StandinScenario(init_error="driver_not_loaded"), on_error=on_error)
    done = node.prolog()
    assert done.returncode == rc
    assert done.stderr.splitlines() == [line]
    (rec,) = node.log_records()
    assert (rec["outcome"], rec["error"]) == ("error", "driver_not_loaded")


HUNG = {
    "prolog": "NVML: NVML did not answer within 2s: a GPU or the NVIDIA driver is hung (look "
    "for Xid errors in dmesg)",
    "epilog": "NVML did not answer within 2s (a hung GPU or driver: look for Xid errors in dmesg)",
}


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize(("on_error", "rc"), [("drain", 1), ("pass", 0)])
def test_hook_hung_gpu_ends_within_deadline(node: Node, hook: str, on_error: str, rc: int) -> None:
    node.setup(mixed(**{"1": {"hang_seconds": 60}}), on_error=on_error, deadline=2)
    start = time.monotonic()
    done = node.hook(hook)
    elapsed = time.monotonic() - start
    assert done.returncode == rc
    assert elapsed < 8, f"{hook} took {elapsed:.1f}s with a 2s deadline"
    verb = "draining" if on_error == "drain" else "passing"
    warn = "warning: " if on_error == "pass" else ""
    assert done.stderr.splitlines() == [
        f"clusterjob {hook}: {warn}gpu2: GPUs not checked: {HUNG[hook]} -- {verb} "
        f"(on_error={on_error})"
    ]


# Run in the Prolog's process: what was imported when it forked its NVML reader, and whether
# a reader was left behind when the Prolog returned.
WATCH_FORK = """
import os, sys, time  # no signal here: it loads enum, functools and collections
seen = []
def hook(event, args):
    if event == "os.fork" and not seen:
        seen.append(sorted(m for m in ("dataclasses", "pathlib", "clusterjob.errors",
            "clusterjob.node.prolog", "clusterjob.site.nodemodel", "pynvml", "collections",
            "contextlib", "pickle", "typing") if m in sys.modules))
sys.addaudithook(hook)
from clusterjob.__main__ import main
code = main(sys.argv[1:])
time.sleep(0.5)
import signal
try:
    pid, status = os.waitpid(-1, os.WNOHANG)
    left = "alive" if pid == 0 else f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
except ChildProcessError:
    left = "none"
print("RESULT", code, seen[0] if seen else None, left)
"""


def test_prolog_reads_nvml_while_its_checks_load(node: Node) -> None:
    """The Prolog forks its NVML reader before it imports anything but the hook's dispatch
    and the reader's own module (not its checks, the site model, pathlib, nor contextlib,
    collections or pickle), so loading pynvml and the driver overlaps with loading
    clusterjob; the reader is done and reaped by the time the Prolog returns."""
    node.setup(mixed())
    done = node.run(
        "-c", WATCH_FORK, "prolog", "--site", str(node.site), "--cache-dir", str(node.cache)
    )
    assert done.stdout.splitlines()[-1] == "RESULT 0 [] none", done.stderr


# Modules no hook may load: dataclasses (with inspect, ast and dis, about as much as pynvml's
# own import, and 0.5-1 ms for each class it makes), typing and pickle (clusterjob.record).
SLOW_MODULES = ("dataclasses", "inspect", "typing", "pickle")
# Run in the hook's process: what it, and the NVML reader it forks, had loaded at the end.
WATCH_LOADED = f"""
import os, sys
slow = {SLOW_MODULES!r}
real_exit = os._exit
def _exit(status):  # where a forked NVML reader ends (its stdio is /dev/null)
    with open(os.environ["LOADED_REPORT"], "a") as fh:
        fh.write(f"reader {{sorted(m for m in slow if m in sys.modules)}}\\n")
    real_exit(status)
os._exit = _exit
from clusterjob.__main__ import main
code = main(sys.argv[1:])
print("LOADED", sorted(m for m in slow if m in sys.modules), "CODE", code)
"""


@pytest.mark.parametrize("hook", [*HOOKS, "task-prolog"])
def test_a_hook_loads_no_dataclasses_on_its_whole_path(node: Node, hook: str) -> None:
    """Every hook, run to its verdict over the stand-in NVML (a node that passes, so that
    every check runs), loads none of SLOW_MODULES, nor does the NVML reader it forks. Not
    the first run after a site edit: that one reads the YAML with the site loader."""
    node.setup(mixed())
    report = node.tmp / "loaded.txt"
    if hook == "task-prolog":  # GPUs named by UUID: it reads NVML to put them in PCI order
        u = [g.uuid for g in mixed().gpus]
        args, env = ["task-prolog"], {"CUDA_VISIBLE_DEVICES": f"{u[3]},{u[1]}"}
    else:
        args, env = node.hook_args(hook), node.hook_env(hook)
    first = node.run(*args, env=env)  # the first job after a site edit: the loader fills a cache
    assert first.returncode == 0, first.stderr
    done = node.run("-c", WATCH_LOADED, *args, env={**env, "LOADED_REPORT": str(report)})
    assert done.stdout.splitlines()[-1] == "LOADED [] CODE 0", done.stdout + done.stderr
    readers = report.read_text().splitlines() if report.exists() else []
    assert readers == ["reader []"], done.stderr  # every hook here read NVML in a child


def test_prolog_whose_early_fork_fails_still_checks_the_gpus(node: Node) -> None:
    """No process to spare when the Prolog starts (the early fork fails with EAGAIN): the
    NVML read is forked again once the site is loaded, and the node is checked as usual."""
    node.setup(mixed())
    failing_first = (
        "import errno, os\n"
        "real_fork, calls = os.fork, []\n"
        "def fork():\n"
        "    calls.append(1)\n"
        "    if len(calls) == 1:\n"
        "        raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))\n"
        "    return real_fork()\n"
        "os.fork = fork\n"
    )
    done = node.run(
        "-c",
        failing_first + WATCH_FORK + "print('FORKS', len(calls))\n",
        "prolog",
        "--site",
        str(node.site),
        "--cache-dir",
        str(node.cache),
    )
    late = "['clusterjob.errors', 'clusterjob.node.prolog', 'clusterjob.site.nodemodel', " + (
        "'collections', 'contextlib', 'dataclasses', 'pathlib', 'typing']"
    )  # the real fork came after the checks (and the first run's site loader) were loaded
    assert done.stdout.splitlines()[-2:] == [f"RESULT 0 {late} none", "FORKS 2"], done.stderr
    (rec,) = node.log_records()
    assert rec["outcome"] == "ok"


# What the hook had imported when it first forked: the Prolog starts its NVML reader first
# thing; the Epilog reads the site before it starts one (None: it never forked).
FORKED_AFTER = {"prolog": "[]", "epilog": "None"}


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_leaves_no_nvml_reader_behind_on_a_config_error(node: Node, hook: str) -> None:
    """A site file that cannot be read ends the hook before it asks for the NVML answer: a
    reader started early (here hung in the driver) is killed, not left to the node."""
    node.setup(mixed(**{"1": {"hang_seconds": 60}}))
    node.site.write_text(node.site.read_text().replace("syntax: gres", "syntax: gress"))
    start = time.monotonic()
    done = node.run("-c", WATCH_FORK, *node.hook_args(hook), env=node.hook_env(hook))
    assert time.monotonic() - start < 20
    # killed: reaped by the hook at once ("none") or a zombie left to its parent; a reader
    # left running would be "alive" (it hangs for 60 s)
    assert done.stdout.splitlines()[-1] in (
        f"RESULT 1 {FORKED_AFTER[hook]} none",
        f"RESULT 1 {FORKED_AFTER[hook]} killed by SIGKILL",
    ), done.stderr
    assert "GPUs not checked: site config:" in done.stderr


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_leaves_no_nvml_reader_behind_past_its_deadline(node: Node, hook: str) -> None:
    """The NVML reader hung in the driver when the deadline ends the hook is killed with it:
    the next job's hook would otherwise find the last one's reader still holding the GPU."""
    node.setup(mixed(**{"1": {"hang_seconds": 60}}))
    start = time.monotonic()
    done = node.run(
        "-c", WATCH_FORK, *node.hook_args(hook), "--deadline", "1", env=node.hook_env(hook)
    )
    assert time.monotonic() - start < 20
    last = done.stdout.splitlines()[-1]
    assert last.startswith("RESULT 1 "), done.stdout + done.stderr
    assert last.endswith((" none", " killed by SIGKILL")), last
    assert "did not answer within 1s" in done.stderr


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_deadline_flag_overrides_policy(node: Node, hook: str) -> None:
    node.setup(mixed(**{"0": {"hang_seconds": 60}}), deadline=30)
    start = time.monotonic()
    done = node.hook(hook, "--deadline", "1")
    assert time.monotonic() - start < 6
    assert done.returncode == 1
    assert "did not answer within 1s" in done.stderr


def test_prolog_parses_yaml_on_a_cold_cache_only(node: Node) -> None:
    """What the docs say of the Prolog's imports: the first run after a site edit (no cache
    entry) parses the YAML, importing ruamel.yaml and python-hostlist; a later run reads the
    JSON entry and imports nothing but the standard library."""
    node.setup(mixed())
    code = (  # anything neither stdlib nor clusterjob (pynvml: NVML is read in a child only)
        "import sys\n"
        "before = set(sys.modules)\n"
        "from clusterjob.__main__ import main\n"
        f"rc = main(['prolog', '--site', {str(node.site)!r}, '--cache-dir', "
        f"{str(node.cache)!r}])\n"
        "print(rc, sorted({m.split('.')[0] for m in set(sys.modules) - before\n"
        "                  if m.split('.')[0] not in sys.stdlib_module_names | {'clusterjob'}}))\n"
    )

    def prolog_imports() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={
                "PATH": os.environ.get("PATH", ""),
                "PYTHONPATH": PYTHONPATH,
                "LD_LIBRARY_PATH": str(node.lib_dir),
                "FAKE_NVML_SCENARIO": str(node.scenario_path),
                "SLURMD_NODENAME": NODE,
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return done.stdout.splitlines()

    cold = prolog_imports()  # no cache entry yet: the site file is parsed
    assert cold[-1].startswith("0 [") and "'ruamel'" in cold[-1] and "'hostlist'" in cold[-1]
    assert prolog_imports() == ["0 []"]  # warm: the JSON entry only


# -- task prolog over NVML (UUIDs in CUDA_VISIBLE_DEVICES) -----------------------------


def test_task_prolog_orders_uuids_by_bus(node: Node) -> None:
    node.setup(mixed())
    u = [g.uuid for g in mixed().gpus]
    done = node.run("task-prolog", env={"CUDA_VISIBLE_DEVICES": f"{u[3]},{u[1]}"})
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        f"export CUDA_VISIBLE_DEVICES={u[1]},{u[3]}",
    ]


# -- preflight ---------------------------------------------------------------------------


def preflight_env(node: Node, **kw: str) -> dict[str, str]:
    return {"CLUSTERJOB_SITE": str(node.site), "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **kw}


TABLE_HEAD = "SLOT  BUS ID        EXPECTED  FOUND                         STATUS"


def test_preflight_good_mixed_allocation(node: Node) -> None:
    node.setup(mixed())
    done = node.run(
        "preflight",
        env=preflight_env(
            node,
            SLURM_JOB_GPUS="1,2",
            CUDA_VISIBLE_DEVICES="1,2",
            CLUSTERJOB_EXPECT_COUNT="2",
        ),
    )
    assert (done.returncode, done.stdout) == (0, "")
    assert done.stderr.splitlines() == [
        TABLE_HEAD,
        "0     0000:07:00.0  A100      NVIDIA A100-SXM4-80GB (A100)  ok",
        "1*    0000:0b:00.0  A100      NVIDIA A100-SXM4-80GB (A100)  ok",
        "2*    0000:48:00.0  V100      Tesla V100-SXM2-32GB (V100)   ok",
        "3     0000:4c:00.0  V100      Tesla V100-SXM2-32GB (V100)   ok",
        "preflight gpu2: OK (4 GPU slot(s))",
    ]


def test_preflight_wrong_model_allocated(node: Node) -> None:
    node.setup(mixed())
    done = node.run(
        "preflight",
        env=preflight_env(
            node,
            SLURM_JOB_GPUS="0,1",
            CUDA_VISIBLE_DEVICES="0,1",
            CLUSTERJOB_EXPECT_MODEL="V100",
            CLUSTERJOB_EXPECT_COUNT="2",
        ),
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[1:5] == [
        "0*    0000:07:00.0  A100      NVIDIA A100-SXM4-80GB (A100)  alloc-model",
        "1*    0000:0b:00.0  A100      NVIDIA A100-SXM4-80GB (A100)  alloc-model",
        "2     0000:48:00.0  V100      Tesla V100-SXM2-32GB (V100)   ok",
        "3     0000:4c:00.0  V100      Tesla V100-SXM2-32GB (V100)   ok",
    ]
    assert lines[5:] == [
        "error: alloc-model: gpu2: slot 0 (0000:07:00.0): job asked for V100, was given "
        "NVIDIA A100-SXM4-80GB (A100)",
        "error: alloc-model: gpu2: slot 1 (0000:0b:00.0): job asked for V100, was given "
        "NVIDIA A100-SXM4-80GB (A100)",
        "clusterjob: error: preflight gpu2: FAILED (2 error(s), 0 warning(s))",
    ]


def test_preflight_cgroup_renumbered_and_flags(node: Node) -> None:
    node.setup(mixed())
    done = node.run(
        "preflight",
        "--expect-model",
        "v100",
        "--expect-count",
        "2",
        env=preflight_env(node, SLURM_JOB_GPUS="2,3", CUDA_VISIBLE_DEVICES="0,1"),
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "preflight gpu2: OK (4 GPU slot(s))"


def test_preflight_cuda_order(node: Node) -> None:
    node.setup(mixed())
    env = preflight_env(node, SLURM_JOB_GPUS="1,2", CUDA_VISIBLE_DEVICES="1,2")
    del env["CUDA_DEVICE_ORDER"]
    done = node.run("preflight", env=env)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-2:] == [
        "error: cuda-order: gpu2: job has mixed GPUs (NVIDIA A100-SXM4-80GB, Tesla "
        "V100-SXM2-32GB) and CUDA_DEVICE_ORDER is unset (FASTEST_FIRST) -- CUDA index i is "
        "not GRES index i; export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "clusterjob: error: preflight gpu2: FAILED (1 error(s), 0 warning(s))",
    ]


def test_preflight_json(node: Node) -> None:
    node.setup(SWAPPED)
    done = node.run("preflight", "--json", env=preflight_env(node, SLURM_JOB_GPUS="0"))
    assert done.returncode == 1
    data = json.loads(done.stdout)
    assert data["ok"] is False
    assert data["allocated_slots"] == [0]
    assert [f["check_id"] for f in data["findings"]] == ["model-mismatch", "model-mismatch"]
    assert data["findings"][0]["message"] == SWAP_LINE
    assert done.stderr.splitlines() == [
        "clusterjob: error: preflight gpu2: FAILED (2 error(s), 0 warning(s))"
    ]


H100_BUSES = tuple(f"0000:{0x18 + 0x10 * i:02x}:00.0" for i in range(8))


def test_preflight_8_gpu_h100_node(node: Node) -> None:
    scenario = StandinScenario(gpus=tuple(h100(b, i, node=NODE) for i, b in enumerate(H100_BUSES)))
    node.setup(scenario, models=("H100",) * 8, buses=H100_BUSES)
    done = node.run(
        "preflight",
        env=preflight_env(
            node, SLURM_JOB_GPUS="0-7", CLUSTERJOB_EXPECT_MODEL="H100", CLUSTERJOB_EXPECT_COUNT="8"
        ),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "SLOT  BUS ID        EXPECTED  FOUND                         STATUS"
    assert lines[8] == "7*    0000:88:00.0  H100      NVIDIA H100 80GB HBM3 (H100)  ok"
    assert lines[9:] == ["preflight gpu2: OK (8 GPU slot(s))"]


def test_preflight_8_gpu_h100_node_one_fallen_off(node: Node) -> None:
    gpus = tuple(h100(b, i, node=NODE) for i, b in enumerate(H100_BUSES) if i != 5)
    node.setup(StandinScenario(gpus=gpus), models=("H100",) * 8, buses=H100_BUSES)
    done = node.run("preflight", env=preflight_env(node, SLURM_JOB_GPUS="0-3"))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-3:] == [
        "error: gpu-count: gpu2: expected 8 GPU(s), found 7",
        "error: gpu-missing: gpu2: slot 5 (0000:68:00.0): expected H100, found nothing -- GPU "
        "missing or fallen off the bus",
        "clusterjob: error: preflight gpu2: FAILED (2 error(s), 0 warning(s))",
    ]


def test_preflight_nvml_unavailable_exit_5(node: Node) -> None:
    node.setup(StandinScenario(init_error="driver_not_loaded"))
    done = node.run("preflight", env=preflight_env(node))
    assert done.returncode == 5
    assert done.stderr.splitlines() == [
        "clusterjob: error: NVIDIA driver is not loaded on this node (NVML: Driver Not "
        "Loaded): check 'lsmod | grep nvidia' and dmesg, or load it with 'modprobe nvidia'"
    ]


def test_preflight_unknown_model_is_usage_error(node: Node) -> None:
    node.setup(mixed())
    done = node.run("preflight", "--expect-model", "K80", env=preflight_env(node))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "clusterjob: error: unknown GPU model 'K80' (site models: A100, H100, V100)"
    ]


# -- gpus --------------------------------------------------------------------------------


def test_gpus_table(node: Node, tmp_path: Path) -> None:
    """Health per GPU, and who holds it: a `clusterjob run` claim and NVML's processes."""
    from clusterjob.workstation.claims import HeldClaims, ensure_shared_dir, try_claim, write_holder

    scenario = mixed(
        **{"2": {"ecc_uncorrectable": 2}, "3": {"processes": ((4242, 3 * 2**30, "python"),)}}
    )
    node.setup(scenario)
    u = [g.uuid for g in scenario.gpus]
    lock_dir = ensure_shared_dir(tmp_path / "locks")
    held = HeldClaims()  # this test process holds GPU 1 while `clusterjob gpus` looks
    assert try_claim(lock_dir, u[1], held)
    write_holder(held, u[1], "python train.py", pid=777)
    done = node.run("gpus", env={"CLUSTERJOB_LOCK_DIR": str(lock_dir)})
    held.release(u[1])
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "INDEX", "BUS", "ID", "NAME", "MEMORY", "MINOR", "UUID", "HEALTH", "LINKS", "IN", "USE",
        "BY",
    ]  # fmt: skip
    rows = [line.split(None, 7) for line in lines[1:5]]
    assert [r[:2] for r in rows] == [["0", BUSES[0]], ["1", BUSES[1]], ["2", BUSES[2]],
                                     ["3", BUSES[3]]]  # fmt: skip
    cells = [re.split(r"\s{2,}", line)[5:] for line in lines[1:5]]
    assert cells[0] == [u[0], "ok", "x16 gen4, nvlink 12/12", "-"]
    assert cells[1][:3] == [u[1], "ok", "x16 gen4, nvlink 12/12"]
    assert re.fullmatch(r"claimed by \S+ \(pid 777, since [\d:]+: python train\.py\)", cells[1][3])
    assert cells[2] == [u[2], "ecc:2", "x16 gen3, nvlink 6/6", "-"]
    # pid 4242 is no process here: its user is unknown
    assert cells[3] == [u[3], "ok", "x16 gen3, nvlink 6/6", "pid 4242 python (3 GiB, ?)"]
    assert lines[5] == "driver 550.54.15, CUDA 12.4, 4 GPU(s)"


def test_gpus_json(node: Node) -> None:
    node.setup(mixed())
    done = node.run("gpus", "--json")
    assert done.returncode == 0
    data = json.loads(done.stdout)
    assert [g["bus_id"] for g in data["gpus"]] == list(BUSES)


# -- links, clocks, leftovers: each check passes and fails through pynvml ------------------


def hgx(**per_gpu: dict) -> StandinScenario:
    """An 8-GPU H100 HGX node: 18 NVLinks per GPU, NVSwitch fabric registered."""
    return StandinScenario(
        gpus=tuple(
            h100(b, i, node=NODE, **per_gpu.get(str(i), {})) for i, b in enumerate(H100_BUSES)
        )
    )


def test_prolog_hgx_node_with_its_nvlinks_in_the_map_passes(node: Node) -> None:
    node.setup(hgx(), models=("H100",) * 8, buses=H100_BUSES, nvlinks=18)
    done = node.prolog(env={"SLURM_JOB_GPUS": "0-7"})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_prolog_nothing_supported_is_unknown_not_a_finding(node: Node) -> None:
    """An old driver or board: every new NVML call says NOT_SUPPORTED; no finding, no error."""
    words = ("pcie", "temperature", "clocks", "nvlink", "fabric", "processes", "persistence")
    node.setup(hgx(**{str(i): {"unsupported": words} for i in range(8)}),
               models=("H100",) * 8, buses=H100_BUSES, nvlinks=18)  # fmt: skip
    done = node.prolog(env={"SLURM_JOB_GPUS": "0-7"})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


H0 = "gpu2: slot 0 (0000:18:00.0): NVIDIA H100 80GB HBM3"
A0 = "gpu2: slot 0 (0000:07:00.0): NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize(
    ("scenario", "map_links", "rc", "line"),
    [
        (
            hgx(**{"0": {"pcie_width": 8}}),
            None,
            0,
            f"warning: pcie-degraded: {H0}: PCIe link trained at x8, the board can do x16 -- "
            "host<->GPU bandwidth is reduced: reseat the board or check the slot/riser",
        ),
        (
            hgx(**{"0": {"nvlinks_down": (4, 9)}}),
            18,
            1,
            f"nvlink-down: {H0}: 16 NVLink link(s) active, the node map says 18 (down: 4,9) -- "
            "check the NVLink/NVSwitch cabling and nvidia-fabricmanager, then reset the GPU",
        ),
        (
            hgx(**{"0": {"nvlinks_down": (4,)}}),
            None,
            0,
            f"warning: nvlink-down: {H0}: NVLink link(s) 4 down, 17 of 18 active -- GPU-to-GPU "
            "traffic is slower; reset the GPU or service the board",
        ),
        (
            hgx(**{"0": {"fabric_state": "in_progress"}}),
            18,
            1,
            f"nvlink-fabric: {H0}: NVSwitch fabric registration in progress -- CUDA jobs fail "
            "to start: check nvidia-fabricmanager and its log",
        ),
        (
            hgx(**{"0": {"clocks_event_reasons": 0x1 | 0x80}}),
            18,
            1,
            f"clocks-throttled: {H0}: clocks held down by hw_power_brake while idle -- check "
            "cooling, power supply and power-brake cabling (nvidia-smi -q -d PERFORMANCE)",
        ),
        (
            hgx(**{"0": {"temperature": 88, "temperature_slowdown": 90}}),
            18,
            0,
            f"warning: gpu-hot: {H0}: 88 C before the job starts, slowdown at 90 C -- check "
            "the cooling",
        ),
        (  # a live pid (this test's own): its user is the owner of /proc/PID
            hgx(**{"0": {"processes": ((os.getpid(), 5 * 2**30, "python3"),)}}),
            18,
            1,
            f"gpu-busy: {H0}: 1 compute process(es) already running: pid {os.getpid()} "
            f"(python3, user {pwd.getpwuid(os.getuid()).pw_name})",
        ),
        (
            hgx(**{"0": {"persistence": False}}),
            18,
            0,
            f"warning: persistence-off: {H0}: persistence mode off -- every job pays the "
            "driver's start-up and the GPU state is reset between jobs: enable "
            "nvidia-persistenced",
        ),
        (
            hgx(**{"0": {"power_limit": 500_000}}),
            18,
            0,
            f"warning: power-capped: {H0}: power limit 500 W, the board's default is 700 W -- "
            "nvidia-smi -i 0000:18:00.0 -pl 700 unless the cap is meant",
        ),
        (
            hgx(**{"0": {"retired_pages_pending": True}}),
            18,
            0,
            f"warning: retired-pages-pending: {H0}: memory page retirement pending -- reset "
            "the GPU (or reboot) to retire the pages",
        ),
    ],
    ids=["pcie", "nvlink-map", "nvlink-partial", "fabric", "power-brake", "hot", "busy",
         "persistence", "power-capped", "retired-pending"],
)  # fmt: skip
def test_prolog_link_clock_and_process_findings(
    node: Node, scenario: StandinScenario, map_links: int | None, rc: int, line: str
) -> None:
    node.setup(scenario, models=("H100",) * 8, buses=H100_BUSES, nvlinks=map_links)
    done = node.prolog(env={"SLURM_JOB_GPUS": "0,1"})
    assert (done.returncode, done.stdout) == (rc, "")
    assert done.stderr.splitlines() == [f"clusterjob prolog: {line}"]


def test_prolog_process_on_another_jobs_gpu_is_not_a_finding(node: Node) -> None:
    node.setup(hgx(**{"5": {"processes": ((31337, 2**30, "python3"),)}}),
               models=("H100",) * 8, buses=H100_BUSES, nvlinks=18)  # fmt: skip
    done = node.prolog(env={"SLURM_JOB_GPUS": "0,1"})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_gpus_json_has_link_clock_and_fabric_facts(node: Node) -> None:
    node.setup(
        hgx(**{"1": {"pcie_width": 8, "nvlinks_down": (2,), "clocks_event_reasons": 0x48}}),
        models=("H100",) * 8,
        buses=H100_BUSES,
    )
    done = node.run("gpus", "--json")
    assert done.returncode == 0, done.stderr
    g0, g1 = json.loads(done.stdout)["gpus"][:2]
    assert (g0["pcie_link_width"], g0["pcie_link_width_max"], g0["pcie_link_gen"]) == (16, 16, 5)
    assert (g0["fabric_state"], g0["fabric_status"], g0["clock_event_reasons"]) == (
        "completed",
        0,
        0,
    )
    assert g0["nvlink_active"] == [True] * 18
    assert g1["nvlink_active"] == [True, True, False] + [True] * 15
    assert (g1["pcie_link_width"], g1["clock_event_reasons"]) == (8, 0x48)
    assert (g0["temperature"], g0["temperature_slowdown"]) == (35, 90)


def test_gpus_table_health_names_link_clock_and_fabric_problems(node: Node) -> None:
    node.setup(
        hgx(
            **{
                "1": {"pcie_width": 8, "nvlinks_down": (2,)},
                "2": {"fabric_state": "not_started", "clocks_event_reasons": 0x1 | 0x8},
                "3": {"temperature": 87, "persistence": False},
            }
        ),
        models=("H100",) * 8,
        buses=H100_BUSES,
    )
    done = node.run("gpus")
    assert (done.returncode, done.stderr) == (0, "")
    cells = [re.split(r"\s{2,}", line) for line in done.stdout.splitlines()[1:5]]
    assert [c[6] for c in cells] == [
        "ok",
        "pcie:x8/x16,nvlink:17/18",
        "fabric:not_started,hw_slowdown",
        "hot:87C,persistence-off",
    ]
    assert [c[7] for c in cells] == [  # the facts behind them, problem or not
        "x16 gen5, nvlink 18/18, fabric completed",
        "x8/x16 gen5, nvlink 17/18, fabric completed",
        "x16 gen5, nvlink 18/18, fabric not_started, clocks gpu_idle+hw_slowdown",
        "x16 gen5, nvlink 18/18, fabric completed",
    ]


def test_gpus_table_lists_mig_slices_under_their_gpu(node: Node) -> None:
    scenario = migged("3g.40gb", "3g.40gb")
    node.setup(scenario, slot_extra=HALF)
    done = node.run("gpus")
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    slices = [re.split(r"\s{2,}", line)[:6] for line in lines[2:4]]
    assert slices == [
        [f"0/{k}", BUSES[0], "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "40 GiB", "-", uuid]
        for k, (_, uuid) in enumerate(scenario.gpus[0].mig_devices)
    ]
    assert re.split(r"\s{2,}", lines[1])[6] == "mig"
    assert lines[-1] == "driver 550.54.15, CUDA 12.4, 4 GPU(s), 2 MIG slice(s)"


# -- the site's say: driver minimum and severity per check, site-wide and per partition ----


def test_prolog_driver_older_than_the_sites_minimum_drains(node: Node) -> None:
    node.setup(mixed(), checks='checks: {driver_min: "550.90.07"}\n')
    done = node.prolog(env={"SLURM_JOB_GPUS": "0"})
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "clusterjob prolog: driver-version: gpu2: NVIDIA driver 550.54.15 is older than the "
        "site's minimum 550.90.07 -- upgrade the driver on this node (and reboot)"
    ]


def test_prolog_cuda_older_than_the_sites_minimum_drains(node: Node) -> None:
    node.setup(mixed(), checks='checks: {driver_min: "535.104.05", cuda_min: "12.6"}\n')
    done = node.prolog(env={"SLURM_JOB_GPUS": "0"})
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "clusterjob prolog: driver-version: gpu2: the NVIDIA driver 550.54.15 supports CUDA "
        "12.4, the site's minimum is 12.6 -- upgrade the driver on this node (and reboot)"
    ]


def test_prolog_driver_minimum_met_passes(node: Node) -> None:
    node.setup(mixed(), checks='checks: {driver_min: "535.104.05", cuda_min: "12.4"}\n')
    done = node.prolog(env={"SLURM_JOB_GPUS": "0"})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_prolog_partition_checks_apply_to_that_partitions_jobs(node: Node) -> None:
    """The partition raises the driver minimum and turns persistence-off into an error; a job
    of another partition (or none named) gets the site-wide policy."""
    node.setup(
        mixed(**{"0": {"persistence": False}}),
        checks='checks: {driver_min: "535.104.05", severity: {gpu-hot: "off"}}\n',
        partition_checks="    checks: {severity: {persistence-off: error}}\n",
    )
    mine = node.prolog(env={"SLURM_JOB_GPUS": "0", "SLURM_JOB_PARTITION": "gpu"})
    assert mine.returncode == 1
    assert mine.stderr.startswith("clusterjob prolog: persistence-off: gpu2: slot 0 ")
    other = node.prolog(env={"SLURM_JOB_GPUS": "0", "SLURM_JOB_PARTITION": "debug"})
    assert other.returncode == 0
    assert other.stderr.startswith("clusterjob prolog: warning: persistence-off: gpu2: slot 0 ")


@pytest.mark.parametrize(
    ("severity", "rc", "first"),
    [
        ("error", 1, "clusterjob prolog: gpu-busy: "),
        ("warning", 0, "clusterjob prolog: warning: gpu-busy: "),
        ("off", 0, None),
    ],
)
def test_prolog_site_severity_for_a_check(
    node: Node, severity: str, rc: int, first: str | None
) -> None:
    node.setup(
        mixed(**{"0": {"processes": ((31337, 2**30, "python3"),)}}),
        checks=f'checks: {{severity: {{gpu-busy: "{severity}"}}}}\n',
    )
    done = node.prolog(env={"SLURM_JOB_GPUS": "0"})
    assert done.returncode == rc
    if first is None:
        assert done.stderr == ""
    else:
        assert done.stderr.startswith(first)


# -- NUMA: the job's CPUs (its affinity inside the job) against each of its GPUs ---------

MY_CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(MY_CPUS) < 2, reason="needs two CPUs to put a job away from a GPU")
@pytest.mark.parametrize("near", [True, False], ids=["near", "far"])
def test_preflight_numa_affinity(node: Node, near: bool) -> None:
    job_cpu, other = MY_CPUS[0], MY_CPUS[1:]
    gpu_cpus = cpu_list([job_cpu] if near else other)
    node.setup(mixed(**{"1": {"cpu_affinity": gpu_cpus}}))
    env = preflight_env(node, SLURM_JOB_GPUS="1", CUDA_VISIBLE_DEVICES="1")
    done = node.run("preflight", env=env, cpus={job_cpu})
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    if near:
        assert warnings == []
    else:
        assert warnings == [
            f"warning: numa-affinity: gpu2: slot 1 (0000:0b:00.0): NVIDIA A100-SXM4-80GB: the "
            f"job's CPUs ({job_cpu}) are all away from this GPU's NUMA node (CPUs {gpu_cpus}) "
            "-- ask for --gres-flags=enforce-binding, or give gres.conf Cores="
        ]


# -- MIG: the slices NVML lists under each GPU against the node map, and the job's slices ----


def migged(*profiles: str, slot: int = 0, **kw: object) -> StandinScenario:
    """The mixed node with GPU ``slot`` in MIG mode, sliced into ``profiles``."""
    devices = tuple((p, mig_uuid_for(NODE, slot, k)) for k, p in enumerate(profiles))
    return mixed(
        **{str(slot): {"mig_current": True, "mig_pending": True, "mig_devices": devices, **kw}}
    )


HALF = {0: ", mig: [3g.40gb, 3g.40gb]"}


def test_prolog_mig_slices_as_the_map_says_pass(node: Node) -> None:
    node.setup(migged("3g.40gb", "3g.40gb"), slot_extra={**HALF, 1: ", mig: []"})
    done = node.prolog(env={"SLURM_JOB_GPUS": "0"})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize(
    ("scenario", "extra", "line"),
    [
        (
            mixed(),
            HALF,
            "mig-mode: gpu2: slot 0 (0000:07:00.0): MIG mode is off, the node map says on "
            "(3g.40gb,3g.40gb) -- nvidia-smi -i 0000:07:00.0 -mig 1 and reset the GPU, or fix "
            "the node map",
        ),
        (
            migged("1g.10gb", slot=1),
            {1: ", mig: []"},
            "mig-mode: gpu2: slot 1 (0000:0b:00.0): MIG mode is on, the node map says off -- "
            "nvidia-smi -i 0000:0b:00.0 -mig 0 and reset the GPU, or fix the node map",
        ),
        (
            migged("3g.40gb", "2g.20gb", "1g.10gb"),
            HALF,
            "mig-layout: gpu2: slot 0 (0000:07:00.0): MIG slices 1g.10gb,2g.20gb,3g.40gb, the "
            "node map says 3g.40gb,3g.40gb -- recreate the GPU and compute instances "
            "(nvidia-smi mig -cgi ... -C) or fix the map",
        ),
    ],
    ids=["off-but-map-on", "on-but-map-off", "layout"],
)
def test_prolog_mig_against_the_map_drains(
    node: Node, scenario: StandinScenario, extra: dict[int, str], line: str
) -> None:
    node.setup(scenario, slot_extra=extra)
    done = node.prolog(env={"SLURM_JOB_GPUS": "0,1"})
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"clusterjob prolog: {line}"]


def test_preflight_job_given_a_mig_slice_of_this_node(node: Node) -> None:
    scenario = migged("3g.40gb", "3g.40gb")
    node.setup(scenario, slot_extra=HALF)
    mine = scenario.gpus[0].mig_devices[1][1]
    done = node.run("preflight", env=preflight_env(node, CUDA_VISIBLE_DEVICES=mine))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "preflight gpu2: OK (4 GPU slot(s))"


def test_preflight_job_given_a_mig_slice_the_node_does_not_have(node: Node) -> None:
    node.setup(migged("3g.40gb", "3g.40gb"), slot_extra=HALF)
    gone = mig_uuid_for("elsewhere")
    done = node.run("preflight", env=preflight_env(node, CUDA_VISIBLE_DEVICES=gone))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-2:] == [
        f"error: alloc-mig: gpu2: CUDA_VISIBLE_DEVICES names {gone}, but NVML lists 2 MIG "
        "device(s) on this node, none of that name -- the GPU's MIG slices changed under "
        "Slurm: check gres.conf (AutoDetect=nvml) and the node map",
        "clusterjob: error: preflight gpu2: FAILED (1 error(s), 0 warning(s))",
    ]


def test_gpus_json_lists_mig_slices(node: Node) -> None:
    scenario = migged("3g.40gb", "3g.40gb")
    node.setup(scenario, slot_extra=HALF)
    done = node.run("gpus", "--json")
    assert done.returncode == 0, done.stderr
    gpus = json.loads(done.stdout)["gpus"]
    assert [m["uuid"] for m in gpus[0]["mig_devices"]] == [
        u for _, u in scenario.gpus[0].mig_devices
    ]
    assert gpus[0]["mig_devices"][0]["name"] == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert gpus[1]["mig_devices"] is None


SLICE_MODELS = """\
  A100-3g.40gb:
    gres_type: a100_3g.40gb
    nvml_names: ["NVIDIA A100-SXM4-80GB MIG 3g.40gb"]
  A100-1g.10gb:
    gres_type: a100_1g.10gb
    nvml_names: ["NVIDIA A100-SXM4-80GB MIG 1g.10gb"]
"""


@pytest.mark.parametrize("asked", ["A100-3g.40gb", "A100-1g.10gb"])
def test_preflight_mig_slice_against_the_profile_asked_for(node: Node, asked: str) -> None:
    scenario = migged("3g.40gb", "3g.40gb")
    node.setup(scenario, slot_extra=HALF, extra_models=SLICE_MODELS)
    mine = scenario.gpus[0].mig_devices[0][1]
    env = preflight_env(node, CUDA_VISIBLE_DEVICES=mine, CLUSTERJOB_EXPECT_MODEL=asked)
    done = node.run("preflight", env=env)
    if asked == "A100-3g.40gb":
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 1
    assert done.stderr.splitlines()[-2:] == [
        "error: alloc-model: gpu2: slot 0 (0000:07:00.0): job asked for A100-1g.10gb, was "
        f"given MIG device {mine}: NVIDIA A100-SXM4-80GB MIG 3g.40gb (A100-3g.40gb)",
        "clusterjob: error: preflight gpu2: FAILED (1 error(s), 0 warning(s))",
    ]


# Slices by GRES index, as Slurm gives them without NVML autodetection (gres.conf's
# MultipleFiles= records, one per slice): the map gives each slice's GPU instance, and NVML's
# instances 2 and 3 are a 1g.10gb and a 2g.20gb slice where the map (and so gres.conf) has
# them the other way round. The set of profiles is the map's: the Prolog cannot tell.
SLICED = {0: ', mig: ["3g.40gb@1", "2g.20gb@2", "1g.10gb@3", "1g.10gb@4"]'}
ALL_SLICE_MODELS = (
    SLICE_MODELS
    + """\
  A100-2g.20gb:
    gres_type: a100_2g.20gb
    nvml_names: ["NVIDIA A100-SXM4-80GB MIG 2g.20gb"]
"""
)


def sliced_node(node: Node) -> StandinScenario:
    scenario = migged("3g.40gb", "1g.10gb", "2g.20gb", "1g.10gb")
    node.setup(scenario, slot_extra=SLICED, extra_models=ALL_SLICE_MODELS)
    return scenario


def test_prolog_takes_gres_indices_as_slices_where_the_map_has_them(node: Node) -> None:
    sliced_node(node)
    assert node.prolog(env={"SLURM_JOB_GPUS": "1"}).returncode == 0
    done = node.prolog(env={"SLURM_JOB_GPUS": "7"})  # 4 slices and 3 whole GPUs: 0-6
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "clusterjob prolog: alloc-slot: gpu2: job was given GRES index 7, but the node has 7 "
        "GRES indices (GPUs and MIG slices) -- gres.conf and the node map disagree"
    ]


@pytest.mark.parametrize(
    ("index", "asked", "given"), [("0", "A100-3g.40gb", 0), ("1", "A100-2g.20gb", 1)]
)
def test_preflight_checks_the_slice_of_a_gres_index_against_the_profile_asked_for(
    node: Node, index: str, asked: str, given: int
) -> None:
    scenario = sliced_node(node)
    env = preflight_env(
        node,
        SLURM_JOB_GPUS=index,
        CUDA_VISIBLE_DEVICES=index,
        CLUSTERJOB_EXPECT_MODEL=asked,
        CLUSTERJOB_EXPECT_COUNT="1",
    )
    done = node.run("preflight", env=env)
    if asked == "A100-3g.40gb":
        assert done.returncode == 0, done.stderr
        assert done.stderr.splitlines()[-1] == "preflight gpu2: OK (4 GPU slot(s))"
        return
    uuid = scenario.gpus[0].mig_devices[given][1]
    assert done.returncode == 1
    assert done.stderr.splitlines()[-2:] == [
        "error: alloc-model: gpu2: slot 0 (0000:07:00.0): job asked for A100-2g.20gb, was "
        f"given MIG device GRES index 1 ({uuid}): NVIDIA A100-SXM4-80GB MIG 1g.10gb "
        "(A100-1g.10gb)",
        "clusterjob: error: preflight gpu2: FAILED (1 error(s), 0 warning(s))",
    ]


def test_task_prolog_gives_cuda_the_slices_of_the_jobs_gres_indices(node: Node) -> None:
    """CUDA takes an index for a whole GPU: the job's slices become their MIG UUIDs, by the
    map's GPU instance (GRES index 2 is instance 3, NVML's third MIG device), whole GPUs
    their GPU UUID."""
    scenario = sliced_node(node)
    migs = [u for _, u in scenario.gpus[0].mig_devices]
    env = {"SLURM_JOB_GPUS": "2,4", "CUDA_VISIBLE_DEVICES": "2,4"}
    done = node.run("task-prolog", "--site", str(node.site), env=env)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        f"export CUDA_VISIBLE_DEVICES={migs[2]},{scenario.gpus[1].uuid}",
    ]


# -- the checks a good node passes (test_prolog_good_node_passes_and_logs) and that fire on
# a node made to fail them, through pynvml over the stand-in ------------------------------


def test_prolog_row_remap_pending_is_a_warning(node: Node) -> None:
    node.setup(mixed(**{"0": {"remapped_pending": True}}))
    done = node.prolog(env={"SLURM_JOB_GPUS": "0"})
    assert (done.returncode, done.stderr.splitlines()) == (
        0,
        [
            "clusterjob prolog: warning: row-remap-pending: gpu2: slot 0 (0000:07:00.0): "
            "NVIDIA A100-SXM4-80GB: row remapping pending -- reset the GPU to apply it"
        ],
    )


def test_prolog_board_replaced_under_its_uuid_is_a_warning(node: Node) -> None:
    scenario = mixed()
    node.setup(scenario, nodes="gpu2", slot_extra={0: f', uuid: "{scenario.gpus[0].uuid}"'})
    assert node.prolog(env={"SLURM_JOB_GPUS": "0"}).stderr == ""
    node.setup(scenario, nodes="gpu2", slot_extra={0: f', uuid: "{scenario.gpus[1].uuid}"'})
    done = node.prolog(env={"SLURM_JOB_GPUS": "0"})
    assert done.returncode == 0
    assert done.stderr.startswith("clusterjob prolog: warning: gpu-uuid: gpu2: slot 0 ")


def test_preflight_a_gpu_the_map_lacks(node: Node) -> None:
    node.setup(mixed(), models=MIXED[:3], buses=BUSES[:3])
    done = node.run("preflight", env=preflight_env(node, SLURM_JOB_GPUS="0"))
    assert done.returncode == 1
    assert any(
        line.startswith("error: gpu-extra: gpu2: 0000:4c:00.0: ")
        for line in done.stderr.splitlines()
    ), done.stderr


@pytest.mark.parametrize("asked", ["1", "2"])
def test_preflight_count_of_gpus_given(node: Node, asked: str) -> None:
    node.setup(mixed())
    env = preflight_env(
        node, SLURM_JOB_GPUS="1", CUDA_VISIBLE_DEVICES="1", CLUSTERJOB_EXPECT_COUNT=asked
    )
    done = node.run("preflight", env=env)
    if asked == "1":
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 1
    assert (
        "error: alloc-count: gpu2: job asked for 2 GPU(s) on this node, was given 1"
        in done.stderr.splitlines()
    ), done.stderr


def test_prolog_cuda_visible_devices_cuda_cannot_read_is_a_warning(node: Node) -> None:
    node.setup(mixed())
    assert node.prolog(env={"CUDA_VISIBLE_DEVICES": "0,1"}).stderr == ""
    done = node.prolog(env={"CUDA_VISIBLE_DEVICES": "0,NoDevFiles"})
    assert done.returncode == 0
    assert done.stderr.splitlines() == [
        "clusterjob prolog: warning: alloc-env: gpu2: CUDA_VISIBLE_DEVICES=0,NoDevFiles: CUDA "
        "stops reading at the first entry it cannot parse"
    ]
