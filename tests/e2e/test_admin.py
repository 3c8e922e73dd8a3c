"""Site admin commands against the real sandbox cluster: `site diff` with drift made by
draining a node and by editing a copy of the site file, and `avail` while a job holds all of
h1's H100s. Every test puts the cluster back (resume, scancel) in a finally."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta

import pytest

from .conftest import clusterjob_cli

pytestmark = pytest.mark.slurm

DRAIN_REASON = "clusterjob: e2e drift test"


def diff(sandbox, site: str):
    done = clusterjob_cli("site", "diff", "--site", site, "--json", env=sandbox.env, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def prolog_drained_now(sandbox) -> set[str]:
    """Nodes drained by the clusterjob Prolog, read independently of clusterjob."""
    found = set()
    for line in sandbox.run("sinfo", "-h", "-N", "-R", "-o", "%N|%E").splitlines():
        node, _, reason = line.partition("|")
        if reason.startswith(("Prolog error", "clusterjob")):
            found.add(node.strip())
    return found


def test_diff_against_the_sandbox_site(sandbox):
    code, report = diff(sandbox, str(sandbox.site_path))
    assert report["not_in_map"] == [] and report["not_in_slurm"] == []
    assert report["gres"] == [] and report["partitions"] == []
    drained = {d["node"] for d in report["prolog_drained"]}
    assert drained == prolog_drained_now(sandbox)
    assert code == (1 if drained else 0)


def test_diff_reports_a_node_drained_with_a_clusterjob_reason(sandbox):
    try:
        sandbox.run("scontrol", "update", "nodename=h1", "state=drain", f"reason={DRAIN_REASON}")
        code, report = diff(sandbox, str(sandbox.site_path))
        assert code == 1
        h1 = [d for d in report["prolog_drained"] if d["node"] == "h1"]
        assert len(h1) == 1 and h1[0]["reason"].startswith(DRAIN_REASON)
        assert "DRAIN" in h1[0]["state"]
        text = clusterjob_cli("site", "diff", "--site", str(sandbox.site_path), env=sandbox.env)
        assert text.returncode == 1
        assert "drained by the clusterjob Prolog: h1 (" in text.stdout
        assert "node map differs" not in text.stdout  # the drain is the only cause
        assert text.stdout.splitlines()[-1].endswith("drained by the clusterjob Prolog: h1")
    finally:
        sandbox.resume("h1")
    _, after = diff(sandbox, str(sandbox.site_path))
    assert "h1" not in {d["node"] for d in after["prolog_drained"]}


def test_diff_against_a_modified_copy(sandbox, tmp_path):
    """h1 left out of the map, a V100 slot removed from gpu2, an extra node gpu9."""
    text = sandbox.site_path.read_text()
    start = text.index("  - nodes: h1\n")
    end = text.index("  - nodes: mig1\n")
    text = text[:start] + "  - nodes: gpu9\n    gpus:\n      - {model: H100}\n" + text[end:]
    gpu2 = text.index("  - nodes: gpu2\n")
    v100 = text.index('      - {model: V100, bus_id: "0000:4c:00.0"}\n', gpu2)
    text = text[:v100] + text[v100 + len('      - {model: V100, bus_id: "0000:4c:00.0"}\n') :]
    text = text.replace('    nodes: "h1"\n', '    nodes: "gpu9"\n')
    copy = tmp_path / "site.yaml"
    copy.write_text(text)
    code, report = diff(sandbox, str(copy))
    assert code == 1
    assert report["not_in_map"] == ["h1"]
    assert report["not_in_slurm"] == ["gpu9"]
    assert [(g["node"], g["expected"], g["actual"]) for g in report["gres"]] == [
        ("gpu2", "gpu:a100:2,gpu:v100:1", "gpu:a100:2,gpu:v100:2")
    ]
    parts = [(p["partition"], p["only_in_map"], p["only_in_slurm"]) for p in report["partitions"]]
    assert parts == [("h100", ["gpu9"], ["h1"])]


def wait_running(sandbox, job_id: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = sandbox.job(job_id).get("JobState")
        if state == "RUNNING":
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {state} after {timeout}s")
        time.sleep(0.5)


def test_avail_while_a_job_holds_all_h100s(sandbox):
    site = str(sandbox.site_path)
    done = clusterjob_cli("avail", "--site", site, "-p", "h100", "--json", env=sandbox.env)
    assert done.returncode == 0, done.stderr
    job = sandbox.sbatch(
        "--wrap", "sleep 30", "--gres=gpu:h100:8", "-p", "h100", "-A", "sandbox",
        "-o", "/dev/null", "-J", "avail-e2e",
    )  # fmt: skip
    try:
        wait_running(sandbox, job)
        done = clusterjob_cli("avail", "--site", site, "--json", env=sandbox.env)
        assert done.returncode == 0, done.stderr
        rows = {(r["partition"], r["model"]): r for r in json.loads(done.stdout)["rows"]}
        assert (rows["h100", "H100"]["free"], rows["h100", "H100"]["total"]) == (0, 8)
        assert rows["h100", "H100"]["nodes_free"] == []

        before = datetime.now()
        done = clusterjob_cli(
            "avail", "--site", site, "--model", "h100", "--gpus", "8", "--json", env=sandbox.env
        )
        assert done.returncode == 0, done.stderr
        estimate = json.loads(done.stdout)["estimate"]
        assert estimate["nodes"] == "h1" and estimate["partition"] == "h100"
        # h1 is busy: Slurm's estimate is after the running job's end, not now
        assert datetime.fromisoformat(estimate["start"]) > before + timedelta(seconds=20)
        text = clusterjob_cli("avail", "--site", site, "-p", "h100", env=sandbox.env).stdout
        assert "h100       H100          0/8  0" in text
    finally:
        sandbox.run("scancel", job)
    assert sandbox.wait_job(job)["JobState"] == "CANCELLED"


def test_site_commands_find_the_sandbox_site_through_slurms_cluster_name(sandbox, tmp_path):
    """No --site, no CLUSTERJOB_SITE: the real slurmctld's ClusterName=sandbox picks the known
    site file declaring cluster_name: sandbox (here in the user's sites directory)."""
    sites = tmp_path / "config" / "clusterjob" / "sites"
    sites.mkdir(parents=True)
    (sites / "sandbox.yaml").write_text(sandbox.site_path.read_text())
    env = {k: v for k, v in sandbox.env.items() if k != "CLUSTERJOB_SITE"}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), HOME=str(tmp_path))
    show = clusterjob_cli("site", "show", "--json", env=env)
    assert show.returncode == 0, show.stderr
    assert json.loads(show.stdout)["site"] == "sandbox"
    done = clusterjob_cli("site", "diff", "--json", env=env, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    assert report["site"] == "sandbox"
    assert report["not_in_map"] == [] and report["not_in_slurm"] == []
    gres = clusterjob_cli("site", "gres-conf", env=env)
    assert gres.returncode == 0, gres.stderr
    assert "NodeName=h1 " in gres.stdout
