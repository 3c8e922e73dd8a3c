"""Stand-in GPUs for machines without one: scenario files and the C library that serves them.

``standin_nvml.c`` builds into a ``libnvidia-ml.so.1`` that the unmodified ``pynvml`` loads
through ``LD_LIBRARY_PATH``; it reports the GPUs of the scenario file named by
``$FAKE_NVML_SCENARIO`` (``%n`` replaced by ``$SLURMD_NODENAME``). Going through the real
bindings tests the real ctypes structures, versioned entry points and error classes.

The dynamic loader reads ``LD_LIBRARY_PATH`` once, at process start: set it (``standin_env``)
for a child process. Inside an already running process, ``preload_standin`` loads the library
by path before pynvml first asks for it; pynvml's ``CDLL("libnvidia-ml.so.1")`` then gets the
loaded copy (matched by soname). Either way the scenario is read at each first ``nvmlInit``.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from clusterjob import envvars
from clusterjob.errors import ClusterjobError

LIBRARY_NAME = "libnvidia-ml.so.1"
SCENARIO_ENV = envvars.NVML_SCENARIO
SOURCE = Path(__file__).with_name("standin_nvml.c")

INIT_ERRORS = (
    "driver_not_loaded",
    "library_mismatch",
    "version_mismatch",
    "no_permission",
    "unknown",
)
UNSUPPORTED_WORDS = (
    "name",
    "uuid",
    "serial",
    "minor",
    "pci",
    "memory",
    "ecc",
    "remap",
    "mig",
    "persistence",
    "processes",
    "utilization",
    "pcie",
    "temperature",
    "clocks",
    "nvlink",
    "fabric",
    "affinity",
    "power",
    "retired",
    "events",
)
FABRIC_STATES = ("not_started", "in_progress", "completed")

_CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-fvisibility=hidden", f"-Wl,-soname,{LIBRARY_NAME}")
GIB = 1024**3


class StandinProcess(NamedTuple):
    """A compute process NVML reports on a GPU."""

    pid: int
    used_memory: int  # bytes
    name: str


@dataclass(frozen=True)
class StandinGpu:
    """One GPU as the stand-in NVML reports it; its position in the scenario is its NVML index."""

    name: str  # as NVML writes it, e.g. "NVIDIA A100-SXM4-80GB"
    uuid: str
    serial: str | None  # None: the board has none (NVML says NOT_SUPPORTED)
    bus_id: str  # any PCI form, e.g. "0000:07:00.0"
    minor: int  # /dev/nvidiaN
    memory_total: int  # bytes
    memory_used: int = 0
    ecc_uncorrectable: int = 0  # volatile (and aggregate) uncorrectable ECC errors
    remapped_pending: bool = False
    remapped_failure: bool = False
    mig_current: bool = False
    mig_pending: bool = False
    persistence: bool = True
    lost_after_calls: int | None = None  # calls addressing this GPU beyond N: GPU_IS_LOST
    hang_seconds: float | None = None  # every call addressing this GPU sleeps first
    unsupported: tuple[str, ...] = ()  # words of UNSUPPORTED_WORDS: NOT_SUPPORTED
    processes: tuple[StandinProcess, ...] = ()
    utilization: int = 0  # percent
    pcie_width: int = 16  # lanes the link trained at
    pcie_width_max: int = 16
    pcie_gen: int = 4
    pcie_gen_max: int = 4
    temperature: int = 35  # degrees C
    temperature_slowdown: int = 90  # NVML's slowdown threshold, degrees C
    clocks_event_reasons: int = 0  # nvmlClocksEventReason* bits active now
    nvlinks: int = 0  # NVLink links 0..nvlinks-1 (0: none; NVML says NOT_SUPPORTED)
    nvlinks_down: tuple[int, ...] = ()  # those links are inactive
    fabric_state: str | None = None  # one of FABRIC_STATES; None: no fabric (NOT_SUPPORTED)
    fabric_status: int = 0  # nvmlReturn_t of the fabric registration
    cpu_affinity: str | None = None  # CPUs near the GPU, "0-31,64-95"; None: every CPU
    power_limit: int = 700_000  # enforced power limit, mW
    power_limit_default: int = 700_000  # the board's default limit, mW
    power_usage: int = 60_000  # power drawn now, mW
    retired_pages_pending: bool = False  # a page retirement waits for a GPU reset
    mig_devices: tuple[tuple[str, str], ...] = ()  # (profile, MIG UUID); NVML lists them
    # only while mig_current is on, named "<name> MIG <profile>"
    xids: tuple[int, ...] = ()  # Xid critical-error events, once to each registered event set

    def __post_init__(self) -> None:
        object.__setattr__(self, "unsupported", tuple(self.unsupported))
        object.__setattr__(self, "nvlinks_down", tuple(self.nvlinks_down))
        object.__setattr__(self, "xids", tuple(int(x) for x in self.xids))
        object.__setattr__(self, "mig_devices", tuple(tuple(m) for m in self.mig_devices))
        if self.fabric_state is not None and self.fabric_state not in FABRIC_STATES:
            raise ValueError(
                f"fabric_state: {self.fabric_state!r} (valid: {', '.join(FABRIC_STATES)} or None)"
            )
        object.__setattr__(self, "processes", tuple(StandinProcess(*p) for p in self.processes))
        unknown = sorted(set(self.unsupported) - set(UNSUPPORTED_WORDS))
        if unknown:
            raise ValueError(
                f"unsupported: unknown {', '.join(unknown)} (valid: {', '.join(UNSUPPORTED_WORDS)})"
            )


@dataclass(frozen=True)
class StandinScenario:
    """What one node's NVML reports: its GPUs in NVML index order, or an init failure."""

    gpus: tuple[StandinGpu, ...] = ()
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040
    init_error: str | None = None  # one of INIT_ERRORS: nvmlInit fails with it

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))
        if self.init_error is not None and self.init_error not in INIT_ERRORS:
            raise ValueError(
                f"init_error: {self.init_error!r} (valid: {', '.join(INIT_ERRORS)} or None)"
            )


