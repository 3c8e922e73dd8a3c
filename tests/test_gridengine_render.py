"""A Grid Engine site's job script: the request's words in qsub's (clusterjob.gridengine.
syntax), the backend the site's ``scheduler:`` picks, and what is refused before qsub.
The rendered scripts themselves are golden files (tests/test_render_golden.py, gelab-*)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterjob import resources
from clusterjob.errors import UsageError
from clusterjob.gridengine import syntax
from clusterjob.jobscript.backends import BACKENDS, backend_for
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site
from clusterjob.site.model import SCHEDULERS
from tests.test_gridengine_runner import recorded

GELAB = resources.site_configs_dir() / "gelab.yaml"
TRAIN = str(Path(__file__).resolve().parent.parent / "examples" / "train.py")
TOKEN = "0123456789abcdef"


def _render(**kw: object) -> str:
    site = load_site(GELAB)
    job = resolve(site, JobRequest("train.py", token=TOKEN, **kw), choose_interpreter=False)  # type: ignore[arg-type]
    return render(site, job, python="/usr/bin/python3").script


# -- the table ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "tasks"),
    [
        ("0-9", syntax.ArrayTasks(1, 10, 1, None)),
        ("0-15:4%2", syntax.ArrayTasks(1, 16, 4, 2)),
        ("3", syntax.ArrayTasks(4, 4, 1, None)),
    ],
)
def test_array_tasks_count_from_one(spec: str, tasks: syntax.ArrayTasks) -> None:
    assert syntax.array_tasks(spec) == tasks


@pytest.mark.parametrize("spec", ["1,3,5", "5-2", "0-9:0", "%4", "a-b"])
def test_array_tasks_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="--array"):
        syntax.array_tasks(spec)


@pytest.mark.parametrize(
    ("dependency", "ids"),
    [("afterany:12", ("12",)), ("afterany:12:13", ("12", "13")), ("12", ("12",))],
)
def test_hold_jids(dependency: str, ids: tuple[str, ...]) -> None:
    assert syntax.hold_jids(dependency) == ids


@pytest.mark.parametrize("dependency", ["afterok:12", "afternotok:3", "singleton", "afterany:"])
def test_dependencies_grid_engine_cannot_say(dependency: str) -> None:
    with pytest.raises(ValueError, match="--dependency"):
        syntax.hold_jids(dependency)


@pytest.mark.parametrize(
    ("pattern", "path"),
    [
        ("logs/%x-%j.out", "logs/$JOB_NAME-$JOB_ID.out"),
        ("out.%A.%a", "out.$JOB_ID.$TASK_ID"),
        ("plain.log", "plain.log"),
    ],
)
def test_log_paths(pattern: str, path: str) -> None:
    assert syntax.log_path(pattern, "--output") == path


@pytest.mark.parametrize("pattern", ["out-%N.log", "with space.log", "a'b", "x\ny"])
def test_log_paths_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match="--output"):
        syntax.log_path(pattern, "--output")


def test_mail_events() -> None:
    assert syntax.mail_events("END,FAIL") == "ea"
    assert syntax.mail_events("ALL") == "bea"
    with pytest.raises(ValueError, match="--mail-type"):
        syntax.mail_events("TIME_LIMIT_80")


@pytest.mark.parametrize("name", ["a/b", "a:b", "x y", "a@b", "q*"])
def test_job_names_qsub_refuses(name: str) -> None:
    with pytest.raises(ValueError, match="job name"):
        syntax.job_name(name)


def test_directives_in_order() -> None:
    job = syntax.QsubRequest(
        name="t", queue="gpu.q", gpus=2, gpu_type="a100", runtime_s=5400, token="ab"
    )
    assert syntax.directives(job) == (
        "-N t",
        "-S /bin/bash",
        "-cwd",
        "-V",
        "-j y",
        "-q gpu.q",
        "-l gpu=2,gpu_type=a100,h_rt=1:30:00",
        "-r n",
        "-ac clusterjob=ab",
    )


# -- the backend -------------------------------------------------------------------------------


def test_every_scheduler_has_a_backend() -> None:
    assert set(BACKENDS) == set(SCHEDULERS)


def test_the_site_picks_the_backend() -> None:
    assert backend_for(load_site(GELAB)).submit_program == "qsub"
    slurm_site = load_site(resources.site_configs_dir() / "mllab.yaml")
    assert backend_for(slurm_site).submit_program == "sbatch"


def test_the_submit_command_is_qsub() -> None:
    site = load_site(GELAB)
    job = resolve(site, JobRequest("train.py", gpus=1, model="a100"), choose_interpreter=False)
    assert render(site, job, script_path="job.sh").sbatch_argv == ["qsub", "job.sh"]


def test_no_sbatch_line_in_a_grid_engine_script() -> None:
    script = _render(gpus=4, model="A100", time="2:00:00")
    assert "#SBATCH" not in script and "srun" not in script and "SLURM_" not in script
    assert "#$ -l gpu=4,gpu_type=a100,h_rt=2:00:00\n" in script


# -- refused before qsub -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(gpus=9, model="H100"), "9"),  # more than any host has
        (dict(gpus=1, model="V100"), "V100"),  # not a model of this site
        (dict(gpus=5, model="A100"), "A100"),  # A100 hosts have 4
        (dict(gpus=2, model="A100", nodes=2), "more than one node"),
        (dict(gpus=1, model="A100", qos="high"), "--qos"),
        (dict(gpus=1, model="A100", constraint="ib"), "--constraint"),
        (dict(gpus=1, model="A100", retry_bad_node=1), "--retry-bad-node"),
        (dict(gpus=1, model="A100", cpus_per_gpu=8), "CPUs per GPU"),
        (dict(gpus=1, model="A100", dependency="afterok:3"), "afterany"),
        (dict(gpus=1, model="A100", array="1,3"), "one range"),
        (dict(gpus=1, model="A100", output="out %j.log"), "--output"),
        (dict(gpus=1, model="A100", time="3-00:00:00"), "limit"),
    ],
)
def test_impossible_requests_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _render(**kw)


def test_scripts_pass_bash_syntax_check(tmp_path: Path) -> None:
    import subprocess

    path = tmp_path / "job.sh"
    path.write_text(_render(gpus=2, model="A100", task_args=(("a",), ("b",)), array="%1"))
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def _fake_qsub(bin_dir: Path, answer: str, code: int = 0) -> Path:
    """A qsub that notes its arguments and answers as Grid Engine's did."""
    bin_dir.mkdir(exist_ok=True)
    seen = bin_dir / "seen"
    qsub = bin_dir / "qsub"
    stream = ">&2" if code else ""
    qsub.write_text(
        f'#!/bin/sh\necho "$@" >>{seen}\ncat <<"EOF" {stream}\n{answer}EOF\nexit {code}\n'
    )
    qsub.chmod(0o755)
    return seen


