"""Bad input through the real command: one clear line, exit 2, never a traceback.

Every case runs `python -m clusterjob ...` in its own process (NUL cannot pass through argv
or the environment, so those go through the in-process `clusterjob.cli.run`). The corpus:
site configs in tests/bad_inputs/sites/ (plus ones generated here: a file over 16 MiB, a
directory, a FIFO, a symlink loop) and site templates in tests/bad_inputs/templates/; the
site-config rules with exact messages in tests/bad_configs/ (test_site_config.py) are run
once more here through the command line. Requests: job names, options, arguments and
environment values with quotes, line breaks, `$()`, backticks and NUL.

`pytest -s` prints how many bad inputs were tried.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir

from clusterjob.cli.app import run as cli_run
from clusterjob.site.loader import validate_site_file

HERE = Path(__file__).parent
SITES = HERE / "bad_inputs" / "sites"
TEMPLATES = HERE / "bad_inputs" / "templates"
BAD_CONFIGS = HERE / "bad_configs"
OK_SITE = SITES / "ok.yaml"  # the valid site each case breaks in one place
TRAIN = str(HERE.parent / "examples" / "train.py")

# site file -> (line, what the one issue says after "file:line: ")
SITE_CASES: dict[str, tuple[int, str]] = {
    "hostlist_huge_range": (8, "node_map[0].nodes: bad hostlist 'm[1-999999999]': range too large"),
    "hostlist_reversed": (8, "node_map[0].nodes: bad hostlist 'm[2-1]': start > stop"),
    "hostlist_letters": (8, "node_map[0].nodes: bad hostlist 'm[a-c]': bad range"),
    "hostlist_nested": (8, "node_map[0].nodes: bad hostlist 'm[[1-2]]': nested brackets"),
    "hostlist_no_nodes": (8, "node_map[0].nodes: hostlist ',' names no nodes"),
    "bus_id_function_8": (9, "node_map[0].gpus[0].bus_id: not a PCI bus ID: '0000:07:00.8'"),
    "bus_id_short": (9, "node_map[0].gpus[0].bus_id: not a PCI bus ID: '07:00'"),
    "bus_id_long_domain": (9, "bus_id: not a PCI bus ID: '000000000000:07:00.0'"),
    "bus_id_number": (9, 'bus_id: expected a string, got 7 (write "7" for text)'),
    "nul_byte": (1, "YAML error: special characters are not allowed"),
    "tab_indent": (4, "YAML syntax error: while scanning for the next token: found character"),
    "two_documents": (10, "expected a single document in the stream"),
    "huge_integer": (4, "models.A100.memory_gb: number too large: 5001 digits"),
    "float_for_integer": (4, "models.A100.memory_gb: expected an integer, got 8.5"),
    "deadline_nan": (10, "prolog.deadline_seconds: expected a positive number, got .nan"),
    "deadline_huge": (10, "prolog.deadline_seconds: expected a positive number, got 1000"),
    "site_null": (1, "site: expected a string, got nothing (null)"),
    "site_list": (1, "site: expected a string, got a list"),
    "partitions_list": (5, "partitions: expected a mapping of partition name to partition"),
    "key_not_text": (10, "keys must be plain text, got 1"),
    "key_complex": (10, "keys must be plain text, got a complex key"),
    "only_comments": (1, "empty file: expected a site config mapping"),
    "top_scalar": (1, "expected a mapping of site settings at the top, got 'hello'"),
    "mem_not_size": (6, "partitions.gpu.defaults.mem_per_gpu: not a Slurm memory size: 'lots'"),
    "node_command_quote": (10, "node_command: not a command line: no closing quotation"),
    "templates_not_dir": (10, "templates: not a directory: "),
    "utf16": (1, "not UTF-8 text: byte 0xff cannot be decoded"),
}

# site file -> (the template file, line or None, message): found when the script is rendered
TEMPLATE_CASES: dict[str, tuple[str, int | None, str]] = {
    "template_undefined_var": (
        "undefined_var/job.sh.j2",
        4,
        "templates: UndefinedError: 'no_such_thing' is undefined",
    ),
    "template_syntax": (
        "syntax_error/job.sh.j2",
        3,
        "templates: TemplateSyntaxError: Expected an expression",
    ),
    "template_sandbox_escape": (
        "sandbox_escape/job.sh.j2",
        3,
        "templates: SecurityError: access to attribute '__class__'",
    ),
    "template_include_missing": ("include_missing", None, "templates: template not found: nope.j2"),
}

# (label, submit options, what the one line says); every one is refused before Slurm
REQUEST_CASES: list[tuple[str, list[str], str]] = [
    ("job name with a line break", ["--job-name", "a\nb"], "line break in --job-name"),
    ("job name with a carriage return", ["--job-name", "a\rb"], "line break in --job-name"),
    ("empty job name", ["--job-name", ""], "--job-name must not be empty"),
    ("directive injected through --partition", ["--partition", "gpu\n#SBATCH --exclusive"],
     "line break in --partition"),
    ("line break in --output", ["--output", "x\ny"], "line break in --output"),
    ("line break in --array", ["--array", "0-3\n"], "line break in --array"),
    ("line break in --mail-user", ["--mail-user", "a@b\nc"], "line break in --mail-user"),
    ("command after a line break in --sbatch-arg", ["--sbatch-arg=--exclusive\nrm -rf /"],
     "line break in --sbatch-arg"),
    ("--sbatch-arg that is not an option", ["--sbatch-arg=exclusive"],
     "is not an sbatch option"),
    ("$() as --time", ["--time", "$(id)"], "--time: not a Slurm time: '$(id)'"),
    ("$() as --model", ["--model", "$(id)"], "unknown GPU model '$(id)'"),
    ("backticks as --model", ["--model", "`id`"], "unknown GPU model '`id`'"),
    ("bad --nodelist", ["--nodelist", "n[1-"], "--nodelist: not a Slurm hostlist"),
    ("a model for zero GPUs", ["--gpus", "0"], "--model asks for GPUs, but this is a CPU-only job"),
    ("negative GPUs", ["--gpus", "-1"], "--gpus must be 0 (a CPU-only job) or more"),
    ("GPUs as a word", ["--gpus", "two"], "Invalid value for '--gpus'"),
    ("missing script", ["--script-missing"], "script not found"),
]  # fmt: skip

# (label, command, environment, what the one line says)
ENV_CASES: list[tuple[str, list[str], dict[str, str], str]] = [
    ("CLUSTERJOB_SITE with $()", ["submit", TRAIN, "--gpus", "1", "--dry-run"],
     {"CLUSTERJOB_SITE": "$(touch {pwned})"}, "no such site config file"),
    ("CLUSTERJOB_SITE with backticks", ["submit", TRAIN, "--gpus", "1", "--dry-run"],
     {"CLUSTERJOB_SITE": "`touch {pwned}`"}, "no such site config file"),
    ("CLUSTERJOB_SITE with a line break", ["submit", TRAIN, "--gpus", "1", "--dry-run"],
     {"CLUSTERJOB_SITE": "a\nb"}, r"CLUSTERJOB_SITE 'a\nb': no such site config file"),
    ("CLUSTERJOB_SITE with quotes", ["submit", TRAIN, "--gpus", "1", "--dry-run"],
     {"CLUSTERJOB_SITE": "'\"x"}, "no such site config file"),
    ("CLUSTERJOB_SLURM_DEADLINE not a number", ["status", "1"],
     {"CLUSTERJOB_SLURM_DEADLINE": "$(id)"}, "CLUSTERJOB_SLURM_DEADLINE='$(id)': give a number"),
    ("CLUSTERJOB_SLURM_DEADLINE zero", ["status", "1"],
     {"CLUSTERJOB_SLURM_DEADLINE": "0"}, "CLUSTERJOB_SLURM_DEADLINE='0'"),
    ("CLUSTERJOB_SLURM_DEADLINE nan", ["status", "1"],
     {"CLUSTERJOB_SLURM_DEADLINE": "nan"}, "CLUSTERJOB_SLURM_DEADLINE='nan'"),
    ("CLUSTERJOB_STATUS_CACHE_SECONDS not a number", ["status", "1"],
     {"CLUSTERJOB_STATUS_CACHE_SECONDS": "soon"}, "CLUSTERJOB_STATUS_CACHE_SECONDS='soon'"),
    ("CLUSTERJOB_STATUS_CACHE_SECONDS negative", ["status", "1"],
     {"CLUSTERJOB_STATUS_CACHE_SECONDS": "-1"}, "CLUSTERJOB_STATUS_CACHE_SECONDS='-1'"),
    ("job id with $()", ["status", "$(id)"], {}, "not a job id: '$(id)'"),
    ("job id with a line break", ["logs", "1\n2"], {}, r"not a job id: '1\n2'"),
    ("job id with backticks", ["cancel", "`id`"], {}, "not a job id: '`id`'"),
]  # fmt: skip

# (label, argv, what the one line says): through the in-process API, as argv cannot hold NUL
NUL_CASES: list[tuple[str, list[str], str]] = [
    ("NUL in --job-name", ["--job-name", "a\0b"], "NUL character in --job-name"),
    ("NUL in a job argument", ["--", "a\0b"], "NUL character in a job argument"),
    ("NUL in --partition", ["--partition", "g\0"], "NUL character in --partition"),
    ("NUL in --sbatch-arg", ["--sbatch-arg=--x\0"], "NUL character in --sbatch-arg"),
    ("NUL in --output", ["--output", "o\0"], "NUL character in --output"),
    ("NUL in --site", ["--site", "/tmp/\0x"], r"--site '/tmp/\x00x': no such site config file"),
    ("NUL in a job id", ["status", "1\0"], r"not a job id: '1\x00'"),
]

# accepted as they are: written quoted into the script, never run by a shell
HOSTILE_BUT_VALID = ["a'b", 'a"b', "$(touch {pwned})", "`touch {pwned}`", "a;b", "a b"]


def clusterjob(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", *args],
        env={**os.environ, **(env or {})}, cwd=cwd,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def assert_one_line(proc_or_text: subprocess.CompletedProcess[str] | str, rc: int = 2) -> str:
    """Exit ``rc``; stderr is exactly one `clusterjob: error:` line; no traceback."""
    if isinstance(proc_or_text, str):
        err = proc_or_text
    else:
        assert proc_or_text.returncode == rc, (proc_or_text.returncode, proc_or_text.stderr)
        err = proc_or_text.stderr
    assert "Traceback" not in err and "internal error" not in err, err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("clusterjob: error: "), err
    return err.strip()


def assert_config_issue(proc: subprocess.CompletedProcess[str], file: str, line: int | None,
                        message: str) -> None:  # fmt: skip
    """Exit 2; stderr is one line, the issue as `file:line: ...`; no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    where = f"{file}:{line}: " if line is not None else f"{file}: "
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(where) and message in lines[0], (where, message, lines[0])


