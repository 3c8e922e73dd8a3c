"""Gaps found on real clusters' site files: node features with a colon (Sherlock), partitions
holding several models that a request cannot tell apart, MIG slices written as GPUs, model
groups whose features Slurm would read otherwise, and one fault reported as several.

Each site is a real file in a temporary directory, loaded by the site loader; requests go
through ``resolve`` and the job script through ``render``, as ``clusterjob submit`` does.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from ruamel.yaml import YAML

from clusterjob.errors import ConfigError
from clusterjob.jobs.interactive import shell_session
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site import schema
from clusterjob.site.admin import GRES_CONF_HEADER, gres_conf_lines
from clusterjob.site.loader import load_site, validate_site_file
from clusterjob.site.model import Site

# Sherlock (Stanford) documents -C GPU_SKU:V100_SXM2 and -C 'GPU_MEM:32GB&IB:HDR'.
SHERLOCK = """\
site: sherlock
gpu_request: {syntax: gres, type_required: false}
models:
  V100:
    gres_type: null
    nvml_names: ["Tesla V100-SXM2-32GB"]
    constraint: "GPU_SKU:V100_SXM2"
  V100-32GB-HDR:
    gres_type: null
    nvml_names: ["Tesla V100-PCIE-32GB"]
    constraint: "GPU_MEM:32GB&IB:HDR"
partitions:
  gpu: {nodes: "sh[01-02]", default: true}
node_map:
  - nodes: sh01
    gpus: [{model: V100}, {model: V100}]
  - nodes: sh02
    gpus: [{model: V100-32GB-HDR}, {model: V100-32GB-HDR}]
"""


def write(tmp_path: Path, text: str, name: str = "site.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def errors(path: Path) -> list[str]:
    _, issues = validate_site_file(path)
    return [str(i).removeprefix(f"{path}:") for i in issues if not i.warning]


def warnings(path: Path) -> list[str]:
    """The warnings of a site that loads."""
    site, issues = validate_site_file(path)
    assert site is not None, [str(i) for i in issues]
    return [str(i).removeprefix(f"{path}:").replace(" warning:", "", 1) for i in issues]


def refused_at_submit(path: Path, model: str, gpus: int = 1) -> str:
    with pytest.raises(ConfigError) as info:
        job = JobRequest("train.py", model=model, gpus=gpus)
        resolve(load_site(path), job, choose_interpreter=False)
    (issue,) = info.value.issues
    return f"{issue.key_path}: {issue.message}"


def constraint_line(site: Site, **request: object) -> str:
    job = resolve(site, JobRequest("train.py", **request), choose_interpreter=False)  # type: ignore[arg-type]
    script = render(site, job, python="/usr/bin/python3").script
    return next(ln for ln in script.splitlines() if ln.startswith("#SBATCH --constraint="))


# -- node features with a colon -----------------------------------------------------------------


def test_a_feature_with_a_colon_is_a_node_feature(tmp_path: Path) -> None:
    site = load_site(write(tmp_path, SHERLOCK))
    assert constraint_line(site, model="V100", gpus=1) == "#SBATCH --constraint=GPU_SKU:V100_SXM2"
    hdr = constraint_line(site, model="V100-32GB-HDR", gpus=1, constraint="ib")
    assert hdr == "#SBATCH --constraint=GPU_MEM:32GB&IB:HDR&ib"
    # an interactive shell: one srun argument, and the line a person would type splits back
    shell = JobRequest("shell", command=True, model="V100-32GB-HDR", gpus=1)
    job = resolve(site, shell, choose_interpreter=False)
    session = shell_session(site, job, ("true",), node_command=["clusterjob"])
    assert "--constraint=GPU_MEM:32GB&IB:HDR" in session.options
    assert "--constraint=GPU_MEM:32GB&IB:HDR" in shlex.split(session.command_line())


def test_the_json_schema_takes_the_same_features_as_the_loader(tmp_path: Path) -> None:
    validator = jsonschema.Draft7Validator(schema.json_schema())
    data = YAML(typ="safe", pure=True).load(SHERLOCK)
    assert list(validator.iter_errors(data)) == []
    data["models"]["V100"]["constraint"] = "GPU_SKU V100"
    assert list(validator.iter_errors(data))
    path = write(tmp_path, SHERLOCK.replace('"GPU_SKU:V100_SXM2"', '"GPU_SKU V100"'))
    assert errors(path) == [
        "7: models.V100.constraint: not a node feature expression: 'GPU_SKU V100' (features "
        "joined with & or |, grouped with ( ) or [ ])"
    ]


# -- a partition of several models --------------------------------------------------------------

MIXED = """\
site: t
gpu_request: {syntax: SYNTAX, type_required: false}
models:
  A100: {gres_type: A100_TYPE, nvml_names: ["NVIDIA A100-SXM4-80GB"]A100_MORE}
  V100: {gres_type: V100_TYPE, nvml_names: ["Tesla V100-SXM2-32GB"]V100_MORE}
