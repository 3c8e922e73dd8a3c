"""Site loading, exact: each section's refusals as `line: key.path: message`, and the values
of what is accepted.

One valid site (tests/bad_inputs/sites/ok.yaml's) is broken in one place per case, by adding
a section or by editing a line, and loaded in this process (the command-line corpus of
test_bad_input.py runs in a subprocess; its site files are loaded here once more, so that the
loader's own messages are held by in-process tests too).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_bad_input import SITE_CASES, SITES

from clusterjob.errors import ConfigIssue
from clusterjob.site.loader import MAX_BYTES, load_site, validate_site_file
from clusterjob.site.model import JobEnvironment, RequestForm
from clusterjob.site.nodemodel import CheckPolicy, OnError, PrologPolicy

BASE = (SITES / "ok.yaml").read_text()


def issues_of(tmp_path: Path, text: str) -> list[str]:
    """The issues of a site file with ``text``, as ``line: key.path: message``; none when it
    loads (then the site is returned through ``loaded``)."""
    path = tmp_path / "site.yaml"
    path.write_text(text)
    site, issues = validate_site_file(path)
    said = [str(i).removeprefix(f"{path}:") for i in issues]
    assert (site is None) == any(not i.warning for i in issues), said
    return said


def loaded(tmp_path: Path, text: str):
    path = tmp_path / "site.yaml"
    path.write_text(text)
    site, issues = validate_site_file(path)
    assert site is not None, [str(i) for i in issues]
    assert issues == []
    return site


ADDED = [
    pytest.param(
        "job: {python: bin/python}\n",
        ["10: job.python: not an absolute path: 'bin/python'"],
        id="job_relative_python",
    ),
    pytest.param(
        "job: {venv: venv}\n",
        ["10: job.venv: not an absolute path: 'venv'"],
        id="job_relative_venv",
    ),
    pytest.param(
        "job: {python: /usr/bin/python3, conda: torch}\n",
        ["10: job.conda: give one of python, venv, conda (this entry also has python)"],
        id="job_two",
    ),
    pytest.param(
        "job: {venv: /v, python: /p, conda: c}\n",
        ["10: job.venv: give one of python, venv, conda (this entry also has python)"],
        id="job_three",
    ),
    pytest.param(
        "job: {python: 3}\n",
        ['10: job.python: expected a string, got 3 (write "3" for text)'],
        id="job_python_int",
    ),
    pytest.param(
        "job: {setup: 3}\n",
        ["10: job.setup: expected a list of strings, got 3"],
        id="job_setup_not_list",
    ),
    pytest.param(
        'job:\n  setup: ["a\\nb", ok, "c\\rd"]\n',
        ["11: job.setup[0]: one shell line per item", "11: job.setup[2]: one shell line per item"],
        id="job_setup_newline",
    ),
    pytest.param(
        "job:\n  setup: [ok, 3]\n",
        ['11: job.setup[1]: expected a string, got 3 (write "3" for text)'],
        id="job_setup_item_int",
    ),
    pytest.param(
        "job: [1]\n",
        ["10: job: expected a mapping, got a list"],
        id="job_not_mapping",
    ),
    pytest.param(
        "job:\n",
        ["10: job: expected a mapping, got nothing (null)"],
        id="job_null",
    ),
    pytest.param(
        "prolog: {on_error: ignore}\n",
        ["10: prolog.on_error: expected one of drain, pass, got 'ignore'"],
        id="prolog_on_error",
    ),
    pytest.param(
        "prolog: {deadline_seconds: 0}\n",
        ["10: prolog.deadline_seconds: expected a positive number, got 0"],
        id="prolog_deadline_zero",
    ),
    pytest.param(
        "prolog: {deadline_seconds: -1}\n",
        ["10: prolog.deadline_seconds: expected a positive number, got -1"],
        id="prolog_deadline_neg",
    ),
    pytest.param(
        "prolog: {deadline_seconds: soon}\n",
        ["10: prolog.deadline_seconds: expected a number, got 'soon'"],
        id="prolog_deadline_str",
    ),
    pytest.param(
        "prolog: {deadline_seconds: true}\n",
        ["10: prolog.deadline_seconds: expected a number, got true"],
        id="prolog_deadline_true",
    ),
    pytest.param(
        'prolog: {log: ""}\n',
        ["10: prolog.log: expected a non-empty string"],
        id="prolog_log_empty",
    ),
    pytest.param(
        "prolog: 3\n",
        ["10: prolog: expected a mapping, got 3"],
        id="prolog_not_mapping",
    ),
    pytest.param(
        "checks: {driver_min: 535}\n",
        ['10: checks.driver_min: expected a string, got 535 (write "535" for text)'],
        id="checks_driver_int",
    ),
    pytest.param(
        'checks: {driver_min: "535.x"}\n',
        ["10: checks.driver_min: not an NVIDIA driver version: '535.x' (e.g. \"535.104.05\")"],
        id="checks_driver_bad",
    ),
    pytest.param(
        'checks: {driver_min: "535.1.2.3"}\n',
        ["10: checks.driver_min: not an NVIDIA driver version: '535.1.2.3' (e.g. \"535.104.05\")"],
        id="checks_driver_4",
    ),
    pytest.param(
        'checks: {cuda_min: "12.45"}\n',
        ["10: checks.cuda_min: not a CUDA version: '12.45' (e.g. \"12.4\", quoted)"],
        id="checks_cuda_bad",
    ),
    pytest.param(
        "checks: {severity: {gpu-busy: loud}}\n",
        ["10: checks.severity.gpu-busy: expected one of error, warning, off, got 'loud'"],
        id="checks_sev_bad",
    ),
    pytest.param(
        "checks: {severity: [gpu-busy]}\n",
        ["10: checks.severity: expected a mapping of check id to severity, got a list"],
        id="checks_sev_not_map",
    ),
    pytest.param(
        "checks: {severity: {gpu-busy: }}\n",
        ['10: checks.severity.gpu-busy: expected a string, got nothing (null) (write "" for text)'],
        id="checks_sev_null",
    ),
    pytest.param(
        "checks: 1\n",
        ["10: checks: expected a mapping, got 1"],
        id="checks_not_map",
    ),
    pytest.param(
        'node_command: "  "\n',
        ["10: node_command: expected a non-empty string"],
        id="node_command_empty",
    ),
    pytest.param(
        "node_command: 3\n",
        ['10: node_command: expected a string, got 3 (write "3" for text)'],
        id="node_command_int",
    ),
    pytest.param(
        "defaults: {cpus_per_gpu: 0}\n",
        ["10: defaults.cpus_per_gpu: expected an integer >= 1, got 0"],
        id="defaults_cpus_zero",
    ),
    pytest.param(
        "defaults: {cpus_per_gpu: many}\n",
        ["10: defaults.cpus_per_gpu: expected an integer, got 'many'"],
        id="defaults_cpus_str",
    ),
    pytest.param(
        "defaults: {mem_per_gpu: 64GB}\n",
        ["10: defaults.mem_per_gpu: not a Slurm memory size: '64GB' (e.g. 64G, 500M, 1T)"],
        id="defaults_mem_bad",
    ),
    pytest.param(
        "defaults: {time: soon}\n",
        ["10: defaults.time: not a Slurm time: 'soon' (e.g. 1:00:00, 2-00:00:00, 30)"],
        id="defaults_time_bad",
    ),
    pytest.param(
        "defaults: {account: 7}\n",
        ['10: defaults.account: expected a string, got 7 (write "7" for text)'],
        id="defaults_account_int",
    ),
    pytest.param(
        "defaults: 3\n",
        ["10: defaults: expected a mapping, got 3"],
        id="defaults_not_map",
    ),
    pytest.param(
        "templates: /nonexistent/templates\n",
        ["10: templates: not a directory: /nonexistent/templates"],
        id="templates_missing",
    ),
]

EDITED = [
    pytest.param(
        ("site: t\n", 'site: ""\n'),
        ["1: site: expected a non-empty string"],
        id="site_empty",
    ),
    pytest.param(
        ("site: t\n", 'site: ""\n'),
        ["1: site: expected a non-empty string"],
        id="site_empty",
    ),
    pytest.param(
        (
            'models:\n  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}\n',
            "models: {}\n",
        ),
        [
            "3: models: at least one GPU model is required",
            "8: node_map[0].gpus[0].model: unknown model 'A100'; defined models: none",
        ],
        id="no_models",
    ),
    pytest.param(
        ('nvml_names: ["NVIDIA A100-SXM4-80GB"]', "nvml_names: []"),
        ["4: models.A100.nvml_names: empty list"],
        id="model_no_nvml",
    ),
    pytest.param(
        (
            'nvml_names: ["NVIDIA A100-SXM4-80GB"]}',
            'nvml_names: ["NVIDIA A100-SXM4-80GB"], memory_gb: 0}',
        ),
        ["4: models.A100.memory_gb: expected an integer >= 1, got 0"],
        id="model_memory_zero",
    ),
    pytest.param(
        ('A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}', "A100: 3"),
        ["4: models.A100: expected a mapping, got 3"],
        id="model_not_map",
    ),
    pytest.param(
        (
            'nvml_names: ["NVIDIA A100-SXM4-80GB"]}',
            'nvml_names: ["NVIDIA A100-SXM4-80GB"], constraint: ""}',
        ),
        ["4: models.A100.constraint: expected a non-empty string"],
        id="model_constraint_empty",
    ),
    pytest.param(
        (
            '  gpu: {nodes: "n[1-2]", default: true}\n',
            '  gpu: {nodes: "n[1-2]", default: true}\n  g2: {nodes: "n1", default: true}\n',
        ),
        [
            "7: partitions.g2.default: partition gpu is already the default (line 6); at most "
            "one partition can be"
        ],
        id="partition_two_default",
    ),
    pytest.param(
        ('  gpu: {nodes: "n[1-2]", default: true}\n', "  gpu: {default: true}\n"),
        ["6: partitions.gpu.nodes: required key missing"],
        id="partition_no_nodes",
    ),
    pytest.param(
        (
            '  gpu: {nodes: "n[1-2]", default: true}\n',
            '  gpu: {nodes: "n[1-2]", default: true, time_limit: forever}\n',
        ),
        [
            "6: partitions.gpu.time_limit: not a Slurm time limit: 'forever' (e.g. 2-00:00:00, "
            "12:00:00, 30)"
        ],
        id="partition_time_bad",
    ),
    pytest.param(
        ('  gpu: {nodes: "n[1-2]", default: true}\n', '  gpu: {nodes: "n[1-2]", default: yes}\n'),
        ["6: partitions.gpu.default: expected true or false, got 'yes'"],
        id="partition_default_str",
    ),
    pytest.param(
        ('  gpu: {nodes: "n[1-2]", default: true}\n', "  gpu: 3\n"),
        ["6: partitions.gpu: expected a mapping, got 3"],
        id="partition_not_map",
    ),
    pytest.param(
        (
            '  gpu: {nodes: "n[1-2]", default: true}\n',
            '  gpu: {nodes: "n[1-2]", default: true, job: {venv: rel}}\n',
        ),
        ["6: partitions.gpu.job.venv: not an absolute path: 'rel'"],
        id="partition_job",
    ),
    pytest.param(
        (
            'node_map:\n  - nodes: "n[1-2]"\n    gpus: [{model: A100, bus_id: "0000:07:00.0"}]\n',
            "node_map: {}\n",
        ),
        [
            "6: partitions.gpu.nodes: not in node_map: n[1-2]",
            "7: node_map: expected a list of {nodes, gpus} entries, got a mapping",
        ],
        id="node_map_not_list",
    ),
    pytest.param(
        ('{model: A100, bus_id: "0000:07:00.0"}', '{bus_id: "0000:07:00.0"}'),
        ["9: node_map[0].gpus[0].model: required key missing"],
        id="node_map_gpu_no_model",
    ),
    pytest.param(
        ('{model: A100, bus_id: "0000:07:00.0"}', "A100"),
        ["9: node_map[0].gpus[0]: expected a mapping such as {model: A100}, got 'A100'"],
        id="node_map_gpu_scalar",
    ),
    pytest.param(
        (
            '{model: A100, bus_id: "0000:07:00.0"}',
            '{model: A100, bus_id: "0000:07:00.0", uuid: "GPU-zz"}',
        ),
        [
            "9: node_map[0].gpus[0].uuid: not an NVML UUID: 'GPU-zz' (expected "
            "GPU-xxxxxxxx-xxxx-...)"
        ],
        id="node_map_uuid_bad",
    ),
    pytest.param(
        (
            '{model: A100, bus_id: "0000:07:00.0"}',
            '{model: A100, bus_id: "0000:07:00.0", uuid: "GPU-0123abcd"}',
        ),
        [
            "9: node_map[0].gpus[0].uuid: a UUID names one GPU, but this entry covers 2 nodes "
            "(n[1-2])"
        ],
        id="node_map_uuid_many",
    ),
    pytest.param(
        (
            '{model: A100, bus_id: "0000:07:00.0"}',
            '{model: A100, bus_id: "0000:3B:00.0"}, {model: A100, bus_id: "3b:00.0"}',
        ),
        [
            "9: node_map[0].gpus[1].bus_id: bus ID 0000:3b:00.0 is already used by slot 0 of "
            "this node"
        ],
        id="node_map_bus_upper",
    ),
    pytest.param(
        (
            '{model: A100, bus_id: "0000:07:00.0"}',
            '{model: A100, bus_id: "0000:0b:00.0"}, {model: A100, bus_id: "0000:07:00.0"}',
        ),
        [
            "9: node_map[0].gpus[1].bus_id: GPUs must be listed in PCI bus order: 0000:07:00.0 "
            "comes before 0000:0b:00.0 (slot 0)"
        ],
        id="node_map_bus_order",
    ),
    pytest.param(
        ('  - nodes: "n[1-2]"\n', '  - nodes: ""\n'),
        [
            "6: partitions.gpu.nodes: not in node_map: n[1-2]",
            "8: node_map[0].nodes: expected a non-empty string",
        ],
        id="node_map_nodes_empty",
    ),
    pytest.param(
        ('  - nodes: "n[1-2]"\n    gpus: [{model: A100, bus_id: "0000:07:00.0"}]\n', "  - 3\n"),
        [
            "6: partitions.gpu.nodes: not in node_map: n[1-2]",
            "8: node_map[0]: expected a mapping, got 3",
        ],
        id="node_map_item_scalar",
    ),
    pytest.param(
        ("gpu_request: {syntax: gres, type_required: true}\n", ""),
        ["1: gpu_request: required key missing"],
        id="gpu_request_missing",
    ),
    pytest.param(
        ("gpu_request: {syntax: gres, type_required: true}\n", "gpu_request: gres\n"),
        ["2: gpu_request: expected a mapping, got 'gres'"],
        id="gpu_request_not_map",
    ),
    pytest.param(
        (
            "gpu_request: {syntax: gres, type_required: true}\n",
            "gpu_request: {type_required: true}\n",
        ),
        ["2: gpu_request.syntax: required key missing"],
        id="syntax_missing",
    ),
]


@pytest.mark.parametrize(("added", "expected"), ADDED)
def test_an_added_section_is_refused_exactly(
    tmp_path: Path, added: str, expected: list[str]
) -> None:
    assert issues_of(tmp_path, BASE + added) == expected


@pytest.mark.parametrize(("edit", "expected"), EDITED)
def test_an_edited_line_is_refused_exactly(
    tmp_path: Path, edit: tuple[str, str], expected: list[str]
) -> None:
    old, new = edit
    assert BASE.count(old) == 1
    assert issues_of(tmp_path, BASE.replace(old, new)) == expected


def test_the_base_site_and_its_defaults(tmp_path: Path) -> None:
    site = loaded(tmp_path, BASE)
    assert site.name == "t"
    assert site.job == JobEnvironment()
    assert site.prolog == PrologPolicy()
    assert site.checks == CheckPolicy()
    assert site.node_command is None
    assert [p.name for p in site.partitions] == ["gpu"]
    assert site.partitions[0].node_names == ("n1", "n2")
    assert site.partitions[0].default is True
    assert site.partitions[0].time_limit is None


@pytest.mark.parametrize(
    ("added", "job"),
    [
        (
            'job: {python: /usr/bin/python3, setup: ["module load cuda", "x=1"]}\n',
            JobEnvironment(python="/usr/bin/python3", setup=("module load cuda", "x=1")),
        ),
        ("job: {venv: /opt/venv}\n", JobEnvironment(venv="/opt/venv")),
        ("job: {conda: torch}\n", JobEnvironment(conda="torch")),
        ("job: {conda: envs/torch}\n", JobEnvironment(conda="envs/torch")),
    ],
)
def test_the_job_section(tmp_path: Path, added: str, job: JobEnvironment) -> None:
    assert loaded(tmp_path, BASE + added).job == job


@pytest.mark.parametrize(
    ("added", "prolog"),
    [
        (
            "prolog: {on_error: pass, deadline_seconds: 7.5, log: /var/log/p.jsonl}\n",
            PrologPolicy(OnError.PASS, 7.5, "/var/log/p.jsonl"),
        ),
        ("prolog: {deadline_seconds: 30}\n", PrologPolicy(OnError.DRAIN, 30.0)),
        ("prolog: {on_error: drain}\n", PrologPolicy(OnError.DRAIN)),
        ("prolog: {log: p.jsonl}\n", PrologPolicy(log_path="p.jsonl")),
    ],
)
def test_the_prolog_section(tmp_path: Path, added: str, prolog: PrologPolicy) -> None:
    got = loaded(tmp_path, BASE + added).prolog
    assert got == prolog
    assert type(got.deadline_seconds) is float


def test_the_checks_section(tmp_path: Path) -> None:
    site = loaded(
        tmp_path,
        BASE + 'checks: {driver_min: "535.104.05", cuda_min: "12.4", '
        "severity: {gpu-busy: off, gpu-hot: warning}}\n",
    )
    assert site.checks.driver_min == "535.104.05"
    assert site.checks.cuda_min == "12.4"
    assert dict(site.checks.severity) == {"gpu-busy": "off", "gpu-hot": "warning"}


@pytest.mark.parametrize("driver", ["535", "535.104", "535.104.05"])
def test_driver_versions_of_one_to_three_parts(tmp_path: Path, driver: str) -> None:
    site = loaded(tmp_path, BASE + f'checks: {{driver_min: "{driver}"}}\n')
    assert site.checks.driver_min == driver


@pytest.mark.parametrize(
    "command", ["/opt/cj/bin/clusterjob --x 'a b'", "bin/clusterjob", "clusterjob"]
)
def test_the_node_command(tmp_path: Path, command: str) -> None:
    site = loaded(tmp_path, BASE + f'node_command: "{command}"\n')
    assert site.node_command == command


def test_the_site_defaults(tmp_path: Path) -> None:
    site = loaded(
        tmp_path,
        BASE + "defaults: {account: ml, qos: normal, cpus_per_gpu: 8, mem_per_gpu: 64G, "
        'time: "1:00:00"}\n',
    )
    d = site.defaults
    assert (d.account, d.qos, d.cpus_per_gpu, d.mem_per_gpu, d.time) == (
        "ml",
        "normal",
        8,
        "64G",
        "1:00:00",
    )


def test_a_partitions_time_limit(tmp_path: Path) -> None:
    text = BASE.replace("default: true}", 'default: true, time_limit: "2-00:00:00"}')
    assert loaded(tmp_path, text).partitions[0].time_limit == "2-00:00:00"


@pytest.mark.parametrize(
    ("gpus", "bus_ids"),
    [
        ('{model: A100, bus_id: "07:00.0"}, {model: A100, bus_id: "0000:0A:00.0"}',
         ("0000:07:00.0", "0000:0a:00.0")),
        ('{model: A100, bus_id: " 0000:0b:00.1 "}', ("0000:0b:00.1",)),
        ('{model: A100, bus_id: "0000:0b:00.0"}, {model: A100}', ("0000:0b:00.0", None)),
        ("{model: A100}, {model: A100}", (None, None)),
    ],
)  # fmt: skip
def test_bus_ids_are_normalised(tmp_path: Path, gpus: str, bus_ids: tuple) -> None:
    text = BASE.replace('{model: A100, bus_id: "0000:07:00.0"}', gpus)
    site = loaded(tmp_path, text)
    slots = site.node_map.gpus("n1")
    assert slots is not None
    assert tuple(s.bus_id for s in slots) == bus_ids
    assert tuple(s.slot for s in slots) == tuple(range(len(bus_ids)))
    assert site.node_map.gpus("n2") == slots


@pytest.mark.parametrize("name", sorted(SITE_CASES))
def test_the_command_line_corpus_in_process(name: str) -> None:
    """test_bad_input.py's site files, loaded here: the same line and message."""
    line, message = SITE_CASES[name]
    path = SITES / f"{name}.yaml"
    site, issues = validate_site_file(path)
    assert site is None
    errors = [i for i in issues if not i.warning]
    assert errors, name
    first = errors[0]
    assert first.line == line
    assert message in f"{first.key_path}: {first.message}" or message in first.message


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1e1", 10.0),
        ("1.5e1", 15.0),
        ("0x10", 16.0),
        ("0o10", 8.0),
        ("1_0", 10.0),
        ("+5", 5.0),
        ("5.", 5.0),
        (".5", 0.5),
        ("0.001", 0.001),
    ],
)
def test_numbers_in_yaml_forms(tmp_path: Path, text: str, seconds: float) -> None:
    site = loaded(tmp_path, BASE + f"prolog: {{deadline_seconds: {text}}}\n")
    assert site.prolog.deadline_seconds == seconds


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (".inf", "expected a positive number, got .inf"),
        ("-.inf", "expected a positive number, got -.inf"),
        (".NaN", "expected a positive number, got .NaN"),
        ("-0.5", "expected a positive number, got -0.5"),
        ("12:30", "expected a number, got '12:30'"),
        ("true", "expected a number, got true"),
    ],
)
def test_numbers_that_are_not_positive_and_finite(tmp_path: Path, text: str, said: str) -> None:
    added = f"prolog: {{deadline_seconds: {text}}}\n"
    assert issues_of(tmp_path, BASE + added) == [f"10: prolog.deadline_seconds: {said}"]


