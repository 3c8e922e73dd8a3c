"""``Cluster(debug=True)``: the same calls (``submit`` of a command, ``submit_function``,
``map``, ``options``) checked exactly as for Slurm, then run here at submit, with jobs of
the same interface, and nothing sent to Slurm: the PATH here has no Slurm command at all."""

from __future__ import annotations

import concurrent.futures
import shutil
import sys
from pathlib import Path

import pytest

from clusterjob.api.cluster import Cluster, DebugJob, Job
from clusterjob.cli.app import run
from clusterjob.errors import JobFailed, UsageError

SANDBOX_SITE = Path(__file__).parent / "fixtures" / "slurm" / "sandbox_site.yaml"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """cwd a fresh directory; PATH only a directory with python3 in it (no sbatch, no
    squeue: a call to Slurm would fail), a registry of its own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("CLUSTERJOB_HOST", raising=False)
    monkeypatch.chdir(tmp_path)
    assert shutil.which("sbatch") is None and shutil.which("squeue") is None
    return tmp_path


def debug_cluster() -> Cluster:
    return Cluster(str(SANDBOX_SITE), debug=True)


def square(x: int) -> int:
    return x * x


def divide(a: int, b: int) -> float:
    return a / b


def test_a_function_runs_here_at_submit_with_a_job_of_the_same_interface(here: Path) -> None:
    calls: list[int] = []

    def record(x: int) -> int:
        calls.append(x)  # the very same process: its side effects are seen here
        return x + 1

    cluster = debug_cluster()
    job = cluster.options(gpus=1, model="V100", time="0:05:00").submit_function(record, 41)
    assert calls == [41]
    assert isinstance(job, Job) and isinstance(job, concurrent.futures.Future)
    assert job.job_id == "debug-1" and job.done() and job.result() == 42
    assert job.state() == "COMPLETED" and job.status().exit_code == 0
    assert job.wait().state == "COMPLETED" and job.is_function
    assert not job.cancel()
    assert cluster.registry().all() == [] and not (here / "data" / "functions").exists()


def test_an_exception_is_reraised_by_result_as_itself(here: Path) -> None:
    job = debug_cluster().submit_function(divide, 1, 0)
    with pytest.raises(ZeroDivisionError) as info:
        job.result()
    assert info.value.__traceback__ is not None  # post-mortem: pdb.post_mortem(tb) works
    assert job.state() == "FAILED" and isinstance(job.exception(), ZeroDivisionError)


def test_map_runs_every_input_in_order_as_tasks_of_one_job(here: Path) -> None:
    cluster = debug_cluster()
    cluster.submit_function(square, 1)
    jobs = cluster.map(square, [1, 2, 3])
    assert [j.id for j in jobs] == ["debug-2_0", "debug-2_1", "debug-2_2"]
    assert [j.result() for j in concurrent.futures.as_completed(jobs)] != []
    assert [j.result() for j in jobs] == [1, 4, 9]
    with cluster.executor(time="0:01:00") as pool:
        assert list(pool.map(square, [4, 5])) == [16, 25]


def test_a_result_that_cannot_travel_fails_as_in_a_job(here: Path) -> None:
    def unpicklable() -> object:
        import threading

        return threading.Lock()

    with pytest.raises(TypeError, match="pickle"):
        debug_cluster().submit_function(unpicklable).result()


def test_a_command_job_runs_as_a_child_process_in_the_submitting_directory(here: Path) -> None:
    (here / "train.py").write_text(
        "import os, sys\n"
        "open('ran.txt', 'a').write(f\"{os.getcwd()} {sys.argv[1:]} {os.environ['FOO']} "
        "{os.environ.get('SLURM_ARRAY_TASK_ID')}\\n\")\n"
    )
    cluster = debug_cluster()
    job = cluster.submit("train.py", ["--lr", "3"], env=["FOO=bar"])
    assert isinstance(job, DebugJob) and job.id == "debug-1"
    assert job.result().state == "COMPLETED"
    assert (here / "ran.txt").read_text() == f"{here} ['--lr', '3'] bar None\n"
    sweep = cluster.submit("train.py", env={"FOO": "baz"}, sweep={"lr": [1, 2]})
    assert sweep.result().state == "COMPLETED"
    assert (here / "ran.txt").read_text().splitlines()[1:] == [
        f"{here} ['--lr=1'] baz 0", f"{here} ['--lr=2'] baz 1",
    ]  # fmt: skip
    failing = cluster.submit(["python", "-c", "raise SystemExit(3)"])
    with pytest.raises(JobFailed, match="debug-3 ended FAILED") as info:
        failing.result()
    assert info.value.exit_code == 3 and failing.state() == "FAILED"


def test_options_are_checked_as_for_slurm_and_nothing_reaches_it(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["submit", "--site", str(SANDBOX_SITE), "--gpus", "1", "--model", "A10O",
                "--dry-run", "--", "nvidia-smi"]) == 2  # fmt: skip
    cli_error = capsys.readouterr().err.strip().removeprefix("clusterjob: error: ")
    cluster = debug_cluster()
    for submit in (
        lambda: cluster.options(gpus=1, model="A10O").submit(["nvidia-smi"]),
        lambda: cluster.options(gpus=1, model="A10O").submit_function(square, 2),
        lambda: cluster.options(gpus=1, model="A10O").map(square, [1, 2]),
    ):
        with pytest.raises(UsageError) as info:
            submit()
        assert str(info.value) == cli_error
    with pytest.raises(UsageError, match="--output logs/x.out: directory .* does not exist"):
        cluster.options(output="logs/x.out").submit_function(square, 2)
    with pytest.raises(UsageError, match=r"debug=True\) sends nothing to Slurm"):
        cluster.submit_prepared(cluster.prepare(["nvidia-smi"]))
    with pytest.raises(UsageError, match=r"debug=True\) sends nothing to Slurm"):
        cluster.submit_test_only(["nvidia-smi"])
    with pytest.raises(UsageError, match=r"debug=True\) sends nothing to Slurm"):
        cluster.resubmit("1")
    with pytest.raises(UsageError, match="debug-1 ran here"):
        cluster.submit(["python3", "-c", "pass"]).stdout()
    assert cluster.slurm_calls == 0
