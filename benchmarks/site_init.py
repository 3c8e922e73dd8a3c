"""``clusterjob site init``: its readings over a big cluster, and the Slurm calls it makes.

A generated ``scontrol show node -o -d`` of 1,000 nodes in 50 GPU configurations (typed,
autodetected, MIG and untyped-with-feature GRES; 12 partitions) goes through the parsers and
the description (``parse_scontrol_nodes``, ``plan_site``, ``render``, the loader's
validation), interleaved with the same for a 50-node listing (one node per configuration):
the ratio says how the work grows with the nodes. With a Slurm on hand, one ``site init`` is
run with logging wrappers on PATH, and its Slurm calls counted (target: at most 4).
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import Result, clusterjob_command, interleaved_runs, median
from benchmarks.slurm_load import count_calls, wrap_clients

TARGET_CALLS = 4
NODES = 1_000
CONFIGURATIONS = 50
SCALE_LIMIT = 2 * NODES / CONFIGURATIONS  # linear in the nodes, with room for noise

_TYPES = (
    "a100", "v100", "h100", "nvidia_a100-sxm4-80gb", "nvidia_h100_80gb_hbm3", "l40s", "h200",
    "a100_3g.20gb", "a100_1g.5gb", "gh200", "mi250x_like", None,
)  # fmt: skip
_FEATURES = ("a100", "h100", "v100-32g", "ib", "nvme")


def configurations(count: int = CONFIGURATIONS, seed: int = 7) -> list[tuple[str, str]]:
    """(Gres=, AvailableFeatures=) of ``count`` distinct GPU configurations."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    while len(out) < count:
        types = rng.sample(_TYPES, rng.randint(1, 2))
        items = []
        for t in types:
            n = rng.choice((1, 2, 4, 8))
            items.append(f"gpu:{n}(S:0-1)" if t is None else f"gpu:{t}:{n}(S:0-1)")
        features = ",".join(sorted(set(rng.sample(_FEATURES, rng.randint(0, 2)))))
        if None in types and not features:
            features = "a100"
        config = (",".join(items) + ",pfsdir:scratch:no_consume:1", features or "(null)")
        if config not in seen:
            seen.add(config)
            out.append(config)
    return out


def node_listing(nodes: int, configs: list[tuple[str, str]]) -> tuple[str, str]:
    """``scontrol show node -o -d`` and ``scontrol show partition -o`` of ``nodes`` nodes
    (node i has configuration i mod len(configs); 12 partitions of consecutive racks)."""
    lines = []
    for i in range(nodes):
        gres, features = configs[i % len(configs)]
        part = f"p{i * 12 // nodes:02d}"
        lines.append(
            f"NodeName=n{i:05d} Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUTot=64 "
            f"AvailableFeatures={features} ActiveFeatures={features} Gres={gres} "
            f"GresDrain=N/A GresUsed=gpu:0(IDX:N/A) NodeAddr=n{i:05d} NodeHostName=n{i:05d} "
            f"Version=24.11.5 OS=Linux 6.1.0 #1 SMP RealMemory=512000 State=IDLE "
            f"Partitions={part},all CfgTRES=cpu=64,mem=500G"
        )
    parts = []
    per = nodes // 12
    for p in range(12):
        last = nodes - 1 if p == 11 else (p + 1) * per - 1
        default = "YES" if p == 0 else "NO"
        parts.append(
            f"PartitionName=p{p:02d} AllowGroups=ALL AllowQos=ALL Default={default} "
            f"DefaultTime=NONE MaxNodes=UNLIMITED MaxTime={p + 1}-00:00:00 "
            f"Nodes=n[{p * per:05d}-{last:05d}] OverSubscribe=NO State=UP"
        )
    parts.append(
        "PartitionName=all Default=NO MaxTime=UNLIMITED Nodes=ALL OverSubscribe=NO State=UP"
    )
    return "\n".join(lines) + "\n", "\n".join(parts) + "\n"


def _describe(nodes: str, partitions: str) -> Callable[[], object]:
    from clusterjob.site.init import ClusterFacts, describe
    from clusterjob.slurm import parse

    def run() -> object:
        facts = ClusterFacts(
            tuple(parse.parse_scontrol_nodes(nodes)),
            tuple(parse.parse_scontrol_partitions(partitions)),
            {"ClusterName": "bench", "SLURM_VERSION": "24.11.5"},
            (),
        )
        result = describe(facts)
        if result.site is None:
            raise RuntimeError(f"site init's file does not load: {result.issues[:3]}")
        return result

    return run


def _parse_only(nodes: str) -> Callable[[], object]:
    from clusterjob.slurm import parse

    return lambda: parse.parse_scontrol_nodes(nodes)


def _timed(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    for fn in runs.values():
        fn()  # warm: imports, regex caches
    timed = {name: functools.partial(_seconds, fn) for name, fn in runs.items()}
    return {n: median(t) for n, t in interleaved_runs(timed, repeats, random.Random(1)).items()}


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(work: Path, *, quick: bool) -> Result:
    result = Result("site_init", "`site init` over a 1,000-node cluster, and its Slurm calls")
    configs = configurations()
    big = node_listing(NODES, configs)
    small = node_listing(CONFIGURATIONS, configs)
    repeats = 3 if quick else 15
    medians = _timed(
        {
            "big": _describe(*big),
            "small": _describe(*small),
            "parse_big": _parse_only(big[0]),
            "parse_small": _parse_only(small[0]),
        },
        repeats,
    )
    reference = f"the same for {CONFIGURATIONS} nodes (one per configuration)"
    result.compared(
        f"parse `scontrol show node`, {NODES:,} nodes",
        medians["parse_big"],
        reference,
        medians["parse_small"],
        limit=SCALE_LIMIT,
        note=f"{len(big[0]) // 1024} KiB of output",
    )
    result.compared(
        f"describe (parse, plan, render, validate), {NODES:,} nodes in {CONFIGURATIONS} "
        "configurations",
        medians["big"],
        reference,
        medians["small"],
        limit=SCALE_LIMIT,
        note=f"{NODES // CONFIGURATIONS}x the nodes; linear is {NODES // CONFIGURATIONS}x",
    )
    result.notes.append(f"median of {repeats} interleaved runs in one process")
    _count_calls(result, work)
    return result


def _count_calls(result: Result, work: Path) -> None:
    conf = os.environ.get("SLURM_CONF", "")
    if shutil.which("scontrol") is None or not (conf and Path(conf).is_file()):
        result.notes.append("Slurm calls not counted: no Slurm (scontrol, SLURM_CONF) here")
        return
    log = work / "slurm-calls.log"
    bin_dir = work / "slurm-wrappers"
    wrap_clients(bin_dir, log)
    real = shutil.which("sacctmgr")
    if real is not None:
        wrapper = bin_dir / "sacctmgr"
        wrapper.write_text(f'#!/bin/sh\necho "sacctmgr" >> "{log}"\nexec "{real}" "$@"\n')
        wrapper.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(
        [*clusterjob_command(), "site", "init"], env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    counts = count_calls(log)
    calls = sum(counts.values())
    note = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no Slurm call"
    result.add(
        "Slurm calls, one `site init` on the local cluster",
        calls,
        "calls",
        target=f"<= {TARGET_CALLS}",
        met=calls <= TARGET_CALLS and done.returncode == 0,
        note=note + (f"; exit {done.returncode}: {done.stderr.strip()}" if done.returncode else ""),
    )