partitions:
  gpu: {nodes: "n[1-3]", default: true}
  v100: {nodes: "n2"}
node_map:
  - nodes: n1
    gpus: [{model: A100}, {model: A100}]
  - nodes: n2
    gpus: [{model: V100}, {model: V100}]
  - nodes: n3
    gpus: N3
"""


def mixed(
    syntax: str = "gres",
    a100: str = "a100",
    v100: str = "null",
    a100_more: str = "",
    v100_more: str = "",
    n3: str = "[]",
) -> str:
    return (
        MIXED.replace("SYNTAX", syntax)
        .replace("A100_TYPE", a100)
        .replace("V100_TYPE", v100)
        .replace("A100_MORE", a100_more)
        .replace("V100_MORE", v100_more)
        .replace("N3", n3)
    )


EITHER = "a gres_type of its own, or a constraint (node feature)"
UNTYPED_V100 = (
    "models.V100: partition gpu also holds A100 GPUs, and a request for V100 ({option}) "
    "can get them: it names no GRES type and no node feature; give V100 {fix}"
)
UNTIL_THEN = " (until then a request for V100 there is refused)"


@pytest.mark.parametrize(
    ("syntax", "option", "fix"),
    [
        ("gres", "--gres=gpu:1", EITHER),
        ("gpus", "--gpus=1", EITHER),
        ("gpus-per-node", "--gpus-per-node=1", EITHER),
        ("gpus-per-task", "--gpus-per-task=1", EITHER),
        ("none", "no GPU option", "a constraint (node feature)"),
    ],
)  # fmt: skip
def test_a_model_no_request_can_pin_is_refused(
    tmp_path: Path, syntax: str, option: str, fix: str
) -> None:
    """Every syntax: an untyped model without a feature on a partition of two models. The
    site file is warned about, with the fix; the request is refused, on that partition only."""
    text = mixed(syntax)
    if syntax == "none":  # whole nodes: each partition says how many GPUs a node gives
        text = text.replace(
            '"n[1-3]", default: true}', '"n[1-2]", default: true, gpus_per_node: 2}'
        )
        text = text.replace('{nodes: "n2"}', '{nodes: "n2", gpus_per_node: 2}')
        text = text.replace("gres_type: a100, ", "constraint: a100, ")
    path = write(tmp_path, text)
    said = UNTYPED_V100.format(option=option, fix=fix)
    assert warnings(path) == [f"5: {said}{UNTIL_THEN}"]
    gpus = 2 if syntax == "none" else 1
    assert refused_at_submit(path, "V100", gpus) == said
    there = JobRequest("t.py", model="V100", gpus=gpus, partition="v100")
    assert resolve(load_site(path), there, choose_interpreter=False).partition.name == "v100"


@pytest.mark.parametrize(
    ("label", "text"),
    [
        ("a type of its own", mixed(v100="v100")),
        ("a node feature, no node holds both", mixed(v100_more=", constraint: v100")),
        ("both", mixed(v100="v100", v100_more=", constraint: v100")),
        ("one type, told apart by features", mixed(v100="a100", a100_more=", constraint: fa",
                                                   v100_more=", constraint: fv")),
        ("a mixed node, typed", mixed(v100="v100", n3="[{model: A100}, {model: V100}]")),
    ],
)  # fmt: skip
def test_a_model_pinned_by_type_or_feature_is_taken(tmp_path: Path, label: str, text: str) -> None:
    path = write(tmp_path, text)
    assert warnings(path) == [], label
    site = load_site(path)
    for model in ("A100", "V100"):
        assert resolve(site, JobRequest("t.py", model=model, gpus=1), choose_interpreter=False)


def test_a_feature_cannot_tell_gpus_apart_on_a_node_that_holds_both(tmp_path: Path) -> None:
    text = mixed(v100_more=", constraint: v100", n3="[{model: A100}, {model: V100}]")
    path = write(tmp_path, text)
    said = (
        "models.V100: partition gpu also holds A100 GPUs, and a request for V100 "
        "(--gres=gpu:1 --constraint=v100) can get them: its node feature cannot tell GPUs "
        "apart on a node that holds both; give V100 a gres_type of its own"
    )
    assert warnings(path) == [f"5: {said}{UNTIL_THEN}"]
    assert refused_at_submit(path, "V100") == said


def test_two_models_of_one_type_without_features_are_refused(tmp_path: Path) -> None:
    """Refused wherever they are: ``--model V100`` would write ``--gres=gpu:a100:1``."""
    text = mixed(v100="a100").replace('"n[1-3]"', '"n1"')  # not even on one partition
    assert errors(write(tmp_path, text)) == [
        "5: models.V100.gres_type: GRES type 'a100' is also the type of model A100: Slurm "
        "cannot tell these models apart; give each its own gres_type, or each its own "
        "constraint (node feature)"
    ]


def test_a_request_slurm_could_fill_with_other_gpus_is_refused_at_submit(tmp_path: Path) -> None:
    """A site built without the loader (the loader refuses it): resolve refuses the request,
    and takes it where the partition holds the model alone."""
    site = load_site(write(tmp_path, mixed(v100_more=", constraint: v100")))
    v100 = site.model_by_name("V100")
    unpinned = replace(site, models=(site.model_by_name("A100"), replace(v100, constraint=None)))
    with pytest.raises(ConfigError) as info:
        resolve(unpinned, JobRequest("train.py", model="V100", gpus=1), choose_interpreter=False)
    (issue,) = info.value.issues
    assert issue.key_path == "models.V100"
    assert issue.message.startswith("partition gpu also holds A100 GPUs, and a request for V100")
    job = resolve(
        unpinned,
        JobRequest("train.py", model="V100", gpus=1, partition="v100"),
        choose_interpreter=False,
    )
    assert job.gres.options == ("--gres=gpu:1",)


GROUPED = """\
site: t
gpu_request: {syntax: gres, type_required: false}
models:
  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"], constraint: A100_FEATURE}
  V100: {gres_type: v100, nvml_names: ["Tesla V100-SXM2-32GB"], constraint: v100}
  H100: {gres_type: h100, nvml_names: ["NVIDIA H100 80GB HBM3"], constraint: h100}
