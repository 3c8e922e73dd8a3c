"""What a site asks of every job (issue: real sites): extra GRES in the one --gres, job
defaults at three levels, partitions named by QoS or not at all, limits, default time, QoS by
time, account patterns, CPU and memory forms, extra #SBATCH lines, preflight modes, AMD
GPUs in gres.conf, grouped constraints. Real loader, real resolve, real templates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterjob.errors import UsageError
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.admin import gres_conf_lines
from clusterjob.site.loader import load_site, validate_site_file
from clusterjob.site.model import Site

TOKEN = "0123456789abcdef"

BASE = """\
site: t
cluster_name: t
gpu_request: {{syntax: {syntax}, type_required: {typed}{form}}}
{top}
models:
  V100:
    gres_type: v100
    nvml_names: ["Tesla V100-SXM2-32GB"]
{model}
partitions:
  gpu:
    nodes: "n[1-4]"
    default: true
    time_limit: "2-00:00:00"
{partition}
node_map:
  - nodes: "n[1-4]"
    gpus: [{{model: V100}}, {{model: V100}}, {{model: V100}}, {{model: V100}}]
"""


def make(
    tmp_path: Path,
    *,
    syntax: str = "gres",
    typed: str = "true",
    form: str = "",
    top: str = "",
    model: str = "",
    partition: str = "",
) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(
        BASE.format(
            syntax=syntax, typed=typed, form=form, top=top, model=model, partition=partition
        )
    )
    return path


def directives(site: Site, **request: object) -> list[str]:
    kw: dict[str, object] = {"gpus": 1, "model": "V100", "token": TOKEN}
    kw.update(request)
    job = resolve(site, JobRequest("train.py", **kw), choose_interpreter=False)  # type: ignore[arg-type]
    script = render(site, job, python="/usr/bin/python3").script
    return [line[len("#SBATCH ") :] for line in script.splitlines() if line.startswith("#SBATCH ")]


def issues(path: Path) -> list[str]:
    _, found = validate_site_file(path)
    return [f"{i.line}: {i.key_path}: {i.message}" for i in found]


# -- 1. extra GRES ---------------------------------------------------------------------------


def test_extra_gres_joins_the_gpu_request_in_one_gres(tmp_path: Path) -> None:
    site = load_site(make(tmp_path))
    lines = directives(site, gres=("nvme:10",))
    assert [x for x in lines if x.startswith("--gres")] == ["--gres=gpu:v100:1,nvme:10"]
    lines = directives(site, sbatch_args=("--gres=nvme:10",))
    assert [x for x in lines if x.startswith("--gres")] == ["--gres=gpu:v100:1,nvme:10"]


def test_site_gres_is_replaced_by_the_users_of_the_same_name(tmp_path: Path) -> None:
    site = load_site(make(tmp_path, top="defaults: {gres: [nvme:10]}"))
    assert "--gres=gpu:v100:2,nvme:10" in directives(site, gpus=2)
    assert "--gres=gpu:v100:2,nvme:20" in directives(site, gpus=2, gres=("nvme:20",))


def test_extra_gres_with_another_gpu_syntax_is_one_gres_line(tmp_path: Path) -> None:
    site = load_site(make(tmp_path, syntax="gpus-per-node", top="defaults: {gres: [nvme:10]}"))
    lines = directives(site)
    assert "--gpus-per-node=v100:1" in lines
    assert [x for x in lines if x.startswith("--gres")] == ["--gres=nvme:10"]


@pytest.mark.parametrize(
    ("request_kw", "message"),
    [
        (dict(gres=("gpu:2",)), "--gres 'gpu:2' asks for GPUs"),
        (dict(sbatch_args=("--gres=gpu:v100:1",)), "'gpu:v100:1' asks for GPUs"),
        (dict(sbatch_args=("--gpus-per-node=2",)), "asks for GPUs next to clusterjob's own"),
        (dict(sbatch_args=("-G 2",)), "asks for GPUs next to clusterjob's own"),
        (dict(gres=("nvme 10",)), "expected NAME[:TYPE][:COUNT]"),
    ],
)
def test_a_second_gpu_request_is_refused(tmp_path: Path, request_kw: dict, message: str) -> None:
    site = load_site(make(tmp_path))
    with pytest.raises(UsageError, match=re.escape(message)):
        directives(site, **request_kw)


_GRES_ITEMS = st.sampled_from(["nvme:10", "nvme:20", "bandwidth:lustre:4G", "mps:100", "tmp"])
_SBATCH = st.lists(
    st.one_of(
        _GRES_ITEMS.map(lambda g: f"--gres={g}"),
        _GRES_ITEMS.map(lambda g: f"--gres {g}"),
        st.sampled_from(["--exclusive", "--hint=nomultithread", "--gres-flags=enforce-binding"]),
    ),
    max_size=4,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    syntax=st.sampled_from(
        ["gres", "gres+constraint", "gpus-per-node", "gpus-per-task", "gpus", "none"]
    ),
    gpus=st.integers(0, 4),
    nodes=st.integers(1, 3),
    site_gres=st.lists(_GRES_ITEMS, max_size=2, unique_by=lambda g: g.split(":")[0]),
    partition_gres=st.lists(_GRES_ITEMS, max_size=2, unique_by=lambda g: g.split(":")[0]),
    model_gres=st.lists(_GRES_ITEMS, max_size=2, unique_by=lambda g: g.split(":")[0]),
    user_gres=st.lists(_GRES_ITEMS, max_size=3),
    sbatch_args=_SBATCH,
)
def test_no_combination_of_options_writes_two_gres_lines(
    tmp_path: Path,
    syntax: str,
    gpus: int,
    nodes: int,
    site_gres: list[str],
    partition_gres: list[str],
    model_gres: list[str],
    user_gres: list[str],
    sbatch_args: list[str],
) -> None:
    """Every option that writes GRES (the GPU syntax, the site's, partition's and model's
    defaults.gres, --gres, --sbatch-arg=--gres) ends in at most one --gres line, and a GPU
    job's GPUs are always in it where the syntax asks through --gres."""
    top = f"defaults: {{gres: [{', '.join(site_gres)}]}}" if site_gres else ""
    model = f"    defaults: {{gres: [{', '.join(model_gres)}]}}" if model_gres else ""
    partition = f"    defaults: {{gres: [{', '.join(partition_gres)}]}}" if partition_gres else ""
    if syntax == "gres+constraint":
        model += "\n    constraint: v100"
    if syntax == "none":  # the partition gives whole nodes: a GPU job asks for all 4
        partition += "\n    gpus_per_node: 4"
        gpus = 4 if gpus else 0
    site = load_site(
        make(tmp_path, syntax=syntax, typed="false", top=top, model=model, partition=partition)
    )
    lines = directives(
        site,
        gpus=gpus,
        nodes=nodes,
        model="V100" if gpus else None,
        gres=tuple(user_gres),
        sbatch_args=tuple(sbatch_args),
    )
    gres_lines = [x for x in lines if x.startswith(("--gres=", "--gres "))]
    assert len(gres_lines) <= 1, lines
    if gpus and syntax.startswith("gres"):
        assert gres_lines and gres_lines[0].startswith("--gres=gpu:"), lines
    names = (
        [g.split(":")[0] for g in gres_lines[0][len("--gres=") :].split(",")] if gres_lines else []
    )
    assert len(names) == len(set(names)), gres_lines


