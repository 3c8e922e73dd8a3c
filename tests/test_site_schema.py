"""The one schema definition (clusterjob/site/schema.py): the loader's key tables come from it,
its JSON Schema takes every shipped site and refuses every bad config it can express, and the
key reference is generated from it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from ruamel.yaml import YAML

from clusterjob.cli.app import run
from clusterjob.resources import site_configs_dir
from clusterjob.site import loader, schema
from clusterjob.site.loader import validate_site_file

BAD = Path(__file__).parent / "bad_configs"

# Bad configs whose fault a JSON Schema cannot see, and why. Every other bad config must be
# refused by the schema; each of these must still be refused by `site validate`.
NOT_EXPRESSIBLE = {
    # YAML itself, before any schema: the parser (or our reader) refuses the text.
    "alias_bomb.yaml": "anchors and aliases are a YAML feature, gone once the file is read",
    "duplicate_key.yaml": "a duplicate key never reaches the schema (the parser keeps one)",
    "malformed_yaml.yaml": "not YAML",
    "non_utf8.yaml": "not UTF-8 text",
    "yaml_tag.yaml": "explicit tags are YAML, not data",
    # Values and cross-references that need the whole file or a computation.
    "alias_collision.yaml": "two models' aliases compared case-insensitively",
    "bad_hostlist.yaml": "a hostlist must expand (python-hostlist)",
    "bus_order.yaml": "slots in ascending PCI order",
    "duplicate_bus_id.yaml": "a bus ID used twice on one node",
    "node_twice.yaml": "a node in two node-map entries",
    "partition_unknown_nodes.yaml": "a partition's nodes must be in the node map",
    "two_defaults.yaml": "at most one default partition",
    "undefined_model.yaml": "a node-map model must be defined under models",
    "uuid_on_many_nodes.yaml": "a UUID on an entry that covers several nodes",
    "mig_slice_as_gpu.yaml": "a slot's model must not be a MIG slice's (its NVML name)",
    "shared_gres_type.yaml": "two models' GRES types compared",
    "group_nested_feature.yaml": "a group member's constraint must nest in [A|B]",
}
WARNING_ONLY = {"gres_substring_warning.yaml"}  # valid configs with a warning


def _validator() -> jsonschema.Draft7Validator:
    document = schema.json_schema()
    jsonschema.Draft7Validator.check_schema(document)
    return jsonschema.Draft7Validator(document)


def _data(path: Path) -> object:
    return YAML(typ="safe", pure=True).load(path.read_text())


def _shipped() -> list[Path]:
    return sorted(site_configs_dir().glob("*.yaml"))


def test_the_loader_checks_keys_against_the_schema() -> None:
    """The loader's valid-key tables are the schema's, table for table."""
    tables = {
        "site": loader._TOP_KEYS,
        "gpu_request": loader._GPU_REQUEST_KEYS,
        "model": loader._MODEL_KEYS,
        "partition": loader._PARTITION_KEYS,
        "job": loader._JOB_KEYS,
        "defaults": loader._DEFAULTS_KEYS,
        "node_entry": loader._NODE_ENTRY_KEYS,
        "gpu_slot": loader._GPU_SLOT_KEYS,
        "prolog": loader._PROLOG_KEYS,
        "checks": loader._CHECKS_KEYS,
    }
    for section_id, table in tables.items():
        assert table == schema.key_tables()[section_id], section_id


@pytest.mark.parametrize("path", _shipped(), ids=lambda p: p.name)
def test_every_shipped_site_validates_against_the_json_schema(path: Path) -> None:
    errors = [e.message for e in _validator().iter_errors(_data(path))]
    assert errors == []


def test_bad_configs_the_schema_can_express_are_refused_by_it() -> None:
    validator = _validator()
    for path in sorted(BAD.glob("*.yaml")):
        if path.name in WARNING_ONLY:
            assert list(validator.iter_errors(_data(path))) == [], path.name
            continue
        site, issues = validate_site_file(path)
        assert site is None and any(not i.warning for i in issues), path.name
        if path.name in NOT_EXPRESSIBLE:
            try:
                data = _data(path)
            except Exception:
                continue  # refused before any schema
            if path.name in {"alias_bomb.yaml", "duplicate_key.yaml", "yaml_tag.yaml"}:
                continue  # the pure parser may read these; what it reads is beside the point
            assert list(validator.iter_errors(data)) == [], f"{path.name} is expressible now"
            continue
        assert list(validator.iter_errors(_data(path))), f"the schema takes {path.name}"


def test_every_bad_config_is_accounted_for() -> None:
    names = {p.name for p in BAD.glob("*.yaml")}
    assert set(NOT_EXPRESSIBLE) <= names
    assert names >= WARNING_ONLY


def test_the_reference_lists_every_key_of_every_section() -> None:
    text = schema.reference_markdown()
    for section in schema.SECTIONS:
        for key in section.keys:
            assert f"| `{key.name}` |" in text, (section.path, key.name)
    assert text.startswith("# Site config reference\n")


def test_site_schema_command_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["site", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == schema.json_schema()
    assert run(["site", "schema", "--reference"]) == 0
    assert capsys.readouterr().out == schema.reference_markdown()


def test_the_shipped_schema_file_is_the_generated_one() -> None:
    """site_configs/site-config.schema.json is what the example sites' first line points
    editors at; regenerate it with
    `clusterjob site schema > site_configs/site-config.schema.json`."""
    shipped = site_configs_dir() / "site-config.schema.json"
    assert json.loads(shipped.read_text()) == schema.json_schema(), "regenerate it"
    for path in _shipped():
        first = path.read_text().splitlines()[0]
        if first.startswith("# yaml-language-server:"):
            assert first.endswith("$schema=site-config.schema.json"), path.name


def test_schema_module_imports_nothing_heavy() -> None:
    """The Prolog's slow path imports the loader, hence the schema: stdlib only at the top."""
    import ast

    tree = ast.parse(Path(schema.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
    assert names <= {"__future__", "collections.abc", "dataclasses", "typing"}
