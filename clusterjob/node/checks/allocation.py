"""Allocation checks: the job's GPUs as Slurm's variables name them, and what the job asked
for (``--expect-model``, ``--expect-count``) against what it was given."""

from __future__ import annotations

from collections.abc import Iterator

from clusterjob.gpu.models import model_for_nvml_name
from clusterjob.node.checks.facts import Facts, Need, names_mig
from clusterjob.node.checks.findings import Severity
from clusterjob.node.checks.registry import Observation, Stage, check


@check(
    "alloc-env",
    Severity.WARNING,
    stage=Stage.ALLOCATION,
    needs={Need.ALLOCATION},
    reads="Slurm's GPU variables",
    action=(
        "a variable Slurm (or a wrapper) set that CUDA reads otherwise: fix the job's "
        "environment or the TaskProlog"
    ),
)
def alloc_env_problems(facts: Facts) -> Iterator[Observation]:
    """Variables that could not be understood (see ``allocation_from_env``)."""
    problems = facts.allocation.problems if facts.allocation is not None else ()
    for problem in problems:
        yield Observation(f"{facts.node}: {problem}")


@check(
    "alloc-slot",
    Severity.ERROR,
    stage=Stage.ALLOCATION,
    needs={Need.ALLOCATION},
    reads=(
        "`SLURM_JOB_GPUS` / `SLURM_STEP_GPUS` / `CUDA_VISIBLE_DEVICES` against the node map's"
        " GRES indices (GPUs, and MIG slices where MIG is on)"
    ),
    action=(
        "gres.conf and the node map disagree: regenerate gres.conf with `clusterjob site gres-conf`"
    ),
)
def alloc_slot_uuids(facts: Facts) -> Iterator[Observation]:
    """Each GPU UUID in CUDA_VISIBLE_DEVICES must name exactly one GPU of this node."""
    for u, hits in facts.uuid_matches:
        if len(hits) != 1:
            yield Observation(
                f"{facts.node}: CUDA_VISIBLE_DEVICES names {u}, which is "
                f"{'no GPU' if not hits else 'more than one GPU'} on this node",
                expected="a GPU of this node",
                found=u,
            )


@check("alloc-env", Severity.INFO, stage=Stage.ALLOCATION, needs={Need.ALLOCATION})
def alloc_env_mig(facts: Facts) -> Iterator[Observation]:
    migs = facts.allocation.mig_devices if facts.allocation is not None else ()
    if migs:
        yield Observation(
            f"{facts.node}: job was given MIG devices ({','.join(migs)}); "
            "their parent GPUs are not checked per slot"
        )


@check("alloc-slot", Severity.ERROR, stage=Stage.ALLOCATION, needs={Need.ALLOCATION})
def alloc_slot_range(facts: Facts) -> Iterator[Observation]:
    """Each GRES index the job was given must be a slot (or, where MIG is on, a slice) of
    this node."""
    n = len(facts.node_map) if facts.node_map is not None else len(facts.physical)
    has = f"{n} GPU slot(s)"
    if facts.units is not None:
        n = len(facts.units)
        has = f"{n} GRES indices (GPUs and MIG slices)"
    for s in facts.allocated or ():
        if not facts.index_known(s):
            yield Observation(
                f"{facts.node}: job was given GRES index {s}, but the node has {has} "
                "-- gres.conf and the node map disagree",
                expected=f"index < {n}",
                found=str(s),
            )


@check(
    "alloc-count",
    Severity.ERROR,
    stage=Stage.REQUEST,
    needs={Need.EXPECT_COUNT},
    reads="the job's `--gpus` (`CLUSTERJOB_EXPECT_COUNT`) against the GRES indices it was given",
    action=(
        "the job got another number of GPUs than it asked for: check the partition's GRES and"
        " the job's options"
    ),
)
def alloc_count(facts: Facts) -> Iterator[Observation]:
    got = len(set(facts.allocated)) if facts.allocated is not None else 0
    if got == facts.expect_count:
        return
    src = facts.allocation.source if facts.allocation is not None else ""
    detail = f" ({src})" if src else " (SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES unset)"
    yield Observation(
        f"{facts.node}: job asked for {facts.expect_count} GPU(s) on this node, was given "
        f"{got}{detail if got == 0 else ''}",
        expected=str(facts.expect_count),
        found=str(got),
    )


