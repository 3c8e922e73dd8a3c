"""Health checks, once per GPU NVML sees: lost, ECC, row remapping, MIG mode, PCIe and NVLink
links, NVSwitch fabric, clock throttling, temperature, leftover processes, persistence; and
the node's driver version, once.

A broken GPU the job was given (or may have been given: its GPUs unknown) is an error; one
it was not given is a warning, so the node is drained when a job would actually land on it.
A lost GPU gets only ``gpu-lost``: NVML stopped reading it, its other fields say nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from clusterjob.gpu.inventory import Gpu, cpu_list, parse_cpu_list
from clusterjob.node.allocation import Context
from clusterjob.node.checks.facts import Facts, Need
from clusterjob.node.checks.findings import Severity
from clusterjob.node.checks.registry import Observation, Stage, check


def _observe(
    facts: Facts,
    gpu: Gpu,
    what: str,
    found: str,
    severity: Severity | None = None,
    expected: str | None = None,
) -> Observation:
    slot = facts.slot_of(gpu)
    where = facts.where(slot, gpu.bus_id)
    label = f"{where}: {gpu.name}" if gpu.name else where
    return Observation(f"{label}: {what}", slot, gpu.bus_id, expected, found, severity)


def _on_job(facts: Facts, gpu: Gpu) -> Severity | None:
    """The check's own severity, or a warning when the job certainly was not given ``gpu``."""
    return Severity.WARNING if facts.job_has(gpu) is False else None


def _version(text: str) -> tuple[int, ...] | None:
    """ "550.54.15" -> (550, 54, 15); None for what is no driver version."""
    try:
        return tuple(int(part) for part in text.strip().split("."))
    except ValueError:
        return None


@check(
    "driver-version",
    Severity.ERROR,
    stage=Stage.MAP,
    needs={Need.DRIVER_MIN},
    reads=(
        "`nvmlSystemGetDriverVersion`, `nvmlSystemGetCudaDriverVersion_v2` against "
        "`checks.driver_min`, `checks.cuda_min`"
    ),
    action="upgrade the NVIDIA driver on the node (and reboot)",
)
def driver_version(facts: Facts) -> Iterator[Observation]:
    """The NVIDIA driver and the CUDA version it supports against the site's (or the job's
    partition's) ``checks.driver_min`` and ``checks.cuda_min``. What NVML cannot name is
    unknown: no finding."""
    found, wanted = facts.inventory.driver_version, facts.driver_min or ""
    have, need = _version(found or ""), _version(wanted)
    if have is not None and need is not None and have < need:
        yield Observation(
            f"{facts.node}: NVIDIA driver {found} is older than the site's minimum {wanted} -- "
            "upgrade the driver on this node (and reboot)",
            expected=f">= {wanted}",
            found=found,
        )
    cuda, cuda_wanted = facts.inventory.cuda_driver_version, facts.cuda_min or ""
    need = _version(cuda_wanted)
    if cuda and need is not None and (cuda // 1000, cuda % 1000 // 10) < need:
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}"
        yield Observation(
            f"{facts.node}: the NVIDIA driver {found or '?'} supports CUDA {cuda_text}, the "
            f"site's minimum is {cuda_wanted} -- upgrade the driver on this node (and reboot)",
            expected=f">= CUDA {cuda_wanted}",
            found=f"CUDA {cuda_text}",
        )