@pytest.mark.parametrize(
    ("text", "value"),
    [("0x50", 80), ("0o10", 8), ("0b11", 3), ("1_0", 10), ("+5", 5), ("08", 8)],
)
def test_integers_in_yaml_forms(tmp_path: Path, text: str, value: int) -> None:
    old = 'nvml_names: ["NVIDIA A100-SXM4-80GB"]}'
    site = loaded(tmp_path, BASE.replace(old, old[:-1] + f", memory_gb: {text}}}"))
    assert site.models[0].memory_gb == value


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("1e2", "expected an integer, got 1e2"),
        ("80.0", "expected an integer, got 80.0"),
        ("-1", "expected an integer >= 1, got -1"),
        ("true", "expected an integer, got true"),
        ("~", "expected an integer, got nothing (null)"),
    ],
)
def test_integers_refused(tmp_path: Path, text: str, said: str) -> None:
    old = 'nvml_names: ["NVIDIA A100-SXM4-80GB"]}'
    text = BASE.replace(old, old[:-1] + f", memory_gb: {text}}}")
    assert issues_of(tmp_path, text) == [f"4: models.A100.memory_gb: {said}"]


# -- QoS by time and model groups -------------------------------------------------------------

TWO_MODELS = BASE.replace(
    '  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}\n',
    '  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}\n'
    '  V100: {gres_type: v100, nvml_names: ["Tesla V100"]}\n',
)
GROUP = "model_groups:\n  any: {models: [A100, V100]}\n"
UNTYPED = TWO_MODELS.replace("type_required: true", "type_required: false")
GRES_CONSTRAINT = TWO_MODELS.replace("syntax: gres,", "syntax: gres+constraint,")
SAME_TYPE = (
    "GRES type 'a100' is also the type of model A100: Slurm cannot tell these models apart; "
    "give each its own gres_type, or each its own constraint (node feature)"
)
SHORTEST_FIRST = (
    "max_time: list the QoS shortest first: the first whose max_time holds the job is taken"
)


