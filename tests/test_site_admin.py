"""Site admin commands: validate (exit codes, one line per problem), show, gres-conf."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from clusterjob.cli.app import run, site_app
from clusterjob.resources import site_configs_dir
from clusterjob.site import schema
from clusterjob.site.admin import gres_conf_lines, node_gres_strings, slurm_node_gres_lines
from clusterjob.site.loader import load_site

REPO = Path(__file__).resolve().parents[1]
BAD = Path(__file__).parent / "bad_configs"
MLLAB = site_configs_dir() / "mllab.yaml"


def test_validate_good_files_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(site_configs_dir() / n) for n in ("mllab.yaml", "hpccentre.yaml", "h100farm.yaml")]
    assert run(["site", "validate", *files]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{files[0]}: ok (site mllab: 2 models, 2 partitions, 8 nodes)"
    assert len(out) == 3


def test_validate_prints_every_problem_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    bad = str(BAD / "many_errors.yaml")
    assert run(["site", "validate", bad, str(MLLAB)]) == 2
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith(bad)] == [
        f"{bad}:5: models.A100.memory_gb: expected an integer >= 1, got -1",
        f"{bad}:7: partitions.gpu.colour: unknown key; valid keys: "
        + ", ".join(sorted(schema.PARTITION.key_table())),
        f"{bad}:7: partitions.gpu.nodes: not in node_map: n[3-4]",
        f"{bad}:10: node_map[0].gpus[0].model: unknown model 'V100'; defined models: A100",
        f"{bad}:11: prolog.on_error: expected one of drain, pass, got 'ignore'",
        f"{bad}:11: prolog.deadline_seconds: expected a positive number, got 0",
    ]
    assert out[-1].startswith(f"{MLLAB}: ok")


def test_warnings_are_printed_but_do_not_fail(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(BAD / "gres_substring_warning.yaml")
    assert run(["site", "validate", path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{path}:6: warning: models.A10.gres_type: GRES type 'a10'")


def test_validate_json(capsys: pytest.CaptureFixture[str]) -> None:
    bad = str(BAD / "bus_order.yaml")
    assert run(["site", "validate", "--json", bad, str(MLLAB)]) == 2
    records = json.loads(capsys.readouterr().out)
    assert records[0]["ok"] is False and records[1] == {
        "file": str(MLLAB),
        "ok": True,
        "issues": [],
    }
    assert records[0]["issues"] == [
        {
            "file": bad,
            "line": 10,
            "key_path": "node_map[0].gpus[1].bus_id",
            "message": "GPUs must be listed in PCI bus order: 0000:07:00.0 comes before "
            "0000:0b:00.0 (slot 0)",
            "severity": "error",
        }
    ]


@pytest.mark.parametrize("name", sorted(p.name for p in BAD.glob("*.yaml")))
def test_validate_subprocess_never_shows_a_traceback(name: str) -> None:
    path = BAD / name
    proc = subprocess.run(
        [sys.executable, "-m", "clusterjob", "site", "validate", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    problems = [line for line in lines if line.startswith(f"{path}:") and ": ok (" not in line]
    if name == "gres_substring_warning.yaml":
        assert proc.returncode == 0 and len(problems) == 1
    else:
        assert proc.returncode == 2 and problems
        assert all(line.count(":") >= 2 for line in problems)


def test_show_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["site", "show", "--site", "mllab"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "    A100: 4 GPUs on 2 nodes (ml-gpu[07-08])" in out
    assert any(line.startswith("  V100; aliases v100, V100-32GB") for line in out)
    assert (
        run(["site", "show", "--site", str(site_configs_dir() / "hpccentre.yaml"), "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["gpu_request"] == {"syntax": "gpus-per-node", "type_required": True}
    big = next(p for p in data["partitions"] if p["name"] == "gpu-big")
    assert big["models"] == {"A100-80GB": {"nodes": "gx[01-04]", "node_count": 4, "gpus": 32}}


def test_show_unknown_site_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["site", "show", "--site", "no-such-site"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("clusterjob: error: --site no-such-site: no site")


def test_gres_conf_groups_slots_by_type() -> None:
    site = load_site(MLLAB)
    assert gres_conf_lines(site, "/tmp/dev/nvidia") == [
        "NodeName=ml-gpu[01-04] Name=gpu Type=a100 File=/tmp/dev/nvidia[0-1]",
        "NodeName=ml-gpu[01-04] Name=gpu Type=v100 File=/tmp/dev/nvidia[2-3]",
        "NodeName=ml-gpu[05-08] Name=gpu Type=v100 File=/tmp/dev/nvidia[0-1]",
        "NodeName=ml-gpu[05-08] Name=gpu Type=a100 File=/tmp/dev/nvidia[2-3]",
    ]
    gres = node_gres_strings(site)
    assert gres["ml-gpu01"] == "gpu:a100:2,gpu:v100:2"
    assert gres["ml-gpu08"] == "gpu:v100:2,gpu:a100:2"
    assert len(gres) == 8


def test_gres_conf_untyped_and_single_slots(tmp_path: Path) -> None:
    site = load_site(site_configs_dir() / "h100farm.yaml")
    assert gres_conf_lines(site) == [
        "NodeName=a100-[01-16],h100-[001-064] Name=gpu File=/dev/nvidia[0-7]",
    ]
    assert slurm_node_gres_lines(site) == ["NodeName=a100-[01-16],h100-[001-064] Gres=gpu:8"]
    path = tmp_path / "s.yaml"
    path.write_text(
        "site: t\n"
        "gpu_request: {syntax: gres}\n"
        "models:\n"
        "  A: {gres_type: a, nvml_names: [A]}\n"
        "  B: {gres_type: b, nvml_names: [B]}\n"
        "node_map:\n"
        "  - {nodes: n1, gpus: [{model: A}, {model: B}, {model: A}]}\n"
        "  - {nodes: n2, gpus: []}\n"
    )
    site = load_site(path)
    assert gres_conf_lines(site) == [
        "NodeName=n1 Name=gpu Type=a File=/dev/nvidia0",
        "NodeName=n1 Name=gpu Type=b File=/dev/nvidia1",
        "NodeName=n1 Name=gpu Type=a File=/dev/nvidia2",
    ]
    assert node_gres_strings(site) == {"n1": "gpu:a:2,gpu:b:1"}


def test_gres_conf_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["site", "gres-conf", "--site", "mllab", "--device-prefix", "/x/nv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "NodeName=ml-gpu[05-08] Name=gpu Type=a100 File=/x/nv[2-3]" in out
    assert "# NodeName=ml-gpu[01-04] Gres=gpu:a100:2,gpu:v100:2" in out


def test_site_help_names_its_commands_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    """The group's one-line help lists the commands by the names `clusterjob site` takes."""
    assert run(["site", "--help"]) == 0
    out = capsys.readouterr().out
    summary = next(line.strip() for line in out.splitlines() if line.strip().startswith("Site"))
    listed = summary.split(":", 1)[1].strip().rstrip(".").split(", ")
    commands = list(typer.main.get_command(site_app).commands)  # type: ignore[attr-defined]
    assert commands and listed == commands
