"""``site init --probe``: the PCI bus order of each node configuration, read by one tiny job.

Slurm does not say which GPU sits at which PCI address, NVML on the node does. Nodes alike in
GRES, features, CPUs, memory and partitions are one configuration; one job per configuration
(``--nodelist`` one usable node of it, a short time limit, all of the node's GPUs asked for so
that NVML sees them) runs ``clusterjob site probe --json`` there, and its answer fills the node
map entry of every node of that configuration. ``--all-nodes`` makes each node a
configuration. Jobs that do not start within the timeout are cancelled and their nodes listed
as not probed; what was probed is kept.

The planning (``node_configurations``, ``pick_node``, ``probe_script``, ``apply_probes``) is
pure; ``run_probe_jobs`` submits, polls and cancels through ``SlurmClient``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import hostlist

from clusterjob import envvars
from clusterjob.errors import SlurmError
from clusterjob.slurm.commands import COMMENT_PREFIX, SlurmClient
from clusterjob.slurm.describe import GpuLayout, node_features, node_gpus
from clusterjob.slurm.parse import NodeRecord, is_final, normalise_state

JOB_NAME = "clusterjob-site-probe"
JOB_TIME_MINUTES = 3
POLL_SECONDS = 2.0
# Node states a job cannot start in (scontrol's base state or one of its flags).
UNUSABLE = frozenset(
    {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "FUTURE", "NOT_RESPONDING",
     "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "MAINTENANCE", "MAINT", "REBOOT_REQUESTED",
     "REBOOT_ISSUED", "UNKNOWN", "INVALID_REG", "INVALID"}
)  # fmt: skip


@dataclass(frozen=True)
class NodeConfig:
    """Nodes one probe job answers for: the same GPUs, features, CPUs, memory, partitions."""

    layout: int  # index of its GpuLayout (and of the node map entry site init wrote for it)
    nodes: tuple[str, ...]
    gpus: tuple[tuple[str | None, int], ...]
    partitions: tuple[str, ...]

    @property
    def hostlist(self) -> str:
        return str(hostlist.collect_hostlist(list(self.nodes)))


@dataclass(frozen=True)
class ProbedGpu:
    nvml_name: str
    bus_id: str


@dataclass(frozen=True)
class ProbeOutcome:
    """One configuration's answer: the GPUs in PCI bus order, or why there is none."""

    config: NodeConfig
    node: str | None  # the node the job ran (or was to run) on
    job_id: str | None
    gpus: tuple[ProbedGpu, ...] | None  # None: not probed
    reason: str = ""


@dataclass
class ProbeProgress:
    """What the caller shows while jobs run: one event at a time, with the counts so far."""

    total: int
    done: int = 0
    running: int = 0
    pending: int = 0
    events: list[str] = field(default_factory=list)


def node_configurations(
    nodes: Sequence[NodeRecord], layouts: Sequence[GpuLayout], *, each_node: bool = False
) -> list[NodeConfig]:
    """The configurations of the GPU nodes, in node order; each node alone with
    ``each_node``."""
    layout_of = {n: i for i, layout in enumerate(layouts) for n in layout.nodes}
    groups: dict[tuple[object, ...], list[NodeRecord]] = {}
    for node in nodes:
        if node.name not in layout_of:
            continue
        key: tuple[object, ...] = (
            layout_of[node.name],
            node_gpus(node),
            tuple(sorted(node_features(node))),
            node.raw.get("CPUTot", ""),
            node.raw.get("RealMemory", ""),
            tuple(sorted(node.partitions)),
        )
        if each_node:
            key = (*key, node.name)
        groups.setdefault(key, []).append(node)
    return [
        NodeConfig(
            layout=layout_of[members[0].name],
            nodes=tuple(n.name for n in members),
            gpus=node_gpus(members[0]),
            partitions=members[0].partitions,
        )
        for members in groups.values()
    ]


def _unusable(node: NodeRecord) -> str | None:
    words = {node.state.upper(), *(f.upper() for f in node.flags)}
    bad = sorted(words & UNUSABLE)
    if not bad and not node.drained:
        return None
    said = "+".join(bad) or "DRAIN"
    return f"{said}: {node.reason}" if node.reason else said


def pick_node(config: NodeConfig, records: Sequence[NodeRecord]) -> tuple[str | None, str]:
    """The node of ``config`` a probe job is pinned to: an idle one first, then one with
    free room (MIXED), then a busy one; (None, why) when every node is down or drained."""
    by_name = {r.name: r for r in records}
    usable = [by_name[n] for n in config.nodes if n in by_name and _unusable(by_name[n]) is None]
    if not usable:
        why = sorted({_unusable(by_name[n]) or "unknown" for n in config.nodes if n in by_name})
        return None, "no usable node (" + "; ".join(why or ["not listed by Slurm"]) + ")"
    rank = {"IDLE": 0, "MIXED": 1}
    best = min(usable, key=lambda r: rank.get(r.state.upper(), 2))
    return best.name, ""