def qos_rules(*rules: str) -> str:
    return BASE + "defaults:\n  qos_by_time:\n" + "".join(f"    - {r}\n" for r in rules)


def test_qos_by_time_rules_in_order(tmp_path: Path) -> None:
    text = qos_rules(
        '{max_time: "1:00:00", qos: dev}',
        '{max_time: "20:00:00", qos: t3}',
        "{max_time: UNLIMITED, qos: t4}",
    )
    rules = loaded(tmp_path, text).defaults.qos_by_time
    assert [(r.max_time, r.qos) for r in rules] == [
        ("1:00:00", "dev"),
        ("20:00:00", "t3"),
        ("UNLIMITED", "t4"),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            BASE + "defaults: {qos_by_time: 3}\n",
            [
                "10: defaults.qos_by_time: expected a list of {max_time, qos} entries, shortest "
                "first, got 3"
            ],
        ),
        (
            BASE + "defaults: {qos_by_time: [x]}\n",
            ["10: defaults.qos_by_time[0]: expected a mapping, got 'x'"],
        ),
        (
            qos_rules("{max_time: soon, qos: dev}"),
            ["12: defaults.qos_by_time[0].max_time: not a Slurm time: 'soon' (e.g. 2:00:00)"],
        ),
        (
            qos_rules('{max_time: "1:00:00"}'),
            ["12: defaults.qos_by_time[0].qos: required key missing"],
        ),
        (
            qos_rules("{max_time: 60, qos: dev}"),
            [
                "12: defaults.qos_by_time[0].max_time: expected a string, got 60 "
                '(write "60" for text)'
            ],
        ),
        (
            qos_rules('{max_time: "1:00:00", qos: a}', '{max_time: "60", qos: b}'),
            [f"13: defaults.qos_by_time[1].{SHORTEST_FIRST}"],
        ),
        (
            qos_rules("{max_time: UNLIMITED, qos: a}", '{max_time: "60", qos: b}'),
            [f"13: defaults.qos_by_time[1].{SHORTEST_FIRST}"],
        ),
        (
            qos_rules(
                '{max_time: "2:00:00", qos: a}',
                '{max_time: "1:00:00", qos: b}',
                '{max_time: "3:00:00", qos: c}',
                '{max_time: "2:30:00", qos: d}',
            ),
            [
                f"13: defaults.qos_by_time[1].{SHORTEST_FIRST}",
                f"15: defaults.qos_by_time[3].{SHORTEST_FIRST}",
            ],
        ),
        (
            TWO_MODELS + GROUP,
            [
                "12: model_groups.any.models: the models' GRES types differ and this site "
                "requires one in every request: a group is asked for by one shared type or by "
                "node features"
            ],
        ),
        (
            UNTYPED + GROUP,
            [
                "12: model_groups.any.models: the models share no GRES type and not every one "
                "has a constraint: the group cannot be asked for as one request"
            ],
        ),
        (
            # one root cause: V100's missing constraint, not also the group it is in
            GRES_CONSTRAINT.replace("a100, nvml", "a100, constraint: fa, nvml") + GROUP,
            ["5: models.V100.constraint: required when gpu_request.syntax is gres+constraint"],
        ),
        (
            GRES_CONSTRAINT.replace("type_required: true", "type_required: false")
            .replace("v100, nvml", "a100, nvml")
            .replace("a100, nvml", "a100, constraint: fa, nvml", 1)
            + GROUP,
            ["5: models.V100.constraint: required when gpu_request.syntax is gres+constraint"],
        ),
    ],
)
def test_qos_rules_and_model_groups_refused(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert issues_of(tmp_path, text) == expected


@pytest.mark.parametrize(
    "text",
    [
        UNTYPED.replace("a100, nvml", "a100, constraint: fa, nvml").replace(
            "v100, nvml", "v100, constraint: fv, nvml"
        )
        + GROUP,
        GRES_CONSTRAINT.replace("a100, nvml", "a100, constraint: fa, nvml").replace(
            "v100, nvml", "v100, constraint: fv, nvml"
        )
        + GROUP,
    ],
)
def test_model_groups_that_can_be_asked_for(tmp_path: Path, text: str) -> None:
    loaded(tmp_path, text)


# -- YAML errors, UUIDs, bus order, partitions, reading from a descriptor -----------------------

ONE_ENTRY = '  - nodes: "n[1-2]"\n    gpus: [{model: A100, bus_id: "0000:07:00.0"}]\n'
GPU_PARTITION = '  gpu: {nodes: "n[1-2]", default: true}\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            BASE + "extra: a: b\n",
            [(10, "", "YAML syntax error: mapping values are not allowed here")],
        ),
        (
            BASE + 'checks: {driver_min: "1",\n  cuda_min: "12.4"\nprolog: {}\n',
            [
                (
                    12,
                    "",
                    "YAML syntax error: while parsing a flow mapping (started at line 10): "
                    "expected ',' or '}', but got '<scalar>'",
                )
            ],
        ),
        (
            BASE.replace(
                ONE_ENTRY,
                '  - nodes: "n1"\n    gpus: [{model: A100, uuid: "GPU-aaaa"}]\n'
                '  - nodes: "n2"\n    gpus: [{model: A100, uuid: "GPU-aaaa"}]\n',
            ),
            [(11, "node_map[1].gpus[0].uuid", "UUID GPU-aaaa is already given to n1 slot 0")],
        ),
        (
            BASE.replace(
                ONE_ENTRY,
                '  - nodes: "n1"\n'
                '    gpus: [{model: A100, uuid: "GPU-aaaa"}, {model: A100, uuid: "GPU-aaaa"}]\n'
                '  - nodes: "n2"\n    gpus: [{model: A100}]\n',
            ),
            [(9, "node_map[0].gpus[1].uuid", "UUID GPU-aaaa is already given to n1 slot 0")],
        ),
        (
            BASE.replace(
                '{model: A100, bus_id: "0000:07:00.0"}',
                '{model: A100, bus_id: "0000:0b:00.0"}, {model: A100, bus_id: "0000:07:00.0"}, '
                '{model: A100, bus_id: "0000:07:00.0"}',
            ),
            [
                (
                    9,
                    "node_map[0].gpus[1].bus_id",
                    "GPUs must be listed in PCI bus order: 0000:07:00.0 comes before "
                    "0000:0b:00.0 (slot 0)",
                ),
                (
                    9,
                    "node_map[0].gpus[2].bus_id",
                    "bus ID 0000:07:00.0 is already used by slot 1 of this node",
                ),
            ],
        ),
        (
            BASE.replace(GPU_PARTITION, '  gpu: {nodes: "n[1-", default: true}\n'),
            [(6, "partitions.gpu.nodes", "bad hostlist 'n[1-': unbalanced brackets")],
        ),
        (
            BASE.replace(GPU_PARTITION, '  gpu: {nodes: "n[1-2]", default: true, time_limit: 5}\n'),
            [(6, "partitions.gpu.time_limit", 'expected a string, got 5 (write "5" for text)')],
        ),
        (
            BASE.replace(GPU_PARTITION, "  a: 3\n" + GPU_PARTITION + "  b: [1]\n"),
            [
                (6, "partitions.a", "expected a mapping, got 3"),
                (8, "partitions.b", "expected a mapping, got a list"),
            ],
        ),
    ],
)
def test_issues_with_their_line_and_key_path(
    tmp_path: Path, text: str, expected: list[tuple[int, str, str]]
) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    site, issues = validate_site_file(path)
    assert site is None
    assert [(i.file, i.line, i.key_path, i.message) for i in issues] == [
        (str(path), *e) for e in expected
    ]