model_groups:
  older: {models: [A100, V100]}
partitions:
  gpu: {nodes: "n[1-3]", default: true}
node_map:
  - nodes: n1
    gpus: [{model: A100}, {model: H100}]
  - nodes: n2
    gpus: [{model: V100}]
  - nodes: n3
    gpus: [{model: H100}]
"""


def test_a_group_slurm_could_fill_with_other_gpus_is_warned_and_refused(tmp_path: Path) -> None:
    """Each model has a type of its own; the group has none, and its features cannot keep it
    off n1's H100s: warned at the group's name, refused at submit; its models are asked for."""
    path = write(tmp_path, GROUPED.replace("A100_FEATURE", "a100"))
    said = (
        "model_groups.older: partition gpu also holds H100 GPUs, and a request for older "
        "(--gres=gpu:1 --constraint=[a100|v100]) can get them: its node feature cannot tell "
        "GPUs apart on a node that holds both; give its models a gres_type they share and no "
        "other model has"
    )
    assert warnings(path) == [f"8: {said} (until then a request for older there is refused)"]
    assert refused_at_submit(path, "older") == said
    site = load_site(path)
    for model in ("A100", "V100", "H100"):
        assert resolve(site, JobRequest("t.py", model=model, gpus=1), choose_interpreter=False)


# -- model groups: the matching OR Slurm reads as meant -----------------------------------------


def test_a_group_of_feature_expressions_is_a_matching_or_of_parenthesised_terms(
    tmp_path: Path,
) -> None:
    """``[gpu&hbm40g|v100]`` is refused by Slurm (an & without a count inside brackets) and
    ``gpu&hbm40g|v100`` is read left to right; each option goes in parentheses."""
    text = GROUPED.replace("A100_FEATURE", '"gpu&hbm40g"').replace(
        "[{model: A100}, {model: H100}]", "[{model: A100}]"
    )
    site = load_site(write(tmp_path, text))
    assert (
        constraint_line(site, model="older", gpus=1) == '#SBATCH --constraint="[(gpu&hbm40g)|v100]"'
    )
    text = text.replace('"gpu&hbm40g"', '"gpu|a100x"')
    site = load_site(write(tmp_path, text))
    assert (
        constraint_line(site, model="older", gpus=1) == '#SBATCH --constraint="[(gpu|a100x)|v100]"'
    )


def test_a_member_feature_that_cannot_nest_refuses_the_group(tmp_path: Path) -> None:
    for feature in ('"gpu&(hbm40g|hbm80g)"', '"[a100|a100x]"'):
        text = GROUPED.replace("A100_FEATURE", feature)
        assert errors(write(tmp_path, text)) == [
            f"8: model_groups.older.models: model A100's constraint {feature.strip(chr(34))!r} "
            "cannot be one option of the group's [A|B]: Slurm takes one set of brackets and no "
            "nested parentheses"
        ]


# -- MIG slices are not GPUs --------------------------------------------------------------------


def test_a_slice_model_as_a_slot_is_refused_and_no_device_file_is_invented(
    tmp_path: Path,
) -> None:
    text = """\
