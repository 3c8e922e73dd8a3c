"""Smoke pass of ``python -m benchmarks --quick``: every benchmark runs and produces figures.

No timing is asserted (the figures depend on the machine); only that each benchmark ran,
wrote its rows into the Markdown and JSON results, and that counts are counts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterjob.sandbox.cluster import resolve_state_dir
from clusterjob.sandbox.config import Layout

# benchmarks/ sits beside the package, not in it: importable from the repository root only
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.__main__ import main  # noqa: E402
from benchmarks.prolog import NVML_NAME  # noqa: E402

# The sandbox CLUSTERJOB_SANDBOX_DIR names (each Slurm release's has its own), else the default.
SANDBOX_CONF = str(Layout(resolve_state_dir()).slurm_conf)


def _slurm_up() -> bool:
    return (
        shutil.which("sbatch") is not None
        and Path(os.environ.get("SLURM_CONF", SANDBOX_CONF)).is_file()
    )


def _run(tmp_path: Path, *names: str) -> dict:
    out = tmp_path / "results.md"
    assert main(["--quick", "--out", str(out), "--only", *names]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    text = out.read_text()
    assert "Machine:" in text and "load average" in text
    assert data["machine"]["cpu_count"] >= 1 and data["machine"]["python"]
    for result in data["results"]:
        assert not any(n.startswith("failed") for n in result["notes"]), result["notes"]
        for row in result["rows"]:
            assert row["figure"] in text
    return {r["name"]: r for r in data["results"]}


def test_local_benchmarks_produce_figures(tmp_path: Path) -> None:
    results = _run(tmp_path, "prolog", "cli", "site_config", "site_init")
    if os.geteuid() == 0:
        prolog = results["prolog"]["rows"]
        for hook in ("prolog", "epilog"):  # measured side by side, against the same floor
            rows = [r for r in prolog if r["figure"].startswith(f"{hook}, ")]
            warm = [r for r in rows if "warm cache" in r["figure"]]
            assert warm and all(r["ratio"] > 0 and r["reference"] == NVML_NAME for r in warm)
            assert any("cold" in r["figure"] for r in rows), hook
        flat = [r for r in prolog if "-node vs 3-node site" in r["figure"]]  # flat with size
        assert {r["figure"].split(",")[0] for r in flat} == {
            "prolog",
            "epilog",
            "sample-usage",
            "preflight",
        }
        assert all(r["value"] > 0 and r["unit"] == "x" for r in flat)
    cli = results["cli"]["rows"]
    assert {"clusterjob --help", "clusterjob submit --dry-run (10-node site)"} <= {
        r["figure"] for r in cli
    }
    assert all(r["value"] > 0 for r in cli)
    assert any(r["unit"] == "MiB" for r in results["site_config"]["rows"])
    init = {r["figure"]: r for r in results["site_init"]["rows"]}
    assert all(r["ratio"] > 0 for r in init.values() if r["unit"] == "ms")
    assert any(f.startswith("describe (") for f in init)


@pytest.mark.slurm
def test_slurm_benchmarks_produce_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if "SLURM_CONF" not in os.environ:
        monkeypatch.setenv("SLURM_CONF", SANDBOX_CONF)
    if not _slurm_up():
        pytest.skip("no Slurm sandbox here")
    results = _run(tmp_path, "slurm_load", "submission", "status_scale")
    scale = {r["unit"]: r for r in results["status_scale"]["rows"]}
    scale_rows = {r["figure"]: r for r in results["status_scale"]["rows"]}
    assert scale["calls"]["value"] >= 1 and scale["ms"]["value"] > 0
    counts = [r for r in results["slurm_load"]["rows"] if r["unit"] == "calls"]
    assert len(counts) == 3 and all(r["value"] == int(r["value"]) >= 0 for r in counts)
    submission = {r["figure"]: r for r in results["submission"]["rows"]}
    assert submission["clusterjob submit, per job, each in a process of its own"]["ratio"] > 0
    served = submission["clusterjob submit, per job (served)"]
    counted = re.search(r"median of (\d+),.*; (\d+) of them run by", served["note"])
    assert counted, served["note"]
    runs, served_runs = counted.groups()
    assert served["ratio"] > 0 and served_runs == runs  # every one went to the server
    status_served = next(r for f, r in scale_rows.items() if f.endswith(", served"))
    assert "of them run by the command server" in status_served["note"]
    assert submission["Slurm client calls per clusterjob submit"]["value"] >= 1


def test_poller_benchmark_counts_calls_and_cpu(tmp_path: Path) -> None:
    rows = _run(tmp_path, "poller")["poller"]["rows"]
    calls = [r for r in rows if r["unit"] == "calls"]
    assert len(calls) == 3 and all(r["value"] >= 1 for r in calls)
    assert all(r["value"] >= 0 for r in rows if r["unit"] == "% of a core")


def test_command_modules_name_every_command() -> None:
    """The start-up shortcut (import only the named command's module) must know them all."""
    code = """
import json
from clusterjob.cli import app as cli
cli._register_commands()
found = {c.name or c.callback.__name__: c.callback.__module__ for c in cli.app.registered_commands}
found.update({g.name: g.typer_instance.registered_commands[0].callback.__module__
              for g in cli.app.registered_groups})
print(json.dumps(found))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    from clusterjob.cli.app import COMMAND_MODULES

    assert {k: f"clusterjob.cli.{v}" for k, v in COMMAND_MODULES.items()} == found


@pytest.mark.slurm
def test_result_latency_benchmark_produces_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.result_latency import CLUSTERJOB

    if "SLURM_CONF" not in os.environ:
        monkeypatch.setenv("SLURM_CONF", SANDBOX_CONF)
    if not _slurm_up():
        pytest.skip("no Slurm sandbox here")
    rows = {r["figure"]: r for r in _run(tmp_path, "result_latency")["result_latency"]["rows"]}
    assert rows[CLUSTERJOB]["value"] > 0
    calls = rows["clusterjob: Slurm status calls while waiting"]["value"]
    assert calls == int(calls) >= 0