def test_a_site_is_read_from_the_descriptor_given(tmp_path: Path) -> None:
    """The Prolog opens the file once, checks it, and has it read from that descriptor."""
    real = tmp_path / "real.yaml"
    real.write_text(BASE)
    fd = os.open(real, os.O_RDONLY)
    try:
        site = load_site(tmp_path / "named.yaml", fd)
    finally:
        os.close(fd)
    assert (site.name, site.source) == ("t", tmp_path / "named.yaml")


# -- model groups, job defaults and partition limits, each refusal word for word ---------------

ASKABLE = UNTYPED.replace("a100, nvml", "a100, constraint: fa, nvml").replace(
    "v100, nvml", "v100, constraint: fv, nvml"
)
NEEDS_TWO = "model_groups.one.models: a group needs two models or more"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            ASKABLE + "model_groups: 3\n",
            ["11: model_groups: expected a mapping of group name to group, got 3"],
        ),
        (
            ASKABLE + "model_groups:\n  bad: 3\n  one: {models: [A100]}\n",
            ["12: model_groups.bad: expected a mapping, got 3", f"13: {NEEDS_TWO}"],
        ),
        (
            ASKABLE + "model_groups:\n  nomodels: {aliases: [x]}\n  one: {models: [A100]}\n",
            ["12: model_groups.nomodels.models: required key missing", f"13: {NEEDS_TWO}"],
        ),
        (
            ASKABLE + "model_groups:\n  any:\n    aliases: 3\n    models: [A100, V100]\n",
            ["13: model_groups.any.aliases: expected a list of strings, got 3"],
        ),
        (
            ASKABLE + "model_groups:\n  any:\n    models: 3\n",
            ["13: model_groups.any.models: expected a list of strings, got 3"],
        ),
        (
            ASKABLE
            + "model_groups:\n  a100:\n    aliases: [fast, V100]\n    models: [A100, V100]\n",
            [
                "12: model_groups.a100: 'a100' already names model A100",
                "13: model_groups.a100.aliases[1]: 'V100' already names model V100",
            ],
        ),
        (
            ASKABLE + "model_groups:\n  any:\n    models: [A100, H100]\n",
            ["13: model_groups.any.models[1]: unknown model 'H100'; defined models: A100, V100"],
        ),
        (  # the line of `models:`, not of the group's name
            ASKABLE + "model_groups:\n  one:\n    models: [A100]\n",
            [f"13: {NEEDS_TWO}"],
        ),
        (  # one refusal per group: too few models, not also what the syntax cannot ask for
            GRES_CONSTRAINT + "model_groups:\n  one:\n    models: [A100]\n",
            [
                "4: models.A100.constraint: required when gpu_request.syntax is gres+constraint",
                "5: models.V100.constraint: required when gpu_request.syntax is gres+constraint",
                f"13: {NEEDS_TWO}",
            ],
        ),
        (  # one GRES type, no node feature: the models are one to Slurm; not also the group
            TWO_MODELS.replace("v100, nvml", "a100, nvml") + GROUP,
            [f"5: models.V100.gres_type: {SAME_TYPE}"],
        ),
    ],
)
def test_model_groups_word_for_word(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert issues_of(tmp_path, text) == expected


def test_a_model_group_as_loaded(tmp_path: Path) -> None:
    text = ASKABLE + "model_groups:\n  any:\n    aliases: [fast]\n    models: [A100, V100]\n"
    [group] = loaded(tmp_path, text).model_groups
    assert (group.name, group.aliases, group.models) == ("any", ("fast",), ("A100", "V100"))


def partition_with(*lines: str) -> str:
    """BASE with its partition written one key a line (so each key has its own line)."""
    block = '  gpu:\n    nodes: "n[1-2]"\n    default: true\n'
    block += "".join(f"    {line}\n" for line in lines)
    return BASE.replace('  gpu: {nodes: "n[1-2]", default: true}\n', block)


GPU_ONLY = "GPUs are the request itself (gpu_request, --gpus, --model), not an extra GRES"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            BASE + "defaults: {qos: 3}\n",
            ['10: defaults.qos: expected a string, got 3 (write "3" for text)'],
        ),
        (
            BASE + "defaults: {mem_per_gpu: 3}\n",
            ['10: defaults.mem_per_gpu: expected a string, got 3 (write "3" for text)'],
        ),
        (
            BASE + "defaults: {time: 3}\n",
            ['10: defaults.time: expected a string, got 3 (write "3" for text)'],
        ),
        (BASE + "defaults: {gres: 3}\n", ["10: defaults.gres: expected a list of strings, got 3"]),
        (
            BASE + 'defaults: {gres: ["gpu:a100:2", "nvme", "gpu"]}\n',
            [f"10: defaults.gres[0]: {GPU_ONLY}", f"10: defaults.gres[2]: {GPU_ONLY}"],
        ),
        (
            BASE + 'defaults: {sbatch: ["--hint=x\\n--exclusive", "--a\\r--b", "--ok"]}\n',
            [
                "10: defaults.sbatch[0]: one option per item",
                "10: defaults.sbatch[1]: one option per item",
            ],
        ),
        (  # every bad entry is named, not only the first
            BASE + "defaults:\n  qos_by_time: [x, y]\n",
            [
                "11: defaults.qos_by_time[0]: expected a mapping, got 'x'",
                "11: defaults.qos_by_time[1]: expected a mapping, got 'y'",
            ],
        ),
        (
            BASE + 'defaults:\n  qos_by_time: [{max_time: "1:00:00"}, {max_time: "2:00:00"}]\n',
            [
                "11: defaults.qos_by_time[0].qos: required key missing",
                "11: defaults.qos_by_time[1].qos: required key missing",
            ],
        ),
        (
            BASE
            + "defaults:\n  qos_by_time: [{max_time: soon, qos: a}, {max_time: later, qos: b}]\n",
            [
                "11: defaults.qos_by_time[0].max_time: not a Slurm time: 'soon' (e.g. 2:00:00)",
                "11: defaults.qos_by_time[1].max_time: not a Slurm time: 'later' (e.g. 2:00:00)",
            ],
        ),
        (
            BASE + 'defaults:\n  qos_by_time: [{max_time: "1:00:00", qos: 3}]\n',
            ['11: defaults.qos_by_time[0].qos: expected a string, got 3 (write "3" for text)'],
        ),
        (
            BASE.replace("type_required: true}", "type_required: true, memory: x}"),
            ["2: gpu_request.memory: expected one of mem-per-gpu, mem, got 'x'"],
        ),
        (
            BASE.replace("type_required: true}", "type_required: true, multi_node: x}"),
            ["2: gpu_request.multi_node: expected one of per-node, total, got 'x'"],
        ),
        (
            BASE + "preflight: maybe\n",
            ["10: preflight: expected one of required, warn, off, got 'maybe'"],
        ),
        (
            partition_with("preflight: maybe"),
            ["9: partitions.gpu.preflight: expected one of required, warn, off, got 'maybe'"],
        ),
        (
            partition_with("max_nodes: 0"),
            ["9: partitions.gpu.max_nodes: expected an integer >= 1, got 0"],
        ),
        (
            partition_with("gpus_per_node: 0"),
            ["9: partitions.gpu.gpus_per_node: expected an integer >= 1, got 0"],
        ),
        (
            partition_with("max_gpus_per_job: 0"),
            ["9: partitions.gpu.max_gpus_per_job: expected an integer >= 1, got 0"],
        ),
        (  # n3 is in the node map with no GPUs
            partition_with("gpus_per_node: 1").replace(
                '"n[1-2]"\n    default', '"n[1-3]"\n    default'
            )
            + '  - nodes: "n3"\n    gpus: []\n',
            ["9: partitions.gpu.gpus_per_node: 1 GPUs per node, but n3 has fewer in the node map"],
        ),
        (
            partition_with('time_limit: "1:00:00"', 'defaults: {time: "2:00:00"}'),
            [
                "10: partitions.gpu.defaults.time: defaults.time 2:00:00 is longer than the "
                "time_limit 1:00:00"
            ],
        ),
        (
            partition_with('time_limit: "1:00:00"') + 'defaults: {time: "2:00:00"}\n',
            [
                "9: partitions.gpu.time_limit: the site's defaults.time 2:00:00 is longer than "
                "the time_limit 1:00:00"
            ],
        ),
        (  # the partition's own bad time, not the site's good one, is what is refused
            partition_with('time_limit: "1:00:00"', "defaults: {time: soon}")
            + 'defaults: {time: "2:00:00"}\n',
            [
                "10: partitions.gpu.defaults.time: not a Slurm time: 'soon' "
                "(e.g. 1:00:00, 2-00:00:00, 30)"
            ],
        ),
        (
            BASE.replace("nvml_names", 'constraint: "a b", nvml_names'),
            [
                "4: models.A100.constraint: not a node feature expression: 'a b' (features "
                "joined with & or |, grouped with ( ) or [ ])"
            ],
        ),
        (
            BASE.replace("nvml_names", 'constraint: "a)(b", nvml_names'),
            ["4: models.A100.constraint: unbalanced brackets in 'a)(b'"],
        ),
        (
            BASE.replace("nvml_names", 'constraint: "(a", nvml_names'),
            ["4: models.A100.constraint: unbalanced brackets in '(a'"],
        ),
    ],
)
def test_defaults_and_partition_limits_word_for_word(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    assert issues_of(tmp_path, text) == expected


def test_limits_a_job_can_meet_exactly_are_accepted(tmp_path: Path) -> None:
    text = partition_with(
        "gpus_per_node: 1",
        "max_gpus_per_job: 1",
        "max_nodes: 2",
        'time_limit: "1:00:00"',
        'defaults: {time: "1:00:00"}',
        "preflight: warn",
    ).replace("nvml_names", 'constraint: "(fX|f_b)&[c]", nvml_names')
    site = loaded(tmp_path, text)
    [gpu] = site.partitions
    assert (gpu.gpus_per_node, gpu.max_gpus_per_job, gpu.max_nodes, gpu.preflight) == (
        1,
        1,
        2,
        "warn",
    )
    assert gpu.defaults.time == "1:00:00"
    assert site.models[0].constraint == "(fX|f_b)&[c]"
    assert loaded(tmp_path, partition_with("max_nodes: 1")).partitions[0].max_nodes == 1


def test_a_site_without_request_forms_gets_the_default_forms(tmp_path: Path) -> None:
    assert loaded(tmp_path, BASE).form == RequestForm()
    text = BASE.replace("type_required: true}", "type_required: true, memory: mem}")
    assert loaded(tmp_path, text).form == RequestForm(memory="mem")


A100_LINE = '  A100: {gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}\n'


def with_models(block: str, base: str = BASE) -> str:
    return base.replace(A100_LINE, block)


SUBSTRING = (
    "GRES type 'a100' is a substring of 'a100x' (model A100X): Slurm matches types by "
    "substring, so asking for 'a100' can also select A100X GPUs"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            BASE.replace("models:\n" + A100_LINE, "models: 3\n"),
            ["3: models: expected a mapping of model name to model, got 3"],
        ),
        (  # every model that is not a mapping is named, not only the first
            with_models("  A100: 3\n  V100: 4\n"),
            [
                "4: models.A100: expected a mapping, got 3",
                "5: models.V100: expected a mapping, got 4",
            ],
        ),
        (
            with_models(A100_LINE.replace("gres_type", "aliases: 3, gres_type")),
            ["4: models.A100.aliases: expected a list of strings, got 3"],
        ),
        (
            with_models('  A100: {gres_type: a100, nvml_names: "x"}\n'),
            ["4: models.A100.nvml_names: expected a list of strings, got 'x'"],
        ),
        (
            with_models(A100_LINE + '  a100: {gres_type: b100, nvml_names: ["B"]}\n'),
            ["5: models.a100: model name collides with model A100 (names are case-insensitive)"],
        ),
        (
            with_models(
                A100_LINE + '  V100: {gres_type: v100, nvml_names: ["nvidia a100-sxm4-80gb", V]}\n'
            ),
            [
                "5: models.V100.nvml_names: NVML name 'nvidia a100-sxm4-80gb' is already listed "
                "for model A100"
            ],
        ),
        (
            with_models(A100_LINE.replace("gres_type", "vendor: intel, gres_type")),
            ["4: models.A100.vendor: expected one of nvidia, amd, got 'intel'"],
        ),
        (  # every model with a bad vendor is named
            with_models(
                "  A100:\n    vendor: intel\n    gres_type: a100\n"
                "  V100:\n    vendor: intel\n    gres_type: v100\n    nvml_names: [V]\n"
            ),
            [
                "5: models.A100.vendor: expected one of nvidia, amd, got 'intel'",
                "8: models.V100.vendor: expected one of nvidia, amd, got 'intel'",
            ],
        ),
        (
            with_models(A100_LINE.replace("gres_type", "defaults: {qos: 3}, gres_type")),
            ['4: models.A100.defaults.qos: expected a string, got 3 (write "3" for text)'],
        ),
        (
            with_models(A100_LINE.replace("gres_type", "gres_type_overlap: 3, gres_type")),
            ["4: models.A100.gres_type_overlap: expected true or false, got 3"],
        ),
        (
            with_models("  A100:\n    vendor: nvidia\n    gres_type: a100\n"),
            ["5: models.A100.nvml_names: required key missing"],
        ),
        (
            with_models(
                A100_LINE + "  MI:\n    vendor: amd\n    gres_type: mi\n    nvml_names: [MI]\n"
            ),
            ["8: models.MI.nvml_names: an AMD GPU has no NVML name (NVML reads NVIDIA GPUs only)"],
        ),
        (
            with_models(A100_LINE.replace("gres_type", "max_per_job: 0, gres_type")),
            ["4: models.A100.max_per_job: expected an integer >= 1, got 0"],
        ),
        (  # a bad constraint is refused once, not also reported missing
            GRES_CONSTRAINT.replace("a100, nvml", 'a100, constraint: "a b", nvml').replace(
                "v100, nvml", "v100, constraint: fv, nvml"
            ),
            [
                "4: models.A100.constraint: not a node feature expression: 'a b' (features "
                "joined with & or |, grouped with ( ) or [ ])"
            ],
        ),
        (  # the line of each model's gres_type; a substring warned about from either side
            with_models(
                "  A100:\n    nvml_names: [A]\n    gres_type: a100\n"
                "  A100X:\n    nvml_names: [AX]\n    gres_type: a100x\n"
                "  B:\n    nvml_names: [B]\n    gres_type: a100\n"
            ),
            [
                f"6: warning: models.A100.gres_type: {SUBSTRING}",
                f"12: models.B.gres_type: {SAME_TYPE}",
                f"12: warning: models.B.gres_type: {SUBSTRING}",
            ],
        ),
    ],
)
def test_models_word_for_word(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert issues_of(tmp_path, text) == expected


def test_a_models_job_cap_as_loaded(tmp_path: Path) -> None:
    text = with_models(A100_LINE.replace("gres_type", "max_per_job: 1, gres_type"))
    assert loaded(tmp_path, text).models[0].max_per_job == 1


SLOT_LINE = '    gpus: [{model: A100, bus_id: "0000:07:00.0"}]\n'


def with_gpus(line: str) -> str:
    return BASE.replace(SLOT_LINE, line)


def string_wanted(path: str) -> str:
    return f'9: {path}: expected a string, got 3 (write "3" for text)'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            with_gpus("    gpus: 3\n"),
            ["9: node_map[0].gpus: expected a list of GPUs (in PCI bus order), got 3"],
        ),
        (  # every slot that is not a mapping is named
            with_gpus("    gpus: [3, 4]\n"),
            [
                "9: node_map[0].gpus[0]: expected a mapping such as {model: A100}, got 3",
                "9: node_map[0].gpus[1]: expected a mapping such as {model: A100}, got 4",
            ],
        ),
        (
            with_gpus('    gpus: [{model: 3, bus_id: "0000:07:00.0"}]\n'),
            [string_wanted("node_map[0].gpus[0].model")],
        ),
        (
            with_gpus("    gpus: [{model: A100, bus_id: 3}]\n"),
            [string_wanted("node_map[0].gpus[0].bus_id")],
        ),
        (
            with_gpus('    gpus: [{model: A100, bus_id: "0000:07:00.0", uuid: 3}]\n'),
            [string_wanted("node_map[0].gpus[0].uuid")],
        ),
        (  # each unknown model named; a case slip gets the canonical name as a hint
            with_gpus(
                '    gpus: [{model: a100, bus_id: "0000:07:00.0"}, '
                '{model: B, bus_id: "0000:08:00.0"}]\n'
            ),
            [
                "9: node_map[0].gpus[0].model: unknown model 'a100' (write the canonical name "
                "'A100'); defined models: A100",
                "9: node_map[0].gpus[1].model: unknown model 'B'; defined models: A100",
            ],
        ),
        (
            with_gpus(
                '    gpus: [{model: A100, bus_id: "0000:07:00.0"}, '
                '{model: A100, bus_id: "0000:07:00.0"}]\n'
            ),
            [
                "9: node_map[0].gpus[1].bus_id: bus ID 0000:07:00.0 is already used by slot 0 of "
                "this node"
            ],
        ),
        (
            with_gpus('    gpus: [{model: A100, bus_id: "0000:07:00.0", nvlinks: 37}]\n'),
            ["9: node_map[0].gpus[0].nvlinks: a GPU has at most 36 NVLink links, got 37"],
        ),
        (BASE.split("node_map:")[0], ["1: node_map: required key missing"]),
        (BASE.replace("models:\n" + A100_LINE, ""), ["1: models: required key missing"]),
        (BASE + "templates: 3\n", ['10: templates: expected a string, got 3 (write "3" for text)']),
    ],
)
def test_node_map_slots_word_for_word(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert issues_of(tmp_path, text) == expected


def test_what_a_site_gets_when_it_leaves_things_out(tmp_path: Path) -> None:
    site = loaded(tmp_path, BASE)
    assert site.templates_dir is None
    assert site.checks == CheckPolicy()
    assert site.preflight == "required"
    assert site.cluster_name is None
    text = BASE + "cluster_name: lab\n"
    assert loaded(tmp_path, text).cluster_name == "lab"


def test_a_slot_with_the_most_nvlinks_there_are(tmp_path: Path) -> None:
    text = with_gpus('    gpus: [{model: A100, bus_id: "0000:07:00.0", nvlinks: 36}]\n')
    [slot] = loaded(tmp_path, text).node_map.nodes["n1"]
    assert slot.nvlinks == 36


NODE_MAP = 'node_map:\n  - nodes: "n[1-2]"\n    gpus: [{model: A100, bus_id: "0000:07:00.0"}]\n'
PARTITION = '  gpu: {nodes: "n[1-2]", default: true}\n'


def with_node_map(block: str) -> str:
    return BASE.replace(NODE_MAP, "node_map:\n" + block)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            with_node_map(
                '  - nodes: n1\n    gpus: [{model: A100, bus_id: "0000:07:00.0", uuid: GPU-1}]\n'
                '  - nodes: n2\n    gpus: [{model: A100, bus_id: "0000:07:00.0", uuid: GPU-1}]\n'
            ),
            ["11: node_map[1].gpus[0].uuid: UUID GPU-1 is already given to n1 slot 0"],
        ),
        (  # a slot out of order still takes its bus ID: a later duplicate names it
            with_node_map(
                '  - nodes: "n[1-2]"\n    gpus: [{model: A100, bus_id: "0000:08:00.0"}, '
                '{model: A100, bus_id: "0000:07:00.0"}, {model: A100, bus_id: "0000:07:00.0"}]\n'
            ),
            [
                "9: node_map[0].gpus[1].bus_id: GPUs must be listed in PCI bus order: "
                "0000:07:00.0 comes before 0000:08:00.0 (slot 0)",
                "9: node_map[0].gpus[2].bus_id: bus ID 0000:07:00.0 is already used by slot 1 "
                "of this node",
            ],
        ),
        (
            with_node_map('  - 3\n  - 4\n  - nodes: "n[1-2]"\n    gpus: [{model: A100}]\n'),
            [
                "8: node_map[0]: expected a mapping, got 3",
                "9: node_map[1]: expected a mapping, got 4",
            ],
        ),
        (  # the line of `nodes:`, not of the entry
            with_node_map('  - gpus: [{model: A100}]\n\n    nodes: "n[1-2"\n'),
            [
                "6: partitions.gpu.nodes: not in node_map: n[1-2]",
                "10: node_map[0].nodes: bad hostlist 'n[1-2': unbalanced brackets",
            ],
        ),
        (
            with_node_map(
                '  - nodes: "n[1-2]"\n    gpus: [{model: A100}]\n'
                "  - nodes: n2\n    gpus: [{model: A100}]\n"
            ),
            ["10: node_map[1].nodes: n2 already defined in node_map[0] (line 8)"],
        ),
        (
            BASE.replace(PARTITION, '  gpu: 3\n  cpu: 4\n  x: {nodes: "n[1-2]", default: true}\n'),
            [
                "6: partitions.gpu: expected a mapping, got 3",
                "7: partitions.cpu: expected a mapping, got 4",
            ],
        ),
        (
            BASE.replace(PARTITION, '  gpu: {nodes: "n[1-2", default: true}\n'),
            ["6: partitions.gpu.nodes: bad hostlist 'n[1-2': unbalanced brackets"],
        ),
        (
            BASE.replace(PARTITION, '  gpu: {nodes: "n[1-2]", default: true, time_limit: 3}\n'),
            ['6: partitions.gpu.time_limit: expected a string, got 3 (write "3" for text)'],
        ),
        (
            BASE.replace(
                PARTITION,
                '  gpu: {nodes: "n[1-2]", default: true, time_limit: soon}\n'
                '  cpu: {nodes: "n[1-2]", time_limit: later}\n',
            ),
            [
                "6: partitions.gpu.time_limit: not a Slurm time limit: 'soon' "
                "(e.g. 2-00:00:00, 12:00:00, 30)",
                "7: partitions.cpu.time_limit: not a Slurm time limit: 'later' "
                "(e.g. 2-00:00:00, 12:00:00, 30)",
            ],
        ),
        (  # the line of the partition's `nodes:`
            BASE.replace(PARTITION, '  gpu:\n    default: true\n\n    nodes: "n[1-3]"\n'),
            ["9: partitions.gpu.nodes: not in node_map: n3"],
        ),
    ],
)
def test_node_map_and_partitions_word_for_word(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    assert issues_of(tmp_path, text) == expected


def test_a_partition_as_loaded_keeps_its_nodes_and_job_environment(tmp_path: Path) -> None:
    text = BASE.replace(
        PARTITION, '  gpu: {nodes: "n[1-2]", default: true, job: {python: /opt/py/bin/python}}\n'
    )
    [gpu] = loaded(tmp_path, text).partitions
    assert gpu.nodes == "n[1-2]"
    assert gpu.job.python == "/opt/py/bin/python"


@pytest.mark.parametrize(
    ("raw", "line", "message"),
    [
        (b"", 1, "empty file: expected a site config mapping"),
        (b"   \n# only a comment\n", 1, "empty file: expected a site config mapping"),
        (BASE.encode() + b"x: a\x07b\n", 10, "YAML error: special characters are not allowed"),
        (
            b"site: [a, b\n",
            2,
            "YAML syntax error: while parsing a flow sequence (started at line 1): expected ',' "
            "or ']', but got '<stream end>'",
        ),
        (BASE.encode() + b"y: \xff\n", 10, "not UTF-8 text: byte 0xff cannot be decoded"),
    ],
)
def test_files_that_are_no_yaml_mapping(
    tmp_path: Path, raw: bytes, line: int, message: str
) -> None:
    path = tmp_path / "site.yaml"
    path.write_bytes(raw)
    assert validate_site_file(path) == (None, [ConfigIssue(str(path), line, "", message)])


def test_a_directory_cannot_be_read_as_a_site(tmp_path: Path) -> None:
    issue = ConfigIssue(str(tmp_path), None, "", "cannot read: Is a directory")
    assert validate_site_file(tmp_path) == (None, [issue])


def test_a_site_file_of_exactly_the_largest_size_is_read_to_its_last_byte(tmp_path: Path) -> None:
    tail = BASE.encode() + b"cluster_name: lab7"  # no line break: the last byte counts
    padding = b"#" * (MAX_BYTES - len(tail) - 1) + b"\n"
    path = tmp_path / "site.yaml"
    path.write_bytes(padding + tail)
    assert path.stat().st_size == MAX_BYTES
    site, issues = validate_site_file(path)
    assert issues == []
    assert site is not None and site.cluster_name == "lab7"
    path.write_bytes(b"#" + padding + tail)
    assert validate_site_file(path) == (
        None,
        [ConfigIssue(str(path), None, "", "file is larger than 16 MiB")],
    )


ONE_HOUR = BASE.replace(
    PARTITION, '  gpu: {nodes: "n[1-2]", default: true, time_limit: "1:00:00"}\n'
)
LONGER = (
    "6: partitions.gpu.time_limit: the site's defaults.time 5:00:00 is longer than the "
    "time_limit 1:00:00"
)


@pytest.mark.parametrize(
    ("defaults", "expected"),
    [
        ("{}", [LONGER]),  # the check these cases must not reach
        (
            '{account: "{user}"}',
            [
                "10: defaults.account: unknown field {user}: the one field an account may hold "
                "is {project}"
            ],
        ),
        (
            '{qos: a, qos_by_time: [{max_time: "1:00:00", qos: b}]}',
            ["10: defaults.qos_by_time: give qos or qos_by_time, not both"],
        ),
        (
            "{mem_per_gpu: lots}",
            ["10: defaults.mem_per_gpu: not a Slurm memory size: 'lots' (e.g. 64G, 500M, 1T)"],
        ),
        ("{qos_by_time: [x]}", ["10: defaults.qos_by_time[0]: expected a mapping, got 'x'"]),
        (
            '{qos_by_time: [{max_time: "1:00:00"}]}',
            ["10: defaults.qos_by_time[0].qos: required key missing"],
        ),
        (
            "{qos_by_time: [{max_time: soon, qos: a}]}",
            ["10: defaults.qos_by_time[0].max_time: not a Slurm time: 'soon' (e.g. 2:00:00)"],
        ),
        (
            '{qos_by_time: [{max_time: "2:00:00", qos: a}, {max_time: "1:00:00", qos: b}]}',
            [f"10: defaults.qos_by_time[1].{SHORTEST_FIRST}"],
        ),
        (
            '{gres: ["gpu"]}',
            [f"10: defaults.gres[0]: {GPU_ONLY}"],
        ),
    ],
)
def test_site_defaults_with_a_refusal_are_not_used_further(
    tmp_path: Path, defaults: str, expected: list[str]
) -> None:
    """Refused site defaults are set aside whole: their time is not checked against limits."""
    text = ONE_HOUR + f"defaults: {defaults[:-1]}{', ' if defaults != '{}' else ''}"
    text += 'time: "5:00:00"}\n'
    assert issues_of(tmp_path, text) == expected


def test_a_partition_with_a_refused_key_is_not_checked_further(tmp_path: Path) -> None:
    text = partition_with("preflight: maybe", "max_nodes: 5")
    assert issues_of(tmp_path, text) == [
        "9: partitions.gpu.preflight: expected one of required, warn, off, got 'maybe'"
    ]


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ("{}", ["9: partitions.gpu.max_nodes: 5 nodes, but the partition has 2"]),
        (
            "{python: 3, venv: 4}",
            [
                '10: partitions.gpu.job.python: expected a string, got 3 (write "3" for text)',
                '10: partitions.gpu.job.venv: expected a string, got 4 (write "4" for text)',
            ],
        ),
        (
            "{python: bin/python}",
            ["10: partitions.gpu.job.python: not an absolute path: 'bin/python'"],
        ),
        (
            "{python: /p, conda: c}",
            [
                "10: partitions.gpu.job.conda: give one of python, venv, conda (this entry also "
                "has python)"
            ],
        ),
        ("{setup: 3}", ["10: partitions.gpu.job.setup: expected a list of strings, got 3"]),
        (
            '{setup: ["a\\nb"]}',
            ["10: partitions.gpu.job.setup[0]: one shell line per item"],
        ),
    ],
)
def test_a_partition_with_a_refused_job_environment_is_not_checked_further(
    tmp_path: Path, job: str, expected: list[str]
) -> None:
    text = partition_with("max_nodes: 5", f"job: {job}")
    assert issues_of(tmp_path, text) == expected


