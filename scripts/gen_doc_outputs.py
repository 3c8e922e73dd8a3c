"""Write, under the key commands of the getting-started pages, what they print on the local
cluster.

    python scripts/gen_doc_outputs.py           # run the pages' commands, rewrite the outputs
    python scripts/gen_doc_outputs.py --check   # exit 1 and show each output that differs

Run where the local cluster is up (`clusterjob sandbox up`). Each page's ```` ```console ````
commands run in order, as tests/e2e/test_docs_blocks.py runs them (one shell, a scratch
directory holding `examples/` and `site_configs/`, a registry of their own), and the output
of each command named in OUTPUTS replaces the lines under its `$ ` line in the page (its
first occurrence; a command named twice, its first two). What varies from run to run is
normalised before comparing: digits (job ids, times, dates, node numbers, free GPUs, pids),
the job token, runs of spaces (columns widen with the ids), where Slurm ran a job (a node
range such as gpu[1-2], the GPU slots the preflight table marks), the state and drain reason
of the nodes `sandbox status` lists (what the cluster's jobs left them in), and this machine's
name and the paths of this checkout and the scratch directory, which the pages show as a
reader's (your-machine, /home/you/...). tests/e2e/test_docs_blocks.py runs `check` on the
local cluster.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from doc_blocks import SHELLS, all_blocks, commands  # noqa: E402

from clusterjob.envvars import SANDBOX_DIR  # noqa: E402

# page -> the commands whose output the page shows, as written after `$ `, in the page's
# order; a command named a second time stands for its second occurrence on the page.
OUTPUTS: dict[str, tuple[str, ...]] = {
    "docs/getting-started/local-cluster.md": ("clusterjob sandbox status", "clusterjob site show"),
    "docs/getting-started/researcher.md": (
        "clusterjob submit examples/train.py --gpus 1 --model A100 --dry-run",
        "clusterjob submit examples/train.py --gpus 2 --model a100 --json",
        "clusterjob wait last --timeout 300",
        "clusterjob status last",
        "clusterjob logs last",
        "clusterjob show last",
        "clusterjob status last --json",
        "clusterjob submit examples/train.py --gpus 1 --model A100 --test-only",
        "clusterjob avail --model A100",
        # the sweep: an array of four tasks
        "clusterjob submit examples/train.py --gpus 1 --model V100 --sweep lr=1e-4,3e-4 "
        "--sweep bs=32,64",
        "clusterjob wait last --timeout 300",
        "clusterjob status last --tasks",
        "clusterjob logs last --task 3",
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
SHOWN_HOST = "your-machine"  # the local cluster's nodes run on the reader's machine
# A command and which of its occurrences on the page (0: the first).
Shown = tuple[str, int]


@dataclass(frozen=True)
class Run:
    """Where a page's commands ran: the paths and host name its outputs are made readable
    from."""

    bin_dir: Path
    work: Path
    data: Path
    sandbox: Path
    host: str = field(default_factory=socket.gethostname)

    def shown(self, text: str) -> str:
        """The output as the page shows it: this machine's paths and name replaced."""
        for here, shown in (
            (self.work, SHOWN_WORK),
            (self.data, SHOWN_DATA),
            (self.bin_dir, SHOWN_BIN),
            (self.sandbox, SHOWN_SANDBOX),
        ):
            text = text.replace(str(here.resolve()), shown).replace(str(here), shown)
        # `sandbox status` names how its state dir was chosen: a reader's is the default one.
        text = text.replace(f"({SANDBOX_DIR})", "(the default)")
        if self.host and self.host != "localhost":  # a whole name, never part of a word
            text = re.sub(rf"(?<![\w.-]){re.escape(self.host)}(?![\w-])", SHOWN_HOST, text)
        return text


