"""The clusterjob version where a login/node skew would show: the Prolog's JSON log line,
`preflight --json`, and `site diff --prolog-log` naming nodes that ran another version."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterjob import __version__
from clusterjob.node.checks import PreflightReport
from clusterjob.node.prolog import PrologRun
from clusterjob.node.report import render_json
from clusterjob.site.drift import DriftReport, VersionSkew, format_report, version_skew


def _record(node: str, version: str | None, time: str = "2026-01-01T00:00:00+0000") -> str:
    record: dict[str, object] = {"node": node, "time": time, "outcome": "ok"}
    if version is not None:
        record["version"] = version
    return json.dumps(record)


def test_version_skew_reads_each_nodes_last_record() -> None:
    log = [
        _record("gpu1", "0.0.9"),
        _record("gpu1", __version__),  # upgraded since: in step now
        _record("gpu2", __version__),
        _record("gpu2", "0.0.9", "2026-01-02T00:00:00+0000"),  # went back: reported
        _record("gpu3", None),  # a Prolog older than the version field
        "not json {",
        json.dumps(["a list"]),
        _record("other", "0.0.1"),  # not in the site: not ours to report
    ]
    skew = version_skew(log, ["gpu1", "gpu2", "gpu3", "gpu4"])
    assert skew == (
        VersionSkew("gpu2", "0.0.9", "2026-01-02T00:00:00+0000"),
        VersionSkew("gpu3", None, "2026-01-01T00:00:00+0000"),
    )


def test_skew_makes_the_site_differ_and_is_said() -> None:
    report = DriftReport("s", (), (), (), (), (), version_skew=(VersionSkew("gpu2", "0.0.9", "t"),))
    assert not report.in_sync
    lines = format_report(report)
    assert lines[0] == (
        f"version differs on gpu2: its Prolog ran clusterjob 0.0.9 (at t), this is "
        f"{__version__} (install the same version at the site's node_command path)"
    )
    assert lines[-1] == "site s: node map matches Slurm; clusterjob version differs on gpu2"
    assert report.to_dict()["version"] == __version__


def test_preflight_json_names_the_version() -> None:
    report = PreflightReport(node="gpu1", findings=(), rows=())
    assert json.loads(render_json(report))["version"] == __version__


@pytest.fixture
def root_tree() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("the Prolog log is written only where root alone can write")
    path = Path(tempfile.mkdtemp(prefix="clusterjob-test-", dir="/var/lib"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_the_prolog_log_line_names_the_version(root_tree: Path) -> None:
    log = root_tree / "log" / "prolog.jsonl"
    run = PrologRun(node="gpu1", job_id="7", log_override=str(log), deadline_override=None)
    assert run.log({"outcome": "ok"}) is None
    (line,) = log.read_text().splitlines()
    assert json.loads(line)["version"] == __version__
    assert version_skew([line], ["gpu1"]) == ()