# -- 2. no --partition; 3. default time; 4. QoS by time; 5. per-model settings ---------------


def test_partition_named_by_qos_or_not_at_all(tmp_path: Path) -> None:
    site = load_site(make(tmp_path, partition="    submit_as: qos"))
    lines = directives(site)
    assert "--qos=gpu" in lines and not any(x.startswith("--partition") for x in lines)
    assert "--qos=gpu" in directives(site, qos="gpu")
    site = load_site(make(tmp_path, partition="    submit_as: none"))
    lines = directives(site)
    assert not any(x.startswith(("--partition", "--qos")) for x in lines)


def test_the_default_time_is_written_and_the_users_wins(tmp_path: Path) -> None:
    site = load_site(make(tmp_path, top='defaults: {time: "1:00:00"}'))
    assert "--time=1:00:00" in directives(site)
    assert "--time=30" in directives(site, time="30")


def test_a_default_time_past_the_limit_is_a_config_error(tmp_path: Path) -> None:
    path = make(tmp_path, top='defaults: {time: "3-00:00:00"}')
    assert any("longer than the time_limit 2-00:00:00" in i for i in issues(path))


QOS_RULES = """\
defaults:
  qos_by_time:
    - {max_time: "2:00:00", qos: qos_gpu-dev}
    - {max_time: "20:00:00", qos: qos_gpu-t3}
    - {max_time: "100:00:00", qos: qos_gpu-t4}
"""


