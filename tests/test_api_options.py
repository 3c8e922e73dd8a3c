"""Every job option of the Python API reaches the job, as the command line's does.

The options are the ``clusterjob submit`` command's own (read from the CLI, not listed here):
each one, given to ``Cluster.options(...)``, must reach the rendered job script of a command
job (``submit``) and of a function job (``submit_function``), and be checked by the same code
as on the command line (an unknown model is the CLI's error, before anything reaches Slurm).
The jobs go through the whole submission path to a stateful stand-in for Slurm."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob.api.cluster import Cluster
from clusterjob.cli.app import run
from clusterjob.errors import UsageError

SANDBOX_SITE = Path(__file__).parent / "fixtures" / "slurm" / "sandbox_site.yaml"

# The command's own names, as API keywords; the options that are not about the job itself.
RENAMED = {"sbatch_arg": "sbatch_args", "launcher_arg": "launcher_args", "module": "modules"}
CLI_ONLY = {"site", "dry_run", "test_only", "mkdir", "as_json", "parsable"}

# Per option: the options to give (it, and what it needs beside it at this site) and a line
# (or part of one) it puts in the job script. ``{dir}``: the test's own directory; ``{job}``:
# a job Slurm has.
CASES: dict[str, tuple[dict[str, object], str]] = {
    "gpus": ({"gpus": 2, "model": "V100"}, "#SBATCH --gres=gpu:v100:2"),
    "model": ({"gpus": 1, "model": "a100"}, "#SBATCH --gres=gpu:a100:1"),
    "nodes": ({"nodes": 2}, "#SBATCH --nodes=2"),
    "partition": ({"partition": "suspect"}, "#SBATCH --partition=suspect"),
    "time": ({"time": "0:05:00"}, "#SBATCH --time=0:05:00"),
    "account": ({"account": "acc1"}, "#SBATCH --account=acc1"),
    "qos": ({"qos": "short"}, "#SBATCH --qos=short"),
    "cpus_per_gpu": ({"gpus": 1, "model": "V100", "cpus_per_gpu": 3}, "#SBATCH --cpus-per-gpu=3"),
    "mem_per_gpu": ({"gpus": 1, "model": "V100", "mem_per_gpu": "8G"}, "--mem-per-gpu=8G"),
    "job_name": ({"job_name": "named-job"}, "#SBATCH --job-name=named-job"),
    "array": ({"array": "0-3"}, "#SBATCH --array=0-3"),
    "dependency": ({"dependency": "afterok:{job}"}, "#SBATCH --dependency=afterok:{job}"),
    "output": ({"output": "o-%j.out"}, "#SBATCH --output=o-%j.out"),
    "error": ({"error": "e-%j.err"}, "#SBATCH --error=e-%j.err"),
    "signal": ({"signal": "B:USR1@60"}, "#SBATCH --signal=B:USR1@60"),
    "requeue": ({"requeue": True}, "#SBATCH --requeue"),
    "max_requeues": ({"max_requeues": 1}, "export CLUSTERJOB_MAX_REQUEUES=1\n"),
    "exclude": ({"exclude": "gpu3"}, "#SBATCH --exclude=gpu3"),
    "nodelist": ({"nodelist": "gpu1"}, "#SBATCH --nodelist=gpu1"),
    "mail_type": ({"mail_type": "END"}, "#SBATCH --mail-type=END"),
    "mail_user": ({"mail_user": "ada@example.org"}, "#SBATCH --mail-user=ada@example.org"),
    "constraint": ({"constraint": "fast"}, "#SBATCH --constraint=fast"),
    "sbatch_args": ({"sbatch_args": ["--exclusive"]}, "#SBATCH --exclusive"),
    "tasks_per_node": ({"tasks_per_node": 2}, "#SBATCH --ntasks-per-node=2"),
    "launcher": ({"launcher": "srun"}, "exec srun "),
    "launcher_args": (
        {"launcher": "srun", "launcher_args": ["--cpu-bind=cores"]}, "--cpu-bind=cores"
    ),
    "setup": ({"setup": ["echo set-up-line"]}, "echo set-up-line"),
    "modules": ({"modules": ["cuda/12.4"]}, "cuda/12.4"),
    "env": ({"env": ["FOO=bar"]}, "export FOO=bar"),
    "gres": ({"gres": ["pfsdir:scratch:1"]}, "#SBATCH --gres=pfsdir:scratch:1"),
    "project": ({"project": "proj7", "partition": "byproject"}, "#SBATCH --account=proj7-gpu"),
    "container_image": ({"container_image": "img.sqsh"}, "--container-image=img.sqsh"),
    "container_mounts": (
        {"container_image": "img.sqsh", "container_mounts": "/a:/b"},
        "--container-mounts=/a:/b",
    ),
    "apptainer": ({"apptainer": "img.sif"}, "apptainer exec --nv"),
    # not a Python clusterjob would choose itself (the machine's python3 may be /usr/bin's)
    "python": ({"python": "{dir}/own/python3"}, "python={dir}/own/python3"),
    "venv": ({"venv": "{dir}/venv"}, "export VIRTUAL_ENV={dir}/venv"),
    "conda": ({"conda": "myenv"}, "activate myenv"),
    "sweep": ({"sweep": ["lr=1,2"]}, "1) task_args=(--lr=2) ;;"),
    "params": ({"params": "{dir}/params.txt"}, "1) task_args=(--a 2) ;;"),
    "snapshot": ({"snapshot": True}, "export CLUSTERJOB_SNAPSHOT={dir}/data/snapshots/"),
    "retry_bad_node": (
        {"gpus": 1, "model": "V100", "retry_bad_node": 2}, "# --retry-bad-node 2: then "
    ),
}  # fmt: skip
# Options whose doing is a line left out: each has its own test below.
NOT_IN_SCRIPT = {"avoid"}


def command_options(name: str) -> list[str]:
    """The options of `clusterjob NAME` that describe the job, as API keywords."""
    from typer.main import get_command

    from clusterjob.cli import app as cli

    cli._register_commands(name)
    command = get_command(cli.app).commands[name]  # type: ignore[attr-defined]
    names = {p.name for p in command.params if p.param_type_name == "option"}
    return sorted({RENAMED.get(n, n) for n in names if n} - CLI_ONLY)


def submit_options() -> list[str]:
    """The options of `clusterjob submit` that describe the job, as API keywords."""
    return command_options("submit")


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sandbox's site with one more partition whose account is built from --project, a
    venv, a params file and a conda to activate, cwd a fresh directory."""
    site = SANDBOX_SITE.read_text().replace(
        "partitions:\n",
        'partitions:\n  byproject:\n    nodes: "gpu[1-2]"\n    time_limit: "1-00:00:00"\n'
        '    default: false\n    defaults: {account: "{project}-gpu"}\n',
        1,
    )
    (tmp_path / "site.yaml").write_text(site)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "python3").symlink_to(sys.executable)
    (tmp_path / "params.txt").write_text("--a 1\n--a 2\n")
    conda = tmp_path / "conda"
    conda.write_text("#!/bin/sh\nexit 0\n")
    conda.chmod(0o755)
    monkeypatch.setenv("CONDA_EXE", str(conda))
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def the_cluster(here: Path, slurm: FakeSlurm) -> Cluster:
    return Cluster(str(here / "site.yaml"), host="", exec=slurm, poll_interval=3600)


