"""Identity checks: is each GPU the model the node map puts in its slot, and is each slot's
GRES index the device file Slurm hands out for it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from clusterjob.gpu.inventory import Gpu
from clusterjob.node.checks.facts import Facts, Need
from clusterjob.node.checks.findings import Severity
from clusterjob.node.checks.registry import Observation, Stage, check
from clusterjob.site.nodemodel import NodeGpu


@check(
    "node-unmapped",
    Severity.WARNING,
    stage=Stage.MAP,
    reads="the node map",
    action="add the node to `node_map`",
)
def node_unmapped(facts: Facts) -> Iterator[Observation]:
    if facts.node_map is not None:
        return
    yield Observation(
        f"{facts.node}: not in the site's node map -- only the job's own request and GPU "
        f"health are checked ({len(facts.physical)} GPU(s) found)",
        expected="in node map",
        found="not in node map",
    )


@check(
    "gpu-count",
    Severity.ERROR,
    stage=Stage.MAP,
    needs={Need.NODE_MAP},
    reads="`nvmlDeviceGetCount`",
    action=(
        "a GPU fell off the bus or the map is wrong: `nvidia-smi`, dmesg (Xid 79), reseat / "
        "fix the map"
    ),
)
def gpu_count(facts: Facts) -> Iterator[Observation]:
    expected, found = len(facts.map_slots), len(facts.physical)
    if found != expected:
        yield Observation(
            f"{facts.node}: expected {expected} GPU(s), found {found}",
            expected=str(expected),
            found=str(found),
        )


@check(
    "gpu-missing",
    Severity.ERROR,
    stage=Stage.SLOTS,
    needs={Need.NODE_MAP},
    reads="each GPU's PCI bus ID (`nvmlDeviceGetPciInfo_v3`)",
    action="the map's GPU at that bus ID is gone: as for `gpu-count`",
)
def gpu_missing(facts: Facts, slot: NodeGpu, gpu: Gpu | None) -> Iterator[Observation]:
    if gpu is not None:
        return
    yield Observation(
        f"{facts.where(slot.slot, slot.bus_id)}: expected {slot.model}, found nothing -- GPU "
        f"missing or fallen off the bus{facts.match_note}",
        slot.slot,
        slot.bus_id,
        slot.model,
        None,
    )


@check(
    "model-mismatch",
    Severity.ERROR,
    stage=Stage.SLOTS,
    needs={Need.NODE_MAP},
    reads="`nvmlDeviceGetName`",
    action="boards swapped or map wrong: fix one of them",
)
def model_mismatch(facts: Facts, slot: NodeGpu, gpu: Gpu | None) -> Iterator[Observation]:
    if gpu is None or gpu.lost:  # a lost GPU cannot say what it is: gpu-lost reports it
        return
    if facts.model_of(gpu) != slot.model:
        yield Observation(
            f"{facts.where(slot.slot, gpu.bus_id)}: expected {slot.model}, found "
            f"{facts.found_text(gpu)} -- boards swapped or node map wrong{facts.match_note}",
            slot.slot,
            gpu.bus_id,
            slot.model,
            gpu.name,
        )


@check(
    "gpu-uuid",
    Severity.WARNING,
    stage=Stage.SLOTS,
    needs={Need.NODE_MAP},
    reads="`nvmlDeviceGetUUID`",
    action="board replaced: update the slot's `uuid`",
)
def gpu_uuid(facts: Facts, slot: NodeGpu, gpu: Gpu | None) -> Iterator[Observation]:
    if gpu is None or gpu.lost:
        return
    if slot.uuid and gpu.uuid and slot.uuid != gpu.uuid:
        yield Observation(
            f"{facts.where(slot.slot, gpu.bus_id)}: expected UUID {slot.uuid}, found "
            f"{gpu.uuid} -- board replaced or node map out of date",
            slot.slot,
            gpu.bus_id,
            slot.uuid,
            gpu.uuid,
        )


@check(
    "gpu-extra",
    Severity.ERROR,
    stage=Stage.EXTRA,
    needs={Need.NODE_MAP},
    reads="each GPU's PCI bus ID",
    action="a GPU the map lacks: add it in bus order (GRES and CUDA indices disagree until then)",
)
def gpu_extra(facts: Facts) -> Iterator[Observation]:
    for gpu in facts.extra:
        yield Observation(
            f"{facts.node}: {gpu.bus_id}: expected no GPU, found {facts.found_text(gpu)} -- "
            "not in the node map, so GRES indices and CUDA indices disagree",
            None,
            gpu.bus_id,
            None,
            gpu.name,
        )


@check(
    "gres-index",
    Severity.ERROR,
    stage=Stage.DEVICE_FILES,
    needs={Need.NODE_MAP},
    reads="`nvmlDeviceGetMinorNumber` against the slot's GRES index",
    action=(
        "`AutoDetect=nvml` in gres.conf, or `File=` lines in bus order (`clusterjob site "
        "gres-conf`)"
    ),
)
def gres_index(facts: Facts, slot: NodeGpu, gpu: Gpu | None) -> Iterator[Observation]:
    """A warning while no job of ours has the slot: its jobs would get another GPU."""
    if gpu is None or gpu.lost or gpu.minor is None or gpu.minor == slot.slot:
        return
    yield Observation(
        f"{facts.where(slot.slot, gpu.bus_id)}: GRES index {slot.slot} is "
        f"/dev/nvidia{gpu.minor} (minor {gpu.minor}) -- with gres.conf "
        f"File=/dev/nvidia{slot.slot} this slot's job gets another GPU; use "
        "AutoDetect=nvml or list File= in bus order",
        slot.slot,
        gpu.bus_id,
        f"minor {slot.slot}",
        f"minor {gpu.minor}",
        severity=None if slot.slot in facts.allocated_set else Severity.WARNING,
    )


def _others_slot(facts: Facts, slot: NodeGpu) -> Severity | None:
    """A warning for a slot the job certainly was not given; else the check's own."""
    if facts.allocated is not None and slot.slot not in facts.allocated_set:
        return Severity.WARNING
    return None


