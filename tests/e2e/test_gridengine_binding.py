"""GPU binding on the running Grid Engine sandbox (`clusterjob sandbox up --scheduler
gridengine`): Grid Engine counts GPUs but names none, so `clusterjob bind-gpus` does.

Two 2-GPU jobs forced onto one 4-GPU host run at the same time and see disjoint
CUDA_VISIBLE_DEVICES, whether the root prolog claims them or (no prolog) the job's first
step; a job asking a100 that lands on a host the node map says holds V100s is stopped by the
prolog (exit 100: error state) and never runs.

clusterjob is installed for the sandbox's own python3 in a folder under /tmp (seen inside),
as a site installs it on its hosts; the queue's prolog and epilog are set for the test and
restored after it. Other users share this Grid Engine: the hook scripts act only on this
test's jobs (by job name) and exit 0 for every other job.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import clusterjob
from clusterjob.sandbox import gridengine
from clusterjob.workstation import claims

pytestmark = pytest.mark.gridengine

# host1's four a100 stand-ins; the map says host2 has V100s (its gpu_type complex: a100).
SITE = """\
site: gesandbox
scheduler: gridengine
models:
  A100: {aliases: [a100], gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"], memory_gb: 80}
  V100: {aliases: [v100], gres_type: v100, nvml_names: ["Tesla V100-SXM2-32GB"], memory_gb: 32}
partitions:
  all.q: {nodes: "host[1-3]", default: true}
node_map:
  - nodes: host1
    gpus:
      - {model: A100, bus_id: "0000:10:00.0"}
      - {model: A100, bus_id: "0000:20:00.0"}
      - {model: A100, bus_id: "0000:30:00.0"}
      - {model: A100, bus_id: "0000:40:00.0"}
  - nodes: "host[2-3]"
    gpus:
      - {model: V100, bus_id: "0000:10:00.0"}
      - {model: V100, bus_id: "0000:20:00.0"}
"""
PREFIX = "cjbind-"  # the jobs the root prolog acts on; "cjstep-" jobs bind in their own step
HOOK = """#!/bin/sh
# Only this test's jobs (others share this Grid Engine).
case "$JOB_NAME" in {prefix}*) ;; *) exit 0 ;; esac
PYTHONPATH={lib} exec /usr/bin/python3 -m clusterjob {command} --site {site}
"""
JOB = """#!/bin/sh
gpus=$(PYTHONPATH={lib} CLUSTERJOB_SITE={site} /usr/bin/python3 -m clusterjob bind-gpus \\
    --job-step --gpus 2 --model a100 --watch-pid $$) || exit 3
eval "$gpus"
echo "host=$(hostname) cvd=$CUDA_VISIBLE_DEVICES order=$CUDA_DEVICE_ORDER start=$(date +%s.%N)"
sleep 6
echo "end=$(date +%s.%N)"
"""


@contextlib.contextmanager
def _sandbox(private: Path) -> Iterator[gridengine.Layout]:
    """The running sandbox; where it is not (fully) up and its root is built, one of our own
    in ``private`` (its own namespaces, beside the other), taken down after."""
    lay = gridengine.layout(None)
    if gridengine.holder_pid(lay) is not None and gridengine.status(lay).up:
        yield lay
        return
    own = gridengine.layout(private)
    if os.geteuid() != 0 or not (own.root / ".clusterjob-root").exists():
        pytest.skip(
            "the Grid Engine sandbox is not up (clusterjob sandbox up --scheduler gridengine)"
        )
    try:
        yield gridengine.up(private, timeout=240).layout
    finally:
        gridengine.down(private, purge=True)


def _install(dest: Path) -> Path:
    """clusterjob and what its node path imports, for the sandbox's python3 (3.11, as ours)."""
    lib = dest / "lib"
    package = Path(clusterjob.__file__).parent
    shutil.copytree(package, lib / "clusterjob", ignore=shutil.ignore_patterns("__pycache__"))
    site_packages = Path(next(p for p in sys.path if p.endswith("site-packages")))
    compiled = glob.glob("_ruamel_yaml*.so", root_dir=site_packages)
    for name in ("ruamel", "hostlist.py", "pynvml.py", *compiled):
        src = site_packages / name
        if src.is_dir():
            shutil.copytree(src, lib / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, lib / name)
    return lib