def answer(x: int = 1) -> int:
    return x


def test_every_submit_option_has_a_case() -> None:
    assert sorted([*CASES, *NOT_IN_SCRIPT]) == submit_options()


@pytest.mark.parametrize("kind", ["command", "function"])
@pytest.mark.parametrize("name", sorted(set(submit_options()) - NOT_IN_SCRIPT))
def test_an_option_of_options_reaches_the_job_script(here: Path, name: str, kind: str) -> None:
    slurm = FakeSlurm("sandbox")
    words = {"dir": here, "job": slurm.add_job(state="RUNNING", reason="None")}
    given, line = CASES[name]
    given = {k: v.format(**words) if isinstance(v, str) else v for k, v in given.items()}
    line = line.format(**words)
    cluster = the_cluster(here, slurm)
    plain = cluster.prepare(["nvidia-smi"]).script
    assert line not in plain  # the line is the option's doing
    view = cluster.options(**given)
    job = view.submit(["nvidia-smi"]) if kind == "command" else view.submit_function(answer, 2)
    record = cluster.registry().get(job.id.split("_")[0])
    assert record is not None
    assert line in record.script, record.script
    (sbatch,) = slurm.commands("sbatch")  # exactly the job recorded went to Slurm
    assert Path(sbatch[-1]).read_text() == record.script


def test_a_call_keyword_wins_over_options_and_cluster_python_is_the_jobs(here: Path) -> None:
    cluster = Cluster(str(here / "site.yaml"), host="", python="/usr/bin/python3")
    view = cluster.options(time="0:05:00", job_name="from-options")
    script = view.prepare(["nvidia-smi"], job_name="from-call").script
    assert "#SBATCH --job-name=from-call" in script and "#SBATCH --time=0:05:00" in script
    assert "python=/usr/bin/python3" in script  # Cluster(python=...), as --python
    venv = view.prepare(["nvidia-smi"], venv=str(here / "venv")).script
    assert f"export VIRTUAL_ENV={here}/venv" in venv  # the call's own choice wins