@check(
    "gpu-lost",
    Severity.ERROR,
    stage=Stage.HEALTH,
    reads="`GPU_IS_LOST` from any call",
    action="dmesg (Xid 79), reset the GPU or reboot",
)
def gpu_lost(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    if gpu.lost:
        yield _observe(facts, gpu, "NVML says GPU is lost -- reset or reboot the node", "lost")


@check(
    "ecc-uncorrectable",
    Severity.ERROR,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetTotalEccErrors` (volatile, uncorrected)",
    action="reset the GPU; if it recurs, RMA",
)
def ecc_uncorrectable(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    n = gpu.ecc_uncorrectable_volatile
    if n and not gpu.lost:
        what = f"{n} uncorrectable ECC error(s) since the last reset"
        yield _observe(facts, gpu, what, str(n), _on_job(facts, gpu))


@check(
    "row-remap-failure",
    Severity.ERROR,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetRemappedRows`",
    action="the GPU needs service (RMA)",
)
def row_remap_failure(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    if gpu.remapped_rows_failure and not gpu.lost:
        what = "row remapping failed -- the GPU needs service"
        yield _observe(facts, gpu, what, "remap failure", _on_job(facts, gpu))


@check(
    "row-remap-pending",
    Severity.WARNING,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetRemappedRows`",
    action="reset the GPU when idle to apply the remap",
)
def row_remap_pending(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    if gpu.remapped_rows_pending and not gpu.lost:
        what = "row remapping pending -- reset the GPU to apply it"
        yield _observe(facts, gpu, what, "remap pending")


@check(
    "mig-pending",
    Severity.ERROR,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetMigMode` (current against pending)",
    action="reset the GPU (`nvidia-smi -r`) so the pending MIG mode takes effect",
)
def mig_pending(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    current, pending = gpu.mig_current, gpu.mig_pending
    if gpu.lost or current is None or pending is None or current == pending:
        return
    cur, pend = ("on" if current else "off"), ("on" if pending else "off")
    what = f"MIG mode is {cur}, {pend} pending a GPU reset"
    yield _observe(facts, gpu, what, f"mig {cur}->{pend}", _on_job(facts, gpu))


# -- links, clocks, leftovers: what makes a node slow or a job fail to start ---------------

_HW_SLOWDOWN = {0x8: "hw_slowdown", 0x40: "hw_thermal", 0x80: "hw_power_brake"}
_SW_THERMAL = 0x20
HOT_MARGIN_C = 5  # gpu-hot: an idle GPU this close to its own slowdown temperature


@check(
    "pcie-degraded",
    Severity.WARNING,
    stage=Stage.HEALTH,
    reads=(
        "`nvmlDeviceGetCurrPcieLinkWidth`, `...MaxPcieLinkWidth`, `...Curr/MaxPcieLinkGeneration`"
    ),
    action="reseat the board, check the slot and riser; `nvidia-smi -q -d PCIE`",
)
def pcie_degraded(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    """Link width below the maximum is a fault (reseat the board, check the riser); a lower
    generation alone is information only: many boards drop the link speed at idle."""
    if gpu.lost:
        return
    width, width_max = gpu.pcie_link_width, gpu.pcie_link_width_max
    gen, gen_max = gpu.pcie_link_gen, gpu.pcie_link_gen_max
    link = f"x{width} gen{gen if gen is not None else '?'}"
    if width is not None and width_max is not None and width < width_max:
        what = (
            f"PCIe link trained at x{width}, the board can do x{width_max} -- host<->GPU "
            "bandwidth is reduced: reseat the board or check the slot/riser"
        )
        yield _observe(facts, gpu, what, link)
    elif gen is not None and gen_max is not None and gen < gen_max:
        what = f"PCIe link at gen{gen}, the board can do gen{gen_max} (normal at idle)"
        yield _observe(facts, gpu, what, link, Severity.INFO)


@check(
    "nvlink-down",
    Severity.ERROR,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetNvLinkState` per link; the slot's `nvlinks:`",
    action=(
        "check NVLink bridges / NVSwitch trays and nvidia-fabricmanager, reset the GPU; "
        "`nvidia-smi nvlink -s`"
    ),
)
def nvlink_down(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    """Fewer active NVLinks than the node map's ``nvlinks`` (an error on the job's GPUs);
    without that key, some links down while others are up (a warning). Unknown: nothing."""
    links = gpu.nvlink_active
    if gpu.lost or links is None:
        return
    up = sum(links)
    down = [i for i, active in enumerate(links) if not active]
    slot = facts.map_slot(gpu)
    expected = slot.nvlinks if slot is not None else None
    found = f"{up}/{len(links)} up"
    if expected is not None:
        if up < expected:
            which = f" (down: {','.join(map(str, down))})" if down else ""
            what = (
                f"{up} NVLink link(s) active, the node map says {expected}{which} -- "
                "check the NVLink/NVSwitch cabling and nvidia-fabricmanager, then reset the GPU"
            )
            yield _observe(facts, gpu, what, found, _on_job(facts, gpu), str(expected))
    elif 0 < up < len(links):
        what = (
            f"NVLink link(s) {','.join(map(str, down))} down, {up} of {len(links)} active -- "
            "GPU-to-GPU traffic is slower; reset the GPU or service the board"
        )
        yield _observe(facts, gpu, what, found, Severity.WARNING)


@check(
    "nvlink-fabric",
    Severity.ERROR,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetGpuFabricInfo` (NVSwitch systems)",
    action=(
        "CUDA cannot start until the fabric manager registers the GPU: `systemctl status "
        "nvidia-fabricmanager`, its log"
    ),
)
def nvlink_fabric(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    """NVSwitch systems: CUDA cannot start on a GPU the fabric manager has not registered."""
    state, status = gpu.fabric_state, gpu.fabric_status
    if gpu.lost or state is None or (state == "completed" and not status):
        return
    if state == "completed":
        what = f"NVSwitch fabric registration failed (NVML status {status})"
        found = f"fabric failed:{status}"
    else:
        what = f"NVSwitch fabric registration {state.replace('_', ' ')}"
        found = f"fabric {state}"
    what += " -- CUDA jobs fail to start: check nvidia-fabricmanager and its log"
    yield _observe(facts, gpu, what, found, _on_job(facts, gpu))


@check(
    "clocks-throttled",
    Severity.ERROR,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetCurrentClocksEventReasons` (older drivers: `...ThrottleReasons`)",
    action=(
        "an idle GPU held down is a cooling, PSU or power-brake cable fault: `nvidia-smi -q "
        "-d PERFORMANCE`"
    ),
)
def clocks_throttled(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    """Hardware slowdown, thermal or power-brake at job start (the GPU is idle): a cooling,
    power-supply or board fault. Software thermal slowdown alone is a warning."""
    mask = gpu.clock_event_reasons
    if gpu.lost or not mask:
        return
    hw = [name for bit, name in _HW_SLOWDOWN.items() if mask & bit]
    if hw:
        what = (
            f"clocks held down by {', '.join(hw)} while idle -- check cooling, power supply "
            "and power-brake cabling (nvidia-smi -q -d PERFORMANCE)"
        )
        yield _observe(facts, gpu, what, ",".join(hw), _on_job(facts, gpu))
    elif mask & _SW_THERMAL:
        what = "clocks held down by sw_thermal while idle -- check the cooling"
        yield _observe(facts, gpu, what, "sw_thermal", Severity.WARNING)


@check(
    "gpu-hot",
    Severity.WARNING,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetTemperature`, `...TemperatureThreshold` (slowdown)",
    action="within 5 C of its slowdown temperature before the job: check fans and airflow",
)
def gpu_hot(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    temp, slowdown = gpu.temperature, gpu.temperature_slowdown
    if gpu.lost or temp is None or slowdown is None or temp < slowdown - HOT_MARGIN_C:
        return
    what = f"{temp} C before the job starts, slowdown at {slowdown} C -- check the cooling"
    yield _observe(facts, gpu, what, f"{temp} C")


@check(
    "power-capped",
    Severity.WARNING,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetEnforcedPowerLimit` against `nvmlDeviceGetPowerManagementDefaultLimit`",
    action=(
        "`nvidia-smi -i BUS -pl WATTS` back to the default, unless the cap is the site's "
        'choice (then `checks.severity: {power-capped: "off"}`)'
    ),
)
def power_capped(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    """An enforced power limit below the board's default: clocks drop under load."""
    limit, default = gpu.power_limit, gpu.power_limit_default
    if gpu.lost or limit is None or default is None or limit >= default:
        return
    what = (
        f"power limit {limit // 1000} W, the board's default is {default // 1000} W -- "
        f"nvidia-smi -i {gpu.bus_id} -pl {default // 1000} unless the cap is meant"
    )
    yield _observe(facts, gpu, what, f"{limit // 1000} W", expected=f"{default // 1000} W")


@check(
    "retired-pages-pending",
    Severity.WARNING,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetRetiredPagesPendingStatus` (boards before Ampere; later ones remap rows)",
    action="reset the GPU or reboot so the pages are retired",
)
def retired_pages_pending(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    if gpu.lost or not gpu.retired_pages_pending:
        return
    what = "memory page retirement pending -- reset the GPU (or reboot) to retire the pages"
    yield _observe(facts, gpu, what, "retirement pending")


@check(
    "gpu-busy",
    Severity.ERROR,
    stage=Stage.HEALTH,
    reads=(
        "`nvmlDeviceGetComputeRunningProcesses` on the job's GPUs, each process's user (the "
        "owner of /proc/PID)"
    ),
    action=(
        "a leftover of an earlier job (or a process outside Slurm): kill the pid, tell its "
        "user, find why the Epilog missed it"
    ),
)
def gpu_busy(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    """Compute processes on a GPU this job was given, before it starts: another job's leftover
    (or a process outside Slurm). Other jobs' GPUs are theirs to use: not looked at. Inside the
    job (preflight) the job's own earlier steps may be there: a warning only. A GPU in MIG
    mode is shared: its processes belong to slices other jobs may hold, so it is skipped. Each
    process is named with its user (the owner of /proc/PID): whose job leaked onto the GPU."""
    if gpu.lost or not gpu.processes or gpu.mig_current or facts.job_has(gpu) is not True:
        return
    procs = ", ".join(f"pid {p.pid} ({p.name or '?'}, user {p.user or '?'})" for p in gpu.processes)
    what = f"{len(gpu.processes)} compute process(es) already running: {procs}"
    severity = None if facts.context is Context.PROLOG else Severity.WARNING
    found = ",".join(str(p.pid) for p in gpu.processes)
    yield _observe(facts, gpu, what, found, severity)


@check(
    "numa-affinity",
    Severity.WARNING,
    stage=Stage.HEALTH,
    needs={Need.JOB_CPUS},
    reads="`nvmlDeviceGetCpuAffinity` against the job's CPUs (inside the job: its CPU affinity)",
    action="`--gres-flags=enforce-binding`, and `Cores=` in gres.conf",
)
def numa_affinity(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    """Every CPU the job may use is on another NUMA node than a GPU it was given: each
    host<->GPU copy crosses the socket link."""
    near_text, job_cpus = gpu.cpu_affinity, facts.job_cpus or frozenset()
    if gpu.lost or near_text is None or not job_cpus or facts.job_has(gpu) is not True:
        return
    try:
        near = parse_cpu_list(near_text)
    except ValueError:
        return
    if near & job_cpus:
        return
    what = (
        f"the job's CPUs ({cpu_list(job_cpus)}) are all away from this GPU's NUMA node "
        f"(CPUs {near_text}) -- ask for --gres-flags=enforce-binding, or give gres.conf Cores="
    )
    yield _observe(facts, gpu, what, cpu_list(job_cpus), expected=near_text)


@check(
    "persistence-off",
    Severity.WARNING,
    stage=Stage.HEALTH,
    reads="`nvmlDeviceGetPersistenceMode`",
    action="enable `nvidia-persistenced`",
)
def persistence_off(facts: Facts, gpu: Gpu) -> Iterator[Observation]:
    if gpu.lost or gpu.persistence_mode is not False:
        return
    what = (
        "persistence mode off -- every job pays the driver's start-up and the GPU state is "
        "reset between jobs: enable nvidia-persistenced"
    )
    yield _observe(facts, gpu, what, "persistence off")