@check(
    "alloc-model",
    Severity.ERROR,
    stage=Stage.REQUEST,
    needs={Need.EXPECT_MODEL},
    reads=(
        "the job's `--model` (`CLUSTERJOB_EXPECT_MODEL`) against `nvmlDeviceGetName` of each "
        "GPU, and of each MIG slice it was given (by GRES index or `MIG-` UUID; a site model "
        "per profile)"
    ),
    action=(
        "the job got other GPUs (or slices) than it asked for: gres.conf types or the map's "
        "`mig:` slices are out of date"
    ),
)
def alloc_model(facts: Facts) -> Iterator[Observation]:
    wanted = facts.expect_model or ""
    for s, gpu in facts.job_gpus:
        if gpu is None:
            continue  # no such slot: alloc-slot reports it
        found = facts.model_of(gpu)
        if found is None or found.casefold() != wanted.casefold():
            yield Observation(
                f"{facts.where(s, gpu.bus_id)}: job asked for {wanted}, was given "
                f"{facts.found_text(gpu)}",
                s,
                gpu.bus_id,
                wanted,
                gpu.name,
            )


@check(
    "alloc-mig",
    Severity.ERROR,
    stage=Stage.ALLOCATION,
    needs={Need.ALLOCATION},
    reads=(
        "the `MIG-` UUIDs in `CUDA_VISIBLE_DEVICES`, and the map's slices of the job's GRES "
        "indices, against `nvmlDeviceGetMigDeviceHandleByIndex` and each slice's "
        "`nvmlDeviceGetGpuInstanceId`"
    ),
    action=(
        "the slices changed under Slurm: recreate them as the map says, or fix the map and "
        "gres.conf, then restart slurmd"
    ),
)
def alloc_mig(facts: Facts) -> Iterator[Observation]:
    """Each MIG device of CUDA_VISIBLE_DEVICES must be a MIG device NVML lists on this node
    (by UUID, or the older MIG-GPU-<uuid>/<gpu instance>/<compute instance> form), and each
    GRES index the map makes a slice must be one NVML lists (by GPU instance, or position)."""
    migs = facts.allocation.mig_devices if facts.allocation is not None else ()
    if any(g.mig_current and g.mig_devices is None for g in facts.physical):
        return  # a GPU in MIG mode whose slices NVML could not list: unknown
    known = facts.mig_devices
    for text in migs:
        if any(names_mig(text, g, m) for g, m in known):
            continue
        listed = (
            f"{len(known)} MIG device(s) on this node, none of that name"
            if known
            else ("no MIG device on this node")
        )
        yield Observation(
            f"{facts.node}: CUDA_VISIBLE_DEVICES names {text}, but NVML lists {listed} -- the "
            "GPU's MIG slices changed under Slurm: check gres.conf (AutoDetect=nvml) and the "
            "node map",
            expected="a MIG device of this node",
            found=text,
        )
    for piece in facts.job_slices:
        unit = piece.unit
        if piece.device is not None or unit is None or not piece.gpu.mig_current:
            continue  # found, or MIG off (mig-mode says so)
        gi = f"GPU instance {unit.gpu_instance}" if unit.gpu_instance is not None else (
            f"slice {unit.slice}")  # fmt: skip
        yield Observation(
            f"{facts.where(unit.slot.slot, piece.gpu.bus_id)}: job was given {piece.named}, the "
            f"node map's {unit.profile} slice ({gi}), but NVML lists no such MIG device -- "
            "recreate the slices or fix the node map and gres.conf",
            unit.slot.slot,
            piece.gpu.bus_id,
            f"{unit.profile} ({gi})",
            "none",
        )


@check(
    "alloc-model", Severity.ERROR, stage=Stage.REQUEST, needs={Need.EXPECT_MODEL, Need.ALLOCATION}
)
def alloc_model_mig(facts: Facts) -> Iterator[Observation]:
    """Each MIG slice the job was given (a GRES index the map makes a slice, or a MIG UUID in
    CUDA_VISIBLE_DEVICES) is of the model (a site model per MIG profile, by the name NVML gives
    the slice) the job asked for. Slices NVML does not list are alloc-mig's."""
    wanted = facts.expect_model or ""
    for piece in facts.job_slices:
        mig = piece.device
        if mig is None:
            continue
        found = model_for_nvml_name(mig.name, facts.models)
        if found is not None and found.casefold() == wanted.casefold():
            continue
        gpu = piece.gpu
        named = piece.named if piece.named == mig.uuid else f"{piece.named} ({mig.uuid or '?'})"
        shown = f"{mig.name} ({found or 'not a model of this site'})"
        yield Observation(
            f"{facts.where(facts.slot_of(gpu), gpu.bus_id)}: job asked for {wanted}, was given "
            f"MIG device {named}: {shown}",
            facts.slot_of(gpu),
            gpu.bus_id,
            wanted,
            mig.name,
        )