def test_qos_by_time(tmp_path: Path) -> None:
    site = load_site(make(tmp_path, top=QOS_RULES))
    assert "--qos=qos_gpu-dev" in directives(site, time="1:00:00")
    assert "--qos=qos_gpu-t3" in directives(site, time="10:00:00")
    assert "--qos=qos_gpu-t4" in directives(site, time="30:00:00")
    assert "--qos=special" in directives(site, time="30:00:00", qos="special")
    assert not any(x.startswith("--qos") for x in directives(site))


def test_a_qos_rule_of_null_writes_no_qos(tmp_path: Path) -> None:
    """Jean Zay: jobs up to 20 hours get the default QoS, which IDRIS's scripts do not name."""
    top = (
        "defaults:\n  qos_by_time:\n"
        '    - {max_time: "20:00:00", qos: null}\n    - {max_time: "100:00:00", qos: t4}'
    )
    site = load_site(make(tmp_path, top=top))
    assert not any(x.startswith("--qos") for x in directives(site, time="10:00:00"))
    assert "--qos=t4" in directives(site, time="30:00:00")
    only_default = 'defaults:\n  qos_by_time: [{max_time: "20:00:00", qos: null}]'
    site = load_site(make(tmp_path, top=only_default))
    with pytest.raises(UsageError) as info:
        directives(site, time="30:00:00")
    assert str(info.value) == (
        "no QoS of this site takes a job of that length: the longest, the default QoS, ends at "
        "20:00:00"
    )


def test_qos_rules_must_be_shortest_first(tmp_path: Path) -> None:
    top = (
        "defaults:\n  qos_by_time:\n"
        '    - {max_time: "20:00:00", qos: a}\n    - {max_time: "2:00:00", qos: b}'
    )
    assert any("shortest first" in i for i in issues(make(tmp_path, top=top)))


def test_model_settings_over_the_partitions(tmp_path: Path) -> None:
    model = '    defaults: {account: "{project}@v100", cpus_per_gpu: 10, mem_per_gpu: 40G}'
    site = load_site(
        make(tmp_path, model=model, partition="    defaults: {cpus_per_gpu: 4, qos: normal}")
    )
    lines = directives(site, project="abc")
    assert {"--account=abc@v100", "--cpus-per-gpu=10", "--mem-per-gpu=40G", "--qos=normal"} <= set(
        lines
    )
    assert "--account=xyz" in directives(site, account="xyz")
    assert not any(x.startswith("--account") for x in directives(site))  # the default account


# -- 7. limits ----------------------------------------------------------------------------------


