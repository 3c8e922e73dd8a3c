"""``submit``'s plain command lines read from the generated table of its options
(clusterjob/cli/fast_commands.py) instead of Typer building the command: the same call Typer
makes, or no call at all (Typer then reads it, and alone prints help and errors)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterjob import envvars, resources
from clusterjob.__main__ import main
from clusterjob.cli import fastpath
from clusterjob.cli.app import run
from clusterjob.cli.fast_commands import COMMANDS

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "examples" / "train.py")
MLLAB = str(resources.site_configs_dir() / "mllab.yaml")
SUBMIT = importlib.import_module("clusterjob.cli.submit").submit
PARAMS = COMMANDS["submit"]["params"]

# Command lines the table reads: each must give the very call Typer makes.
READ = [
    ["train.py"],
    ["train.py", "--gpus", "2", "--model", "A100", "--dry-run"],
    ["--gpus=2", "--model=A100", "train.py", "a", "b"],
    ["train.py", "--", "--lr", "3e-4", "--", "x"],
    ["--", "python", "-m", "pkg", "--gpus", "3"],
    ["-N", "2", "-p", "gpu", "-t", "1:00:00", "-A", "ml", "-J", "name", "t.py"],
    ["t.py", "--avoid", "--no-avoid", "--snapshot", "--requeue", "--mkdir", "--json"],
    ["t.py", "--no-snapshot", "--parsable", "--test-only"],
    ["t.py", "--gres", "nvme:1", "--gres=x:2", "--env", "A=1", "--setup", "echo hi"],
    ["t.py", "--module", "cuda", "--launcher-arg=--max-restarts=3", "--sbatch-arg=--exclusive"],
    ["t.py", "--sweep", "lr=1,2", "--params", "params.txt", "--gpus", "0", "--nodes", "3"],
    ["t.py", "--params=", "--gpus", "+4", "--cpus-per-gpu", " 8", "--retry-bad-node", "1_0"],
    ["t.py", "--mem-per-gpu", "64G", "--array", "0-9%2", "--dependency", "afterok:1"],
    ["t.py", "-o", "o.log", "-e", "e.log", "--signal", "B:USR1@90", "-x", "n1", "-w", "n2"],
    ["t.py", "--mail-type", "END", "--mail-user", "a@b", "-C", "ib", "--project", "p"],
    ["t.py", "--tasks-per-node", "4", "--launcher", "srun", "--container-image", "img"],
    ["t.py", "--container-mounts", "/a:/b", "--apptainer", "x.sif", "--python", "/p"],
    ["t.py", "--venv", "v", "--conda", "c", "-s", "site", "--site", "other", "-m", "V100"],
    ["t.py", "--max-requeues", "5", "--qos", "normal", "--time", "10", "--account", ""],
    ["t.py", "--gpus", "2", "--gpus", "3", "--job-name", "it's", "--model", "a b"],
]

# Command lines left to Typer: help, errors, and the forms the table does not read.
DECLINED = [
    ["--help"],
    ["train.py", "-h"],
    ["train.py", "--lr", "3e-4"],
    ["train.py", "--gpus"],
    ["train.py", "--gpus", "-1"],
    ["train.py", "--gpus", "two"],
    ["train.py", "-N2"],
    ["train.py", "--dry-run=1"],
    ["train.py", "-"],
    ["train.py", "-p=gpu"],
    ["train.py", "--nodes", "--dry-run"],
]


STATUS = importlib.import_module("clusterjob.cli.jobs").status
STATUS_PARAMS = COMMANDS["status"]["params"]
STATUS_READ = [
    [],
    ["123", "124_3", "last~2"],
    ["--json", "--all", "--tasks", "--state", "FAILED,RUNNING", "--name", "lr*"],
    ["--since", "2h", "-w", "--interval", "2.5"],
    ["--watch", "--interval=1e1", "--repair"],
]
STATUS_DECLINED = [["--interval", "often"], ["-h"], ["--json=1"], ["--host", "h"]]


@pytest.mark.parametrize("words", STATUS_READ, ids=" ".join)
def test_the_status_table_reads_what_typer_reads(words: list[str]) -> None:
    fast = fastpath.parse(STATUS_PARAMS, words)  # type: ignore[arg-type]
    assert fast is not None, "the fast path declined a plain command line"
    assert fast == fastpath.typer_call(STATUS, words)


@pytest.mark.parametrize("words", STATUS_DECLINED, ids=" ".join)
def test_other_status_command_lines_are_left_to_typer(words: list[str]) -> None:
    assert fastpath.parse(STATUS_PARAMS, words) is None  # type: ignore[arg-type]


def _typer(words: list[str]) -> dict[str, object] | str:
    try:
        return fastpath.typer_call(SUBMIT, words)
    except Exception as exc:
        return f"error: {type(exc).__name__}"


@pytest.mark.parametrize("words", READ, ids=" ".join)
def test_the_table_reads_what_typer_reads(words: list[str]) -> None:
    fast = fastpath.parse(PARAMS, words)  # type: ignore[arg-type]
    assert fast is not None, "the fast path declined a plain command line"
    assert fast == _typer(words)


@pytest.mark.parametrize("words", DECLINED, ids=" ".join)
def test_other_command_lines_are_left_to_typer(words: list[str]) -> None:
    assert fastpath.parse(PARAMS, words) is None  # type: ignore[arg-type]


def test_an_unreadable_params_file_is_left_to_typer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Typer's path type refuses a file that exists but cannot be read: so must the reader."""
    secret = tmp_path / "params.txt"
    secret.write_text("--lr 1\n")
    secret.chmod(0)
    if os.access(secret, os.R_OK):  # root reads any file: both ask os.access, so deny there
        real = os.access
        monkeypatch.setattr(
            os, "access", lambda p, mode, **kw: mode != os.R_OK and real(p, mode, **kw)
            if Path(p) == secret else real(p, mode, **kw)
        )  # fmt: skip
    assert fastpath.parse(PARAMS, ["t.py", "--params", str(secret)]) is None  # type: ignore[arg-type]
    assert isinstance(_typer(["t.py", "--params", str(secret)]), str)


