"""The Prolog's view of a site: cache hit/miss/invalidation, and a stdlib-only import."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterjob.errors import ConfigError
from clusterjob.resources import site_configs_dir
from clusterjob.site.nodemodel import NodeGpu, OnError
from clusterjob.site.nodeview import load_node_view

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def site_file(tmp_path: Path) -> Path:
    path = tmp_path / "mllab.yaml"
    shutil.copy(site_configs_dir() / "mllab.yaml", path)
    return path


def test_view_has_the_node_slots_models_and_policy(site_file: Path, tmp_path: Path) -> None:
    view = load_node_view(site_file, "ml-gpu05", tmp_path / "cache")
    assert view.site == "mllab" and view.node == "ml-gpu05" and view.source == site_file
    assert view.gpus is not None and [g.model for g in view.gpus] == [
        "V100",
        "V100",
        "A100",
        "A100",
    ]
    assert view.gpus[2] == NodeGpu(2, "A100", "0000:af:00.0")
    assert view.models == {"A100": ("NVIDIA A100-PCIE-40GB",), "V100": ("Tesla V100-SXM2-32GB",)}
    assert view.gres_types == {"A100": "a100", "V100": "v100"}
    assert view.prolog.on_error is OnError.DRAIN and view.prolog.deadline_seconds == 20
    assert view.model_for_nvml_name("tesla v100-sxm2-32gb") == "V100"


def test_cache_hit_equals_miss_and_skips_the_loader(site_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    miss = load_node_view(site_file, "ml-gpu01", cache)
    [entry] = cache.iterdir()
    assert json.loads(entry.read_text())["node"] == "ml-gpu01"
    # Prove the hit does not parse YAML: a poisoned entry with the right key is believed.
    data = json.loads(entry.read_text())
    data["site"] = "from-cache"
    entry.write_text(json.dumps(data))
    hit = load_node_view(site_file, "ml-gpu01", cache)
    assert hit.site == "from-cache"
    assert (hit.gpus, hit.models, hit.prolog) == (miss.gpus, miss.models, miss.prolog)


def test_changed_site_file_invalidates_the_cache(site_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_node_view(site_file, "ml-gpu01", cache)
    text = site_file.read_text().replace("deadline_seconds: 20", "deadline_seconds: 25")
    site_file.write_text(text)
    st = site_file.stat()
    os.utime(site_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert load_node_view(site_file, "ml-gpu01", cache).prolog.deadline_seconds == 25


def test_only_mtime_changed_still_reloads(site_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_node_view(site_file, "ml-gpu01", cache)
    [entry] = cache.iterdir()
    data = json.loads(entry.read_text())
    data["site"] = "stale"
    entry.write_text(json.dumps(data))
    st = site_file.stat()
    os.utime(site_file, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000))
    assert load_node_view(site_file, "ml-gpu01", cache).site == "mllab"


def test_torn_or_foreign_cache_entries_are_misses(site_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_node_view(site_file, "ml-gpu01", cache)
    [entry] = cache.iterdir()
    entry.write_text('{"format": 1, "key": [')
    assert load_node_view(site_file, "ml-gpu01", cache).site == "mllab"
    data = json.loads(entry.read_text())
    data["site"] = "planted"
    entry.write_text(json.dumps(data))
    entry.chmod(0o666)  # writable by anyone: not trusted
    assert load_node_view(site_file, "ml-gpu01", cache).site == "mllab"


def test_node_not_in_map_and_no_cache_dir(site_file: Path, tmp_path: Path) -> None:
    assert load_node_view(site_file, "login01", None).gpus is None
    assert load_node_view(site_file, "login01", tmp_path / "c").gpus is None
    assert load_node_view(site_file, "login01", tmp_path / "c").gpus is None


def test_invalid_or_missing_site_raises_config_error(tmp_path: Path) -> None:
    bad = Path(__file__).parent / "bad_configs" / "bus_order.yaml"
    with pytest.raises(ConfigError, match="bus_order.yaml:10: node_map"):
        load_node_view(bad, "n1", tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    with pytest.raises(ConfigError, match="cannot read: No such file"):
        load_node_view(tmp_path / "gone.yaml", "n1", tmp_path / "cache")


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return out.stdout


def test_importing_nodeview_pulls_in_no_heavy_modules(site_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_node_view(site_file, "ml-gpu01", cache)  # prime: the hit path must stay light too
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from clusterjob.site.nodeview import load_node_view\n"
        f"load_node_view(Path({str(site_file)!r}), 'ml-gpu01', Path({str(cache)!r}))\n"
        "heavy = ('ruamel', 'hostlist', 'typer', 'click', 'jinja2', 'rich', 'pynvml')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    assert _run(code).strip() == "[]"


def test_hit_path_timing_for_a_ten_thousand_node_site(tmp_path: Path) -> None:
    """The times are printed, not asserted (the machine is shared; compare with a bare
    interpreter). What is asserted: the miss validates the site (loader, ruamel, hostlist
    imported) and writes one entry; a hit imports none of them, leaves the entry as it is,
    and takes less time than the miss."""
    lines = [
        "site: big",
        "gpu_request: {syntax: gres, type_required: true}",
        "models:",
        "  H100: {gres_type: h100, nvml_names: ['NVIDIA H100 80GB HBM3']}",
        "node_map:",
    ]
    for start in range(0, 10_000, 100):
        lines += [f"  - nodes: gpu[{start:05d}-{start + 99:05d}]", "    gpus:"]
        for slot in range(8):
            lines.append(f"      - {{model: H100, bus_id: '0000:{0x18 + 16 * slot:02x}:00.0'}}")
    site = tmp_path / "big.yaml"
    site.write_text("\n".join(lines) + "\n")
    cache = tmp_path / "cache"
    call = (
        "from pathlib import Path\n"
        "from clusterjob.site.nodeview import load_node_view\n"
        f"v = load_node_view(Path({str(site)!r}), 'gpu04711', Path({str(cache)!r}))\n"
        "assert v.gpus is not None and len(v.gpus) == 8\n"
        "import sys\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ruamel', 'hostlist')\n"
        "             or m == 'clusterjob.site.loader'))\n"
    )

    def best_of(code: str, runs: int = 5) -> float:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            _run(code)
            times.append(time.perf_counter() - start)
        return min(times)

    start = time.perf_counter()
    slow_path = _run(call)  # miss: validates the site and writes the entry
    miss = time.perf_counter() - start
    assert "'clusterjob.site.loader'" in slow_path and "'ruamel" in slow_path
    [entry] = cache.iterdir()
    written = entry.stat()
    assert _run(call).strip() == "[]"  # a hit: the standard library and the cache only
    hit = best_of(call)
    bare = best_of("pass")
    print(
        f"\n10,000-node site: miss {miss * 1000:.0f} ms, hit {hit * 1000:.0f} ms, "
        f"python -c pass {bare * 1000:.0f} ms"
    )
    assert list(cache.iterdir()) == [entry]
    assert (entry.stat().st_ino, entry.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert hit < miss
