"""scripts/gen_doc_outputs.py without a cluster: the commands it names are on their pages,
outputs are compared modulo what varies between runs and nothing else, and writing an output
replaces exactly the lines under its command. (tests/e2e/test_docs_blocks.py runs the
commands on the local cluster and compares.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from doc_blocks import all_blocks, commands

REPO = Path(__file__).resolve().parents[1]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_doc_outputs", REPO / "scripts" / "gen_doc_outputs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_doc_outputs", module)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_every_named_command_is_a_console_command_of_its_page() -> None:
    for name in gen.OUTPUTS:
        page = REPO / name
        shown = [
            c.text for b in all_blocks() if b.doc == page and b.lang == "console"
            for c in commands(b)
        ]  # fmt: skip
        wanted = gen.wanted(page)
        for command, n in wanted:  # named twice: the page has it twice
            assert shown.count(command) > n, (name, command, n)
        outputs = gen.page_outputs(page)
        empty = [gen.describe(s) for s in wanted if not outputs[s].strip()]
        assert not empty, f"{name}: these commands show no output: {empty}"


def test_the_documented_outputs_are_named() -> None:
    """What a reader most needs to see is real output, generated and checked, not a sample."""
    named = {c for commands in gen.OUTPUTS.values() for c in commands}
    for command in (
        "clusterjob sandbox status",
        "clusterjob logs last",
        "clusterjob show last",
        "clusterjob status last --json",
        "clusterjob status last --tasks",
    ):
        assert command in named, command
    assert any("--sweep" in c for c in named)


def test_only_what_varies_between_runs_is_ignored() -> None:
    page = "JOBID  STATE      NODES  TIME\n2549   COMPLETED  gpu1   00:00:02\n"
    now = "JOBID  STATE      NODES  TIME\n674    COMPLETED  gpu2   00:00:00\n"
    assert gen.normalised(page) == gen.normalised(now)
    assert gen.normalised("token 5b94558bfcb614b8") == gen.normalised("token d19d4aeb47caaa26")
    assert gen.normalised(page) != gen.normalised(now.replace("COMPLETED", "FAILED   "))
    assert gen.normalised("a\nb") != gen.normalised("a\nb\nc")  # a line more


def test_a_nodes_state_in_sandbox_status_is_what_jobs_left_it() -> None:
    page = "munged         running (pid 7254)\nnode gpu3   drained  reason: clusterjob: x\n"
    now = "munged         running (pid 81)\nnode gpu3   idle\n"
    assert gen.normalised(page) == gen.normalised(now)
    assert gen.normalised(page) != gen.normalised(now.replace("running (pid 81)", "stopped"))
    assert gen.normalised(page) != gen.normalised(now.replace("gpu3", "h1"))  # another node
    assert gen.normalised("node map: 5 nodes") == "node map: 0 nodes"  # site show's line


def test_where_slurm_ran_a_job_is_what_the_clusters_other_jobs_decided() -> None:
    page = "0*    0000:07:00.0  A100  ok\n2     0000:48:00.0  V100  ok\n1659  gpu[1-2]  -"
    now = "0     0000:07:00.0  A100  ok\n2*    0000:48:00.0  V100  ok\n1702  gpu1  -"
    assert gen.normalised(page) == gen.normalised(now)
    assert gen.normalised(page) != gen.normalised(now.replace("V100  ok", "V100  FAIL"))


def test_writing_an_output_replaces_the_lines_under_its_command(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("x\n\n```console\n$ one\nold\nlines\n$ two\nkept\n```\n")
    new = gen.with_outputs(page, {("one", 0): "new output\n"})
    assert new == "x\n\n```console\n$ one\nnew output\n$ two\nkept\n```\n"
    page.write_text("```console\n$ one\n```\n")
    assert gen.with_outputs(page, {("one", 0): "a\n\nb\n"}) == "```console\n$ one\na\n\nb\n```\n"


def test_a_command_shown_twice_gets_each_output_in_its_place(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```console\n$ wait\nfirst\n$ two\n```\n\n```console\n$ wait\n```\n")
    new = gen.with_outputs(page, {("wait", 1): "second\n", ("wait", 0): "1st\n"})
    assert new == "```console\n$ wait\n1st\n$ two\n```\n\n```console\n$ wait\nsecond\n```\n"


def test_this_machines_paths_are_shown_as_a_readers(tmp_path: Path) -> None:
    run = gen.Run(tmp_path / "bin", tmp_path / "work", tmp_path / "data", tmp_path / "sb")
    text = f"python={tmp_path}/bin/python3 --chdir={tmp_path}/work {tmp_path}/data/scripts/x.sh"
    assert run.shown(text) == (
        "python=/home/you/.venv/bin/python3 --chdir=/home/you/project "
        "/home/you/.local/share/clusterjob/scripts/x.sh"
    )


def test_this_machines_name_is_shown_as_a_readers(tmp_path: Path) -> None:
    """The local cluster's nodes all run on this machine: `hostname` in a job is its name."""
    run = gen.Run(tmp_path, tmp_path / "w", tmp_path / "d", tmp_path / "s", host="node7")
    assert run.shown("hostname=node7\nnode7.example.org\n") == (
        "hostname=your-machine\nyour-machine.example.org\n"
    )
    assert run.shown("node77 xnode7 gpu-node7") == "node77 xnode7 gpu-node7"  # whole names only
    described = "sandbox: the host's Slurm, state in /x (CLUSTERJOB_SANDBOX_DIR)"
    assert run.shown(described).endswith("(the default)")