site: t
gpu_request: {syntax: gres, type_required: true}
models:
  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"], memory_gb: 80}
  A100-1g: {gres_type: 1g.10gb, nvml_names: ["NVIDIA A100-SXM4-80GB MIG 1g.10gb"]}
partitions:
  gpu: {nodes: n1}
node_map:
  - nodes: n1
    gpus: [{model: A100-1g}, {model: A100-1g}, {model: A100-1g}, {model: A100-1g}]
"""
    assert errors(write(tmp_path, text)) == [
        f"10: node_map[0].gpus[{i}].model: A100-1g is a MIG slice (NVIDIA A100-SXM4-80GB MIG "
        "1g.10gb), not a GPU: list the GPU it is cut from, its slices in mig: (e.g. {model: "
        "A100, mig: [1g.10gb, ...]})"
        for i in range(4)
    ]
    fixed = text.replace(
        "[{model: A100-1g}, {model: A100-1g}, {model: A100-1g}, {model: A100-1g}]",
        "[{model: A100, mig: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}]",
    )
    lines = gres_conf_lines(load_site(write(tmp_path, fixed)))
    assert not any("/dev/nvidia[" in line or "/dev/nvidia1" in line for line in lines), lines


def test_a_slice_named_as_a_slot_model_says_where_slices_go(tmp_path: Path) -> None:
    text = """\
site: t
gpu_request: {syntax: gres, type_required: true}
models:
  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"], memory_gb: 80}
node_map:
  - nodes: n1
    gpus: [{model: 1g.10gb}, {model: "A100 MIG 1g.10gb"}, {model: H100}]
"""
    hint = " (a MIG slice: list its GPU's model, and the slice in that slot's mig:)"
    assert errors(write(tmp_path, text)) == [
        f"7: node_map[0].gpus[0].model: unknown model '1g.10gb'{hint}; defined models: A100",
        f"7: node_map[0].gpus[1].model: unknown model 'A100 MIG 1g.10gb'{hint}; defined "
        "models: A100",
        "7: node_map[0].gpus[2].model: unknown model 'H100'; defined models: A100",
    ]


def _keys_in_comment(line: str) -> list[str]:
    """Site keys a generated comment names, as it names them: ``(key: ...)``."""
    return re.findall(r"\(([a-z][a-z_]*):", line)


def test_every_key_a_generated_gres_conf_comment_names_is_a_site_key(tmp_path: Path) -> None:
    text = """\
