"""Write, under the key commands of the getting-started pages, what they print on the local
cluster.

    python scripts/gen_doc_outputs.py           # run the pages' commands, rewrite the outputs
    python scripts/gen_doc_outputs.py --check   # exit 1 and show each output that differs

Run where the local cluster is up (`clusterjob sandbox up`). Each page's ```` ```console ````
commands run in order, as tests/e2e/test_docs_blocks.py runs them (one shell, a scratch
directory holding `examples/` and `site_configs/`, a registry of their own), and the output
of each command named in OUTPUTS replaces the lines under its `$ ` line in the page (its
first occurrence). What varies from run to run is normalised before comparing: digits (job
ids, times, dates, node numbers, free GPUs), the job token, runs of spaces (columns widen
with the ids), and the paths of this checkout and the scratch directory, which the pages show
as /home/you/... . tests/e2e/test_docs_blocks.py runs `check` on the local cluster.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from doc_blocks import SHELLS, all_blocks, commands  # noqa: E402

# page -> the commands whose output the page shows, as written after `$ `.
OUTPUTS: dict[str, tuple[str, ...]] = {
    "docs/getting-started/local-cluster.md": ("clusterjob site show",),
    "docs/getting-started/researcher.md": (
        "clusterjob submit examples/train.py --gpus 1 --model A100 --dry-run",
        "clusterjob submit examples/train.py --gpus 2 --model a100 --json",
        "clusterjob wait last --timeout 300",
        "clusterjob status last",
        "clusterjob avail --model A100",
    ),
    "docs/getting-started/site-admin.md": (
        "clusterjob site validate site_configs/mllab.yaml site_configs/hpccentre.yaml "
        "site_configs/h100farm.yaml",
        "clusterjob site gres-conf --site site_configs/mllab.yaml",
    ),
}
# What the pages show in place of this machine's paths.
SHOWN_BIN = "/home/you/.venv/bin"
SHOWN_WORK = "/home/you/project"
SHOWN_DATA = "/home/you/.local/share/clusterjob"  # the default data dir
SHOWN_SANDBOX = "/var/lib/clusterjob-sandbox"


@dataclass(frozen=True)
class Run:
    """Where a page's commands ran: the paths its outputs are made readable from."""

    bin_dir: Path
    work: Path
    data: Path
    sandbox: Path

    def shown(self, text: str) -> str:
        """The output as the page shows it: this machine's paths replaced."""
        for here, shown in (
            (self.work, SHOWN_WORK),
            (self.data, SHOWN_DATA),
            (self.bin_dir, SHOWN_BIN),
            (self.sandbox, SHOWN_SANDBOX),
        ):
            text = text.replace(str(here.resolve()), shown).replace(str(here), shown)
        return text


def normalised(text: str) -> str:
    """What must stay the same from run to run."""
    text = re.sub(r"\b[0-9a-f]{16}\b", "TOKEN", text)
    text = re.sub(r"\d+", "0", text)
    return "\n".join(re.sub(r"[ \t]+", " ", line).strip() for line in text.strip().splitlines())


