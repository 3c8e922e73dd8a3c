"""The composer's remembered tag answers: the same text resolves as YAML says each time it
appears, whatever it resolved to before (plain or quoted, key or value, 1.1 or 1.2)."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

from clusterjob.site.yamlcheck import compose

TEXT = 'a: 123\nb: "123"\n123: x\nc: [123, "123", yes, true, null, ~, "", 1.5]\nd: yes\n'


def _tags(node: Node) -> list[str]:
    if isinstance(node, ScalarNode):
        return [f"{node.value}={str(node.tag).rsplit(':', 1)[-1]}"]
    if isinstance(node, MappingNode):
        return [t for k, v in node.value for t in _tags(k) + _tags(v)]
    return [t for item in node.value for t in _tags(item)]


@pytest.mark.parametrize("anchor", ["", "\ne: &x 1\nf: *x\n"])  # libyaml, pure parser
def test_each_occurrence_gets_its_own_tag(anchor: str) -> None:
    root, issues = compose(TEXT + anchor, "f.yaml", "a mapping")
    assert root is not None and issues == []
    assert _tags(root)[:17] == [
        "a=str", "123=int", "b=str", "123=str", "123=int", "x=str", "c=str",
        "123=int", "123=str", "yes=str", "true=bool", "null=null", "~=null", "=str",
        "1.5=float", "d=str", "yes=str",
    ]  # fmt: skip


@pytest.mark.parametrize("anchor", ["", "g: &x 1\nh: *x\n"])  # libyaml, pure parser
@pytest.mark.parametrize("version", ["", "%YAML 1.1\n---\n"])
def test_tags_are_ruamels_own(version: str, anchor: str) -> None:
    text = version + TEXT + "e: 0o17\nf: [0x1F, .inf, 2001-12-14, on, Off, '~', 1_000]\n" + anchor
    root, _ = compose(text, "f.yaml", "a mapping")
    assert root is not None
    assert _tags(root) == _tags(YAML(typ="safe", pure=bool(anchor)).compose(text))