def test_a_bad_option_value_is_the_cli_error_before_slurm(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["submit", "--site", str(here / "site.yaml"), "--gpus", "1", "--model", "A10O",
                "--", "nvidia-smi"]) == 2  # fmt: skip
    cli_error = capsys.readouterr().err.strip().removeprefix("clusterjob: error: ")
    slurm = FakeSlurm("sandbox")
    cluster = the_cluster(here, slurm)
    for submit in (
        lambda: cluster.options(gpus=1, model="A10O").submit(["nvidia-smi"]),
        lambda: cluster.options(gpus=1, model="A10O").submit_function(answer),
        lambda: cluster.options(gpus=1, model="A10O").map(answer, [1, 2]),
        lambda: cluster.options(gpus=1).submit(["nvidia-smi"], model="A10O"),
    ):
        with pytest.raises(UsageError) as info:
            submit()
        assert str(info.value) == cli_error
    assert slurm.commands("sbatch") == [] and cluster.registry().all() == []


def test_an_unknown_keyword_names_the_valid_ones(here: Path) -> None:
    cluster = the_cluster(here, FakeSlurm("sandbox"))
    for call in (
        lambda: cluster.options(gpu=2),
        lambda: cluster.submit(["nvidia-smi"], gpu=2),
        lambda: cluster.prepare(["nvidia-smi"], gpu=2),
        lambda: cluster.executor(gpu=2),
    ):
        with pytest.raises(UsageError, match=r"^unknown job option 'gpu' .*: gpus, model, "):
            call()


def shell_options() -> list[str]:
    """The options of `clusterjob shell` that describe the session, as API keywords."""
    return command_options("shell")


# The srun option each `clusterjob shell` option gives (with what it needs beside it).
SHELL_CASES: dict[str, tuple[dict[str, object], str]] = {
    name: CASES[name]
    for name in ("gpus", "model", "partition", "time", "account", "qos", "cpus_per_gpu",
                 "constraint", "exclude", "nodelist", "job_name")
}  # fmt: skip
SHELL_CASES["mem_per_gpu"] = CASES["mem_per_gpu"][0], "--mem-per-gpu=8G"


def test_the_shell_keywords_are_the_shell_options() -> None:
    from clusterjob.api.cluster import SHELL_OPTIONS

    assert sorted(SHELL_OPTIONS) == shell_options() == sorted(SHELL_CASES)


@pytest.mark.parametrize("name", shell_options())
def test_an_option_of_options_reaches_the_shell(here: Path, name: str) -> None:
    given, line = SHELL_CASES[name]
    option = line.removeprefix("#SBATCH ")
    cluster = the_cluster(here, FakeSlurm("sandbox"))
    assert option not in str(cluster.shell(dry_run=True))
    assert option in str(cluster.options(**given, sweep=["a=1,2"]).shell(dry_run=True))
    with pytest.raises(UsageError, match=r"^unknown shell option 'sweep' .*: gpus, model, "):
        cluster.shell(dry_run=True, sweep=["a=1,2"])


@pytest.mark.parametrize("kind", ["command", "function"])
def test_the_avoid_list_joins_exclude_unless_avoid_is_false(here: Path, kind: str) -> None:
    """A node on the avoid list (jobs/badnodes.py) is excluded, after the user's own -x;
    ``avoid=False`` (``--no-avoid``) leaves it out, and a node the user pins is never added."""
    cluster = the_cluster(here, FakeSlurm("sandbox"))
    cluster.avoid_list().add([("gpu2", "preflight failed: gpu-model: wrong")], cluster="sandbox",
                             job_id="7")  # fmt: skip
    for options, line in (
        ({}, "#SBATCH --exclude=gpu2\n"),
        ({"exclude": "gpu3"}, "#SBATCH --exclude=gpu3,gpu2\n"),
        ({"avoid": False}, None),
        ({"nodelist": "gpu2"}, None),
    ):
        view = cluster.options(**options)
        job = view.submit(["nvidia-smi"]) if kind == "command" else view.submit_function(answer)
        record = cluster.registry().get(job.id.split("_")[0])
        assert record is not None
        excludes = [x for x in record.script.splitlines() if x.startswith("#SBATCH --exclude")]
        assert excludes == ([line.strip()] if line else [] if "exclude" not in options else []), (
            options,
            record.script,
        )
    note = cluster.prepare(["nvidia-smi"]).notes[-1]
    # the age is the clock's (a loaded machine takes a second or more between the two)
    assert re.match(r"avoiding gpu2 \(preflight failed \d+s ago: gpu-model: wrong, job 7\)", note)