def submit_dry_run(site: Path | str, *extra: str, cwd: Path | None = None):
    return clusterjob("submit", TRAIN, "--site", str(site), "--gpus", "1", "--model", "A100",
                      "--dry-run", *extra, cwd=cwd)  # fmt: skip


# --- site configs ---------------------------------------------------------------------------


def test_corpus_and_table_agree() -> None:
    on_disk = {p.stem for p in SITES.glob("*.yaml")} - {"ok"}
    assert on_disk == set(SITE_CASES) | set(TEMPLATE_CASES)
    assert {p.name for p in TEMPLATES.iterdir()} == {
        Path(f).parts[0] for f, _, _ in TEMPLATE_CASES.values()
    }
    overlap = {p.stem for p in BAD_CONFIGS.glob("*.yaml")} & on_disk
    assert not overlap, f"already in tests/bad_configs: {overlap}"


def test_the_valid_site_is_valid() -> None:
    """Each case breaks this site in one place: it must itself pass."""
    proc = submit_dry_run(OK_SITE)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", sorted(SITE_CASES))
def test_bad_site_config(name: str) -> None:
    line, message = SITE_CASES[name]
    path = SITES / f"{name}.yaml"
    assert_config_issue(submit_dry_run(path), str(path), line, message)


@pytest.mark.parametrize("name", sorted(TEMPLATE_CASES))
def test_bad_site_template(name: str) -> None:
    template, line, message = TEMPLATE_CASES[name]
    proc = submit_dry_run(SITES / f"{name}.yaml")
    assert_config_issue(proc, str(TEMPLATES / template), line, message)