def test_the_table_is_up_to_date() -> None:
    """scripts/gen_compiled.py was run after the last change to the command's options."""
    module = REPO / "clusterjob" / "cli" / "fast_commands.py"
    assert module.read_text() == fastpath.commands_module("scripts/gen_compiled.py"), (
        "run: python scripts/gen_compiled.py"
    )


def test_a_table_older_than_its_declarations_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["submit", TRAIN, "--dry-run"]
    assert fastpath.fast_call(argv) is not None
    monkeypatch.setattr(fastpath, "declared_digest", lambda files: "edited since")
    assert fastpath.fast_call(argv) is None
    monkeypatch.undo()
    monkeypatch.setitem(COMMANDS["submit"], "typer", "0.0.0")
    assert fastpath.fast_call(argv) is None


def test_only_the_fast_commands_are_read() -> None:
    assert fastpath.fast_call(["logs", "1"]) is None
    assert fastpath.fast_call(["--host", "h", "submit", TRAIN]) is None
    assert fastpath.fast_call(["submit"]) is None, "no words: Typer shows submit's help"
    assert fastpath.fast_call(["status"]) is not None


def _both_ways(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    calls: list[list[str]] = []
    real = fastpath.fast_call

    def counted(words: list[str]) -> object:
        call = real(words)
        if call is not None:
            calls.append(words)
        return call

    monkeypatch.setattr(fastpath, "fast_call", counted)
    code = main(argv)
    fast = (code, *capsys.readouterr())
    assert calls, "not run by the fast path"
    code = run(argv)
    return fast, (code, *capsys.readouterr())


def _tokenless(result: tuple[int, str, str]) -> tuple[int, str, str]:
    code, out, err = result
    token = next((ln.split(":")[1] for ln in out.splitlines() if "clusterjob:" in ln), "")
    return code, out.replace(token, "TOKEN") if token else out, err


def test_status_prints_the_same_either_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterjob import envvars

    monkeypatch.setenv(envvars.DATA_DIR, str(tmp_path))
    for argv in (["status"], ["status", "--json"], ["status", "--watch", "--interval", "0"]):
        fast, typer = _both_ways(argv, capsys, monkeypatch)
        assert fast == typer


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", TRAIN, "--site", MLLAB, "--gpus", "2", "--model", "a100", "--dry-run"],
        ["submit", "--site", MLLAB, "--gpus", "1", "--model", "P100", TRAIN],  # an error
        ["submit", "--site", MLLAB, "--dry-run", "--test-only", TRAIN],  # the command's own
    ],
)
def test_the_command_prints_the_same_either_way(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, typer = _both_ways(argv, capsys, monkeypatch)
    assert _tokenless(fast) == _tokenless(typer)


def test_a_remote_host_of_an_earlier_run_is_forgotten(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path sets the app's options as Typer's callback does: none given."""
    from clusterjob.cli import common

    monkeypatch.setitem(common.REMOTE, "host", "login.example.org")
    argv = ["submit", TRAIN, "--site", MLLAB, "--gpus", "1", "--model", "a100", "--dry-run"]
    assert main(argv) == 0
    assert common.REMOTE == {"host": None, "remote_dir": None, "sync": None}


# What the fast path is for: a plain submit loads neither Typer nor Jinja2.
_LOADED = """import contextlib, io, sys
from clusterjob.__main__ import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(int(code), *sorted(m for m in ("typer", "jinja2", "click") if m in sys.modules))
"""


def test_a_plain_submit_imports_neither_typer_nor_jinja2(tmp_path: Path) -> None:
    argv = ["submit", TRAIN, "--site", MLLAB, "--gpus", "2", "--model", "a100", "--dry-run"]
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, *argv], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.stdout.split() == ["0"], done.stderr
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, *argv, "--help"], capture_output=True, text=True
    )
    assert done.stdout.split() == ["0", "typer"], "--help is Typer's: the test can tell"


def test_the_command_list_is_typers_at_its_widest(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`clusterjob --help` prints the list Typer printed when the table was generated, and
    only where Typer prints that very text: 80 columns or more; narrower is Typer's."""
    for columns in (80, 200):
        typer = fastpath.typer_listing(columns)  # a new interpreter: the app's own order
        monkeypatch.setenv("COLUMNS", str(columns))
        for argv in (["--help"], ["-h"]):
            assert fastpath.fast_main(argv) == 0
            assert capsys.readouterr() == (typer, "")
    monkeypatch.setenv("COLUMNS", "60")
    assert fastpath.fast_main(["--help"]) is None
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv(envvars.DEBUG, "1")
    assert fastpath.fast_main(["--help"]) is None, "the app prints the debug header"
    monkeypatch.delenv(envvars.DEBUG)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setitem(fastpath.__dict__, "declared_digest", lambda files: "edited since")
    assert fastpath.fast_main(["--help"]) is None, "a listing older than the CLI's sources"


def test_the_command_list_is_printed_without_typer() -> None:
    code = "import sys; from clusterjob.__main__ import main; main(['--help'])\n"
    code += "print('typer' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert done.stdout.splitlines()[-1] == "False" and "Commands:" in done.stdout


# A Typer release other than the one the tables were written with: its version, as
# `typer_version` reads it; the Typer that builds the tables here is the installed one.
OTHER_TYPER = "0.28.99"
PLAIN_SUBMIT = ["submit", TRAIN, "--site", MLLAB, "--gpus", "2", "--model", "a100", "--dry-run"]


def _notes() -> list[str]:
    """The notes in the private cache: ``typer-VERSION-WHAT``, and `` differs`` where the
    run found that release builds another table (or prints another listing)."""
    folder = Path(os.environ["XDG_CACHE_HOME"]) / "clusterjob" / "fastpath"
    return sorted(
        p.name.rsplit("-", 1)[0] + (" differs" if p.name.endswith(".differs") else "")
        for p in folder.glob("typer-*")
    )


def test_another_typer_takes_the_table_once_a_run_under_it_built_the_same(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run of a command under another Typer is Typer's, and builds the command's
    table from Typer's own click command: the same table, so the runs after it read it."""
    monkeypatch.setattr(fastpath, "typer_version", lambda: OTHER_TYPER)
    assert fastpath.fast_call(PLAIN_SUBMIT) is None
    assert fastpath.fast_call(["status"]) is None
    assert run(PLAIN_SUBMIT) == 0
    first = capsys.readouterr().out
    assert _notes() == [f"typer-{OTHER_TYPER}-submit"]
    assert fastpath.fast_call(PLAIN_SUBMIT) is not None
    assert fastpath.fast_call(["status"]) is None, "noted for the command Typer ran only"
    assert main(PLAIN_SUBMIT) == 0
    assert _tokenless((0, capsys.readouterr().out, "")) == _tokenless((0, first, ""))


def test_a_typer_that_builds_another_table_is_never_noted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fastpath, "typer_version", lambda: OTHER_TYPER)
    shipped = COMMANDS["submit"]["params"]
    changed = tuple((*p[:5], 3) if p[0] == "nodes" else p for p in shipped)  # type: ignore[attr-defined]
    monkeypatch.setitem(COMMANDS["submit"], "params", changed)  # as if -N's default were 3
    fastpath.note_typer_agreement("submit")
    assert _notes() == [f"typer-{OTHER_TYPER}-submit differs"]
    assert fastpath.fast_call(PLAIN_SUBMIT) is None
    monkeypatch.setitem(COMMANDS["submit"], "params", shipped)
    fastpath.note_typer_agreement("submit")
    assert _notes() == [f"typer-{OTHER_TYPER}-submit", f"typer-{OTHER_TYPER}-submit differs"]
    assert fastpath.fast_call(PLAIN_SUBMIT) is not None
    monkeypatch.setitem(COMMANDS["submit"], "params", changed)
    assert fastpath.fast_call(PLAIN_SUBMIT) is None, "a note is for the very table noted"
    monkeypatch.setitem(COMMANDS["submit"], "params", shipped)
    monkeypatch.setattr(fastpath, "typer_version", lambda: "0.28.98")
    assert fastpath.fast_call(PLAIN_SUBMIT) is None, "and for the very release"


def test_notes_live_only_in_a_cache_no_one_else_may_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fastpath, "typer_version", lambda: OTHER_TYPER)
    fastpath.note_typer_agreement("submit")
    folder = Path(os.environ["XDG_CACHE_HOME"]) / "clusterjob" / "fastpath"
    assert fastpath.fast_call(PLAIN_SUBMIT) is not None
    folder.chmod(0o777)
    assert fastpath.fast_call(PLAIN_SUBMIT) is None
    for note in folder.iterdir():
        note.unlink()
    fastpath.note_typer_agreement("submit")
    assert not list(folder.iterdir()), "nothing is written there either"
    monkeypatch.setattr(fastpath, "typer_version", lambda: "0.28/../../x")
    folder.chmod(0o700)
    fastpath.note_typer_agreement("submit")
    assert not list(folder.iterdir()), "a version that is not a plain release name"


# `clusterjob --help` as a person runs it, under the Typer release OTHER_TYPER names.
_HELP_UNDER_OTHER = f"""import sys
from clusterjob.cli import fastpath
fastpath.typer_version = lambda: {OTHER_TYPER!r}
from clusterjob.__main__ import main
code = main(["--help"])
print("typer" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


def test_another_typer_prints_the_command_list_without_typer_once_it_printed_the_same() -> None:
    env = {**os.environ, "COLUMNS": "100"}
    runs = [
        subprocess.run([sys.executable, "-c", _HELP_UNDER_OTHER], capture_output=True,
                       text=True, env=env, check=True)
        for _ in range(2)
    ]  # fmt: skip
    typer = fastpath.typer_listing()
    assert [r.stdout for r in runs] == [typer, typer]
    assert [r.stderr for r in runs] == ["True\n", "False\n"], "Typer's the first time only"
    assert _notes() == [f"typer-{OTHER_TYPER}-listing"]


def test_a_listing_typer_printed_otherwise_is_not_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterjob.cli.fast_commands import LISTING

    monkeypatch.setattr(fastpath, "typer_version", lambda: OTHER_TYPER)
    assert fastpath.listing_to_check()
    fastpath.note_listing_agreement(str(LISTING["text"]).replace("Commands", "Kommandos"))
    assert _notes() == [f"typer-{OTHER_TYPER}-listing differs"]
    assert not fastpath.listing_to_check(), "compared once"
    assert fastpath.fast_main(["--help"]) is None


def test_a_typer_that_builds_otherwise_is_looked_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release whose click command this reader refuses (0.29's options carry no click
    type) costs the look once: its runs after the first go to Typer without looking again."""
    monkeypatch.setattr(fastpath, "typer_version", lambda: OTHER_TYPER)
    looks = []

    def refused(module: str, function: str) -> list[fastpath.Param]:
        looks.append(function)
        raise AttributeError("'TyperOption' object has no attribute 'type'")

    monkeypatch.setattr(fastpath, "command_table", refused)
    for _ in range(3):
        fastpath.note_typer_agreement("submit")
    assert looks == ["submit"] and _notes() == [f"typer-{OTHER_TYPER}-submit differs"]
    assert fastpath.fast_call(PLAIN_SUBMIT) is None
