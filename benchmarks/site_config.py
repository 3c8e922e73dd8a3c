"""Site config scale: load + validate time and peak memory for a 10,000-node site.

Each load runs in a fresh child (so ru_maxrss is that load's own peak): once timed, once
under tracemalloc for the Python-level peak. Time is reported against loading a 10-node
site in the same run; memory against the child's resident size before the load.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from benchmarks.common import PYTHON, Result, median
from benchmarks.sitegen import write_site

COLD_LIMIT_S = 1.0  # a 10,000-node site written one entry per node, no cache of any kind

CHILD = """\
import json, resource, sys, time, tracemalloc
from pathlib import Path
if sys.argv[3] == "cache":
    from clusterjob.site.sitecache import load_site
else:
    from clusterjob.site.loader import load_site
path, traced = Path(sys.argv[1]), sys.argv[2] == "1"
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if traced:
    tracemalloc.start()
start = time.perf_counter()
site = load_site(path)
seconds = time.perf_counter() - start
peak = tracemalloc.get_traced_memory()[1] if traced else None
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "rss_before_kib": before, "rss_after_kib": after,
                  "traced_peak": peak, "nodes": len(site.node_map.nodes)}))
"""


def _child(path: Path, traced: bool, cache: Path | None = None) -> dict:
    """One load in a fresh process: the loader itself, or (``cache``: its XDG_CACHE_HOME)
    through the user's site cache, as the commands load a site."""
    env = dict(os.environ, XDG_CACHE_HOME=str(cache)) if cache else None
    done = subprocess.run(
        [PYTHON, "-c", CHILD, str(path), "1" if traced else "0", "cache" if cache else "loader"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(done.stdout)


def run(work: Path, *, quick: bool) -> Result:
    result = Result("site_config", "Site config: load + validate, peak memory")
    big = 1_000 if quick else 10_000
    repeats = 1 if quick else 3
    cases = [(10, "hostlist"), (big, "hostlist"), (big if not quick else 100, "individual")]
    base_time = None
    for n, style in cases:
        path, _ = write_site(work / "config-sites", n, style)
        runs = [_child(path, traced=False) for _ in range(repeats if style == "hostlist" else 1)]
        seconds = median([r["seconds"] for r in runs])
        rss = runs[0]["rss_after_kib"] - runs[0]["rss_before_kib"]
        if base_time is None:
            base_time = seconds
        size = path.stat().st_size
        goal = style == "individual" and n == big and not quick  # cold: a fresh process
        result.add(
            f"load + validate, {n:,}-node site ({style}, {size / 1024:,.0f} KiB)",
            seconds * 1000,
            "ms",
            ratio=seconds / base_time,
            reference="load + validate, 10-node site",
            target=f"<= {COLD_LIMIT_S * 1000:,.0f} ms" if goal else None,
            met=seconds <= COLD_LIMIT_S if goal else None,
            note=f"median of {len(runs)}; {len(path.read_text().splitlines()):,} lines",
        )
        result.add(
            f"peak RSS growth during the load, {n:,}-node ({style})",
            rss / 1024,
            "MiB",
            ratio=runs[0]["rss_after_kib"] / runs[0]["rss_before_kib"],
            reference="child RSS before the load (interpreter + loader imports)",
        )
        if n == big or quick:
            traced = _child(path, traced=True)
            result.add(
                f"tracemalloc peak, {n:,}-node ({style})",
                traced["traced_peak"] / 2**20,
                "MiB",
                ratio=traced["traced_peak"] / size,
                reference="size of the site file",
            )
    # what a user's second command pays: the site read back from their cache
    path, _ = write_site(work / "config-sites", big if not quick else 100, "individual")
    cache = work / "xdg-cache"
    _child(path, traced=False, cache=cache)  # fills it (the cold load above, again)
    again = median([_child(path, traced=False, cache=cache)["seconds"] for _ in range(repeats)])
    result.add(
        f"load from the user's site cache, {big if not quick else 100:,}-node site (individual)",
        again * 1000,
        "ms",
        ratio=again / base_time if base_time else None,
        reference="load + validate, 10-node site",
        note=f"median of {repeats}; a command after the first (clusterjob.site.sitecache)",
    )
    return result
