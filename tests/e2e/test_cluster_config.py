"""The sandbox's config files agree with each other and with the site YAML (no Slurm needed),
and its host plumbing (pid files, /etc/hosts lines) does what `down` relies on."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from clusterjob.sandbox import config, host
from clusterjob.sandbox.config import SANDBOX_NODES, Layout, Ports
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path / "state")


def test_site_yaml_loads_and_matches_the_node_table(layout: Layout) -> None:
    layout.state_dir.mkdir()
    layout.site_yaml.write_text(config.site_yaml(layout))
    site = load_site(layout.site_yaml)
    assert site.cluster_name == config.CLUSTER_NAME
    assert {m.name: m.gres_type for m in site.models} == {
        "A100": "a100", "V100": "v100", "H100": "h100",
        "A100-3g.40gb": "3g.40gb", "A100-2g.20gb": "2g.20gb", "A100-1g.10gb": "1g.10gb",
    }  # fmt: skip
    mig1 = site.node_map.gpus("mig1") or ()
    assert [(g.mig, g.mig_gi) for g in mig1] == [
        (("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"), (1, 2, 3, 4))
    ]
    for node in SANDBOX_NODES:
        gpus = site.node_map.gpus(node.name)
        assert gpus is not None
        assert [(g.model, g.bus_id) for g in gpus] == [(g.model, g.bus_id) for g in node.mapped]
        assert node.name in site.partition(node.partition).node_names
    assert site.prolog.log_path == str(layout.prolog_log)
    # Every GPU the stand-in will report is a model the site knows by its NVML name.
    for node in SANDBOX_NODES:
        for gpu in node.physical:
            model = site.model_for_nvml_name(config.MODELS[gpu.model].nvml_name)
            assert model is not None and model.name == gpu.model


def test_the_suspect_node_differs_from_its_map_and_only_it() -> None:
    def boards(gpus: tuple[config.SandboxGpu, ...]) -> list[tuple[str, str]]:
        return [(g.model, g.bus_id) for g in gpus]

    differs = [n.name for n in SANDBOX_NODES if boards(n.physical) != boards(n.mapped)]
    assert differs == ["gpu3"]
    # mig1's slices: the same profiles as its map's, two of them at the other GPU instance
    (mig1,) = [n for n in SANDBOX_NODES if n.name == "mig1"]
    mapped = [s.partition("@")[0] for s in mig1.mapped[0].mig]
    assert sorted(mapped) == sorted(mig1.physical[0].mig) and mapped != list(mig1.physical[0].mig)
    gpu3 = next(n for n in SANDBOX_NODES if n.name == "gpu3")
    assert sorted(g.model for g in gpu3.physical) == sorted(g.model for g in gpu3.mapped)
    assert gpu3.partition not in {n.partition for n in SANDBOX_NODES if n.name != "gpu3"}


def _site(layout: Layout) -> Site:
    layout.state_dir.mkdir(exist_ok=True)
    layout.site_yaml.write_text(config.site_yaml(layout))
    return load_site(layout.site_yaml)


def test_gres_conf_indices_follow_the_node_map(layout: Layout) -> None:
    text, node_gres = config.gres_from_site(_site(layout), layout)
    lines = text.splitlines()[1:]
    dev = layout.dev_dir
    assert [ln for ln in lines if ln.startswith("NodeName=gpu1 ")] == [
        f"NodeName=gpu1 Name=gpu Type=a100 File={dev}/gpu1/nvidia[0-1]",
        f"NodeName=gpu1 Name=gpu Type=v100 File={dev}/gpu1/nvidia[2-3]",
    ]
    assert f"NodeName=h1 Name=gpu Type=h100 File={dev}/h1/nvidia[0-7]" in lines
    # The device nodes `up` creates are exactly the ones gres.conf names.
    assert layout.device("h1", 7) == dev / "h1" / "nvidia7"
    assert node_gres == {"gpu1": "gpu:a100:2,gpu:v100:2", "gpu2": "gpu:a100:2,gpu:v100:2",
                         "gpu3": "gpu:a100:2,gpu:v100:2", "h1": "gpu:h100:8",
                         "mig1": "gpu:3g.40gb:1,gpu:2g.20gb:1,gpu:1g.10gb:2"}  # fmt: skip
    # mig1: a record per slice, its GPU's device and its GPU/compute instance's cap files
    caps = f"{dev}/mig1/nvidia-caps/nvidia-cap"
    assert [ln for ln in lines if ln.startswith("NodeName=mig1 ")][1] == (
        f"NodeName=mig1 Name=gpu Type=2g.20gb MultipleFiles={dev}/mig1/nvidia0,{caps}21,{caps}22"
    )
    mig1 = next(n for n in SANDBOX_NODES if n.name == "mig1")
    first = [dev / "mig1" / "nvidia0", Path(f"{caps}12"), Path(f"{caps}13")]
    assert layout.devices(mig1)[:3] == first


def test_slurm_conf_nodes_ports_and_hooks(layout: Layout) -> None:
    ports = Ports.from_base(26800)
    _, node_gres = config.gres_from_site(_site(layout), layout)
    text = config.slurm_conf(layout, ports, node_gres)
    assert len(set(ports.all())) == len(ports.all())
    assert "NodeName=gpu3 NodeAddr=127.0.0.1 NodeHostname=localhost Port=26812" in text
    assert "Gres=gpu:a100:2,gpu:v100:2" in text and "Gres=gpu:h100:8" in text
    assert "AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:v100,gres/gpu:h100" in text
    assert f"Prolog={layout.hooks_dir}/clusterjob-prolog" in text
    assert f"TaskProlog={layout.hooks_dir}/clusterjob-task-prolog" in text
    assert f"Epilog={layout.hooks_dir}/clusterjob-epilog" in text
    without = config.slurm_conf(layout, ports, node_gres, hooks=False)
    assert "Prolog=" not in without and "Epilog=" not in without


def test_task_prolog_wrapper_exports_the_standin(layout: Layout) -> None:
    script = layout.state_dir / "task-prolog"
    layout.state_dir.mkdir()
    script.write_text(config.task_prolog_script(layout))
    env = {"SLURMD_NODENAME": "gpu2", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=60)
    out = done.stdout.splitlines()
    assert out[:2] == [
        f"export LD_LIBRARY_PATH={layout.lib_dir}",
        f"export FAKE_NVML_SCENARIO={layout.scenario('gpu2')}",
    ]


def test_spawned_daemon_is_detached_recorded_and_stopped(tmp_path: Path) -> None:
    log = tmp_path / "sleeper.log"
    rec = host.spawn("sleeper", ["sleep", "300"], pid_dir=tmp_path, log=log)
    assert rec.alive()
    assert host.read_pid(tmp_path, "sleeper") == rec
    assert [r.name for r in host.list_pids(tmp_path)] == ["sleeper"]
    started = time.monotonic()
    host.stop(rec, tmp_path, timeout=5)
    assert not rec.alive() and time.monotonic() - started < 5
    assert host.read_pid(tmp_path, "sleeper") is None


def test_a_reused_pid_is_not_ours(tmp_path: Path) -> None:
    rec = host.spawn("sleeper", ["sleep", "300"], pid_dir=tmp_path, log=tmp_path / "log")
    try:
        impostor = host.PidRecord("sleeper", rec.pid, rec.start_ticks + 1, rec.log)
        assert not impostor.alive()
        host.stop(impostor, tmp_path)  # must not signal the real process
        assert rec.alive()
    finally:
        host.stop(rec, tmp_path, timeout=5)


def test_hosts_lines_are_added_once_and_removed_by_marker(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.0.0.5 gpu1 # someone else's\n")
    marker = f"{config.HOSTS_MARKER} /var/lib/x"
    host.add_hosts_entry(["gpu1", "h1"], marker, hosts)
    host.add_hosts_entry(["gpu1", "h1"], marker, hosts)
    lines = hosts.read_text().splitlines()
    assert lines.count(f"127.0.0.1 gpu1 h1 {marker}") == 1
    host.remove_hosts_entry(marker, hosts)
    assert hosts.read_text() == "127.0.0.1 localhost\n10.0.0.5 gpu1 # someone else's\n"
