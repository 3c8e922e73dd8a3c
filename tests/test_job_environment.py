"""The user's environment in the job: which interpreter, why, and the site's `job:` entries.

Real files in temp dirs: stand-in interpreters are small executables, a stand-in conda prints
a shell hook as conda does; rendered scripts run under bash with a stand-in preflight.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from clusterjob import resources
from clusterjob.cli.app import run
from clusterjob.errors import ConfigError, UsageError
from clusterjob.jobs.logs import RankLayout, select_lines
from clusterjob.jobs.registry import JobRecord
from clusterjob.jobs.submit import recorded_request
from clusterjob.jobscript.interpreter import SubmitPython, choose, find_submit_python
from clusterjob.jobscript.program import Program, classify
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site, validate_site_file
from clusterjob.site.model import JobEnvironment

REPO = Path(__file__).resolve().parent.parent
TRAIN = str(REPO / "examples" / "train.py")
MLLAB = resources.site_configs_dir() / "mllab.yaml"


def _exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _fake_python(path: Path) -> Path:
    """An 'interpreter' that says which one it is and with what arguments."""
    return _exe(path, '#!/bin/sh\necho "ran $0 $*"\necho "PATH=$PATH"\n')


def _site_with_job(tmp_path: Path, top: str, partition: str = "") -> Path:
    """mllab with a top-level ``job:`` entry (and one for partition gpu)."""
    text = MLLAB.read_text()
    if partition:
        text = text.replace("    default: true\n", f"    default: true\n    job: {partition}\n", 1)
    path = tmp_path / "site.yaml"
    path.write_text(text + (f"job: {top}\n" if top else ""))
    return path


# -- the submitting shell's python ----------------------------------------------------------


def test_python3_on_path_is_found_as_an_absolute_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)  # a venv's bin/python is such a link
    found = find_submit_python({"PATH": f"{bin_dir}:/usr/bin", "VIRTUAL_ENV": str(tmp_path)})
    assert found == SubmitPython(str(bin_dir / "python3"), str(tmp_path))


def test_a_shim_is_resolved_to_the_interpreter_it_runs(tmp_path: Path) -> None:
    """pyenv and asdf put shell scripts named python3 on PATH; the job gets the real one."""
    _exe(tmp_path / "shims" / "python3", f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    found = find_submit_python({"PATH": str(tmp_path / "shims")})
    assert found.python == sys.executable and found.active_env is None


def test_python_is_the_fallback_and_none_is_none(tmp_path: Path) -> None:
    (tmp_path / "python").symlink_to(sys.executable)
    assert find_submit_python({"PATH": str(tmp_path)}).python == str(tmp_path / "python")
    assert find_submit_python({"PATH": str(tmp_path / "empty")}).python is None


# -- the choice and its reason ----------------------------------------------------------------


def _choose(**kw: object) -> object:
    args: dict[str, object] = dict(
        python=None, venv=None, conda=None, submitted=None, site_job=JobEnvironment(),
        partition_job=JobEnvironment(), site_file="site.yaml", partition="gpu", environ={},
    )  # fmt: skip
    args.update(kw)
    return choose(**args)  # type: ignore[arg-type]


def test_order_of_choice(tmp_path: Path) -> None:
    user = _fake_python(tmp_path / "user" / "bin" / "python3")
    site_py = _fake_python(tmp_path / "site" / "bin" / "python3")
    part_py = _fake_python(tmp_path / "part" / "bin" / "python3")
    given = _fake_python(tmp_path / "given" / "python")
    site_job = JobEnvironment(python=str(site_py))
    part_job = JobEnvironment(python=str(part_py))
    plain = SubmitPython(str(user))
    active = SubmitPython(str(user), active_env=str(tmp_path / "user"))

    got = _choose(python=str(given), submitted=active, site_job=site_job, partition_job=part_job)
    assert (got.python, got.why) == (str(given), "--python")  # type: ignore[attr-defined]
    got = _choose(submitted=active, site_job=site_job, partition_job=part_job)
    assert got.python == str(user)  # type: ignore[attr-defined]
    assert got.why == f"python3 on the submitting PATH, env {tmp_path / 'user'} active"  # type: ignore[attr-defined]
    got = _choose(submitted=plain, site_job=site_job, partition_job=part_job)
    assert (got.python, got.why) == (str(part_py), "site.yaml: partitions.gpu.job python")  # type: ignore[attr-defined]
    got = _choose(submitted=plain, site_job=site_job)
    assert (got.python, got.why) == (str(site_py), "site.yaml: job python")  # type: ignore[attr-defined]
    got = _choose(submitted=plain)
    assert (got.python, got.why) == (str(user), "python3 on the submitting PATH")  # type: ignore[attr-defined]
    assert _choose() is None


def test_venv_gives_its_bin_python_and_goes_first_on_path(tmp_path: Path) -> None:
    _fake_python(tmp_path / "env" / "bin" / "python")
    got = _choose(venv=str(tmp_path / "env"))
    assert got.python == str(tmp_path / "env" / "bin" / "python")  # type: ignore[attr-defined]
    assert got.venv == str(tmp_path / "env")  # type: ignore[attr-defined]
    assert got.bin_dir == str(tmp_path / "env" / "bin")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"python": "/no/such/python"}, "--python /no/such/python: no such file"),
        ({"python": "/"}, "--python /: is a directory, not an interpreter"),
        ({"python": "{plain}"}, "--python {plain}: not executable"),
        ({"venv": "/no/such/env"}, "--venv /no/such/env: no such directory"),
        ({"venv": "{tmp}"}, "--venv {tmp}: no bin/python in it (not a virtual environment?)"),
        ({"conda": "ml"}, "--conda: neither conda nor micromamba found"),
        ({"python": "/usr/bin/python3", "conda": "ml"}, "--python and --conda exclude each other"),
    ],
)
def test_bad_interpreter_choices_are_refused(
    tmp_path: Path, kw: dict[str, str], message: str
) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program")
    fill = {"plain": str(plain), "tmp": str(tmp_path)}
    kw = {k: v.format(**fill) for k, v in kw.items()}
    with pytest.raises(UsageError, match="^" + re.escape(message.format(**fill))):
        _choose(environ={"PATH": str(tmp_path / "nothing")}, **kw)


# -- the site's job: entries ----------------------------------------------------------------


def test_site_and_partition_job_entries_load(tmp_path: Path) -> None:
    path = _site_with_job(
        tmp_path, '{conda: ml, setup: ["module load cuda/12.4"]}', "{venv: /opt/envs/torch}"
    )
    site = load_site(path)
    assert site.job == JobEnvironment(conda="ml", setup=("module load cuda/12.4",))
    assert site.partition("gpu").job == JobEnvironment(venv="/opt/envs/torch")  # type: ignore[union-attr]
    assert site.partition("debug").job == JobEnvironment()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("top", "partition", "message"),
    [
        ("{python: bin/python}", "", "job.python: not an absolute path: 'bin/python'"),
        ("{python: /x/python, conda: ml}", "", "job.conda: give one of python, venv, conda"),
        ("{setup: [1]}", "", "job.setup[0]: expected a string"),
        ('{setup: ["a\\nb"]}', "", "job.setup[0]: one shell line per item"),
        ("{shell: zsh}", "", "job.shell: unknown key; valid keys: conda, python, setup, venv"),
        ("", "{venv: env}", "partitions.gpu.job.venv: not an absolute path: 'env'"),
    ],
)
def test_bad_job_entries_name_file_line_and_key(
    tmp_path: Path, top: str, partition: str, message: str
) -> None:
    path = _site_with_job(tmp_path, top, partition)
    site, issues = validate_site_file(path)
    assert site is None
    errors = [str(i) for i in issues if not i.warning]
    assert len(errors) == 1, errors
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "job: " in text)
    assert errors[0].startswith(f"{path}:{line}: {message}"), errors
    with pytest.raises(ConfigError):
        load_site(path)


# -- the rendered script ----------------------------------------------------------------------


def _run_script(script: str, tmp_path: Path, env: dict[str, str] | None = None) -> str:
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run(
        ["bash", str(path)], capture_output=True, text=True, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_script_names_the_interpreter_and_why_and_runs_it(tmp_path: Path) -> None:
    site = load_site(MLLAB)
    python = _fake_python(tmp_path / "env" / "bin" / "python")
    job = resolve(site, JobRequest("train.py", model="a100", venv=str(tmp_path / "env")))
    assert job.request.python == str(python) and job.request.python_why == "--venv"
    script = render(site, job, node_command=["true"]).script
    assert f"# Python: {python} (--venv)" in script.splitlines()
    out = _run_script(script, tmp_path).splitlines()
    assert out[0] == f"ran {python} train.py"
    assert out[1].startswith(f"PATH={tmp_path / 'env' / 'bin'}:")


def test_conda_env_is_activated_through_condas_own_hook(tmp_path: Path) -> None:
    """A stand-in conda whose `shell.bash hook` defines `conda` as the real hook does."""
    env_bin = tmp_path / "envs" / "ml" / "bin"
    _fake_python(env_bin / "python")
    conda = _exe(
        tmp_path / "conda" / "bin" / "conda",
        "#!/bin/sh\n"
        '[ "$1 $2" = "shell.bash hook" ] || exit 9\n'
        f'echo \'conda() {{ [ "$1" = activate ] && [ "$2" = ml ] && '
        f"export PATH={env_bin}:$PATH CONDA_PREFIX={env_bin.parent}; }}'\n",
    )
    site = load_site(MLLAB)
    job = resolve(
        site, JobRequest("train.py", model="a100", conda="ml"), environ={"CONDA_EXE": str(conda)}
    )
    script = render(site, job, node_command=["true"]).script
    assert "# Python: conda env ml (--conda), activated through conda's own shell hook." in script
    out = _run_script(script, tmp_path).splitlines()
    assert out[0] == f"ran {env_bin / 'python'} train.py"


def test_a_missing_conda_env_fails_the_job_with_one_line(tmp_path: Path) -> None:
    conda = _exe(
        tmp_path / "conda",
        "#!/bin/sh\necho 'conda() { echo \"EnvironmentNameNotFound: $2\" >&2; return 1; }'\n",
    )
    site = load_site(MLLAB)
    job = resolve(
        site, JobRequest("train.py", model="a100", conda="nope"), environ={"CONDA_EXE": str(conda)}
    )
    path = tmp_path / "job.sh"
    path.write_text(render(site, job, node_command=["true"]).script)
    proc = subprocess.run(["bash", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert (
        proc.stderr.splitlines()[-1] == f"clusterjob: cannot activate conda env nope with {conda}"
    )


def test_the_choice_is_recorded_and_reused_on_resubmit(tmp_path: Path) -> None:
    site = load_site(MLLAB)
    python = _fake_python(tmp_path / "bin" / "python3")
    submitted = JobRequest("train.py", model="a100", submit_python=str(python))
    job = resolve(site, submitted)
    record = JobRecord(
        job_id="1", cluster="c", site="mllab", token=job.token, job_name="train", script="",
        script_path="", command_line="", work_dir=str(tmp_path), git_commit=None,
        submitted_at=0.0,
        request=json.dumps(asdict(job.request)),
    )  # fmt: skip
    again = resolve(site, recorded_request(record))
    assert again.interpreter is not None
    assert again.interpreter.python == str(python)
    assert again.interpreter.why == "recorded at submit: python3 on the submitting PATH"


# -- the command line -------------------------------------------------------------------------


def test_dry_run_shows_the_users_python_not_clusterjobs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = tmp_path / "userenv" / "bin"
    user.mkdir(parents=True)
    (user / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{user}:{os.environ['PATH']}")
    monkeypatch.setenv("VIRTUAL_ENV", str(user.parent))
    code = run(
        ["submit", "--site", str(MLLAB), "--gpus", "1", "--model", "a100", "--dry-run", TRAIN]
    )
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert (
        f"# Python: {user / 'python3'} (python3 on the submitting PATH, env {user.parent} active)"
        in lines
    )
    assert f"python={user / 'python3'}" in lines


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--python", "/no/such/python"], "--python /no/such/python: no such file"),
        (["--venv", "/no/such/env"], "--venv /no/such/env: no such directory"),
        (["--python", "/usr/bin/python3", "--venv", "/tmp"], "--python and --venv exclude"),
    ],
)
def test_bad_interpreter_options_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], option: list[str], message: str
) -> None:
    code = run(["submit", "--site", str(MLLAB), "--gpus", "1", "--model", "a100", *option, TRAIN])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"clusterjob: error: {message}"), err


# -- any command ------------------------------------------------------------------------------


def test_a_py_script_runs_with_the_jobs_python(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    assert classify("train.py", tmp_path) == Program("train.py", command=False)
    with pytest.raises(UsageError, match="^script not found: 'other.py'$"):
        classify("other.py", tmp_path)


def test_commands_and_executables_run_as_given(tmp_path: Path) -> None:
    _exe(tmp_path / "run.sh", "#!/bin/bash\necho hi\n")
    _exe(tmp_path / "bin" / "tool", "#!/bin/sh\n")
    assert classify("bash", tmp_path) == Program("bash", command=True)
    assert classify("accelerate", tmp_path) == Program("accelerate", command=True)
    assert classify("run.sh", tmp_path) == Program("./run.sh", command=True)  # not PATH's
    assert classify("bin/tool", tmp_path) == Program("bin/tool", command=True)
    assert classify(str(tmp_path / "run.sh"), tmp_path).command


def test_a_non_executable_python_script_runs_with_the_jobs_python(tmp_path: Path) -> None:
    (tmp_path / "train").write_text("#!/usr/bin/env python3\nprint(1)\n")
    assert classify("train", tmp_path) == Program("train", command=False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "#!/bin/bash\necho hi\n",
            "run.sh is not executable and its #! line names bash: chmod +x run.sh, or submit "
            "it as: -- bash run.sh",
        ),
        (
            "#!/usr/bin/env -S zsh -f\n",
            "run.sh is not executable and its #! line names zsh: chmod +x run.sh, or submit "
            "it as: -- zsh run.sh",
        ),
        (
            "echo hi\n",
            "run.sh is not executable and has no #! line: chmod +x it, or name its "
            "interpreter: -- bash run.sh",
        ),
    ],
)
def test_a_non_executable_non_python_script_is_refused_with_a_hint(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "run.sh").write_text(text)
    with pytest.raises(UsageError) as err:
        classify("run.sh", tmp_path)
    assert str(err.value) == message
    with pytest.raises(UsageError, match="is a directory"):
        classify(str(tmp_path), tmp_path)


@pytest.mark.parametrize(
    ("words", "runs_python", "argv"),
    [
        (("train.py", "--lr", "1"), True, ("train.py", "--lr", "1")),
        (("python", "-m", "pkg", "$HOME"), True, ("-m", "pkg", "$HOME")),
        (("python3", "-c", "print(1)"), True, ("-c", "print(1)")),
        (("bash", "run.sh", "a b"), False, ("bash", "run.sh", "a b")),
        (("accelerate", "launch", "t.py"), False, ("accelerate", "launch", "t.py")),
    ],
)
def test_the_program_line_of_the_script(
    words: tuple[str, ...], runs_python: bool, argv: tuple[str, ...]
) -> None:
    site = load_site(MLLAB)
    request = JobRequest(
        words[0], args=words[1:], model="a100", command=not words[0].endswith(".py"),
        python="/bin/sh",
    )  # fmt: skip
    job = resolve(site, request)
    assert (job.runs_python, job.argv) == (runs_python, argv)
    script = render(site, job).script
    last = script.rstrip().splitlines()[-1]
    prefix = 'exec "$python" ' if runs_python else "exec "
    assert last == prefix + " ".join(shlex.quote(w) for w in argv)


def test_a_command_under_multi_node_torchrun_is_no_python(tmp_path: Path) -> None:
    site = load_site(MLLAB)
    request = JobRequest("bash", args=("run.sh",), model="a100", nodes=2, command=True)
    script = render(site, resolve(site, request), python="/bin/sh").script
    assert (
        '--master-port="$MASTER_PORT" --tee=3 --no-python "$@"\' \\\n    "$python" bash run.sh'
        in script
    )


def test_dry_run_of_a_command_after_double_dash(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _exe(tmp_path / "run.sh", "#!/bin/bash\n")
    base = ["submit", "--site", str(MLLAB), "--gpus", "1", "--model", "a100", "--dry-run"]
    assert run([*base, "--", "./run.sh", "--lr", "3e-4"]) == 0
    assert "exec ./run.sh --lr 3e-4" in capsys.readouterr().out.splitlines()
    assert run([*base, "--", "accelerate", "launch", "--num_processes", "2", "t.py"]) == 0
    assert "exec accelerate launch --num_processes 2 t.py" in capsys.readouterr().out
    (tmp_path / "plain.sh").write_text("#!/bin/bash\n")
    assert run([*base, "plain.sh"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("clusterjob: error: plain.sh is not executable and its #! line")


# -- launchers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "launcher"),
    [
        ({}, "none"),
        ({"nodes": 2}, "torchrun"),
        ({"tasks_per_node": 2}, "srun"),
        ({"tasks_per_node": 2, "nodes": 2}, "srun"),
        ({"launcher": "torchrun"}, "torchrun"),
        ({"launcher": "none", "nodes": 2}, "none"),
        ({"launcher": "srun"}, "srun"),
    ],
)
def test_the_launcher_by_default_and_by_option(kw: dict[str, object], launcher: str) -> None:
    site = load_site(MLLAB)
    job = resolve(site, JobRequest("train.py", model="a100", python="/bin/sh", **kw))  # type: ignore[arg-type]
    assert job.launcher == launcher


def _launch_line(**kw: object) -> str:
    site = load_site(MLLAB)
    job = resolve(site, JobRequest(model="a100", python="/bin/sh", **kw))  # type: ignore[arg-type]
    return render(site, job).script.rstrip().splitlines()[-1]


def test_single_node_torchrun_starts_one_worker_per_gpu_with_the_users_options() -> None:
    line = _launch_line(
        script="train.py", gpus=2, launcher="torchrun", launcher_args=("--max-restarts=3",)
    )
    assert line == (
        'exec "$python" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 '
        "--tee=3 --max-restarts=3 train.py"
    )
    line = _launch_line(script="bash", args=("run.sh",), command=True, launcher="torchrun")
    assert line.endswith("--nproc-per-node=1 --tee=3 --no-python bash run.sh")


def test_srun_starts_tasks_per_node_tasks() -> None:
    line = _launch_line(script="train.py", tasks_per_node=4, launcher_args=("--label",))
    assert line == (
        "exec srun --nodes=1 --ntasks=4 --ntasks-per-node=4 --gres=gpu:a100:1 --label "
        '--kill-on-bad-exit=1 --label "$python" train.py'
    )


def test_multi_node_torchrun_takes_the_users_options_too() -> None:
    site = load_site(MLLAB)
    request = JobRequest(
        "train.py", model="a100", nodes=2, python="/bin/sh", launcher_args=("--max-restarts=2",)
    )
    script = render(site, resolve(site, request)).script
    assert script.rstrip().endswith('"$python" --max-restarts=2 train.py')


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"launcher": "mpirun"}, "--launcher 'mpirun': expected one of torchrun, srun, none"),
        (
            {"tasks_per_node": 2, "launcher": "torchrun"},
            "--tasks-per-node 2 with --launcher torchrun",
        ),
        ({"tasks_per_node": 3, "launcher": "none"}, "--tasks-per-node 3 with --launcher none"),
        ({"launcher_args": ("-x",)}, "--launcher-arg needs a launcher"),
    ],
)
def test_launcher_mistakes_are_refused(kw: dict[str, object], message: str) -> None:
    site = load_site(MLLAB)
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        resolve(site, JobRequest("train.py", model="a100", python="/bin/sh", **kw))  # type: ignore[arg-type]


def test_launcher_mistake_on_the_command_line_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["submit", "--site", str(MLLAB), "--gpus", "1", "--model", "a100", "--launcher", "x"]
    assert run([*argv, TRAIN]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "clusterjob: error: --launcher 'x': expected one of torchrun, srun, none\n"
    )


# -- setup lines, modules, environment variables ------------------------------------------------


_PROBE = '#!/bin/sh\necho "FOO=[$FOO] BAR=[$BAR] LOADED=[$LOADED] ORDER=[$ORDER]"\n'


def test_setup_modules_and_env_reach_the_program(tmp_path: Path) -> None:
    """Order: --env, the site's then the partition's setup, --module, --setup; a stand-in
    `module` function (exported, as Lmod and environment modules export theirs)."""
    path = _site_with_job(
        tmp_path, '{setup: ["export ORDER=site"]}', '{setup: ["ORDER=$ORDER,partition"]}'
    )
    site = load_site(path)
    probe = _exe(tmp_path / "probe", _PROBE)
    request = JobRequest(
        str(probe), command=True, model="a100", python="/bin/sh",
        env=("FOO=a b $(touch pwned)", "BAR="),
        modules=("cuda/12.4", "nccl"),
        setup=('ORDER="$ORDER,user:$LOADED"', "echo setup-ran"),
    )  # fmt: skip
    script = render(site, resolve(site, request), node_command=["true"]).script
    module = 'module() { [ "$1" = load ] && export LOADED="${LOADED:+$LOADED,}$2"; }'
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run(
        ["bash", "-c", f'{module}; export -f module; bash "$0"', str(path)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "setup-ran",
        "FOO=[a b $(touch pwned)] BAR=[] LOADED=[cuda/12.4,nccl] "
        "ORDER=[site,partition,user:cuda/12.4,nccl]",
    ]
    assert not (tmp_path / "pwned").exists()


def test_module_without_a_module_command_is_one_clear_line(tmp_path: Path) -> None:
    site = load_site(MLLAB)
    request = JobRequest("true", command=True, model="a100", modules=("cuda",), python="/bin/sh")
    script = render(site, resolve(site, request), node_command=["true"]).script
    # as on a node with neither Lmod nor environment modules installed
    script = script.replace("/etc/profile.d/", "/nonexistent/").replace("/usr/share/", "/none/")
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run(["bash", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == (
        "clusterjob: --module: this node has no 'module' command (Lmod or environment modules)\n"
    )


def test_a_failing_module_load_fails_the_job_with_its_name(tmp_path: Path) -> None:
    site = load_site(MLLAB)
    request = JobRequest("true", command=True, model="a100", modules=("nope",), python="/bin/sh")
    path = tmp_path / "job.sh"
    path.write_text(render(site, resolve(site, request), node_command=["true"]).script)
    proc = subprocess.run(
        ["bash", "-c", 'module() { return 1; }; export -f module; bash "$0"', str(path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr == "clusterjob: module load nope failed\n"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--env", "1X=2"], "--env '1X=2': expected KEY=VALUE with KEY a variable name"),
        (["--env", "NOVALUE"], "--env 'NOVALUE': expected KEY=VALUE"),
        (["--setup", "a\nb"], "--setup 'a\\nb': one line each (repeat --setup for more)"),
        (["--setup", " "], "--setup must not be empty"),
        (["--module", "a b"], "--module 'a b': one module name (repeat --module for more)"),
        (["--module", ""], "--module '': one module name"),
    ],
)
def test_setup_mistakes_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], option: list[str], message: str
) -> None:
    code = run(["submit", "--site", str(MLLAB), "--gpus", "1", "--model", "a100", *option, TRAIN])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"clusterjob: error: {message}"), err


# -- CPU-only jobs ----------------------------------------------------------------------------


def test_a_cpu_only_job_asks_for_no_gpus_and_checks_none() -> None:
    site = load_site(MLLAB)
    job = resolve(site, JobRequest("train.py", gpus=0, python="/bin/sh"))
    assert (job.model, job.gres.options, job.partition.name) == (None, (), "gpu")
    # the partition's per-GPU defaults mean nothing without GPUs (Slurm refuses them)
    assert (job.cpus_per_gpu, job.mem_per_gpu, job.account) == (None, None, "mllab")
    script = render(site, job).script
    assert not re.search(r"gres|gpus-per|per-gpu|EXPECT_|preflight$", script, re.M), script
    assert "# A CPU-only job (--gpus 0): no GPUs to check." in script
    two = resolve(
        site, JobRequest("train.py", gpus=0, nodes=2, partition="debug", python="/bin/sh")
    )
    assert (two.launcher, two.partition.name) == ("srun", "debug")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"cpus_per_gpu": 4}, "--cpus-per-gpu asks for GPUs, but this is a CPU-only job"),
        ({"launcher": "torchrun"}, "--launcher torchrun starts one worker per GPU"),
        ({"nodes": 3, "partition": "debug"}, "cannot give 3 node(s) in partition debug"),
        ({"partition": "nope"}, "unknown partition 'nope' at site mllab"),
    ],
)
def test_cpu_only_mistakes(kw: dict[str, object], message: str) -> None:
    site = load_site(MLLAB)
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        resolve(site, JobRequest("train.py", gpus=0, python="/bin/sh", **kw))  # type: ignore[arg-type]


def test_no_gpus_option_is_a_cpu_only_job(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["submit", "--site", str(MLLAB), "--dry-run", TRAIN]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --partition=gpu" in out and "--gres" not in out


# -- clusterjob shell -------------------------------------------------------------------------


def test_shell_dry_run_is_srun_pty_with_the_sites_gpu_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["shell", "--site", str(MLLAB), "--gpus", "2", "--model", "a100", "--dry-run"]
    assert run([*argv, "--", "python", "-c", "print(1)"]) == 0
    words = shlex.split(capsys.readouterr().out)
    srun = words.index("srun")
    assert "CLUSTERJOB_EXPECT_MODEL=A100" in words[:srun]
    assert "CLUSTERJOB_EXPECT_COUNT=2" in words[:srun]
    assert words[srun : srun + 4] == ["srun", "--pty", "--job-name=shell", "--partition=gpu"]
    assert words[srun + 4 : srun + 8] == [
        "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--gres=gpu:a100:2",
    ]  # fmt: skip
    inner = words[words.index("clusterjob-shell") + 1 :]
    assert inner == ["1", "/opt/clusterjob/bin/clusterjob", "python", "-c", "print(1)"]


@pytest.mark.parametrize(
    ("site", "model", "gpus", "cpus"),
    [
        ("perlmutter", "A100", "--gpus-per-node=4", "--cpus-per-task=128"),  # cpus-per-task
        ("lumi", "MI250X", "--gpus-per-node=8", "--cpus-per-task=8"),  # 8 tasks, 1 CPU each
    ],
)
def test_a_shell_gets_all_its_gpus_and_their_cpus_on_a_task_per_gpu_site(
    capsys: pytest.CaptureFixture[str], site: str, model: str, gpus: str, cpus: str
) -> None:
    """One task with the GPUs asked for: the batch's per-task options with one task gave one
    GPU (gpus-per-task) or asked CPUs per GPU where the site asks them per task."""
    count = gpus.rsplit("=", 1)[1]
    argv = ["shell", "--site", site, "--gpus", count, "--model", model, "--dry-run"]
    assert run(argv) == 0
    words = shlex.split(capsys.readouterr().out)
    assert gpus in words and cpus in words, words
    assert not [w for w in words if w.startswith(("--gpus-per-task", "--cpus-per-gpu"))]


def test_shell_without_gpus_has_no_preflight(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["shell", "--site", str(MLLAB), "--dry-run"]) == 0
    out = capsys.readouterr().out
    words = shlex.split(out)
    assert words[words.index("clusterjob-shell") + 1 :] == ["0"]
    assert "--gres" not in out and "EXPECT" not in out


def test_shell_on_a_script_runs_the_preflight_then_the_command(tmp_path: Path) -> None:
    """The node side of the session, run here: a failing preflight ends it with its status."""
    from clusterjob.jobs.interactive import shell_session

    site = load_site(MLLAB)
    job = resolve(site, JobRequest("shell", command=True, model="a100"))
    for preflight, status, shown in (("true", 0, "ran a b\n"), ("false", 1, "")):
        session = shell_session(site, job, ("echo", "ran", "a b"), node_command=[preflight])
        proc = subprocess.run(list(session.command), capture_output=True, text=True)
        assert (proc.returncode, proc.stdout) == (status, shown)


def test_shell_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["shell", "--site", str(MLLAB), "--gpus", "1", "--model", "P100"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "unknown GPU model 'P100'" in err


# -- containers -------------------------------------------------------------------------------


def _last_lines(n: int, **kw: object) -> list[str]:
    site = load_site(MLLAB)
    job = resolve(site, JobRequest(model="a100", **kw))  # type: ignore[arg-type]
    return render(site, job).script.rstrip().splitlines()[-n:]


def test_pyxis_runs_the_program_in_an_srun_step_with_the_image() -> None:
    image = "nvcr.io#nvidia/pytorch:24.01-py3"
    (line,) = _last_lines(
        1, script="train.py", container_image=image, container_mounts="/data:/data"
    )
    assert line == (
        "exec srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --gres=gpu:a100:1 "
        f"--container-image='{image}' --container-mounts=/data:/data \"$python\" train.py"
    )
    lines = _last_lines(3, script="train.py", container_image=image, nodes=2)
    assert lines[0].endswith(f"--kill-on-bad-exit=1 --container-image='{image}' \\")
    (line,) = _last_lines(1, script="train.py", container_image=image, tasks_per_node=2)
    assert f"--kill-on-bad-exit=1 --container-image='{image}' \"$python\" train.py" in line


def test_in_a_container_python_is_the_images() -> None:
    site = load_site(MLLAB)
    job = resolve(site, JobRequest("train.py", model="a100", apptainer="img.sif"))
    assert job.interpreter is not None
    assert (job.interpreter.python, job.interpreter.why) == (
        "python3",
        "python3 in the container image img.sif",
    )
    job = resolve(
        site, JobRequest("t.py", model="a100", apptainer="i.sif", python="/opt/py/bin/python")
    )
    assert job.interpreter is not None and job.interpreter.python == "/opt/py/bin/python"


def test_apptainer_exec_nv_with_the_working_dir_bound(tmp_path: Path) -> None:
    """Run with a stand-in apptainer that shows how it was called, then runs the command."""
    _exe(tmp_path / "bin" / "apptainer", '#!/bin/sh\necho "apptainer $*"\n')
    site = load_site(MLLAB)
    request = JobRequest(
        "run.sh", args=("a b",), command=True, model="a100", apptainer="/img/torch.sif"
    )
    path = tmp_path / "job.sh"
    path.write_text(render(site, resolve(site, request), node_command=["true"]).script)
    proc = subprocess.run(
        ["bash", str(path)], capture_output=True, text=True, cwd=tmp_path,
        env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"apptainer exec --nv --bind {tmp_path} /img/torch.sif run.sh a b\n"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"container_image": "a", "apptainer": "b"}, "--container-image and --apptainer exclude"),
        ({"container_mounts": "/a:/b"}, "--container-mounts needs --container-image (pyxis)"),
        ({"container_image": " "}, "--container-image must not be empty"),
        ({"apptainer": "x.sif", "venv": "/v"}, "--venv names an environment on the host"),
        ({"container_image": "x", "conda": "ml"}, "--conda names an environment on the host"),
    ],
)
def test_container_mistakes(kw: dict[str, object], message: str) -> None:
    site = load_site(MLLAB)
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        resolve(site, JobRequest("train.py", model="a100", **kw))  # type: ignore[arg-type]


def test_container_mistake_on_the_command_line_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["submit", "--site", str(MLLAB), "--gpus", "1", "--model", "a100"]
    assert run([*argv, "--container-mounts", "/a:/b", TRAIN]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "clusterjob: error: --container-mounts needs --container-image (pyxis)\n"
    )


def test_a_conda_env_without_python_fails_the_job_with_one_line(tmp_path: Path) -> None:
    conda = _exe(tmp_path / "conda", "#!/bin/sh\necho 'conda() { return 0; }'\n")
    site = load_site(MLLAB)
    job = resolve(
        site, JobRequest("train.py", model="a100", conda="bare"), environ={"CONDA_EXE": str(conda)}
    )
    path = tmp_path / "job.sh"
    path.write_text(render(site, job, node_command=["true"]).script)
    proc = subprocess.run(
        ["/bin/bash", str(path)], capture_output=True, text=True,
        env={"PATH": str(tmp_path / "none")},
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr == "clusterjob: conda env bare has no python\n"


# -- logs of many ranks -----------------------------------------------------------------------

_TORCH_TWO_NODES = (
    "preflight gpu1: OK\n"
    "0: [rank0]: hello from 0\n"
    "1: [rank2]: hello from 2\n"
    "0: [rank1]: hello from 1\n"
    "1: W torchrun warning\n"
    "1: [rank3]: hello from 3\n"
)
_SRUN_FOUR_TASKS = " 0: a0\n 2: a2\n 1: a1\n 3: a3\n10: a10\n"


@pytest.mark.parametrize(
    ("text", "layout", "rank", "node", "want"),
    [
        (_TORCH_TWO_NODES, ("torchrun", ("gpu1", "gpu2"), 1), 2, None,
         "1: [rank2]: hello from 2\n"),
        (
            _TORCH_TWO_NODES, ("torchrun", ("gpu1", "gpu2"), 1), None, "gpu2",
            "1: [rank2]: hello from 2\n1: W torchrun warning\n1: [rank3]: hello from 3\n",
        ),
        (_TORCH_TWO_NODES, ("torchrun", ("gpu1", "gpu2"), 1), 1, "gpu2", ""),
        ("[rank0]: a\n[rank1]: b\nplain\n", ("torchrun", ("gpu1",), 1), 1, None, "[rank1]: b\n"),
        ("[rank0]: a\nplain\n", ("torchrun", ("gpu1",), 1), None, "gpu1", "[rank0]: a\nplain\n"),
        (_SRUN_FOUR_TASKS, ("srun", ("n1", "n2"), 2), 1, None, " 1: a1\n"),
        (_SRUN_FOUR_TASKS, ("srun", ("n1", "n2"), 2), None, "n2", " 2: a2\n 3: a3\n"),
        (_SRUN_FOUR_TASKS, ("srun", ("n1", "n2"), 2), 10, None, "10: a10\n"),
    ],
)  # fmt: skip
def test_one_ranks_or_one_nodes_lines(
    text: str, layout: tuple[str, tuple[str, ...], int], rank: int | None, node: str | None,
    want: str,
) -> None:  # fmt: skip
    assert select_lines(text, RankLayout(*layout), rank=rank, node=node) == want


def test_rank_and_node_mistakes() -> None:
    with pytest.raises(UsageError, match=r"^--node gpu9: the job ran on gpu1, gpu2$"):
        select_lines("", RankLayout("torchrun", ("gpu1", "gpu2")), rank=None, node="gpu9")
    with pytest.raises(UsageError, match=r"^--rank: this job started one process"):
        select_lines("", RankLayout("none", ("gpu1",)), rank=0, node=None)


def test_a_sites_missing_interpreter_stops_submit_but_not_shell_or_avail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _site_with_job(tmp_path, "{python: /nonexistent/bin/python}")
    site = load_site(path)
    with pytest.raises(UsageError, match=r"^site\.yaml: job python /nonexistent/bin/python: no"):
        resolve(site, JobRequest("train.py", model="a100"))
    job = resolve(site, JobRequest("train.py", model="a100"), choose_interpreter=False)
    assert job.interpreter is None
    assert run(["shell", "--site", str(path), "--gpus", "1", "--model", "a100", "--dry-run"]) == 0
    assert "srun --pty" in capsys.readouterr().out