def test_partition_limits_refuse_at_submit_with_what_is_possible(tmp_path: Path) -> None:
    site = load_site(make(tmp_path, partition="    max_gpus_per_job: 4\n    max_nodes: 2"))
    with pytest.raises(UsageError, match=r"at most 4 GPUs per job, this job asks for 6"):
        directives(site, gpus=2, nodes=3)
    with pytest.raises(UsageError, match=r"at most 2 nodes"):
        directives(site, gpus=1, nodes=3)
    site = load_site(make(tmp_path, partition="    gpus_per_node: 4"))
    with pytest.raises(UsageError, match=r"whole nodes of 4 GPUs: ask for --gpus 4"):
        directives(site, gpus=2, partition="gpu")


def test_limit_contradictions_are_config_errors(tmp_path: Path) -> None:
    found = issues(make(tmp_path, partition="    gpus_per_node: 8\n    max_nodes: 9"))
    assert any("8 GPUs per node, but n[1-4] have fewer" in i for i in found)
    assert any("9 nodes, but the partition has 4" in i for i in found)
    found = issues(make(tmp_path, partition="    gpus_per_node: 4\n    max_gpus_per_job: 2"))
    assert any("no job fits" in i for i in found)


# -- 10. site lines and forms --------------------------------------------------------------------


def test_site_sbatch_lines_and_the_users_replace_them(tmp_path: Path) -> None:
    site = load_site(make(tmp_path, top='defaults: {sbatch: ["--hint=nomultithread"]}'))
    assert "--hint=nomultithread" in directives(site)
    lines = directives(site, sbatch_args=("--hint=multithread",))
    assert "--hint=multithread" in lines and "--hint=nomultithread" not in lines


def test_site_lines_may_not_write_what_clusterjob_writes(tmp_path: Path) -> None:
    found = issues(make(tmp_path, top='defaults: {sbatch: ["--gres=nvme:1", "-p gpu"]}'))
    assert any("--gres is written by clusterjob: set defaults.gres" in i for i in found)
    assert any("-p is written by clusterjob" in i for i in found)


def test_cpus_per_task_and_memory_per_node_forms(tmp_path: Path) -> None:
    site = load_site(
        make(
            tmp_path,
            form=", cpus: cpus-per-task, memory: mem",
            partition="    defaults: {cpus_per_gpu: 10, mem_per_gpu: 40G}",
        )
    )
    lines = directives(site, gpus=4)
    assert {"--ntasks-per-node=4", "--cpus-per-task=10", "--mem=160G"} <= set(lines)
    assert not any(x.startswith(("--cpus-per-gpu", "--mem-per-gpu")) for x in lines)


# -- 11. preflight modes and AMD ----------------------------------------------------------------


AMD = """\
site: amd
gpu_request: {syntax: gpus-per-node}
preflight: warn
models:
  MI250X: {vendor: amd, gres_type: mi250x}
partitions:
  standard-g: {nodes: "x[1-2]", default: true}
node_map:
  - nodes: "x[1-2]"
    gpus: [{model: MI250X}, {model: MI250X}, {model: MI250X}]
"""


def test_amd_gres_conf_names_render_nodes(tmp_path: Path) -> None:
    path = tmp_path / "amd.yaml"
    path.write_text(AMD)
    site = load_site(path)
    lines = gres_conf_lines(site)
    assert "NodeName=x[1-2] Name=gpu Type=mi250x File=/dev/dri/renderD[128-130]" in lines
    assert not any("/dev/nvidia" in line for line in lines)


def test_preflight_warn_goes_on_and_off_runs_none(tmp_path: Path) -> None:
    path = tmp_path / "amd.yaml"
    path.write_text(AMD)
    site = load_site(path)
    job = resolve(site, JobRequest("t.py", gpus=1, token=TOKEN), choose_interpreter=False)
    script = render(site, job, python="/usr/bin/python3").script
    assert "preflight || echo" in script
    path.write_text(AMD.replace("preflight: warn", "preflight: off"))
    site = load_site(path)
    job = resolve(site, JobRequest("t.py", gpus=1, token=TOKEN), choose_interpreter=False)
    script = render(site, job, python="/usr/bin/python3").script
    assert "# No preflight" in script and not re.search(r"preflight( \|\||$)", script, re.M)