@pytest.fixture(scope="module")
def ge() -> Iterator[tuple[gridengine.Layout, Path, Path]]:
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the sandbox's python3 is 3.11: clusterjob's compiled dependencies must match")
    dest = Path(tempfile.mkdtemp(prefix="cj-gpubind-", dir="/tmp"))  # /tmp: seen inside
    try:
        with _sandbox(dest / "state") as lay:  # a sandbox of our own is down before rmtree
            yield from _configured(lay, dest)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def _configured(
    lay: gridengine.Layout, dest: Path
) -> Iterator[tuple[gridengine.Layout, Path, Path]]:
    dest.chmod(0o755)
    lib = _install(dest)
    site = dest / "site.yaml"
    site.write_text(SITE)
    for command, name in (("bind-gpus", "prolog"), ("release-gpus", "epilog")):
        hook = dest / name
        hook.write_text(HOOK.format(prefix=PREFIX, lib=lib, command=command, site=site))
        hook.chmod(0o755)
    before = {
        key: gridengine.qconf(lay, "-sq", gridengine.QUEUE).stdout.split(f"\n{key}", 1)[1]
        .split("\n", 1)[0].strip()
        for key in ("prolog", "epilog")
    }  # fmt: skip
    try:
        for key in ("prolog", "epilog"):
            gridengine.qconf(lay, "-mattr", "queue", key, f"root@{dest / key}", gridengine.QUEUE)
        yield lay, dest, lib
    finally:
        for key, value in before.items():
            gridengine.qconf(lay, "-mattr", "queue", key, value, gridengine.QUEUE, check=False)


def _qsub(lay: gridengine.Layout, cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [str(lay.bin_dir / "qsub"), "-cwd", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split("Your job ", 1)[1].split()[0]


def _qstat_j(lay: gridengine.Layout, job_id: str) -> str:
    return subprocess.run(
        [str(lay.bin_dir / "qstat"), "-j", job_id],
        cwd="/tmp", capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip


def _wait_for(path: Path, text: str, seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with contextlib.suppress(OSError):
            found = path.read_text()
            if text in found:
                return found
        time.sleep(0.5)
    raise AssertionError(f"{path} has no {text!r} after {seconds:.0f}s")


@pytest.mark.parametrize("prefix", [PREFIX, "cjstep-"], ids=["root-prolog", "job-step"])
def test_two_jobs_on_one_host_run_together_on_disjoint_gpus(
    ge: tuple[gridengine.Layout, Path, Path], prefix: str
) -> None:
    lay, dest, lib = ge
    script = dest / "two.sh"
    script.write_text(JOB.format(lib=lib, site=dest / "site.yaml"))
    ids = [
        _qsub(lay, dest, "-N", f"{prefix}{n}", "-l", "gpu=2,gpu_type=a100,h=host1", str(script))
        for n in "ab"
    ]
    try:
        outputs = [
            _wait_for(dest / f"{prefix}{n}.o{i}", "end=", 120)
            for n, i in zip("ab", ids, strict=True)
        ]
    finally:
        subprocess.run([str(lay.bin_dir / "qdel"), *ids], cwd="/tmp", capture_output=True)
    # the job's own lines (the root prolog's line, when it ran, comes first in the same file)
    seen = [
        dict(w.split("=", 1) for line in out.splitlines() if line.startswith(("host=", "end="))
             for w in line.split())
        for out in outputs
    ]  # fmt: skip
    if prefix == PREFIX:
        assert all("clusterjob: job " in out for out in outputs), outputs
    assert [s["host"] for s in seen] == ["host1", "host1"], outputs
    assert [s["order"] for s in seen] == ["PCI_BUS_ID", "PCI_BUS_ID"], outputs
    devices = [set(s["cvd"].split(",")) for s in seen]
    assert all(len(d) == 2 for d in devices) and not devices[0] & devices[1], outputs
    # at the same time: each started before the other ended
    assert float(seen[0]["start"]) < float(seen[1]["end"]), outputs
    assert float(seen[1]["start"]) < float(seen[0]["end"]), outputs
    # and freed after (the epilog, or the holder seeing the job gone): their bindings go.
    # Inside, /var/lock leads to an empty /run: the lock dir is the /tmp one, seen here too.
    bindings = [claims.FALLBACK_LOCK_DIR / f"job-{i}.gpus" for i in ids]
    end = time.monotonic() + 30
    while time.monotonic() < end and any(b.exists() for b in bindings):
        time.sleep(0.5)
    assert not any(b.exists() for b in bindings)


def test_a100_job_on_a_host_the_node_map_says_is_v100_is_stopped_by_the_prolog(
    ge: tuple[gridengine.Layout, Path, Path],
) -> None:
    lay, dest, lib = ge
    script = dest / "wrong.sh"
    script.write_text(f"#!/bin/sh\ntouch {dest}/wrong.ran\n")
    job_id = _qsub(lay, dest, "-N", f"{PREFIX}wrong", "-l", "gpu=1,gpu_type=a100,h=host2",
                   str(script))  # fmt: skip
    try:
        end = time.monotonic() + 90
        detail = ""
        while time.monotonic() < end and "error reason" not in detail:
            time.sleep(1)
            detail = _qstat_j(lay, job_id)
        assert "error reason" in detail, detail  # Eqw: the prolog said 100
        assert "100" in detail and "prolog" in detail, detail
        assert not (dest / "wrong.ran").exists()
        said = (dest / f"{PREFIX}wrong.e{job_id}").read_text()
        assert "asks for 1 A100 GPU(s)" in said and "gives host2 V100 x2" in said, said
    finally:
        subprocess.run([str(lay.bin_dir / "qdel"), job_id], cwd="/tmp", capture_output=True)
