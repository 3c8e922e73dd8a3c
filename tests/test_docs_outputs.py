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
    for name, wanted in gen.OUTPUTS.items():
        page = REPO / name
        shown = [
            c.text for b in all_blocks() if b.doc == page and b.lang == "console"
            for c in commands(b)
        ]  # fmt: skip
        assert set(wanted) <= set(shown), (name, set(wanted) - set(shown))
        outputs = gen.page_outputs(page)
        assert all(outputs[c].strip() for c in wanted), f"{name}: a command shows no output"


def test_only_what_varies_between_runs_is_ignored() -> None:
    page = "JOBID  STATE      NODES  TIME\n2549   COMPLETED  gpu1   00:00:02\n"
    now = "JOBID  STATE      NODES  TIME\n674    COMPLETED  gpu2   00:00:00\n"
    assert gen.normalised(page) == gen.normalised(now)
    assert gen.normalised("token 5b94558bfcb614b8") == gen.normalised("token d19d4aeb47caaa26")
    assert gen.normalised(page) != gen.normalised(now.replace("COMPLETED", "FAILED   "))
    assert gen.normalised("a\nb") != gen.normalised("a\nb\nc")  # a line more


def test_writing_an_output_replaces_the_lines_under_its_command(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("x\n\n```console\n$ one\nold\nlines\n$ two\nkept\n```\n")
    new = gen.with_outputs(page, {"one": "new output\n"})
    assert new == "x\n\n```console\n$ one\nnew output\n$ two\nkept\n```\n"
    page.write_text("```console\n$ one\n```\n")
    assert gen.with_outputs(page, {"one": "a\n\nb\n"}) == "```console\n$ one\na\n\nb\n```\n"


def test_this_machines_paths_are_shown_as_a_readers(tmp_path: Path) -> None:
    run = gen.Run(tmp_path / "bin", tmp_path / "work", tmp_path / "data", tmp_path / "sb")
    text = f"python={tmp_path}/bin/python3 --chdir={tmp_path}/work {tmp_path}/data/scripts/x.sh"
    assert run.shown(text) == (
        "python=/home/you/.venv/bin/python3 --chdir=/home/you/project "
        "/home/you/.local/share/clusterjob/scripts/x.sh"
    )