def normalised(text: str) -> str:
    """What must stay the same from run to run."""
    # `sandbox status`: a node's state and drain reason are what the cluster's jobs left
    text = re.sub(r"^(node \S+ +)\S+(?:  reason: .*)?$", r"\1STATE", text, flags=re.M)
    # where Slurm ran a job, which the cluster's other jobs decide: its nodes (a range of them,
    # gpu[1-2], as one) and its GPUs' slots (the preflight table's `*`)
    text = re.sub(r"\[[\d,-]+\]", "0", text)
    text = re.sub(r"^(\s*\d+)\*", r"\1", text, flags=re.M)
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


def wanted(page: Path) -> list[Shown]:
    """The outputs OUTPUTS names for the page: each command with its occurrence."""
    seen: dict[str, int] = {}
    found = []
    for command in OUTPUTS[page.relative_to(ROOT).as_posix()]:
        found.append((command, seen.get(command, 0)))
        seen[command] = seen.get(command, 0) + 1
    return found


def describe(shown: Shown) -> str:
    command, n = shown
    return f"`{command}`" + (f" (occurrence {n + 1} on the page)" if n else "")


def _output_span(lines: list[str], shown: Shown) -> tuple[int, int]:
    """The line range under the command's occurrence on the page: up to the next command or
    the end of its block."""
    command, n = shown
    starts = [i for i, line in enumerate(lines) if line == f"$ {command}"]
    if n >= len(starts):
        raise ValueError(f"`$ {command}` is on the page {len(starts)} time(s), not {n + 1}")
    start = starts[n] + 1
    end = start
    while end < len(lines) and not lines[end].startswith(("$ ", "```")):
        end += 1
    return start, end


def page_outputs(page: Path) -> dict[Shown, str]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found = {}
    for shown in wanted(page):
        start, end = _output_span(lines, shown)
        found[shown] = "\n".join(lines[start:end])
    return found


def with_outputs(page: Path, outputs: dict[Shown, str]) -> str:
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    for shown, output in outputs.items():
        start, end = _output_span(lines, shown)
        lines[start:end] = output.rstrip("\n").splitlines()
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def environment(data_dir: Path, sandbox: Path) -> dict[str, str]:
    from clusterjob.sandbox import cluster

    env = dict(os.environ, **cluster.client_env(sandbox))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["CLUSTERJOB_DATA_DIR"] = str(data_dir)
    env["CLUSTERJOB_STATUS_CACHE_SECONDS"] = "0"
    return env


def capture(page: Path, scratch: Path, sandbox: Path) -> tuple[dict[Shown, str], Run]:
    """Run the page's commands; the outputs of those OUTPUTS names, as the page shows them."""
    work = scratch / "work"
    work.mkdir(parents=True)
    for tree in ("examples", "site_configs"):
        shutil.copytree(ROOT / tree, work / tree)
    env = environment(scratch / "data", sandbox)
    run = Run(Path(sys.executable).parent, work, scratch / "data", sandbox)
    named = set(wanted(page))
    seen: dict[str, int] = {}
    outputs: dict[Shown, str] = {}
    for text, rc, output in run_page(page, env, work):
        shown = (text, seen.get(text, 0))
        seen[text] = shown[1] + 1
        if shown in named:
            if rc != 0:
                raise RuntimeError(f"{page.name}: {describe(shown)} exited {rc}:\n{output}")
            outputs[shown] = run.shown(output)
    missing = named - set(outputs)
    if missing:
        raise RuntimeError(f"{page.name}: no such commands ran: {sorted(missing)}")
    return outputs, run


def differences(page: Path, outputs: dict[Shown, str]) -> list[str]:
    """Each command whose output on the page differs (normalised) from what it printed."""
    on_page = page_outputs(page)
    found = []
    for shown, output in outputs.items():
        if normalised(on_page[shown]) != normalised(output):
            diff = "\n".join(
                difflib.unified_diff(
                    on_page[shown].splitlines(),
                    output.splitlines(),
                    "the page",
                    "printed now",
                    lineterm="",
                )  # fmt: skip
            )
            found.append(f"{page.relative_to(ROOT)}: {describe(shown)}:\n{diff}")
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