def test_an_nvidia_model_needs_nvml_names_an_amd_one_has_none(tmp_path: Path) -> None:
    path = tmp_path / "amd.yaml"
    path.write_text(AMD.replace("{vendor: amd, gres_type: mi250x}", "{gres_type: mi250x}"))
    assert any("models.MI250X.nvml_names: required key missing" in i for i in issues(path))
    path.write_text(AMD.replace("vendor: amd,", 'vendor: amd, nvml_names: ["x"],'))
    assert any("an AMD GPU has no NVML name" in i for i in issues(path))


# -- 12. constraints ------------------------------------------------------------------------------


def test_an_or_constraint_is_grouped_before_joining_the_users(tmp_path: Path) -> None:
    model = '    constraint: "v100-16g|v100-32g"'
    site = load_site(make(tmp_path, syntax="gres+constraint", typed="false", model=model))
    # (the #SBATCH line quotes a value with shell characters; sbatch reads the quotes away)
    assert '--constraint="(v100-16g|v100-32g)&ib"' in directives(site, constraint="ib")
    assert '--constraint="(v100-16g|v100-32g)&(ib|eth)"' in directives(site, constraint="ib|eth")
    assert "--constraint=v100-16g|v100-32g" in directives(site)


def test_a_malformed_model_constraint_is_a_config_error(tmp_path: Path) -> None:
    found = issues(make(tmp_path, model='    constraint: "(a|b"'))
    assert any("unbalanced brackets" in i for i in found)


# -- 13. --gpus over several nodes --------------------------------------------------------------


def test_one_task_per_gpu(tmp_path: Path) -> None:
    site = load_site(
        make(
            tmp_path,
            syntax="gpus-per-task",
            typed="false",
            partition="    defaults: {cpus_per_gpu: 32}",
        )
    )
    lines = directives(site, gpus=4)
    assert {"--ntasks-per-node=4", "--cpus-per-task=32", "--gpus-per-task=v100:1"} <= set(lines)


def test_gpus_total_over_nodes_is_split_per_node_or_said(tmp_path: Path) -> None:
    site = load_site(make(tmp_path, syntax="gpus"))
    assert "--gpus-per-node=v100:2" in directives(site, gpus=2, nodes=2)
    site = load_site(make(tmp_path, syntax="gpus", form=", multi_node: total"))
    job = resolve(site, JobRequest("t.py", gpus=2, nodes=2, model="V100", token=TOKEN))
    assert job.gres.options == ("--gpus=v100:4",)
    assert any("may split it unevenly" in n for n in job.notes)


# -- 14. substring warning ------------------------------------------------------------------------


def test_substring_warning_can_be_silenced_per_type(tmp_path: Path) -> None:
    model = "  A10:\n    gres_type: v10\n    nvml_names: [A10]\n"
    path = make(tmp_path, model=model)
    assert any("is a substring of" in i for i in issues(path))
    path = make(tmp_path, model=model + "    gres_type_overlap: true\n")
    assert not any("is a substring of" in i for i in issues(path))


# -- 8. no GPU option; 9. model groups ------------------------------------------------------------


def test_no_gpu_option_still_one_gres_line_for_extra_gres(tmp_path: Path) -> None:
    partition = "    gpus_per_node: 4"
    site = load_site(
        make(
            tmp_path,
            syntax="none",
            typed="false",
            partition=partition,
            top="defaults: {gres: [nvme:1]}",
        )
    )
    lines = directives(site, gpus=4, gres=("tmp:2",), sbatch_args=("--gres=nvme:5",))
    assert [x for x in lines if x.startswith("--gres")] == ["--gres=tmp:2,nvme:5"]