def test_submitting_to_a_grid_engine_site_runs_qsub_once_and_records_its_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterjob.jobs.registry import Registry
    from clusterjob.jobs.submit import submit

    seen = _fake_qsub(tmp_path / "bin", recorded("qsub-plain.txt"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    site = load_site(GELAB)
    job = resolve(site, JobRequest("train.py", gpus=1, model="a100"), choose_interpreter=False)
    rendered = render(site, job)
    work = tmp_path / "work"
    work.mkdir()
    result = submit(site, job, rendered, workdir=work)
    assert seen.read_text().split() == ["-wd", str(work), result.script_path]
    (record,) = Registry().all()
    assert (record.job_id, record.scheduler, record.state) == (
        result.job_id,
        "gridengine",
        "PENDING",
    )


def test_a_refused_qsub_leaves_no_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterjob.cli.app import run
    from clusterjob.jobs.registry import Registry

    _fake_qsub(tmp_path / "bin", recorded("qsub-refused-gpu5.txt"), code=1)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    code = run(["submit", "--site", str(GELAB), "--gpus", "1", "--model", "a100", TRAIN])
    assert code != 0
    assert Registry().all() == []


def test_submit_dry_run_prints_the_grid_engine_script_and_its_qsub(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from clusterjob.cli.app import run

    code = run(
        ["submit", "--site", str(GELAB), "--gpus", "2", "--model", "h100", "--dry-run", TRAIN]
    )
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert "#$ -l gpu=2,gpu_type=h100" in lines
    assert not any(line.startswith("#SBATCH") for line in lines)
    token = next(ln for ln in lines if ln.startswith("#$ -ac clusterjob=")).split("=")[1]
    assert lines[-1] == f"# qsub clusterjob-{token}.sh"
