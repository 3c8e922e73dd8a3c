"""Shared test setup: every test gets its own XDG dirs, so nothing reads or writes the
real user's config, data or cache (job registry, site discovery, status cache)."""

from __future__ import annotations

import os
import sys

import pytest

# Every command a test runs does its work in its own process, as before the command server:
# which commands a warm server would take depends on timing, and a test's answer must not.
# tests/test_command_server.py turns it on where it is the subject, and compares both ways.
os.environ["CLUSTERJOB_SERVER"] = "0"


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path_factory.mktemp("xdg")
    for var, sub in (
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_DATA_HOME", "data"),
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_STATE_HOME", "state"),
    ):
        (home / sub).mkdir()
        monkeypatch.setenv(var, str(home / sub))
    monkeypatch.delenv("CLUSTERJOB_SITE", raising=False)
    monkeypatch.delenv("CLUSTERJOB_DATA_DIR", raising=False)
    yield
    # A cluster's polling thread outlives its test: left running, it asks the next test's
    # (monkeypatched) Slurm about this one's jobs.
    cluster = sys.modules.get("clusterjob.api.cluster")
    if cluster is not None:
        cluster.stop_polling()


# The stand-in NVML library fixtures (standin_lib, run_python, ...) for every test module.
pytest_plugins = ["standin_fixtures"]
