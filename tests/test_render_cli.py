"""`clusterjob submit`, in process: argument pass-through, --dry-run output, one-line errors."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

from clusterjob import resources
from clusterjob.cli.app import run

REPO = Path(__file__).resolve().parent.parent
TRAIN = str(REPO / "examples" / "train.py")
MLLAB = str(resources.site_configs_dir() / "mllab.yaml")


def _submit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run(["submit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_prints_script_and_sbatch_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = _submit(
        capsys,
        "--site", MLLAB, "--gpus", "2", "--model", "a100", "--dry-run",
        "--sbatch-arg=--exclusive", "--sbatch-arg", "--reservation=maint",
        TRAIN, "epoch", "--", "--lr", "3e-4", "--gpus", "9", "--", "x y",
    )  # fmt: skip
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert "#SBATCH --gres=gpu:a100:2" in lines
    assert "#SBATCH --exclusive" in lines
    assert "#SBATCH --reservation=maint" in lines
    # positional words and everything after -- reached SCRIPT unchanged, our option names included
    assert f"exec \"$python\" {TRAIN} epoch --lr 3e-4 --gpus 9 -- 'x y'" in lines
    token = next(ln for ln in lines if ln.startswith("#SBATCH --comment=clusterjob:")).split(":")[1]
    assert lines[-1] == f"# sbatch --parsable clusterjob-{token}.sh"
    assert lines[-2].startswith("# dry run: nothing submitted.")
    script = tmp_path / "job.sh"
    script.write_text(out)  # the whole output is still a valid script
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--site", MLLAB, "--gpus", "1", "--model", "P100", TRAIN],
            "clusterjob: error: unknown GPU model 'P100' at site mllab; "
            "this site has: A100 (8 nodes), V100 (8 nodes)",
        ),
        (
            ["--site", MLLAB, "--gpus", "3", "--model", "v100", TRAIN],
            "clusterjob: error: cannot give 3 V100 GPU(s) per node on 1 node(s) at site mllab: "
            "no node has 3 V100 GPUs; possible: partition gpu: "
            "V100: at most 2 per node (nodes ml-gpu[01-08]), "
            "A100: at most 2 per node (nodes ml-gpu[01-08]); partition debug: "
            "V100: at most 2 per node (nodes ml-gpu[07-08]), "
            "A100: at most 2 per node (nodes ml-gpu[07-08])",
        ),
        (
            ["--site", MLLAB, "--model", "a100", TRAIN],
            "clusterjob: error: --model asks for GPUs, but this is a CPU-only job (--gpus 0 or "
            "none): give --gpus N",
        ),
        (
            [TRAIN, "--lr", "3e-4", "--site", MLLAB, "--gpus", "1"],
            "clusterjob: error: No such option: --lr (Possible options: --gres, --help) "
            "(arguments for SCRIPT that look like options go after --)",
        ),
        (
            ["--site", MLLAB, "--gpus", "1", "--model", "a100", "--mem-per-gpu", "lots", TRAIN],
            "clusterjob: error: --mem-per-gpu 'lots' is not a Slurm memory size (e.g. 64G, 500M)",
        ),
        (
            ["--site", MLLAB, "--gpus", "1", "nope.py"],
            "clusterjob: error: script not found: 'nope.py'",
        ),
        (
            ["--site", MLLAB, "--gpus", "1", "--model", "a100", "--job-name", "a\nb", TRAIN],
            "clusterjob: error: line break in --job-name is not allowed: 'a\\nb' "
            "(an #SBATCH directive must fit on one line)",
        ),
        (
            ["--site", MLLAB, "--gpus", "1", "--dry-run", "--test-only", TRAIN],
            "clusterjob: error: --dry-run and --test-only exclude each other",
        ),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = _submit(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.splitlines() == [message]


def test_bad_site_file_is_a_config_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("site: x\nnot_a_key: 1\n")
    code, out, err = _submit(capsys, "--site", str(bad), "--gpus", "1", TRAIN)
    assert code == 2
    assert str(bad) in err
    assert "Traceback" not in err


def test_submission_goes_through_jobs_submit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract with clusterjob.jobs: submit(site, resolved, rendered, test_only=...)."""
    calls = []

    def submit(site, resolved, rendered, *, test_only=False, **where):  # type: ignore[no-untyped-def]
        assert where["client"].remote is False and where["workdir"] == str(Path.cwd().resolve())
        calls.append((site.name, resolved.gres.options, rendered.token, test_only))
        return f"job 42 token {rendered.token}"

    try:
        jobs = importlib.import_module("clusterjob.jobs.submit")
    except ImportError:
        jobs = types.ModuleType("clusterjob.jobs.submit")
        monkeypatch.setitem(sys.modules, "clusterjob.jobs.submit", jobs)
        monkeypatch.setattr(sys.modules["clusterjob.jobs"], "submit", jobs, raising=False)
    monkeypatch.setattr(jobs, "submit", submit, raising=False)
    code, out, err = _submit(capsys, "--site", MLLAB, "--gpus", "2", "--model", "v100", TRAIN)
    assert (code, err) == (0, "")
    ((site, options, token, test_only),) = calls
    assert (site, options, test_only) == ("mllab", ("--gres=gpu:v100:2",), False)
    assert out == f"job 42 token {token}\n"
    code, out, err = _submit(
        capsys, "--site", MLLAB, "--gpus", "1", "--model", "A100", "--test-only", TRAIN
    )
    assert code == 0 and calls[-1][3] is True


def test_options_after_script_are_clusterjobs(capsys: pytest.CaptureFixture[str]) -> None:
    """The headline form: `clusterjob submit train.py --gpus 2 --model A100`."""
    code, out, err = _submit(capsys, TRAIN, "--gpus", "2", "--model", "A100", "--site", MLLAB,
                             "--dry-run")  # fmt: skip
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert "#SBATCH --gres=gpu:a100:2" in lines
    assert f'exec "$python" {TRAIN}' in lines


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["preflight", "--bogus"], "clusterjob: error: No such option: --bogus"),
        (["site", "validate", "--site", "x"], "clusterjob: error: No such option: --site"),
    ],
)
def test_an_unknown_option_of_a_command_without_a_script_is_not_sent_after_dashes(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The SCRIPT hint is `submit`'s and `shell`'s: elsewhere it pointed at an argument the
    command does not have."""
    assert run(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [said]