def gpu_option(gpus: Sequence[tuple[str | None, int]], syntax: str) -> str:
    """All of a node's GPUs, asked for in ``syntax`` (so NVML in the job sees every one)."""
    typed = [f"{t}:{n}" if t else str(n) for t, n in gpus]
    if syntax in ("gpus-per-node", "gpus"):
        return f"--{syntax}=" + ",".join(typed)
    if any(t is None for t, _ in gpus):  # untyped GRES: one count for them all
        return f"--gres=gpu:{sum(n for _, n in gpus)}"
    return "--gres=" + ",".join(f"gpu:{t}" for t in typed)


def probe_script(
    config: NodeConfig,
    node: str,
    partition: str | None,
    *,
    syntax: str,
    token: str,
    directory: Path,
    node_command: Sequence[str],
    site_file: Path,
) -> str:
    """The probe job: pinned to ``node``, all its GPUs, a few minutes, one CPU; its stdout
    (``ID.out`` in ``directory``) is ``site probe --json``'s answer."""
    import shlex

    lines = [
        f"--job-name={JOB_NAME}",
        f"--nodelist={node}",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=1",
        "--mem=1G",
        f"--time={JOB_TIME_MINUTES}",
        gpu_option(config.gpus, syntax),
        f"--output={directory}/%j.out",
        f"--error={directory}/%j.err",
        f"--comment={COMMENT_PREFIX}{token}",
    ]
    if partition:
        lines.insert(2, f"--partition={partition}")
    command = [*node_command, "site", "probe", "--json", "--node", node, "--site", str(site_file)]
    return (
        "#!/bin/sh\n"
        "# Written by `clusterjob site init --probe`: this node's GPUs in PCI bus order.\n"
        + "".join(f"#SBATCH {line}\n" for line in lines)
        + "exec "
        + " ".join(shlex.quote(str(w)) for w in command)
        + "\n"
    )


def parse_probe_output(text: str) -> tuple[ProbedGpu, ...]:
    """``site probe --json``'s answer as (NVML name, bus ID) in PCI bus order."""
    record = json.loads(text)
    gpus = record["gpus"]
    return tuple(ProbedGpu(str(g.get("nvml_name") or ""), str(g["bus_id"])) for g in gpus)


def probe_dir() -> Path:
    """Where probe jobs write: under the user's data dir, which the nodes share with the
    login node as the home does (``$CLUSTERJOB_DATA_DIR``, else ``$XDG_DATA_HOME/clusterjob``,
    ``~/.local/share/clusterjob``)."""
    base = os.environ.get(envvars.DATA_DIR) or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share"),
        "clusterjob",
    )
    os.makedirs(base, mode=0o700, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="site-probe-", dir=base))


@dataclass(frozen=True)
class ProbeJobs:
    """How ``site init --probe`` runs its jobs."""

    timeout: float = 300.0  # seconds for every job to start and end; then the rest is cancelled
    each_node: bool = False
    node_command: tuple[str, ...] = (sys.executable, "-m", "clusterjob")
    progress: Callable[[ProbeProgress], None] | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def _partition_for(config: NodeConfig, partitions: Sequence[tuple[str, bool]]) -> str | None:
    """The default partition if it holds the node, else the first listed that does."""
    mine = [name for name, _ in partitions if name in config.partitions]
    default = [name for name, is_default in partitions if is_default and name in mine]
    chosen = default or mine
    return chosen[0] if chosen else None


def run_probe_jobs(
    client: SlurmClient,
    configs: Sequence[NodeConfig],
    records: Sequence[NodeRecord],
    *,
    syntax: str,
    partitions: Sequence[tuple[str, bool]],
    site_text: str,
    options: ProbeJobs,
) -> list[ProbeOutcome]:
    """One job per configuration; their answers, or why each configuration has none."""
    progress = ProbeProgress(total=len(configs))

    def tell(event: str) -> None:
        progress.events.append(event)
        if options.progress is not None:
            options.progress(progress)

    directory = probe_dir()
    site_file = directory / "site.yaml"
    site_file.write_text(site_text, encoding="utf-8")
    outcomes: dict[int, ProbeOutcome] = {}
    jobs: dict[str, tuple[int, str]] = {}  # job id -> (config index, node)
    try:
        for i, config in enumerate(configs):
            node, why = pick_node(config, records)
            if node is None:
                outcomes[i] = ProbeOutcome(config, None, None, None, why)
                progress.done += 1
                tell(f"{config.hostlist}: not probed, {why}")
                continue
            token = secrets.token_hex(8)
            script = probe_script(
                config, node, _partition_for(config, partitions), syntax=syntax, token=token,
                directory=directory, node_command=options.node_command, site_file=site_file,
            )  # fmt: skip
            path = directory / f"probe-{i}.sh"
            path.write_text(script, encoding="utf-8")
            try:
                job = client.sbatch(path, token=token, workdir=directory, script=script)
            except SlurmError as exc:
                said = (exc.stderr or str(exc)).strip().splitlines()
                outcomes[i] = ProbeOutcome(
                    config, node, None, None, f"sbatch refused: {said[-1] if said else exc}"
                )
                progress.done += 1
                tell(f"{config.hostlist}: not probed, sbatch refused the job")
                continue
            jobs[job.job_id] = (i, node)
            progress.pending += 1
            tell(f"{config.hostlist}: job {job.job_id} submitted on {node}")
        _wait(client, jobs, outcomes, configs, directory, options, progress, tell)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return [outcomes[i] for i in range(len(configs))]


