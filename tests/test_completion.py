"""Shell completion: the site's models and partitions after --model / --partition.

Bash is driven for real: an interactive bash on a pseudo-terminal sources the script that
`clusterjob --show-completion bash` prints, and gets TAB TAB after `--model `. zsh and fish
are not installed here, so their side of Typer's protocol (the environment variables their
scripts set) is run directly.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterjob.site.loader import load_site

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / "site_configs" / "mllab.yaml"
MLLAB_MODELS = {"A100", "V100"}


def _clusterjob() -> str:
    exe = Path(sys.executable).parent / "clusterjob"  # the installed entry point beside us
    found = str(exe) if exe.is_file() else shutil.which("clusterjob")
    if found is None:
        pytest.skip("no installed `clusterjob` command to complete")
    return found


def _complete(env_extra: dict[str, str]) -> list[str]:
    env = dict(os.environ, CLUSTERJOB_SITE=str(SITE), **env_extra)
    done = subprocess.run(
        [_clusterjob()], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_bash_protocol_offers_models_and_partitions() -> None:
    bash = {"_CLUSTERJOB_COMPLETE": "complete_bash"}
    models = _complete(bash | {"COMP_WORDS": "clusterjob submit --model ", "COMP_CWORD": "3"})
    assert set(models) == MLLAB_MODELS
    aliases = _complete(bash | {"COMP_WORDS": "clusterjob avail -m a100-", "COMP_CWORD": "3"})
    assert aliases == ["a100-pcie-40gb"]  # an alias once the prefix is one of theirs
    parts = _complete(bash | {"COMP_WORDS": "clusterjob submit -p d", "COMP_CWORD": "3"})
    assert parts == ["debug"]
    every = _complete(bash | {"COMP_WORDS": "clusterjob avail --partition ", "COMP_CWORD": "3"})
    assert every == ["gpu", "debug"]


def test_an_explicit_site_is_the_one_completed_from() -> None:
    words = "clusterjob submit --site h100farm --model "
    out = _complete({"_CLUSTERJOB_COMPLETE": "complete_bash", "COMP_WORDS": words,
                     "COMP_CWORD": "5"})  # fmt: skip
    h100farm = load_site(REPO / "site_configs" / "h100farm.yaml")
    assert out == [m.name for m in h100farm.models] and out != sorted(MLLAB_MODELS)


def test_no_site_offers_nothing_and_says_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLUSTERJOB_SITE"}
    env |= {"_CLUSTERJOB_COMPLETE": "complete_bash", "COMP_WORDS": "clusterjob submit --model ",
            "COMP_CWORD": "3", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path),
            "PATH": "/nonexistent", "SLURM_CONF": str(tmp_path / "none.conf")}  # fmt: skip
    done = subprocess.run([_clusterjob()], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "", "")


def test_zsh_and_fish_protocols_offer_models() -> None:
    zsh = _complete({"_CLUSTERJOB_COMPLETE": "complete_zsh",
                     "_TYPER_COMPLETE_ARGS": "clusterjob submit --model "})  # fmt: skip
    assert '"A100"' in "\n".join(zsh) and '"V100"' in "\n".join(zsh)
    fish = _complete({"_CLUSTERJOB_COMPLETE": "complete_fish",
                      "_TYPER_COMPLETE_ARGS": "clusterjob submit --model ",
                      "_TYPER_COMPLETE_FISH_ACTION": "get-args"})  # fmt: skip
    assert set(fish) == MLLAB_MODELS


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_show_completion_prints_each_shells_script(shell: str) -> None:
    done = subprocess.run([_clusterjob(), "--show-completion", shell], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "_CLUSTERJOB_COMPLETE" in done.stdout
    assert f"complete_{shell}" in done.stdout  # that shell's, not the parent process's


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_show_completion_takes_the_named_shell_without_a_shell_above_it(shell: str) -> None:
    """Typer guessed the shell from the parent processes: from a script with none above it
    (setsid, as cron or a container's entry point), "Shell  not supported"."""
    done = subprocess.run(["setsid", "-w", _clusterjob(), "--show-completion", shell],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"complete_{shell}" in done.stdout


def _read_until(fd: int, wanted: list[str], timeout: float) -> str:
    seen = ""
    end = time.monotonic() + timeout
    while time.monotonic() < end and not all(w in seen for w in wanted):
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 4096).decode(errors="replace")
            except OSError:
                break
    return seen


def test_bash_under_a_pty_completes_the_sites_models(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    script = subprocess.run([_clusterjob(), "--show-completion", "bash"], capture_output=True,
                            text=True, timeout=60, check=True).stdout  # fmt: skip
    rc = tmp_path / "bashrc"
    rc.write_text(
        f"{script}\nPS1='READY> '\nbind 'set show-all-if-ambiguous on'\n"
        f"export PATH={Path(_clusterjob()).parent}:$PATH\n"
    )
    env = {"HOME": str(tmp_path), "TERM": "dumb", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "CLUSTERJOB_SITE": str(SITE)}  # fmt: skip
    pid, fd = pty.fork()
    if pid == 0:  # the child: an interactive bash reading our rc file
        os.execve(bash, [bash, "--noprofile", "--rcfile", str(rc), "-i"], env)
    try:
        assert "READY>" in _read_until(fd, ["READY>"], 30)
        os.write(fd, b"clusterjob submit --model \t\t")
        seen = _read_until(fd, sorted(MLLAB_MODELS), 60)
        assert all(m in seen for m in MLLAB_MODELS), seen
    finally:
        os.write(fd, b"\x03exit\n")
        os.close(fd)
        os.waitpid(pid, 0)
