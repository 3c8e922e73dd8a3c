"""The runnable (```console) blocks of README.md and docs/, run as a reader would run them:
each page's commands in order, in one scratch directory holding a copy of `examples/` and
`site_configs/`, with `clusterjob` on PATH, the local cluster's environment (what
`eval "$(clusterjob sandbox env)"` sets) and a registry of their own. Each command must
exit with the status its block says (0 unless it ends in `# exit N`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from doc_blocks import REPO, SHELLS, all_blocks, commands

from clusterjob.sandbox import cluster

from .conftest import Cli, Sandbox
from .test_install_hooks import _prolog_records

pytestmark = pytest.mark.slurm

PAGES = sorted({b.doc for b in all_blocks() if b.lang == "console"})


def _script(page: Path) -> tuple[str, list[str]]:
    """One bash script for the page's commands, in order, in one shell (a variable set by
    one command is there for the next, as in a reader's terminal); after each, its exit
    status is compared with the page's and the script stops at the first difference."""
    lines, shown = [], []
    for block in (b for b in all_blocks() if b.doc == page and b.lang == "console"):
        for command in commands(block):
            n = len(shown)
            shown.append(f"{block.where}: `{command.text}` (the page says exit {command.expect})")
            lines += [f"echo '>>> command {n}' >&2", command.text, "rc=$?"]
            lines.append(
                f'[ "$rc" -eq {command.expect} ] || {{ echo ">>> failed {n} $rc" >&2; exit 99; }}'
            )
    return "\n".join(lines) + "\n", shown


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_runnable_blocks_run(page: Path, sandbox: Sandbox, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for tree in ("examples", "site_configs"):
        shutil.copytree(REPO / tree, work / tree)
    env = dict(os.environ, **cluster.client_env(sandbox.state_dir))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["CLUSTERJOB_DATA_DIR"] = str(tmp_path / "data")
    env["CLUSTERJOB_STATUS_CACHE_SECONDS"] = "0"
    for block in all_blocks():  # files the page's commands use: ```LANG title="a/relative/path"
        if block.doc == page and block.lang not in SHELLS and block.title:
            assert not block.title.startswith("/"), block.where
            (work / block.title).parent.mkdir(parents=True, exist_ok=True)
            (work / block.title).write_text(block.text, encoding="utf-8")
    script, shown = _script(page)
    assert shown
    done = subprocess.run(
        ["bash", "-c", script], cwd=work, env=env,
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    failed = re.search(r"^>>> failed (\d+) (\d+)$", done.stderr, re.M)
    detail = f"\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    assert failed is None, f"{shown[int(failed.group(1))]} exited {failed.group(2)}{detail}"
    assert done.returncode == 0, detail
    assert f">>> command {len(shown) - 1}" in done.stderr  # every command ran


def test_quickstart_ends_with_the_line_that_makes_the_next_command_work(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """The line scripts/quickstart.sh prints last, typed into a fresh shell (no clusterjob on
    PATH, no SLURM_CONF, no site): afterwards `clusterjob` finds the local cluster's site and
    Slurm answers. Without it, `submit` said "no site config found"."""
    script = (REPO / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    assert script.rstrip().endswith('echo "$next"')
    (assign,) = [ln for ln in script.splitlines() if ln.startswith("next=")]
    printed = subprocess.run(
        ["bash", "-c", f'{assign}\necho "$next"'], cwd=REPO, capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    bare = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    before = subprocess.run(
        ["bash", "-c", "clusterjob site show"], cwd=tmp_path, env=bare,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert before.returncode != 0  # not on PATH yet
    # Before the line, each way of trying says what is missing, in one line.
    cj = str(Path(sys.executable).parent / "clusterjob")
    train = str(REPO / "examples" / "train.py")
    no_site = subprocess.run(
        [cj, "submit", train, "--gpus", "1", "--model", "A100"], cwd=tmp_path, env=bare,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert no_site.returncode == 2 and "no site config found" in no_site.stderr
    assert "set CLUSTERJOB_SITE" in no_site.stderr and len(no_site.stderr.splitlines()) == 1
    site = str(cluster.client_env(sandbox.state_dir)["CLUSTERJOB_SITE"])
    no_conf = subprocess.run(
        [cj, "submit", train, "--gpus", "1", "--model", "A100", "--site", site], cwd=tmp_path,
        env=bare, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert no_conf.returncode == 4, no_conf.stderr
    assert "point SLURM_CONF at the cluster's slurm.conf" in no_conf.stderr
    assert len(no_conf.stderr.splitlines()) == 1
    after = subprocess.run(
        ["bash", "-c", f"{printed}\nclusterjob site show && sinfo -h -o %P"], cwd=tmp_path,
        env=bare, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert after.returncode == 0, after.stdout + after.stderr
    assert "site sandbox" in after.stdout and "gpu*" in after.stdout.split()


def test_the_prolog_wrapper_shown_is_the_file_slurmd_runs_and_a_job_passes(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """The Prolog wrapper block of the docs, with the local cluster's paths in place of the
    documented installation's and the `--env` lines its stand-in NVML needs, is byte for byte
    the wrapper this cluster's slurm.conf names; a job on a right node then passes it (and
    the Prolog logs the job). The cluster's configuration is read, never changed."""
    from clusterjob.sandbox import config

    layout = sandbox.layout
    (block,) = [b for b in all_blocks() if b.title == "/etc/slurm/clusterjob-prolog"]
    live_path = layout.hooks_dir / "clusterjob-prolog"
    assert f"Prolog={live_path}" in layout.slurm_conf.read_text().splitlines()
    live = live_path.read_text(encoding="utf-8")
    text = block.text
    for documented, here in (
        ("/etc/slurm", str(layout.hooks_dir)),
        ("/opt/clusterjob/bin/python", str(config.hook_python(layout))),
        ("/etc/clusterjob/site.yaml", str(layout.site_yaml)),
        ("/var/cache/clusterjob", str(layout.cache_dir)),
    ):
        assert documented in text
        text = text.replace(documented, here)
    exports = [line for line in live.splitlines() if line.startswith("export ")]
    assert exports  # the stand-in NVML's --env lines: the only difference allowed
    text = text.replace("cd / || exit 1\n", "cd / || exit 1\n" + "".join(e + "\n" for e in exports))
    assert text == live

    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho passed the prolog\n")
    out = tmp_path / "out.txt"
    job_id = sandbox.sbatch(
        "-p", "gpu", "-w", "gpu1", "--gres=gpu:a100:1", "-A", "sandbox", "-o", str(out),
        "-J", "docs-prolog-block", str(script),
    )  # fmt: skip
    fields = sandbox.wait_job(job_id, timeout=120)
    assert fields["JobState"] == "COMPLETED", fields
    assert out.read_text() == "passed the prolog\n"
    logged = _prolog_records(layout, job_id)
    assert [(r["node"], r["outcome"]) for r in logged] == [("gpu1", "ok")]


def _documented_keys(command: str) -> list[str]:
    """The keys docs/reference/json.md lists for `clusterjob COMMAND --json`, in order."""
    page = (REPO / "docs" / "reference" / "json.md").read_text(encoding="utf-8")
    start = page.index(f"## clusterjob {command} --json")
    section = page[start : page.find("\n## ", start + 1)]
    first_table = section.split("\n\n`")[0]
    return re.findall(r"^\| `([a-z_]+)` \|", first_table, re.M)


def test_json_outputs_have_the_documented_keys(cj: Cli) -> None:
    """What submit, status, show, avail and site diff print with --json on the local
    cluster, key for key against the generated JSON reference."""
    outputs: dict[str, object] = {}
    train = str(REPO / "examples" / "train.py")
    submitted = cj("submit", train, "--gpus", "1", "--model", "A100", "--json")
    assert submitted.returncode == 0, submitted.stderr
    outputs["submit"] = json.loads(submitted.stdout)
    job = str(outputs["submit"]["job_id"])  # type: ignore[index]
    assert cj("wait", job, "--timeout", "300").returncode == 0
    for command, argv in (
        ("status", ["status", job, "--json"]),
        ("show", ["show", job, "--json"]),
        ("avail", ["avail", "--model", "A100", "--gpus", "1", "--json"]),
        ("site diff", ["site", "diff", "--json"]),
    ):
        done = cj(*argv)
        assert done.returncode in (0, 1), done.stderr  # site diff: 1 when gpu3 is drained
        outputs[command] = json.loads(done.stdout)
    for command, data in outputs.items():
        obj = data[0] if isinstance(data, list) else data
        assert isinstance(obj, dict)
        assert list(obj) == _documented_keys(command), command


def _outputs_generator() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gen_doc_outputs", REPO / "scripts" / "gen_doc_outputs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_doc_outputs", module)
    spec.loader.exec_module(module)
    return module


OUTPUT_PAGES = sorted(_outputs_generator().OUTPUTS)


@pytest.mark.parametrize("page", OUTPUT_PAGES)
def test_the_outputs_shown_are_what_the_commands_print(
    page: str, sandbox: Sandbox, tmp_path: Path
) -> None:
    """The output under a getting-started page's key commands (scripts/gen_doc_outputs.py
    writes it) is what they print on the local cluster today, job ids, times, tokens and
    paths aside: a change to a command's output shows in the page or fails here."""
    gen = _outputs_generator()
    outputs, _ = gen.capture(REPO / page, tmp_path, sandbox.state_dir)
    assert set(outputs) == set(gen.wanted(REPO / page))
    stale = gen.differences(REPO / page, outputs)
    assert not stale, "\n\n".join(stale) + "\n(run python scripts/gen_doc_outputs.py)"