site: t
gpu_request: {syntax: gres, type_required: true}
models:
  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"], memory_gb: 80}
  MI250X: {vendor: amd, gres_type: mi250x}
node_map:
  - nodes: n1
    gpus: [{model: A100, mig: [3g.40gb, 1g.10gb]}, {model: A100}]
  - nodes: n2
    gpus: [{model: MI250X}]
"""
    site = load_site(write(tmp_path, text))
    comments = [ln for ln in (*GRES_CONF_HEADER, *gres_conf_lines(site)) if ln.startswith("#")]
    named = [k for line in comments for k in _keys_in_comment(line)]
    assert "mig" in named  # the comment of n1's slices without GPU instance ids
    keys = {k for section in schema.SECTIONS for k in section.key_table()}
    assert [k for k in named if k not in keys] == []


# -- one fault, one error -----------------------------------------------------------------------

WHOLE = """\
site: t
gpu_request: {syntax: gres, type_required: false}
models:
  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"], memory_gb: 80, constraint: a100}
  V100: {gres_type: v100, nvml_names: ["Tesla V100-SXM2-32GB"], memory_gb: 32, constraint: v100}
model_groups:
  any: {models: [A100, V100]}
partitions:
  gpu: {nodes: "n[1-2]", default: true, gpus_per_node: 2}
node_map:
  - nodes: n1
    gpus:
      - {model: A100, bus_id: "0000:07:00.0", nvlinks: 12}
      - {model: A100, bus_id: "0000:0b:00.0", mig: [3g.40gb, 3g.40gb]}
  - nodes: n2
    gpus: [{model: V100, uuid: GPU-0a1b}, {model: V100}]
"""


@pytest.mark.parametrize(
    ("fault", "old", "new"),
    [
        ("a refused constraint", "constraint: a100}", 'constraint: "GPU_SKU:A100$"}'),
        ("a refused memory size", "memory_gb: 80", "memory_gb: -80"),
        ("a refused GRES type", "gres_type: a100", 'gres_type: "a100:2"'),
        ("no NVML names", 'nvml_names: ["NVIDIA A100-SXM4-80GB"], ', ""),
        ("an unknown vendor", "{gres_type: a100,", "{vendor: intel, gres_type: a100,"),
        ("a bad bus ID", '"0000:07:00.0"', '"0000:zz:00.0"'),
        ("bus IDs out of order", '"0000:07:00.0"', '"0000:0c:00.0"'),
        ("a bad UUID", "GPU-0a1b", "0a1b"),
        ("too many NVLinks", "nvlinks: 12", "nvlinks: 99"),
        ("a bad MIG profile", "[3g.40gb, 3g.40gb]", "[3g, 3g.40gb]"),
        ("an unknown slot model", "{model: V100, uuid", "{model: P100, uuid"),
        ("a slice as a GPU", "{model: V100}]", "{model: V100-1g}]\n"),
        ("a node missing from the map", '"n[1-2]", default', '"n[1-3]", default'),
        ("a group of one", "[A100, V100]", "[A100]"),
    ],
)
def test_one_fault_is_one_error(tmp_path: Path, fault: str, old: str, new: str) -> None:
    """A model, a slot or a node that is refused is not refused again by what refers to it
    (the node map, a model group, a partition's GPUs per node)."""
    text = WHOLE
    if fault == "a slice as a GPU":
        text = text.replace(
            "model_groups:",
            '  V100-1g: {gres_type: 1g.5gb, nvml_names: ["Tesla V100-SXM2-32GB MIG 1g.5gb"]}\n'
            "model_groups:",
        )
    assert errors(write(tmp_path, WHOLE)) == []
    assert old in text, fault
    found = errors(write(tmp_path, text.replace(old, new, 1)))
    assert len(found) == 1, (fault, found)
