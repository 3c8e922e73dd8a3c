"""Which GPUs Slurm gave a job, read from the environment Slurm sets.

Slurm speaks three dialects, depending on where we run:

* ``SLURM_JOB_GPUS`` / ``SLURM_STEP_GPUS`` always hold *global* GRES indices (slot i of the
  node map is GRES index i).
* In the Prolog (root, outside any cgroup) ``CUDA_VISIBLE_DEVICES`` holds the same global
  indices.
* Inside a job with ``ConstrainDevices=yes``, ``CUDA_VISIBLE_DEVICES`` is renumbered
  ``0..n-1`` while ``SLURM_JOB_GPUS`` keeps the global indices.

``CUDA_VISIBLE_DEVICES`` may also name GPUs by UUID (``GPU-...``, or a unique prefix) or MIG
devices (``MIG-...``). Everything here is pure: environment in, ``Allocation`` out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum

from clusterjob.record import Record

__all__ = [
    "Allocation",
    "Context",
    "CudaDevice",
    "allocation_from_env",
    "parse_cuda_visible_devices",
    "parse_index_list",
    "task_cuda_visible_devices",
]


class Context(str, Enum):
    """Where the environment was read: it decides how ``CUDA_VISIBLE_DEVICES`` is numbered."""

    PROLOG = "prolog"  # root, outside the job's cgroup: every index is global
    JOB = "job"  # inside the job (TaskProlog, job script): CUDA indices may be renumbered


class CudaDevice(Record):
    """One entry of ``CUDA_VISIBLE_DEVICES``: an index, a GPU UUID (or prefix) or a MIG UUID."""

    __slots__ = ("text", "index", "uuid", "mig")

    text: str
    index: int | None
    uuid: str | None  # "GPU-..." (possibly a prefix, as CUDA accepts)
    mig: bool  # "MIG-..." or legacy "MIG-GPU-<uuid>/<gi>/<ci>"

    def __init__(
        self, text: str, index: int | None = None, uuid: str | None = None, mig: bool = False
    ) -> None:
        self._fill(text, index, uuid, mig)


class Allocation(Record):
    """The GPUs a job was given on this node, as far as the environment tells.

    ``slots`` are global GRES indices (== node-map slots, PCI order), in the order Slurm listed
    them; ``None`` when nothing in the environment names the job's GPUs by index (no GPUs
    requested, or only UUIDs). ``uuids`` holds GPU UUIDs when ``CUDA_VISIBLE_DEVICES`` names
    GPUs that way; the checks resolve them against the inventory.
    """

    __slots__ = (
        "slots",
        "source",
        "uuids",
        "mig_devices",
        "renumbered",
        "cuda_visible",
        "problems",
    )

    slots: tuple[int, ...] | None
    source: str  # the variable that gave ``slots``/``uuids``, or "" when none did
    uuids: tuple[str, ...]
    mig_devices: tuple[str, ...]
    renumbered: bool  # CUDA_VISIBLE_DEVICES is 0..n-1 inside a device cgroup
    cuda_visible: tuple[CudaDevice, ...] | None  # None: CUDA_VISIBLE_DEVICES unset
    problems: tuple[str, ...]  # things that could not be understood, one line each

    def __init__(
        self,
        slots: tuple[int, ...] | None,
        source: str,
        uuids: tuple[str, ...] = (),
        mig_devices: tuple[str, ...] = (),
        renumbered: bool = False,
        cuda_visible: tuple[CudaDevice, ...] | None = None,
        problems: tuple[str, ...] = (),
    ) -> None:
        self._fill(slots, source, uuids, mig_devices, renumbered, cuda_visible, problems)

    @property
    def known(self) -> bool:
        """True when the environment says which GPUs the job has (by index or by UUID)."""
        return self.slots is not None or bool(self.uuids) or bool(self.mig_devices)


_RANGE = re.compile(r"^(\d{1,9})(?:-(\d{1,9}))?$")
MAX_INDICES = 1024  # per node; far above any real node, far below what would stall the Prolog


def parse_index_list(text: str) -> tuple[int, ...]:
    """Parse ``"0,2"``, ``"0-3"``, ``"0-1,4"``; ``""`` is no GPUs. ValueError on anything else."""
    text = text.strip()
    if not text:
        return ()
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ValueError(f"not a GPU index list: {text!r}")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        if hi < lo:
            raise ValueError(f"descending range {part!r} in {text!r}")
        if len(out) + (hi - lo + 1) > MAX_INDICES:
            raise ValueError(f"more than {MAX_INDICES} GPU indices in {text[:40]!r}...")
        out.extend(range(lo, hi + 1))
    if len(set(out)) != len(out):
        raise ValueError(f"GPU index repeated in {text!r}")
    return tuple(out)


def parse_cuda_visible_devices(text: str) -> tuple[CudaDevice, ...]:
    """Split ``CUDA_VISIBLE_DEVICES`` the way CUDA reads it: entries up to the first bad one.

    CUDA silently ignores everything from the first entry it cannot parse (``NoDevFiles``,
    ``-1``); that is reproduced so our idea of "visible" matches CUDA's.
    """
    out: list[CudaDevice] = []
    for raw in text.split(","):
        entry = raw.strip()
        if entry.isdigit():
            out.append(CudaDevice(entry, index=int(entry)))
        elif entry.startswith("GPU-") and len(entry) > 4:
            out.append(CudaDevice(entry, uuid=entry))
        elif entry.startswith("MIG-") and len(entry) > 4:
            out.append(CudaDevice(entry, mig=True))
        else:
            break
    return tuple(out)


def _env_indices(environ: Mapping[str, str], name: str) -> tuple[tuple[int, ...] | None, str]:
    value = environ.get(name)
    if value is None:
        return None, ""
    try:
        return parse_index_list(value), ""
    except ValueError as exc:
        return None, f"{name}: {exc}"


def allocation_from_env(environ: Mapping[str, str], context: Context) -> Allocation:
    """The job's GPUs from Slurm's variables; never raises (problems are reported, not fatal).

    Preference: ``SLURM_STEP_GPUS`` (job context only: the step's own GPUs), then
    ``SLURM_JOB_GPUS``, then ``CUDA_VISIBLE_DEVICES``. Integer ``CUDA_VISIBLE_DEVICES`` counts
    as global only where it can be: in the Prolog, or when it equals the Slurm list.
    """
    problems: list[str] = []
    names = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS") if context is Context.JOB else ("SLURM_JOB_GPUS",)
    slots: tuple[int, ...] | None = None
    source = ""
    for name in names:
        found, problem = _env_indices(environ, name)
        if problem:
            problems.append(problem)
        if found is not None:
            slots, source = found, name
            break

    cvd_text = environ.get("CUDA_VISIBLE_DEVICES")
    cvd = parse_cuda_visible_devices(cvd_text) if cvd_text is not None else None
    uuids: tuple[str, ...] = ()
    migs: tuple[str, ...] = ()
    renumbered = False
    if cvd is not None:
        if cvd_text and cvd_text.strip() and len(cvd) < len(cvd_text.split(",")):
            problems.append(
                f"CUDA_VISIBLE_DEVICES={cvd_text}: CUDA stops reading at the first entry it "
                "cannot parse"
            )
        indices = tuple(d.index for d in cvd if d.index is not None)
        uuids = tuple(d.uuid for d in cvd if d.uuid is not None)
        migs = tuple(d.text for d in cvd if d.mig)
        if len(indices) == len(cvd) and cvd:
            if slots is None:
                if context is Context.PROLOG:
                    slots, source = indices, "CUDA_VISIBLE_DEVICES"
                else:
                    problems.append(
                        f"CUDA_VISIBLE_DEVICES={cvd_text} without SLURM_JOB_GPUS: cannot tell "
                        "global indices from cgroup-renumbered ones"
                    )
            elif set(indices) == set(slots):
                renumbered = False
            elif context is Context.JOB and sorted(indices) == list(range(len(slots))):
                renumbered = True
            else:
                problems.append(
                    f"CUDA_VISIBLE_DEVICES={cvd_text} does not match {source}="
                    f"{','.join(map(str, slots))}"
                )
        if uuids and not source:
            source = "CUDA_VISIBLE_DEVICES"
    return Allocation(
        slots=slots,
        source=source,
        uuids=uuids,
        mig_devices=migs,
        renumbered=renumbered,
        cuda_visible=cvd,
        problems=tuple(problems),
    )


def task_cuda_visible_devices(
    alloc: Allocation, uuid_bus_ids: Mapping[str, str] | None = None
) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` value that makes CUDA index i the job's i-th GPU in PCI order.

    Assumes ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (the TaskProlog exports it). Returns None when the
    current value is already right or cannot be improved safely. ``uuid_bus_ids`` maps GPU UUID
    -> PCI bus ID (from NVML) and is needed only when ``CUDA_VISIBLE_DEVICES`` names UUIDs.
    """
    cvd = alloc.cuda_visible
    if cvd is None or not cvd or alloc.mig_devices:
        return None  # unset (ambiguous), empty, or MIG devices: leave Slurm's value alone
    current = ",".join(d.text for d in cvd)
    if alloc.uuids:
        if uuid_bus_ids is None or len(alloc.uuids) != len(cvd):
            return None
        bus: dict[str, str] = {}
        for u in alloc.uuids:
            match = [b for full, b in uuid_bus_ids.items() if full.startswith(u)]
            if len(match) != 1:
                return None  # unknown or ambiguous prefix: CUDA will complain itself
            bus[u] = match[0]
        wanted = ",".join(sorted(alloc.uuids, key=lambda u: bus[u]))
        return None if wanted == current else wanted
    if alloc.slots is None:
        return None
    indices = [d.index for d in cvd if d.index is not None]
    if alloc.renumbered:
        wanted = ",".join(str(i) for i in range(len(indices)))
    elif set(indices) == set(alloc.slots):
        wanted = ",".join(str(i) for i in sorted(indices))
    else:
        return None
    return None if wanted == current else wanted