def test_site_file_over_16_mib(tmp_path: Path) -> None:
    """Real bytes (not a sparse file): a valid site followed by 17 MiB of comments."""
    path = tmp_path / "huge.yaml"
    with path.open("w") as fh:
        fh.write(OK_SITE.read_text())
        chunk = "# " + "x" * 1021 + "\n"
        for _ in range(17 * 1024):
            fh.write(chunk)
    assert path.stat().st_size > 16 * 1024 * 1024
    assert_config_issue(submit_dry_run(path), str(path), None, "file is larger than 16 MiB")


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink loop", "missing"])
def test_site_path_that_is_not_a_file(tmp_path: Path, kind: str) -> None:
    """Never opened (a FIFO would block the read forever): one line, exit 2."""
    path = tmp_path / "site.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink loop":
        path.symlink_to(path)
    err = assert_one_line(submit_dry_run(path))
    assert err == f"clusterjob: error: --site {path}: no such site config file"


def test_existing_bad_configs_through_the_command_line() -> None:
    """The exact-message corpus of tests/bad_configs, now via `clusterjob site validate`:
    exit 2, every line `file:line: ...`, no traceback."""
    files = sorted(BAD_CONFIGS.glob("*.yaml"))
    proc = clusterjob("site", "validate", *map(str, files))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout and not proc.stderr, proc.stderr
    for path in files:
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{path}:")]
        assert lines, path
        assert all(re.match(rf"{re.escape(str(path))}:(\d+:)? ", ln) for ln in lines), lines


