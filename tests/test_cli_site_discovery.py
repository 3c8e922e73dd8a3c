"""Every command finds its site the same way, down to the last step of the documented order:
the known site whose ``cluster_name`` is Slurm's ``ClusterName``.

``scontrol`` here is a small executable on PATH that answers ``show config`` as Slurm does
(the real cluster is asked in tests/e2e/test_admin.py); clusterjob runs as its own process
with no ``--site``, no ``$CLUSTERJOB_SITE`` and empty config directories.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCONTROL = """#!/bin/sh
if [ "$1 $2" = "show config" ]; then
    echo "Configuration data as of 2026-12-01T10:00:00"
    echo "AccountingStorageType   = accounting_storage/slurmdbd"
    echo "ClusterName             = {name}"
    echo "SchedulerType           = sched/backfill"
    exit 0
fi
echo "scontrol: stand-in answers only 'show config'" >&2
exit 1
"""


@pytest.fixture
def cluster_named(tmp_path: Path):
    def env_for(name: str) -> dict[str, str]:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        scontrol = bin_dir / "scontrol"
        scontrol.write_text(SCONTROL.format(name=name))
        scontrol.chmod(0o755)
        env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERJOB_SITE", "SLURM_CONF")}
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
        env["HOME"] = str(tmp_path / "home")
        env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
        env["CLUSTERJOB_DATA_DIR"] = str(tmp_path / "data")
        return env

    return env_for


def cli(env: dict[str, str], *args: str, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("name", ["mllab", "hpccentre"])
def test_every_site_command_and_submit_pick_the_site_of_slurms_cluster_name(
    cluster_named, tmp_path: Path, name: str
) -> None:
    env = cluster_named(name)
    show = cli(env, "site", "show", "--json")
    assert show.returncode == 0, show.stderr
    assert json.loads(show.stdout)["site"] == name

    gres = cli(env, "site", "gres-conf")
    assert gres.returncode == 0, gres.stderr
    assert "NodeName=" in gres.stdout

    (tmp_path / "train.py").write_text("print('training')\n")
    submit = cli(env, "submit", "train.py", "--gpus", "1", "--model", "A100", "--dry-run",
                 cwd=tmp_path)  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    site_file = [
        ln for ln in submit.stdout.splitlines() if ln.startswith("export CLUSTERJOB_SITE=")
    ]
    assert site_file and site_file[0].endswith(f"/{name}.yaml"), submit.stdout

    # site diff got as far as asking Slurm about the nodes of the right site: the stand-in
    # answers nothing else, so it fails there, naming the command it ran.
    diff = cli(env, "site", "diff")
    assert diff.returncode == 3, diff.stderr
    assert "scontrol failed" in diff.stderr and "stand-in answers only" in diff.stderr


def test_an_unknown_cluster_name_says_what_was_tried(cluster_named) -> None:
    env = cluster_named("big-iron")
    for args in (("site", "show"), ("site", "gres-conf"), ("site", "diff"), ("avail",)):
        done = cli(env, *args)
        assert done.returncode == 2, (args, done.stderr)
        (line,) = done.stderr.splitlines()
        assert "no site config found" in line and "a site with cluster_name big-iron" in line
