"""End to end on the real local Slurm cluster: the user's own job, as the user runs it.

clusterjob runs from its own venv (this test process's interpreter); the user's packages live
in another venv made here, holding a small package clusterjob's venv lacks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterjob.sandbox import cluster

from .conftest import Cli, Sandbox
from .test_end_to_end import TRAIN, finished, logs, status, submit, wait_status

pytestmark = pytest.mark.slurm

USER_PACKAGE = "cj_userpkg_probe"


@pytest.fixture
def user_venv(tmp_path: Path) -> Path:
    """A venv outside clusterjob's, with a package only it has (no network: written here)."""
    venv = tmp_path / "userenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", ask],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    package = Path(purelib) / USER_PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("GREETING = 'hello from the user venv'\n")
    return venv


def _probe(tmp_path: Path) -> str:
    script = tmp_path / "probe.py"
    script.write_text(
        f"import sys\nimport {USER_PACKAGE}\n"
        f"print('probe:', {USER_PACKAGE}.GREETING, 'via', sys.executable)\n"
    )
    return str(script)


def test_the_users_venv_runs_the_job_by_default_and_by_option(
    cj: Cli, sandbox: Sandbox, tmp_path: Path, user_venv: Path
) -> None:
    """Default (the venv active at submit), --python, --venv and --conda (a stand-in conda):
    each job imports the package clusterjob's own venv lacks."""
    assert importlib.util.find_spec(USER_PACKAGE) is None  # clusterjob's venv lacks it
    probe = _probe(tmp_path)
    python = str(user_venv / "bin" / "python")
    active = {"PATH": f"{user_venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(user_venv)}
    gpu = ("--gpus", "1", "--model", "A100")
    site = ("--site", str(sandbox.site_path))
    # No real conda installs here (not on PyPI, no micromamba in Debian 12): a stand-in whose
    # `shell.bash hook` defines `conda` as conda's does, activating the user venv as "ml".
    conda = tmp_path / "conda" / "bin" / "conda"
    conda.parent.mkdir(parents=True)
    conda.write_text(
        '#!/bin/sh\n[ "$1 $2" = "shell.bash hook" ] || exit 9\n'
        f"echo 'conda() {{ [ \"$2\" = ml ] && export PATH={user_venv}/bin:$PATH; }}'\n"
    )
    conda.chmod(0o755)
    jobs = {
        "default": cj("submit", *site, *gpu, probe, extra_env=active),
        "--conda": cj(
            "submit", *site, *gpu, "--conda", "ml", probe, extra_env={"CONDA_EXE": str(conda)}
        ),  # fmt: skip
        "--python": cj("submit", *site, *gpu, "--python", python, probe),
        "--venv": cj("submit", *site, *gpu, "--venv", str(user_venv), probe),
    }
    ids = {}
    for how, proc in jobs.items():
        assert proc.returncode == 0, (how, proc.stderr)
        ids[how] = proc.stdout.split("Submitted job ")[1].split()[0]
    for how, job in ids.items():
        row = wait_status(cj, job, finished)
        out = logs(cj, job)
        assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (how, row, out)
        assert f"probe: hello from the user venv via {user_venv}/bin/python" in out, (how, out)
    # What was chosen, and why, is what the registry recorded.
    show = cj("show", ids["default"], "--json")
    assert show.returncode == 0, show.stderr
    info = json.loads(show.stdout)
    assert info["python"] == f"{user_venv}/bin/python3", info
    assert info["python_why"] == f"python3 on the submitting PATH, env {user_venv} active", info


def test_a_missing_interpreter_is_refused_before_sbatch(
    cj: Cli, sandbox: Sandbox, tmp_path: Path
) -> None:
    proc = cj(
        "submit", "--site", str(sandbox.site_path), "--gpus", "1", "--model", "A100",
        "--python", str(tmp_path / "no-python"), _probe(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr == f"clusterjob: error: --python {tmp_path / 'no-python'}: no such file\n"
    assert not (tmp_path / "data").exists() or "Submitted" not in proc.stdout


def test_any_command_runs_as_given(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    """An executable bash script through its #! line, `bash run.sh`, `python -m pkg`: each
    runs and completes, its arguments literal; a non-executable bash script is refused."""
    script = tmp_path / "run.sh"
    script.write_text('#!/bin/bash\necho "bash-ran: $BASH_VERSION args=[$1] [$2]"\n')
    script.chmod(0o755)
    package = tmp_path / "probe_pkg"
    package.mkdir()
    (package / "__main__.py").write_text(
        "import sys\nprint('module-ran:', sys.executable, sys.argv[1:])\n"
    )
    gpu = ("--gpus", "1", "--model", "A100")
    jobs = {
        "shebang": submit(cj, sandbox, *gpu, "--", "./run.sh", "a b", "$HOME"),
        "bash": submit(cj, sandbox, *gpu, "--", "bash", "run.sh", "x", "--gpus"),
        "module": submit(cj, sandbox, *gpu, "--", "python", "-m", "probe_pkg", "--lr", "1"),
    }
    outs = {}
    for how, job in jobs.items():
        row = wait_status(cj, job, finished)
        outs[how] = logs(cj, job)
        assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (how, row, outs[how])
    assert "bash-ran: 5" in outs["shebang"] and "args=[a b] [$HOME]" in outs["shebang"]
    assert "args=[x] [--gpus]" in outs["bash"], outs["bash"]
    assert re.search(r"^module-ran: /\S+ \['--lr', '1'\]$", outs["module"], re.M), outs["module"]

    script.chmod(0o644)
    proc = cj("submit", "--site", str(sandbox.site_path), *gpu, "run.sh")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "clusterjob: error: run.sh is not executable and its #! line names bash: "
        "chmod +x run.sh, or submit it as: -- bash run.sh\n"
    )


def _rank_summaries(out: str) -> list[dict[str, str]]:
    """examples/train.py's one line per process (after any rank label)."""
    return [
        dict(word.split("=", 1) for word in line.split("rank-summary: ", 1)[1].split())
        for line in out.splitlines()
        if "rank-summary: " in line
    ]


@pytest.mark.torch
def test_single_node_torchrun_two_ranks_each_on_its_gpu(cj: Cli, sandbox: Sandbox) -> None:
    """--launcher torchrun on one node with 2 GPUs: two workers, local ranks 0 and 1, both
    seeing the job's two GPUs in PCI order, so local rank i uses the i-th GPU Slurm gave."""
    assert importlib.util.find_spec("torch") is not None, "install torch: bash scripts/test.sh"
    job = submit(
        cj, sandbox, TRAIN, "--gpus", "2", "--model", "A100", "--launcher", "torchrun",
        "--python", sys.executable, "--launcher-arg=--max-restarts=0",
    )  # fmt: skip
    row = wait_status(cj, job, finished, timeout=180)
    out = logs(cj, job)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (row, out)
    ranks = _rank_summaries(out)
    assert sorted((r["rank"], r["local_rank"]) for r in ranks) == [("0", "0"), ("1", "1")], out
    assert {r["world_size"] for r in ranks} == {"2"}
    assert len({r["slurmd_nodename"] for r in ranks}) == 1
    assert {r["cuda_visible_devices"] for r in ranks} == {"0,1"}
    assert len(re.findall(r"^preflight gpu[12]: OK", out, re.M)) == 1, out
    # each worker's lines are labelled; `logs --rank 1` shows rank 1's alone
    one = cj("logs", job, "--rank", "1")
    assert one.returncode == 0, one.stderr
    assert one.stdout and all(ln.startswith("[rank1]: ") for ln in one.stdout.splitlines())
    assert "[rank1]: RANK=1" in one.stdout.splitlines(), one.stdout


def test_srun_starts_tasks_per_node_tasks(cj: Cli, sandbox: Sandbox) -> None:
    job = submit(
        cj, sandbox, TRAIN, "--gpus", "1", "--model", "A100", "--tasks-per-node", "2",
    )  # fmt: skip
    row = wait_status(cj, job, finished)
    out = logs(cj, job)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (row, out)
    procids = sorted(re.findall(r"^(\d+): SLURM_PROCID=(\d+)$", out, re.M))
    assert procids == [("0", "0"), ("1", "1")], out  # srun --label: each line's task
    one = cj("logs", job, "--rank", "1")
    assert one.returncode == 0 and "1: SLURM_PROCID=1" in one.stdout.splitlines(), one
    assert all(ln.startswith("1: ") for ln in one.stdout.splitlines()), one.stdout


def test_setup_module_and_env_reach_the_program(cj: Cli, sandbox: Sandbox, tmp_path: Path) -> None:
    """--env, --module (Debian's environment-modules, which scripts/test.sh installs, loading
    a modulefile made here; a stand-in `module` function where it is missing) and --setup."""
    modulefiles = tmp_path / "modulefiles"
    (modulefiles / "probe").mkdir(parents=True)
    (modulefiles / "probe" / "1.0").write_text("#%Module1.0\nsetenv PROBE_MODULE loaded-1.0\n")
    extra_env = {}
    real = Path("/usr/share/modules/init/bash").is_file()
    if not real:
        extra_env["BASH_FUNC_module%%"] = "() { export PROBE_MODULE=loaded-1.0; }"
    proc = cj(
        "submit", "--site", str(sandbox.site_path), "--gpus", "1", "--model", "A100",
        "--env", f"MODULEPATH={modulefiles}", "--env", "GREETING=a b $(nope)",
        "--module", "probe/1.0", "--setup", "export FROM_SETUP=$((6 * 7))",
        "--", "bash", "-c", 'echo "probe: $PROBE_MODULE [$GREETING] $FROM_SETUP"',
        extra_env=extra_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.split("Submitted job ")[1].split()[0]
    row = wait_status(cj, job, finished)
    out = logs(cj, job)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (row, out)
    assert "probe: loaded-1.0 [a b $(nope)] 42" in out.splitlines(), out


def test_cpu_only_job_completes_with_the_same_status_and_logs(cj: Cli, sandbox: Sandbox) -> None:
    """No --gpus: no GPU request, no preflight; registry, status and logs as for any job."""
    job = submit(cj, sandbox, TRAIN, "--", "--cpu-only-probe")
    row = wait_status(cj, job, finished)
    out = logs(cj, job)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (row, out)
    assert not row["gpus"], row  # Slurm gave no GPUs
    assert "argv[0]='--cpu-only-probe'" in out.splitlines(), out
    assert "preflight" not in out and "CUDA_VISIBLE_DEVICES=" in out.splitlines(), out
    (again,) = status(cj, job)
    assert again["source"] == "registry" and again["state"] == "COMPLETED", again
    zero = submit(cj, sandbox, "--gpus", "0", "--", "bash", "-c", "echo zero-gpus-ran")
    row = wait_status(cj, zero, finished)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), row
    assert "zero-gpus-ran" in logs(cj, zero)


def _under_a_pty(
    cj_env: dict[str, str], argv: list[str], send: str, until: str, cwd: Path, timeout: float = 90
) -> str:
    """Run ``argv`` with a pseudo-terminal as its terminal; once ``until`` shows, type
    ``send``; return all it printed (the terminal's view, CR LF line ends)."""
    import pty
    import select

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        argv, stdin=follower, stdout=follower, stderr=follower, env=cj_env, cwd=cwd,
        start_new_session=True,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    sent = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # the session ended: the follower side is closed
                    break
                if not chunk:
                    break
                seen += chunk
            if not sent and until.encode() in seen:
                os.write(leader, send.encode())
                sent = True
            if proc.poll() is not None and not ready:
                break
        else:
            raise AssertionError(f"no end after {timeout}s: {seen.decode(errors='replace')}")
        assert proc.wait(timeout=10) == 0, seen.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    return seen.decode(errors="replace").replace("\r\n", "\n")


def test_shell_opens_a_session_on_a_gpu_node_with_the_preflight_first(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """`clusterjob shell --gpus 1 --model A100` under a pseudo-terminal: the preflight table
    and verdict, then an interactive shell on the node that runs what is typed."""
    env = dict(os.environ, **cluster.client_env(sandbox.state_dir), SHELL="/bin/bash")
    env["CLUSTERJOB_DATA_DIR"] = str(tmp_path / "data")
    argv = [sys.executable, "-m", "clusterjob", "shell", "--site", str(sandbox.site_path),
            "--gpus", "1", "--model", "A100"]  # fmt: skip
    typed = 'echo "in-job $SLURM_JOB_ID on $SLURMD_NODENAME tty=$(tty)" $((6 * 7)); exit\n'
    out = _under_a_pty(env, argv, typed, until=": OK", cwd=tmp_path)
    assert re.search(r"^preflight gpu[12]: OK", out, re.M), out
    assert re.search(r"in-job \d+ on gpu[12] tty=/dev/pts/\d+ 42$", out, re.M), out
    # with a command: it runs instead of the shell, after the preflight
    out = _under_a_pty(
        env, [*argv, "--", "bash", "-c", "test -t 0 && echo command-on-a-tty"], "", "", tmp_path
    )
    assert out.index("preflight gpu") < out.index("command-on-a-tty"), out


@pytest.fixture
def pyxis_standin(sandbox: Sandbox) -> None:
    """A SPANK plugin that registers --container-image/--container-mounts as pyxis does
    (tests/e2e/pyxis_standin.c), built here and named in the sandbox's plugstack.conf (the
    default one, beside slurm.conf: srun and slurmstepd read it at each start, no restart).
    It is `optional` and does nothing unless its options are given, so it stays."""
    if not Path("/usr/include/slurm/spank.h").is_file():
        pytest.skip("no slurm/spank.h (Debian: libslurm-dev, which scripts/test.sh installs)")
    plugin = sandbox.state_dir / "lib" / "pyxis_standin.so"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).with_name("pyxis_standin.c")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(plugin), str(source)],
        check=True,
    )
    plugstack = Path(sandbox.env["SLURM_CONF"]).with_name("plugstack.conf")
    line = f"optional {plugin}\n"
    if line not in (plugstack.read_text() if plugstack.exists() else ""):
        with plugstack.open("a") as f:
            f.write(line)


def test_container_image_passes_through_a_pyxis_style_spank_plugin(
    cj: Cli, sandbox: Sandbox, pyxis_standin: None
) -> None:
    """srun accepts --container-image/--container-mounts only because a SPANK plugin
    registers them, exactly as on a pyxis site; the step gets them; the preflight ran first,
    on the host."""
    job = submit(
        cj, sandbox, "--gpus", "1", "--model", "A100",
        "--container-image", "nvcr.io#nvidia/pytorch:24.01-py3",
        "--container-mounts", "/scratch:/scratch,/data:/data:ro",
        "--", "bash", "-c",
        'echo "in-step image=$PYXIS_STANDIN_IMAGE mounts=$PYXIS_STANDIN_MOUNTS"',
    )  # fmt: skip
    row = wait_status(cj, job, finished)
    out = logs(cj, job)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), (row, out)
    line = "in-step image=nvcr.io#nvidia/pytorch:24.01-py3 mounts=/scratch:/scratch,/data:/data:ro"
    assert line in out.splitlines(), out
    assert out.index("preflight gpu") < out.index("in-step"), out