def test_bad_config_through_submit() -> None:
    path = BAD_CONFIGS / "alias_bomb.yaml"
    proc = submit_dry_run(path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == "clusterjob: error: 2 problems in site config"


# --- requests -------------------------------------------------------------------------------


@pytest.mark.parametrize("label", [c[0] for c in REQUEST_CASES])
def test_bad_request(label: str, tmp_path: Path) -> None:
    _, extra, message = next(c for c in REQUEST_CASES if c[0] == label)
    if extra == ["--script-missing"]:
        proc = clusterjob("submit", str(tmp_path / "nope.py"), "--site", str(OK_SITE),
                          "--gpus", "1", "--dry-run")  # fmt: skip
    elif extra[0] == "--gpus":
        proc = clusterjob("submit", TRAIN, "--site", str(OK_SITE), "--model", "A100",
                          "--dry-run", *extra)  # fmt: skip
    else:
        proc = submit_dry_run(OK_SITE, *extra, cwd=tmp_path)
    err = assert_one_line(proc)
    assert message in err, err


@pytest.mark.parametrize("label", [c[0] for c in ENV_CASES])
def test_bad_environment_value(label: str, tmp_path: Path) -> None:
    _, args, env, message = next(c for c in ENV_CASES if c[0] == label)
    pwned = tmp_path / "pwned"
    env = {k: v.replace("{pwned}", str(pwned)) for k, v in env.items()}
    env.setdefault("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    err = assert_one_line(clusterjob(*args, env=env, cwd=tmp_path))
    assert message in err, err
    assert not pwned.exists()


@pytest.mark.parametrize("label", [c[0] for c in NUL_CASES])
def test_nul_through_the_in_process_api(label: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, argv, message = next(c for c in NUL_CASES if c[0] == label)
    if argv[0] != "status":
        base = ["submit", TRAIN, "--site", str(OK_SITE), "--gpus", "1", "--model", "A100"]
        if argv[0] == "--site":
            base = ["submit", TRAIN, "--gpus", "1", "--model", "A100"]
        argv = [*base, "--dry-run", *argv]
    assert cli_run(argv) == 2
    err = assert_one_line(capsys.readouterr().err)
    assert message in err, err


def test_hostile_but_valid_values_are_written_literally(tmp_path: Path) -> None:
    """Quotes, $() and backticks are legal in a job name and arguments: accepted, written
    quoted, never run (test_render.py proves the quoting round trip through bash)."""
    pwned = tmp_path / "pwned"
    for value in (v.replace("{pwned}", str(pwned)) for v in HOSTILE_BUT_VALID):
        proc = submit_dry_run(OK_SITE, "--job-name", value, "--", value, cwd=tmp_path)
        assert proc.returncode == 0, (value, proc.stderr)
        directive = next(ln for ln in proc.stdout.splitlines() if "--job-name=" in ln)
        written = directive.split("=", 1)[1]
        if written.startswith('"'):  # sbatch's own quoting: "...", with \" and \\ inside
            written = re.sub(r'\\(["\\])', r"\1", written[1:-1])
        assert written == value, (value, directive)
    assert not pwned.exists()


def _refused(path: Path) -> bool:
    """Whether the site loader, run here in process, finds an error (not only a warning)."""
    site, issues = validate_site_file(path)
    return site is None and any(not issue.warning for issue in issues)


def test_count_of_bad_inputs_tried() -> None:
    """The site configs are counted as the loader refuses them now, not as files on disk: a
    loader that lets one through fails this (the exact messages are checked above)."""
    refused = sorted(name for name in SITE_CASES if _refused(SITES / f"{name}.yaml"))
    assert refused == sorted(SITE_CASES)
    corpus = sorted(BAD_CONFIGS.glob("*.yaml"))
    only_warned = [p.name for p in corpus if not _refused(p)]
    assert only_warned == ["gres_substring_warning.yaml"]
    bad_configs = len(corpus) - len(only_warned)
    generated = 1 + 4  # the 17 MiB file; directory, FIFO, symlink loop, missing path
    total = {
        "site configs (bad_inputs)": len(refused),
        "site templates": len(TEMPLATE_CASES),
        "site configs generated at test time": generated,
        "site configs (bad_configs, via the CLI)": bad_configs,
        "request options": len(REQUEST_CASES),
        "environment values and job ids": len(ENV_CASES),
        "NUL (in-process)": len(NUL_CASES),
    }
    print("\nbad inputs tried: " + ", ".join(f"{k}={v}" for k, v in total.items())
          + f"; total={sum(total.values())}")  # fmt: skip
    assert sum(total.values()) >= 90
    # the README states this count: it must be the one measured here
    readme = (HERE.parent / "README.md").read_text(encoding="utf-8")
    said = re.findall(r"`tests/bad_configs/` feed (\d+) bad inputs", readme)
    assert said == [str(sum(total.values()))], "README.md's count of bad inputs"


# --- the Prolog's own config (root reads it; tests/test_hooks*.py cover missing, FIFO,
# untrusted owner/mode, CLUSTERJOB_SITE ignored, invalid YAML, NVML hang/absent) -----------


@pytest.fixture
def trusted_dir() -> Iterator[Path]:
    """The Prolog trusts no path through sticky /tmp: a root-owned tree instead."""
    yield from trusted_tmp_dir()


@pytest.mark.parametrize("kind", ["directory", "invalid UTF-8", "mode 000"])
def test_prolog_config_root_cannot_use(trusted_dir: Path, kind: str) -> None:
    """'Unreadable' for root: a directory or undecodable bytes drain with one line naming the
    file; mode 000 does not stop root, so the check goes on (to NVML) rather than failing on
    the config."""
    tmp_path = trusted_dir
    etc = tmp_path / "etc"
    etc.mkdir()
    etc.chmod(0o755)
    site = etc / "site.yaml"
    if kind == "directory":
        site.mkdir()
        site.chmod(0o755)
        why = f"{site}: cannot read: Is a directory"
    elif kind == "invalid UTF-8":
        site.write_bytes(b"site: lab\ncluster_name: caf\xe9\n")
        site.chmod(0o644)
        why = f"{site}:2: not UTF-8 text: byte 0xe9 cannot be decoded"
    else:
        site.write_text(OK_SITE.read_text())
        site.chmod(0o000)
        why = ""
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7"}
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", "prolog", "--site", str(site), "--log",
         str(tmp_path / "p.jsonl"), "--cache-dir", str(tmp_path / "cache")],
        env={**env, "PYTHONPATH": str(HERE.parent)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("clusterjob prolog: n1: GPUs not checked: ") and "draining" in line
    if why:
        assert f"site config: {why} -- draining" in line, line
    else:
        assert "site config" not in line, line