def scenario_text(scenario: StandinScenario) -> str:
    """The scenario in the line format standin_nvml.c reads."""
    lines = [
        "# stand-in NVML scenario (read by libnvidia-ml.so.1 built from standin_nvml.c)",
        f"driver_version = {scenario.driver_version}",
        f"cuda_driver_version = {scenario.cuda_driver_version}",
    ]
    if scenario.init_error:
        lines.append(f"init_error = {scenario.init_error}")
    for n, gpu in enumerate(scenario.gpus):
        p = f"gpu.{n}."
        values: dict[str, Any] = {
            "name": gpu.name,
            "uuid": gpu.uuid,
            "serial": gpu.serial,
            "bus_id": gpu.bus_id,
            "minor": gpu.minor,
            "memory_total": gpu.memory_total,
            "memory_used": gpu.memory_used,
            "ecc_uncorrectable": gpu.ecc_uncorrectable,
            "remapped_pending": gpu.remapped_pending,
            "remapped_failure": gpu.remapped_failure,
            "mig_current": gpu.mig_current,
            "mig_pending": gpu.mig_pending,
            "persistence": gpu.persistence,
            "utilization": gpu.utilization,
            "pcie_width": gpu.pcie_width,
            "pcie_width_max": gpu.pcie_width_max,
            "pcie_gen": gpu.pcie_gen,
            "pcie_gen_max": gpu.pcie_gen_max,
            "temperature": gpu.temperature,
            "temperature_slowdown": gpu.temperature_slowdown,
            "clocks_event_reasons": hex(gpu.clocks_event_reasons),
            "nvlinks": gpu.nvlinks,
            "nvlinks_down": ",".join(map(str, gpu.nvlinks_down)) or None,
            "fabric_state": gpu.fabric_state,
            "fabric_status": gpu.fabric_status,
            "cpu_affinity": gpu.cpu_affinity,
            "power_limit": gpu.power_limit,
            "power_limit_default": gpu.power_limit_default,
            "power_usage": gpu.power_usage,
            "retired_pages_pending": gpu.retired_pages_pending,
            "lost_after_calls": gpu.lost_after_calls,
            "hang_seconds": gpu.hang_seconds,
            "unsupported": ",".join(gpu.unsupported) or None,
            "xid": ",".join(map(str, gpu.xids)) or None,
        }
        for key, value in values.items():
            if value is None:
                continue
            if isinstance(value, bool):
                value = int(value)
            text = str(value)
            if "\n" in text or text != text.strip():
                raise ValueError(f"gpu {n} {key}: {text!r} cannot be written on one line")
            lines.append(f"{p}{key} = {text}")
        for k, (profile, mig_uuid) in enumerate(gpu.mig_devices):
            lines.append(f"{p}mig.{k} = {profile}:{mig_uuid}")
        for k, proc in enumerate(gpu.processes):
            lines.append(f"{p}process.{k} = {proc.pid}:{proc.used_memory}:{proc.name}")
    return "\n".join(lines) + "\n"