def _wait(
    client: SlurmClient,
    jobs: dict[str, tuple[int, str]],
    outcomes: dict[int, ProbeOutcome],
    configs: Sequence[NodeConfig],
    directory: Path,
    options: ProbeJobs,
    progress: ProbeProgress,
    tell: Callable[[str], None],
) -> None:
    deadline = options.clock() + options.timeout
    states: dict[str, str] = {}
    waiting = dict(jobs)
    while waiting:
        seen = {j.job_id: j for j in client.squeue_jobs(waiting)}
        for job_id, (i, node) in list(waiting.items()):
            job = seen.get(job_id)
            state = normalise_state(job.state) if job is not None else "GONE"
            held = job is not None and state == "PENDING" and "held" in (job.reason or "").lower()
            if held and job is not None:  # a Prolog that failed requeues and holds the job
                client.scancel([job_id])
                del waiting[job_id]
                states.pop(job_id, None)
                outcomes[i] = ProbeOutcome(
                    configs[i], node, job_id, None,
                    f"job {job_id} held ({job.reason}): the node's Prolog refused it, or an "
                    "admin holds it; cancelled",
                )  # fmt: skip
                progress.done += 1
                progress.running = sum(1 for s in states.values() if s == "RUNNING")
                progress.pending = len(waiting) - progress.running
                tell(f"{configs[i].hostlist}: job {job_id} held ({job.reason}), cancelled")
                continue
            if job is not None and not is_final(job.state):
                if state != states.get(job_id):
                    states[job_id] = state
                    progress.running = sum(1 for s in states.values() if s == "RUNNING")
                    progress.pending = len(waiting) - progress.running
                    tell(f"{configs[i].hostlist}: job {job_id} {state.lower()} on {node}")
                continue
            del waiting[job_id]
            states.pop(job_id, None)
            outcomes[i] = _answer(configs[i], node, job_id, state, directory)
            progress.done += 1
            progress.running = sum(1 for s in states.values() if s == "RUNNING")
            progress.pending = len(waiting) - progress.running
            count = len(outcomes[i].gpus or ())
            said = outcomes[i].reason or f"{count} GPU{'' if count == 1 else 's'} read"
            tell(f"{configs[i].hostlist}: job {job_id} on {node}: {said}")
        if not waiting:
            break
        if options.clock() >= deadline:
            client.scancel(list(waiting))
            for job_id, (i, node) in waiting.items():
                state = states.get(job_id, "PENDING").lower()
                job = seen.get(job_id)
                why = f" ({job.reason})" if job is not None and job.reason else ""
                outcomes[i] = ProbeOutcome(
                    configs[i], node, job_id, None,
                    f"job {job_id} still {state}{why} after {options.timeout:g} s: cancelled",
                )  # fmt: skip
                progress.done += 1
                tell(f"{configs[i].hostlist}: job {job_id} cancelled ({state} after "
                     f"{options.timeout:g} s)")  # fmt: skip
            progress.running = progress.pending = 0
            return
        options.sleep(POLL_SECONDS)


def _answer(
    config: NodeConfig, node: str, job_id: str, state: str, directory: Path
) -> ProbeOutcome:
    out = directory / f"{job_id}.out"
    try:
        gpus = parse_probe_output(out.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        try:
            err = (directory / f"{job_id}.err").read_text(encoding="utf-8").strip().splitlines()
        except OSError:
            err = []
        said = err[-1] if err else "no answer in its output"
        return ProbeOutcome(config, node, job_id, None, f"job {job_id} {state.lower()}: {said}")
    return ProbeOutcome(config, node, job_id, gpus)


# --- the answers in the node map -----------------------------------------------------------


def not_probed_lines(outcomes: Sequence[ProbeOutcome]) -> list[str]:
    """One line per configuration left without bus IDs: its nodes and why."""
    return [f"{o.config.hostlist}: {o.reason}" for o in outcomes if o.gpus is None]