@pytest.mark.parametrize(
    ("checks", "expected"),
    [
        (
            "{driver_min: 3}",
            ['10: partitions.gpu.checks.driver_min: expected a string, got 3 (write "3" for text)'],
        ),
        (
            "{cuda_min: 3}",
            ['10: partitions.gpu.checks.cuda_min: expected a string, got 3 (write "3" for text)'],
        ),
        (
            "{severity: 3}",
            [
                "10: partitions.gpu.checks.severity: expected a mapping of check id to severity, "
                "got 3"
            ],
        ),
        (
            "{severity: {gpu-hot: loud, gpu-lost: quiet}}",
            [
                "10: partitions.gpu.checks.severity.gpu-hot: expected one of error, warning, "
                "off, got 'loud'",
                "10: partitions.gpu.checks.severity.gpu-lost: expected one of error, warning, "
                "off, got 'quiet'",
            ],
        ),
    ],
)
def test_a_partition_with_refused_checks_is_not_checked_further(
    tmp_path: Path, checks: str, expected: list[str]
) -> None:
    text = partition_with("max_nodes: 5", f"checks: {checks}")
    assert issues_of(tmp_path, text) == expected


def test_each_unknown_check_id_is_named(tmp_path: Path) -> None:
    said = issues_of(tmp_path, partition_with("max_nodes: 5", "checks: {severity: {a: x, b: y}}"))
    assert [s.split("; valid:")[0] for s in said] == [
        "10: partitions.gpu.checks.severity.a: unknown check id",
        "10: partitions.gpu.checks.severity.b: unknown check id",
    ]