def _profiles(profiles: Iterable[str | None]) -> str:
    return ",".join(sorted(p or "?" for p in profiles)) or "none"


@check(
    "mig-mode",
    Severity.ERROR,
    stage=Stage.SLOTS,
    needs={Need.NODE_MAP},
    reads="`nvmlDeviceGetMigMode` against the slot's `mig:` (`[]`: off)",
    action="`nvidia-smi -i BUS -mig 1|0` and reset the GPU, or fix the map",
)
def mig_mode(facts: Facts, slot: NodeGpu, gpu: Gpu | None) -> Iterator[Observation]:
    """MIG on where the map's slot says ``mig: []`` (off), or off where it lists slices. A
    change already pending a reset is ``mig-pending``'s to report."""
    if gpu is None or gpu.lost or slot.mig is None or gpu.mig_current is None:
        return
    want = bool(slot.mig)
    if gpu.mig_current == want or gpu.mig_pending == want:
        return
    now, then = ("on", "off") if gpu.mig_current else ("off", "on")
    yield Observation(
        f"{facts.where(slot.slot, gpu.bus_id)}: MIG mode is {now}, the node map says {then}"
        f"{f' ({_profiles(slot.mig)})' if want else ''} -- nvidia-smi -i {gpu.bus_id} -mig "
        f"{int(want)} and reset the GPU, or fix the node map",
        slot.slot,
        gpu.bus_id,
        f"mig {then}",
        f"mig {now}",
        severity=_others_slot(facts, slot),
    )


@check(
    "mig-layout",
    Severity.ERROR,
    stage=Stage.SLOTS,
    needs={Need.NODE_MAP},
    reads=(
        "`nvmlDeviceGetMigDeviceHandleByIndex`, each slice's name (`... MIG 3g.40gb`) against"
        " the slot's `mig:` profiles"
    ),
    action="recreate the GPU and compute instances (`nvidia-smi mig -cgi ... -C`) or fix the map",
)
def mig_layout(facts: Facts, slot: NodeGpu, gpu: Gpu | None) -> Iterator[Observation]:
    """The MIG slices NVML lists against the profiles the map's slot names."""
    if gpu is None or gpu.lost or not slot.mig or not gpu.mig_current:
        return
    if gpu.mig_devices is None:
        return  # NVML could not list them: unknown
    found, wanted = _profiles(m.profile for m in gpu.mig_devices), _profiles(slot.mig)
    if found == wanted:
        return
    yield Observation(
        f"{facts.where(slot.slot, gpu.bus_id)}: MIG slices {found}, the node map says {wanted} "
        "-- recreate the GPU and compute instances (nvidia-smi mig -cgi ... -C) or fix the map",
        slot.slot,
        gpu.bus_id,
        wanted,
        found,
        severity=_others_slot(facts, slot),
    )
