"""The Prolog's verdicts in this process, exact: the line slurmd logs, the exit code, the
JSON line in the node's log, and the drain reason left for Slurm.

NVML is replaced by a function returning a fixed inventory (the stand-in library's runs of the
real Prolog are in test_hooks_nvml.py, in their own processes); the site file, the cache and
the log are real files in a tree root alone can write, as on a node.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir

from clusterjob import __version__
from clusterjob.errors import NvmlError, NvmlErrorKind, PreflightFailed, UsageError
from clusterjob.gpu.inventory import Gpu, GpuInventory
from clusterjob.node import preflight, prolog
from clusterjob.node.checks import Finding, PreflightReport, Severity
from clusterjob.site import admin, loader, nodeview

SITE = Path(__file__).parent / "fixtures" / "slurm" / "sandbox_site.yaml"
A100, V100 = "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"
BUSES = ("0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0")


def inventory(*names: str) -> GpuInventory:
    gpus = tuple(
        Gpu(index=i, bus_id=BUSES[i], name=n, uuid=f"GPU-{i}", memory_total=80 << 30)
        for i, n in enumerate(names)
    )
    return GpuInventory(gpus=gpus, driver_version="550.54.15", cuda_driver_version=12040)


AS_MAPPED = (A100, A100, V100, V100)  # gpu1 of the sandbox site
SLOT_3 = (
    "gpu1: slot 3 (0000:4c:00.0): expected V100, found NVIDIA A100-SXM4-80GB (A100) -- boards "
    "swapped or node map wrong"
)


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    for path in trusted_tmp_dir():
        yield Node(path, monkeypatch)


class Node:
    """One node: its site file (on_error as given), NVML's answer, the drain reasons left."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.site = root / "site.yaml"
        self.log = root / "prolog.jsonl"
        self.answer: GpuInventory | BaseException = inventory(*AS_MAPPED)
        self.drained: list[tuple[str, str]] = []
        self.write_site()
        monkeypatch.setattr(prolog, "read_inventory", self._read_inventory)
        monkeypatch.setattr(
            prolog.drain,
            "set_drain_reason_later",
            lambda node, reason: self.drained.append((node, reason)),
        )

    def write_site(self, on_error: str = "drain", extra: str = "") -> None:
        text = SITE.read_text().replace("  on_error: drain\n", f"  on_error: {on_error}\n")
        self.site.write_text(text + extra)
        self.site.chmod(0o644)

    def _read_inventory(
        self,
        timeout: float | None = None,
        *,
        isolate: bool = False,
        deadline: float | None = None,
        started: object = None,
    ) -> GpuInventory:
        assert isolate is True  # NVML is read in a child the Prolog can abandon
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def run(self, environ: dict[str, str] | None = None, **kw: object) -> int:
        env = {"SLURMD_NODENAME": "gpu1", "SLURM_JOB_ID": "9", **(environ or {})}
        options: dict[str, object] = {
            "site": str(self.site),
            "cache_dir": str(self.root / "cache"),
            "log": str(self.log),
        }
        options.update(kw)
        try:
            return prolog.run_prolog(env, **options)  # type: ignore[arg-type]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.setitimer(signal.ITIMER_PROF, 0)

    def logged(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


def test_a_good_node_passes_silently_and_logs_ok(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    assert node.run() == 0
    assert lines(capsys) == []
    [record] = node.logged()
    assert record["outcome"] == "ok"
    assert record["action"] == "pass"
    assert record["error"] is None
    assert record["reason"] is None
    assert (record["node"], record["job_id"], record["version"]) == ("gpu1", "9", __version__)
    assert record["findings"] == []
    assert 0 <= record["elapsed_s"] < 60
    assert record["time"][:2] == "20" and record["time"][10] == "T"
    assert node.drained == []
    assert node.log.read_text().count("\n") == 1
    assert node.log.read_text().startswith('{"action": "pass", ')  # keys sorted


def test_swapped_boards_drain_with_the_first_error_and_a_count(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.answer = inventory(V100, A100, A100, V100)
    assert node.run({"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}) == 1
    [line] = lines(capsys)
    first = (
        "gpu1: slot 0 (0000:07:00.0): expected A100, found Tesla V100-SXM2-32GB (V100) "
        "-- boards swapped or node map wrong"
    )
    assert line == f"clusterjob prolog: model-mismatch: {first} (+1 more error(s))"
    assert node.drained == [("gpu1", f"clusterjob: model-mismatch: {first} (+1 more error(s))")]
    [record] = node.logged()
    assert (record["outcome"], record["action"], record["error"]) == ("failed", "drain", None)
    assert record["reason"] == first
    assert [f["check_id"] for f in record["findings"]] == ["model-mismatch", "model-mismatch"]


def test_one_error_has_no_count_and_by_hand_no_drain_reason(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.answer = inventory(A100, A100, V100, A100)
    assert node.run() == 1
    assert lines(capsys) == [f"clusterjob prolog: model-mismatch: {SLOT_3}"]
    assert node.drained == []  # not run by slurmd: nobody to leave a reason for


def test_warnings_are_shown_when_passing(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.answer = inventory(A100, A100, V100, V100)
    assert node.run({"SLURMD_NODENAME": "gpu9"}) == 0
    [line] = lines(capsys)
    assert line.startswith(
        "clusterjob prolog: warning: node-unmapped: gpu9: not in the site's node map"
    )
    [record] = node.logged()
    assert record["outcome"] == "ok" and record["node"] == "gpu9"
    assert [f["check_id"] for f in record["findings"]] == ["node-unmapped"]


@pytest.mark.parametrize(
    ("on_error", "code", "said"),
    [
        (
            "drain",
            1,
            "clusterjob prolog: gpu1: GPUs not checked: NVML: driver gone -- draining "
            "(on_error=drain)",
        ),
        (
            "pass",
            0,
            "clusterjob prolog: warning: gpu1: GPUs not checked: NVML: driver gone -- passing "
            "(on_error=pass)",
        ),
    ],
)
def test_nvml_that_cannot_answer_follows_on_error(
    node: Node, capsys: pytest.CaptureFixture[str], on_error: str, code: int, said: str
) -> None:
    node.write_site(on_error)
    node.answer = NvmlError(NvmlErrorKind.DRIVER_NOT_LOADED, "driver gone")
    assert node.run({"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}) == code
    assert lines(capsys) == [said]
    [record] = node.logged()
    action = "drain" if code else "pass"
    assert (record["outcome"], record["action"], record["error"]) == (
        "error",
        action,
        "driver_not_loaded",
    )
    assert record["reason"] == "NVML: driver gone"
    assert record["findings"] == []
    expected = [("gpu1", "clusterjob: GPUs not checked: NVML: driver gone")] if code else []
    assert node.drained == expected


def test_a_lost_gpu_drains_even_when_on_error_is_pass(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.write_site("pass")
    node.answer = NvmlError(NvmlErrorKind.GPU_LOST, "GPU is lost")
    assert node.run() == 1
    assert lines(capsys) == ["clusterjob prolog: gpu-lost: gpu1: GPU is lost"]
    [record] = node.logged()
    assert (record["outcome"], record["action"], record["reason"]) == (
        "failed",
        "drain",
        "gpu1: GPU is lost",
    )
    [finding] = record["findings"]
    assert (finding["check_id"], finding["severity"], finding["found"]) == (
        "gpu-lost",
        "error",
        "lost",
    )


def test_a_site_config_that_cannot_be_read_drains_with_the_policy_unknown(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = node.root / "nope.yaml"
    assert node.run(site=str(missing)) == 1
    [line] = lines(capsys)
    assert line.startswith(f"clusterjob prolog: gpu1: GPUs not checked: site config: {missing}")
    assert line.endswith(" -- draining (on_error=drain, site policy unknown)")
    [record] = node.logged()
    assert (record["outcome"], record["action"], record["error"]) == ("error", "drain", "config")


def test_an_internal_error_is_one_line(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    node.answer = RuntimeError("boom")
    assert node.run() == 1
    assert lines(capsys) == [
        "clusterjob prolog: gpu1: GPUs not checked: internal error: RuntimeError: boom -- "
        "draining (on_error=drain)"
    ]
    assert node.logged()[0]["error"] == "internal"


def test_a_log_that_cannot_be_written_is_named_after_the_verdict(
    node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "prolog.jsonl"  # under the sticky, world-writable /tmp: refused
    node.answer = inventory(A100, A100, V100, A100)
    assert node.run({"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}, log=str(bad)) == 1
    [line] = lines(capsys)
    assert line.startswith(f"clusterjob prolog: model-mismatch: {SLOT_3}; cannot write log {bad}: ")
    assert node.drained == [("gpu1", f"clusterjob: model-mismatch: {SLOT_3}")]
    assert not bad.exists()


def test_a_log_that_cannot_be_written_is_a_warning_when_passing(
    node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "prolog.jsonl"
    assert node.run(log=str(bad)) == 0
    [line] = lines(capsys)
    assert line.startswith(f"clusterjob prolog: warning: cannot write log {bad}: ")


def test_an_untrusted_cache_is_not_used_and_said_when_passing(
    node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"  # under the sticky, world-writable /tmp: not root's alone
    assert node.run(cache_dir=str(cache)) == 0
    [line] = lines(capsys)
    assert line.startswith("clusterjob prolog: warning: cache not used: ")


def test_the_site_log_path_is_used_without_an_override(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    site_log = node.root / "site-log.jsonl"
    text = node.site.read_text().replace(
        '"/var/lib/clusterjob-sandbox/log/prolog.jsonl"', f'"{site_log}"'
    )
    node.site.write_text(text)
    assert node.run(log=None) == 0
    assert json.loads(site_log.read_text())["outcome"] == "ok"
    assert not node.log.exists()


@pytest.mark.parametrize(
    ("override", "configured", "deadline"),
    [(3.0, 11.0, 3.0), (None, 11.0, 11.0), (None, None, 20.0)],
)
def test_the_deadline(override: float | None, configured: float | None, deadline: float) -> None:
    run = prolog.PrologRun(node="n", job_id=None, log_override=None, deadline_override=override)
    if configured is not None:
        run.policy = prolog.DEFAULT_POLICY.replace(deadline_seconds=configured)
    assert run.deadline == deadline
    assert deadline - 1 < run.remaining() <= deadline


def test_the_log_is_made_readable_by_root_and_its_group_only(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    assert node.run() == 0
    assert node.log.stat().st_mode & 0o777 == 0o640
    assert node.run() == 0
    assert [r["outcome"] for r in node.logged()] == ["ok", "ok"]  # appended, not replaced


def test_the_jobs_partition_chooses_the_check_policy(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    """The suspect partition lowers model-mismatch to a warning: its jobs still run there."""
    text = node.site.read_text().replace(
        '  suspect:\n    nodes: "gpu3"\n',
        '  suspect:\n    nodes: "gpu3"\n    checks: {severity: {model-mismatch: warning}}\n',
    )
    node.site.write_text(text)
    node.answer = inventory(A100, A100, V100, A100)
    assert node.run({"SLURMD_NODENAME": "gpu3", "SLURM_JOB_PARTITION": "suspect"}) == 0
    assert lines(capsys) == [
        "clusterjob prolog: warning: model-mismatch: " + SLOT_3.replace("gpu1:", "gpu3:")
    ]
    assert node.run({"SLURMD_NODENAME": "gpu3", "SLURM_JOB_PARTITION": "gpu"}) == 1
    assert lines(capsys) == [
        "clusterjob prolog: model-mismatch: " + SLOT_3.replace("gpu1:", "gpu3:")
    ]


# -- the job-side preflight (clusterjob preflight), in this process ----------------------------


class Reader:
    """NVML's answer for ``run_preflight``, and the deadline it was asked to keep."""

    def __init__(self, *names: str) -> None:
        self.inventory = inventory(*names)
        self.deadlines: list[float] = []

    def __call__(self, deadline: float) -> GpuInventory:
        self.deadlines.append(deadline)
        return self.inventory


def preflight_of(site: Path, environ: dict[str, str], **kw: object):
    return preflight.run_preflight(site, "gpu1", environ, **kw)  # type: ignore[arg-type]


def test_a_good_allocation_passes_the_preflight() -> None:
    read = Reader(*AS_MAPPED)
    env = {"SLURM_JOB_GPUS": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    report = preflight_of(SITE, env, expect_model="a100", expect_count=2, read=read)
    assert report.findings == ()
    assert report.ok
    assert read.deadlines == [20.0]  # the site's prolog.deadline_seconds


@pytest.mark.parametrize(
    ("environ", "kw", "expected"),
    [
        (
            {"SLURM_JOB_GPUS": "2"},
            dict(expect_model="A100", expect_count=1),
            [("alloc-model", "error")],
        ),
        ({"SLURM_JOB_GPUS": "0"}, dict(expect_count=2), [("alloc-count", "error")]),
        (
            {"SLURM_JOB_GPUS": "1,2"},
            dict(),
            [("cuda-order", "error")],  # mixed models, CUDA's order unset
        ),
        (
            {"SLURM_JOB_GPUS": "2", "SLURM_JOB_PARTITION": "gpu"},
            dict(expect_model="A100"),
            [("alloc-model", "warning")],
        ),
    ],
)
def test_the_preflight_checks_what_the_job_asked_for(
    tmp_path: Path, environ: dict[str, str], kw: dict, expected: list[tuple[str, str]]
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        SITE.read_text().replace(
            '  gpu:\n    nodes: "gpu[1-2]"\n',
            '  gpu:\n    nodes: "gpu[1-2]"\n    checks: {severity: {alloc-model: warning}}\n',
        )
    )
    report = preflight_of(site, environ, read=Reader(*AS_MAPPED), **kw)
    assert [(f.check_id, f.severity.value) for f in report.findings] == expected


def test_the_preflight_finds_the_site_from_the_environment() -> None:
    read = Reader(*AS_MAPPED)
    report = preflight.run_preflight(
        None, "gpu1", {"CLUSTERJOB_SITE": str(SITE), "SLURM_JOB_GPUS": "0"}, read=read
    )
    assert report.ok and read.deadlines == [20.0]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(expect_model="P100"), "unknown GPU model 'P100' (site models: A100, H100, V100)"),
        (dict(expect_count=-1), "expected GPU count must be >= 0, got -1"),
    ],
)
def test_the_preflight_refuses_what_it_cannot_check(kw: dict, message: str) -> None:
    read = Reader(*AS_MAPPED)
    with pytest.raises(UsageError) as info:
        preflight_of(SITE, {}, read=read, **kw)
    assert str(info.value) == message
    assert read.deadlines == []  # refused before NVML is read


def test_the_preflight_reads_nvml_in_a_child_within_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[float, bool]] = []

    def read_inventory(timeout: float, *, isolate: bool = False) -> GpuInventory:
        calls.append((timeout, isolate))
        return inventory()

    monkeypatch.setattr(preflight, "read_inventory", read_inventory)
    preflight.read_gpus(5.0)
    preflight.read_gpus()
    assert calls == [(5.0, True), (20.0, True)]


def test_the_jobs_cpus_are_its_affinity() -> None:
    assert preflight._job_cpus() == frozenset(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("environ", "kw", "expected"),
    [
        ({"SLURM_JOB_GPUS": "1,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, dict(), []),
        ({"SLURM_JOB_GPUS": ""}, dict(expect_count=0), []),
    ],
)
def test_what_the_preflight_lets_pass(
    environ: dict[str, str], kw: dict, expected: list[str]
) -> None:
    report = preflight_of(SITE, environ, read=Reader(*AS_MAPPED), **kw)
    assert [f.check_id for f in report.findings] == expected


@pytest.mark.parametrize(
    ("checks", "expected"),
    [('{cuda_min: "12.6"}', ["driver-version"]), ('{driver_min: "560"}', ["driver-version"])],
)
def test_the_preflight_applies_the_sites_driver_minimums(
    tmp_path: Path, checks: str, expected: list[str]
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(SITE.read_text() + f"checks: {checks}\n")
    env = {"SLURM_JOB_GPUS": "0"}
    report = preflight_of(site, env, read=Reader(*AS_MAPPED))
    assert [f.check_id for f in report.findings] == expected


# -- timers, the alarm, the log line and the node map's sources ---------------------------------


class Timers:
    """``signal.setitimer`` recorded, never armed: no deadline of a test can end pytest."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []

    def __call__(self, which: int, seconds: float, interval: float = 0.0) -> tuple[float, float]:
        self.calls.append((which, seconds))
        return (0.0, 0.0)


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Timers]:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGALRM, signal.SIGPROF)}
    recorded = Timers()
    monkeypatch.setattr(prolog.signal, "setitimer", recorded)
    try:
        yield recorded
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


REAL, PROF = signal.ITIMER_REAL, signal.ITIMER_PROF


def test_the_alarm_is_armed_past_the_deadline_wall_and_cpu_time(timers: Timers) -> None:
    run = prolog.PrologRun(node="n", job_id=None, log_override=None, deadline_override=10.0)
    run.arm_alarm()
    [(real, at), (prof, cpu)] = timers.calls
    assert (real, prof) == (REAL, PROF)
    assert 10.4 < at <= 10.5  # half a second past what is left
    assert 11.9 < cpu <= 12.0  # two seconds of CPU time past it
    assert signal.getsignal(signal.SIGALRM) == run._on_alarm
    assert signal.getsignal(signal.SIGPROF) == signal.SIG_DFL
    run.disarm()
    assert timers.calls[2:] == [(REAL, 0), (PROF, 0)]


def test_an_alarm_armed_past_the_deadline_still_fires(timers: Timers) -> None:
    run = prolog.PrologRun(node="n", job_id=None, log_override=None, deadline_override=0.0)
    run.arm_alarm()
    assert timers.calls == [(REAL, 0.51), (PROF, 2.01)]  # from 0.01s left, not from none


def test_the_alarm_gives_the_timeout_verdict_then_ends_the_process(
    node: Node, timers: Timers, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    exits: list[object] = []
    killed: list[bool] = []
    monkeypatch.setattr(prolog.os, "_exit", exits.append)
    monkeypatch.setattr(prolog, "kill_children", lambda: killed.append(True))
    run = prolog.PrologRun(
        node="gpu1", job_id="9", log_override=str(node.log), deadline_override=7.5
    )
    run._on_alarm(signal.SIGALRM, None)
    assert exits == [1]
    assert killed == [True]
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL  # a second alarm ends it
    assert timers.calls == [(REAL, 1.0), (REAL, 0), (PROF, 0)]
    assert lines(capsys) == [
        "clusterjob prolog: gpu1: GPUs not checked: no verdict within the 7.5s deadline -- "
        "draining (on_error=drain, site policy unknown)"
    ]
    [record] = node.logged()
    assert (record["error"], record["reason"]) == ("timeout", "no verdict within the 7.5s deadline")


def test_the_run_keeps_the_deadline_it_was_given(node: Node, timers: Timers) -> None:
    assert node.run(deadline=7.0) == 0
    first, after_site = timers.calls[0], timers.calls[2]
    assert first[0] == after_site[0] == REAL
    assert 7.4 < first[1] <= 7.5
    assert 7.4 < after_site[1] <= 7.5


def test_nvml_gets_what_is_left_of_the_deadline(
    node: Node, timers: Timers, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[float | None] = []

    def read_inventory(timeout=None, *, isolate=False, deadline=None, started=None):  # noqa: ANN001, ANN202
        asked.extend((timeout, deadline))
        return inventory(*AS_MAPPED)

    monkeypatch.setattr(prolog, "read_inventory", read_inventory)
    assert node.run(deadline=0.5) == 0
    timeout, deadline = asked
    assert 0.01 <= timeout <= 0.5  # never more than the deadline leaves
    assert deadline == 0.5


class FlushCounting(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())
        super().flush()


def test_each_line_is_flushed_as_it_is_said() -> None:
    err = FlushCounting()
    run = prolog.PrologRun(
        node="n", job_id=None, log_override=None, deadline_override=None, err=err
    )
    run.say("one")
    assert err.flushed == ["clusterjob prolog: one\n"]


def test_the_log_line_says_the_time_taken_to_the_millisecond(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        prolog, "time", types.SimpleNamespace(monotonic=lambda: 1000.0, strftime=time.strftime)
    )
    run = prolog.PrologRun(
        node="gpu1",
        job_id="9",
        log_override=str(node.log),
        deadline_override=None,
        started=1000.0 - 1.2345678,
    )
    assert run.log({"outcome": "x"}) is None
    [record] = node.logged()
    assert record["elapsed_s"] == 1.235


def test_a_log_path_that_is_a_directory_is_named_with_the_systems_words(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    assert node.run(log=str(node.root)) == 0
    assert lines(capsys) == [
        f"clusterjob prolog: warning: cannot write log {node.root}: Is a directory"
    ]


def test_an_unchecked_node_that_passes_still_shows_the_notes(
    node: Node, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    node.write_site("pass")
    node.answer = NvmlError(NvmlErrorKind.DRIVER_NOT_LOADED, "driver gone")
    cache = tmp_path / "cache"  # under the sticky, world-writable /tmp: not root's alone
    assert node.run(cache_dir=str(cache)) == 0
    said = lines(capsys)
    assert said[0] == (
        "clusterjob prolog: warning: gpu1: GPUs not checked: NVML: driver gone -- passing "
        "(on_error=pass)"
    )
    assert said[1].startswith(f"clusterjob prolog: warning: cache not used: refusing {cache}: ")
    assert len(said) == 2


def test_an_unchecked_node_names_the_log_it_could_not_write(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.answer = NvmlError(NvmlErrorKind.DRIVER_NOT_LOADED, "driver gone")
    assert node.run(log=str(node.root)) == 1
    assert lines(capsys) == [
        "clusterjob prolog: gpu1: GPUs not checked: NVML: driver gone -- draining "
        f"(on_error=drain); cannot write log {node.root}: Is a directory"
    ]


def test_the_prolog_applies_the_sites_driver_minimum(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.write_site(extra='checks: {driver_min: "560"}\n')
    assert node.run() == 1
    [line] = lines(capsys)
    assert line.startswith("clusterjob prolog: driver-version: ")


def test_the_prolog_applies_the_sites_cuda_minimum(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.write_site(extra='checks: {cuda_min: "12.6"}\n')
    assert node.run() == 1
    [line] = lines(capsys)
    assert line.startswith("clusterjob prolog: driver-version: ")


def test_a_lost_gpu_is_one_error_finding_for_the_node() -> None:
    report = prolog._lost_report("gpu1", NvmlError(NvmlErrorKind.GPU_LOST, "GPU is lost"))
    lost = Finding("gpu-lost", Severity.ERROR, "gpu1", "gpu1: GPU is lost", found="lost")
    assert report == PreflightReport(node="gpu1", findings=(lost,), rows=())


def test_the_node_view_is_cached_under_the_site_files_real_path(node: Node) -> None:
    assert node.run() == 0
    entry = nodeview._cache_file(node.root / "cache", os.path.realpath(node.site), "gpu1")
    assert sorted((node.root / "cache").iterdir()) == [entry]


def test_a_compiled_node_map_beside_the_site_file_is_used(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = admin.write_compiled(node.site)
    compiled.chmod(0o644)

    def no_yaml(*args: object, **kw: object) -> None:
        raise AssertionError("the YAML was read")

    monkeypatch.setattr(loader, "load_site", no_yaml)
    assert node.run(cache_dir=str(node.root / "no-cache")) == 0


def test_the_prolog_reads_the_jobs_gpus_as_the_prolog_sees_them(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    """In the Prolog an integer CUDA_VISIBLE_DEVICES alone names the node's own slots."""
    assert node.run({"CUDA_VISIBLE_DEVICES": "7"}) == 1
    [line] = lines(capsys)
    assert line.startswith("clusterjob prolog: alloc-slot: ")


AMD_SITE = """\
site: amd
gpu_request: {syntax: gpus-per-node}
preflight: warn
models:
  MI250X: {vendor: amd, gres_type: mi250x}
partitions:
  standard-g: {nodes: "gpu1", default: true}
node_map:
  - nodes: "gpu1"
    gpus: [{model: MI250X}]
"""


def test_the_preflight_cannot_check_an_amd_model(tmp_path: Path) -> None:
    site = tmp_path / "amd.yaml"
    site.write_text(AMD_SITE)
    read = Reader()
    with pytest.raises(PreflightFailed) as info:
        preflight_of(site, {}, expect_model="mi250x", read=read)
    assert str(info.value) == (
        "cannot check MI250X GPUs: clusterjob reads GPUs through NVML (NVIDIA), and the site "
        "gives MI250X no NVML name (an AMD GPU); where the preflight is required this stops the "
        "job: set preflight: warn (or off) for the site or partition to run such jobs unchecked"
    )
    assert read.deadlines == []


def test_the_preflight_names_this_node_in_its_findings() -> None:
    report = preflight_of(SITE, {"SLURM_JOB_GPUS": "0"}, expect_count=2, read=Reader(*AS_MAPPED))
    [finding] = report.findings
    assert finding.node == "gpu1"
    assert finding.message.startswith("gpu1")


def test_the_preflight_prefers_the_steps_gpus_to_the_jobs() -> None:
    env = {"SLURM_STEP_GPUS": "0", "SLURM_JOB_GPUS": "2"}
    report = preflight_of(SITE, env, expect_model="A100", read=Reader(*AS_MAPPED))
    assert report.findings == ()


def test_the_preflight_warns_when_the_jobs_cpus_are_far_from_its_gpu() -> None:
    read = Reader(*AS_MAPPED)
    far = 1 + max(os.sched_getaffinity(0))
    gpus = (read.inventory.gpus[0].replace(cpu_affinity=f"{far}-{far + 7}"),)
    read.inventory = read.inventory.replace(gpus=gpus + read.inventory.gpus[1:])
    report = preflight_of(SITE, {"SLURM_JOB_GPUS": "0"}, read=read)
    assert [(f.check_id, f.severity.value) for f in report.findings] == [
        ("numa-affinity", "warning")
    ]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to leave one out")
def test_the_jobs_cpus_are_this_processs_own() -> None:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        assert preflight._job_cpus() == frozenset({min(before)})
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.skipif(Path("/etc/clusterjob/site.yaml").exists(), reason="a site file of this host")
def test_the_preflight_finds_the_site_by_slurms_cluster_name(tmp_path: Path) -> None:
    sites = tmp_path / "config" / "clusterjob" / "sites"
    sites.mkdir(parents=True)
    (sites / "lab.yaml").write_text(
        SITE.read_text().replace("cluster_name: sandbox", "cluster_name: mutantlab")
    )
    env = {
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "SLURM_CLUSTER_NAME": "mutantlab",
        "SLURM_JOB_GPUS": "0",
    }
    read = Reader(*AS_MAPPED)
    assert preflight_of(None, env, read=read).ok  # type: ignore[arg-type]
    assert read.deadlines == [20.0]