def write_scenario(path: Path | str, scenario: StandinScenario) -> Path:
    """Write ``scenario`` where the stand-in library will read it; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(scenario_text(scenario), encoding="utf-8")
    return path


def find_nvml_header(roots: Iterable[str | Path] | None = None) -> Path:
    """nvml.h from the PyPI package nvidia-nvml-dev (namespace package ``nvidia``).

    ``roots`` replaces the ``nvidia`` package's directories as the places to look.
    """
    if roots is None:
        spec = importlib.util.find_spec("nvidia")
        roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        for sub in ("cu13", "cu12", ""):
            header = Path(root, sub, "include", "nvml.h")
            if header.is_file():
                return header
    raise ClusterjobError(
        "nvml.h not found: the stand-in NVML library is built against it, from the "
        f"`sandbox` extra (PyPI package nvidia-nvml-dev): {add_sandbox_extra()}"
    )


def add_sandbox_extra(prefix: str | None = None) -> str:
    """How to add the `sandbox` extra to the environment clusterjob runs in (``sys.prefix``):
    pipx and `uv tool` keep their own venvs, where a bare `pip install` does not reach."""
    where = Path(prefix or sys.prefix).as_posix()
    if "/pipx/venvs/" in where:
        return "pipx inject clusterjob-slurm nvidia-nvml-dev"
    if "/uv/tools/" in where:
        return "uv tool install --reinstall 'clusterjob-slurm[sandbox]'"
    return f"{sys.executable} -m pip install 'clusterjob-slurm[sandbox]'"


def build_standin_library(dest_dir: Path) -> Path:
    """Compile the stand-in into ``dest_dir/libnvidia-ml.so.1``; reuse an up-to-date build.

    The build is keyed by a hash of the C source, nvml.h and the flags, stored next to the
    library, so editing the source rebuilds and parallel callers never see a half-written file.
    """
    dest_dir = Path(dest_dir)
    lib = dest_dir / LIBRARY_NAME
    stamp = dest_dir / (LIBRARY_NAME + ".sha256")
    header = find_nvml_header()
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), header.read_bytes(), " ".join(_CFLAGS).encode()):
        digest.update(hashlib.sha256(part).digest())
    key = digest.hexdigest()
    if lib.is_file() and stamp.is_file() and stamp.read_text().strip() == key:
        lib.chmod(0o755)  # an older build was left 0711: other users' jobs could not load it
        return lib

    cc = shutil.which(os.environ.get("CC", "gcc"))
    if cc is None:
        raise ClusterjobError(
            "gcc not found: install a C compiler (Debian/Ubuntu: apt-get install gcc) "
            "to build the stand-in NVML library"
        )
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libnvidia-ml.", suffix=".so", dir=dest_dir)
    os.close(fd)
    try:
        cmd = [cc, *_CFLAGS, f"-I{header.parent}", "-o", tmp, str(SOURCE)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no error output"])[0]
            raise ClusterjobError(f"building the stand-in NVML library failed: {first}")
        # mkstemp's 0600 leaves the linker's output 0711: every user's job loads it
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    stamp.write_text(key + "\n")
    return lib


def standin_env(lib_dir: Path | str, scenario_path: Path | str) -> dict[str, str]:
    """Environment for a child process whose pynvml should load the stand-in.

    ``scenario_path`` may contain ``%n`` (one scenario file per Slurm node). The current
    ``LD_LIBRARY_PATH`` is kept after the stand-in directory.
    """
    old = os.environ.get("LD_LIBRARY_PATH", "")
    path = str(lib_dir) + (f":{old}" if old else "")
    return {"LD_LIBRARY_PATH": path, SCENARIO_ENV: str(scenario_path)}


def preload_standin(lib: Path | str) -> None:
    """Load the stand-in into this process so pynvml's later dlopen by name finds it.

    Only works before pynvml has loaded a library in this process; the scenario still comes
    from ``$FAKE_NVML_SCENARIO`` as it is when ``nvmlInit`` runs.
    """
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)


def _uuid_for(*parts: object) -> str:
    h = hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def mig_uuid_for(*parts: object) -> str:
    """A stable MIG device UUID (``MIG-`` and a GPU-style UUID body) for a test scenario."""
    return "MIG-" + _uuid_for("mig", *parts)[4:]


def _serial_for(*parts: object) -> str:
    h = hashlib.sha256(("serial/" + "/".join(map(str, parts))).encode()).hexdigest()
    return "132" + str(int(h[:12], 16))[-10:].rjust(10, "0")


def _make(
    name: str, memory: int, bus_id: str, index: int, node: str, overrides: Mapping[str, Any]
) -> StandinGpu:
    gpu = StandinGpu(
        name=name,
        uuid=_uuid_for(node, name, bus_id),
        serial=_serial_for(node, name, bus_id),
        bus_id=bus_id,
        minor=index,
        memory_total=memory,
    )
    return replace(gpu, **overrides) if overrides else gpu


def gpu_named(
    name: str, memory: int, bus_id: str, index: int, *, node: str = "", **overrides: Any
) -> StandinGpu:
    """A GPU NVML calls ``name`` with ``memory`` bytes (a site's model, `sandbox up --like`)."""
    return _make(name, memory, bus_id, index, node, overrides)


def a100(bus_id: str, index: int, *, node: str = "", **overrides: Any) -> StandinGpu:
    """An A100 SXM4 80GB (12 NVLinks); UUID and serial derive from node and bus ID."""
    overrides = {"nvlinks": 12, **overrides}
    return _make("NVIDIA A100-SXM4-80GB", 80 * GIB, bus_id, index, node, overrides)


def v100(bus_id: str, index: int, *, node: str = "", **overrides: Any) -> StandinGpu:
    """A V100 SXM2 32GB (no MIG, no row remapping: NVML says NOT_SUPPORTED for both)."""
    overrides = {"unsupported": ("mig", "remap"), "nvlinks": 6, "pcie_gen_max": 3,
                 "pcie_gen": 3, **overrides}  # fmt: skip
    return _make("Tesla V100-SXM2-32GB", 32 * GIB, bus_id, index, node, overrides)


def h100(bus_id: str, index: int, *, node: str = "", **overrides: Any) -> StandinGpu:
    """An H100 SXM5 80GB HBM3 of an HGX board: 18 NVLinks, NVSwitch fabric registered."""
    overrides = {
        "nvlinks": 18,
        "fabric_state": "completed",
        "pcie_gen": 5,
        "pcie_gen_max": 5,
        **overrides,
    }
    return _make("NVIDIA H100 80GB HBM3", 81559 * 1024**2, bus_id, index, node, overrides)


def gpus_on_buses(
    maker: Any, bus_ids: Iterable[str], *, node: str = "", **overrides: Any
) -> tuple[StandinGpu, ...]:
    """Several GPUs of one model, NVML index and minor following the given bus order."""
    return tuple(maker(b, i, node=node, **overrides) for i, b in enumerate(bus_ids))