def run_page(page: Path, env: dict[str, str], work: Path) -> list[tuple[str, int, str]]:
    """Each ```console command of the page, in order, in one shell: (command, exit status,
    what it printed on stdout and stderr together)."""
    out = work.parent / "outputs"
    out.mkdir(exist_ok=True)
    shown: list[str] = []
    lines = []
    for block in (b for b in all_blocks() if b.doc == page and b.lang == "console"):
        for command in commands(block):
            n = len(shown)
            shown.append(command.text)
            lines += ["{", command.text, f"}} >{out}/{n}.out 2>&1", f"echo $? >{out}/{n}.rc"]
    for block in all_blocks():  # files the page's commands use: ```LANG title="a/relative/path"
        if block.doc == page and block.lang not in SHELLS and block.title:
            (work / block.title).parent.mkdir(parents=True, exist_ok=True)
            (work / block.title).write_text(block.text, encoding="utf-8")
    subprocess.run(
        ["bash", "-c", "\n".join(lines) + "\n"], cwd=work, env=env,
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    results = []
    for n, text in enumerate(shown):
        rc = out / f"{n}.rc"
        results.append(
            (
                text,
                int(rc.read_text()) if rc.exists() else -1,
                (out / f"{n}.out").read_text(encoding="utf-8", errors="replace")
                if rc.exists()
                else "",
            )
        )
    return results


def _output_span(lines: list[str], command: str) -> tuple[int, int]:
    """The line range under the first `$ command` of the page: up to the next command or
    the end of its block."""
    start = lines.index(f"$ {command}") + 1
    end = start
    while end < len(lines) and not lines[end].startswith(("$ ", "```")):
        end += 1
    return start, end


def page_outputs(page: Path) -> dict[str, str]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found = {}
    for command in OUTPUTS[page.relative_to(ROOT).as_posix()]:
        start, end = _output_span(lines, command)
        found[command] = "\n".join(lines[start:end])
    return found


def with_outputs(page: Path, outputs: dict[str, str]) -> str:
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    for command, output in outputs.items():
        start, end = _output_span(lines, command)
        lines[start:end] = output.rstrip("\n").splitlines()
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def environment(data_dir: Path, sandbox: Path) -> dict[str, str]:
    from clusterjob.sandbox import cluster

    env = dict(os.environ, **cluster.client_env(sandbox))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["CLUSTERJOB_DATA_DIR"] = str(data_dir)
    env["CLUSTERJOB_STATUS_CACHE_SECONDS"] = "0"
    return env


def capture(page: Path, scratch: Path, sandbox: Path) -> tuple[dict[str, str], Run]:
    """Run the page's commands; the outputs of those OUTPUTS names, as the page shows them."""
    work = scratch / "work"
    work.mkdir(parents=True)
    for tree in ("examples", "site_configs"):
        shutil.copytree(ROOT / tree, work / tree)
    env = environment(scratch / "data", sandbox)
    run = Run(Path(sys.executable).parent, work, scratch / "data", sandbox)
    wanted = OUTPUTS[page.relative_to(ROOT).as_posix()]
    outputs: dict[str, str] = {}
    for text, rc, output in run_page(page, env, work):
        if text in wanted and text not in outputs:
            if rc != 0:
                raise RuntimeError(f"{page.name}: `{text}` exited {rc}:\n{output}")
            outputs[text] = run.shown(output)
    missing = set(wanted) - set(outputs)
    if missing:
        raise RuntimeError(f"{page.name}: no such commands ran: {sorted(missing)}")
    return outputs, run


def differences(page: Path, outputs: dict[str, str]) -> list[str]:
    """Each command whose output on the page differs (normalised) from what it printed."""
    shown = page_outputs(page)
    found = []
    for command, output in outputs.items():
        if normalised(shown[command]) != normalised(output):
            diff = "\n".join(
                difflib.unified_diff(
                    shown[command].splitlines(),
                    output.splitlines(),
                    "the page",
                    "printed now",
                    lineterm="",
                )  # fmt: skip
            )
            found.append(f"{page.relative_to(ROOT)}: `{command}`:\n{diff}")
    return found


def main(argv: list[str]) -> int:
    from clusterjob.sandbox import cluster

    check = "--check" in argv
    sandbox = cluster.resolve_state_dir()
    stale = []
    for name in OUTPUTS:
        page = ROOT / name
        with tempfile.TemporaryDirectory(prefix="clusterjob-docs-") as scratch:
            outputs, _ = capture(page, Path(scratch), sandbox)
        if check:
            stale += differences(page, outputs)
        else:
            page.write_text(with_outputs(page, outputs), encoding="utf-8")
    if stale:
        print("\n\n".join(stale), file=sys.stderr)
        print("the pages' outputs are out of date: run python scripts/gen_doc_outputs.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