def test_no_gpu_option_the_partition_gives_whole_nodes(tmp_path: Path) -> None:
    path = make(tmp_path, syntax="none", typed="false")
    assert any("required when gpu_request.syntax is none" in i for i in issues(path))
    site = load_site(make(tmp_path, syntax="none", typed="false", partition="    gpus_per_node: 4"))
    lines = directives(site, gpus=4)
    assert not any(x.startswith(("--gres", "--gpus")) for x in lines)
    job = resolve(site, JobRequest("t.py", gpus=4, model="V100", token=TOKEN))
    script = render(site, job, python="/usr/bin/python3").script
    assert "export CLUSTERJOB_EXPECT_COUNT=4" in script
    with pytest.raises(UsageError, match="whole nodes of 4 GPUs"):
        directives(site, gpus=1)


GROUPS = """\
  V100-32GB:
    gres_type: v100
    nvml_names: ["Tesla V100-SXM2-32GB-x"]
    constraint: v100-32g
  A100:
    gres_type: a100
    nvml_names: ["NVIDIA A100-SXM4-80GB"]
    constraint: a100
model_groups:
  any-V100:
    aliases: [v100-any]
    models: [V100, V100-32GB]
"""


def test_a_model_group_is_an_or_of_features(tmp_path: Path) -> None:
    text = make(tmp_path, typed="false", model="    constraint: v100-16g\n" + GROUPS).read_text()
    text = text.replace('  - nodes: "n[1-4]"', '  - nodes: "n[1-2]"').replace(
        "gpus: [{model: V100}, {model: V100}, {model: V100}, {model: V100}]\n",
        "gpus: [{model: V100}, {model: V100}, {model: V100}, {model: V100}]\n"
        '  - nodes: "n3"\n    gpus: [{model: V100-32GB}]\n'
        '  - nodes: "n4"\n    gpus: [{model: A100}]\n',
    )
    path = tmp_path / "g.yaml"
    path.write_text(text)
    site = load_site(path)
    lines = directives(site, model="v100-any")
    assert "--constraint=[v100-16g|v100-32g]" in lines
    assert "--gres=gpu:v100:1" in lines


def test_a_group_only_of_the_partitions_models_needs_no_feature(tmp_path: Path) -> None:
    text = make(tmp_path, typed="false", model="    constraint: v100-16g\n" + GROUPS).read_text()
    text = text.replace(
        "gpus: [{model: V100}, {model: V100}, {model: V100}, {model: V100}]\n",
        "gpus: [{model: V100}, {model: V100}, {model: V100}, {model: V100}]\n"
        '  - nodes: "n5"\n    gpus: [{model: V100-32GB}]\n',
    ).replace('nodes: "n[1-4]"\n    default', 'nodes: "n[1-5]"\n    default')
    path = tmp_path / "g.yaml"
    path.write_text(text)
    lines = directives(load_site(path), model="any-V100")
    assert not any(x.startswith("--constraint") for x in lines)


def test_a_group_the_syntax_cannot_ask_for_is_a_config_error(tmp_path: Path) -> None:
    model = "  H100:\n    gres_type: h100\n    nvml_names: [H]\nmodel_groups:\n  any:\n"
    path = make(tmp_path, model=model + "    models: [V100, H100]")
    assert any("GRES types differ and this site requires one" in i for i in issues(path))
    path = make(tmp_path, typed="false", model=model + "    models: [V100, H100]")
    assert any("share no GRES type" in i for i in issues(path))
    path = make(tmp_path, model=model + "    models: [V100, P100]")
    assert any("unknown model 'P100'" in i for i in issues(path))


def test_the_preflight_says_it_cannot_check_amd_gpus(tmp_path: Path) -> None:
    from clusterjob.errors import PreflightFailed
    from clusterjob.node.preflight import run_preflight

    path = tmp_path / "amd.yaml"
    path.write_text(AMD)

    def never(timeout: float) -> object:
        raise AssertionError("NVML must not be read for a GPU it cannot check")

    with pytest.raises(PreflightFailed, match=r"cannot check MI250X GPUs: .* NVML \(NVIDIA\)"):
        run_preflight(path, "x1", {}, expect_model="mi250x", expect_count=1, read=never)  # type: ignore[arg-type]