ANCHORS = "YAML anchors and aliases (&s, *s) are not supported in site configs; write the value out"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE.replace("site: t", "site: &s t"), [f"1: site: {ANCHORS}"]),  # no alias: pure parser
        (BASE.replace("site: t", "site: &s t") + "cluster_name: *s\n", [f"1: site: {ANCHORS}"]),
        (
            BASE.replace("site: t", "site: !custom t"),
            ["1: site: YAML tags are not supported here (found !custom)"],
        ),
        (
            BASE.replace("site: t", "&k site: t"),
            ["1: keys must be plain text, got 'site'", "1: site: required key missing"],
        ),
        (  # each complex key is named
            BASE + "? [a]\n: b\n? [c]\n: d\n",
            [
                "10: keys must be plain text, got a complex key",
                "12: keys must be plain text, got a complex key",
            ],
        ),
        ("# a & b\n", ["1: empty file: expected a site config mapping"]),  # the pure parser's
    ],
)
def test_yaml_features_a_site_may_not_use(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert issues_of(tmp_path, text) == expected


def test_nesting_deeper_than_python_can_follow_is_one_issue(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("&a " + "[" * 3000 + "]" * 3000 + "\n")
    issue = ConfigIssue(str(path), None, "", "YAML nesting is too deep")
    assert validate_site_file(path) == (None, [issue])


NO_SHARED_TYPE = (
    "model_groups.any.models: the models share no GRES type and not every one has a "
    "constraint: the group cannot be asked for as one request"
)
UNTYPED_REQUEST = "gpu_request: {syntax: gres, type_required: false}\n"


@pytest.mark.parametrize(
    ("request_line", "expected"),
    [
        ("", ["1: gpu_request: required key missing", f"11: {NO_SHARED_TYPE}"]),
        (
            "gpu_request: 3\n",
            ["2: gpu_request: expected a mapping, got 3", f"12: {NO_SHARED_TYPE}"],
        ),
    ],
)
def test_without_a_readable_gpu_request_types_are_not_required(
    tmp_path: Path, request_line: str, expected: list[str]
) -> None:
    text = UNTYPED.replace(UNTYPED_REQUEST, request_line) + GROUP
    assert issues_of(tmp_path, text) == expected


def test_a_site_that_is_not_a_mapping_is_one_issue_at_the_top(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("- a\n")
    issue = ConfigIssue(
        str(path), 1, "", "expected a mapping of site settings at the top, got a list"
    )
    assert validate_site_file(path) == (None, [issue])


@pytest.mark.parametrize(
    ("bad_key", "refusal"),
    [
        ("time_limit: soon", "not a Slurm time limit: 'soon' (e.g. 2-00:00:00, 12:00:00, 30)"),
        ("preflight: maybe", "expected one of required, warn, off, got 'maybe'"),
        ("defaults: {qos: 3}", 'expected a string, got 3 (write "3" for text)'),
        ("job: {python: 3}", 'expected a string, got 3 (write "3" for text)'),
        ("checks: {driver_min: 3}", 'expected a string, got 3 (write "3" for text)'),
    ],
)
def test_a_refused_partition_is_skipped_and_the_next_one_checked(
    tmp_path: Path, bad_key: str, refusal: str
) -> None:
    key = bad_key.split(":")[0]
    if key in ("defaults", "job", "checks"):
        key += "." + bad_key.split("{")[1].split(":")[0]
    text = BASE.replace(
        PARTITION,
        f'  gpu: {{nodes: "n[1-2]", default: true, max_nodes: 5, {bad_key}}}\n'
        "  cpu: {nodes: n1, max_nodes: 5}\n",
    )
    assert issues_of(tmp_path, text) == [
        f"6: partitions.gpu.{key}: {refusal}",
        "7: partitions.cpu.max_nodes: 5 nodes, but the partition has 1",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            BASE.replace(NODE_MAP, "node_map: 3\n"),
            [
                "6: partitions.gpu.nodes: not in node_map: n[1-2]",
                "7: node_map: expected a list of {nodes, gpus} entries, got 3",
            ],
        ),
        (
            BASE + "cluster_name: !custom ~\n",
            ["10: cluster_name: YAML tags are not supported here (found !custom)"],
        ),
        (
            BASE.replace(NODE_MAP, "node_map:\n  - nodes: n1\n  - nodes: n2\n    gpus: 3\n"),
            [
                "8: node_map[0].gpus: required key missing",
                "10: node_map[1].gpus: expected a list of GPUs (in PCI bus order), got 3",
            ],
        ),
    ],
)
def test_node_map_and_null_values_word_for_word(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    assert issues_of(tmp_path, text) == expected


@pytest.mark.parametrize(
    ("block", "line"),
    [
        ("  A100:\n    nvml_names: [A]\n    gres_type: ~\n", 6),
        ("  A100:\n    nvml_names: [A]\n", 4),
    ],
)
def test_a_missing_gres_type_is_reported_where_it_is_written_or_at_the_model(
    tmp_path: Path, block: str, line: int
) -> None:
    assert issues_of(tmp_path, with_models(block)) == [
        f"{line}: models.A100.gres_type: required when gpu_request.syntax is gres and "
        "type_required is true"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (  # a group named like a model is refused for that alone, not also for its types
            TWO_MODELS + "model_groups:\n  v100: {models: [A100, V100]}\n",
            ["12: model_groups.v100: 'v100' already names model V100"],
        ),
        (
            BASE.replace("models:\n" + A100_LINE, "models: {}\n")
            + "model_groups:\n  any: {models: [A100, V100]}\n",
            [
                "3: models: at least one GPU model is required",
                "8: node_map[0].gpus[0].model: unknown model 'A100'; defined models: none",
                "10: model_groups.any.models[0]: unknown model 'A100'; defined models: none",
                "10: model_groups.any.models[1]: unknown model 'V100'; defined models: none",
            ],
        ),
    ],
)
def test_model_groups_refused_once(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert issues_of(tmp_path, text) == expected
