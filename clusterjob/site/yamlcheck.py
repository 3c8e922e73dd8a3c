"""A strict YAML reader for config files: line numbers kept, every problem collected.

The file is composed (not constructed) with ruamel.yaml so that every node keeps its line;
``Validator`` walks the node tree, records each problem as a ``ConfigIssue``
(``file:line: key.path: message``) and returns plain, typed values. A value that failed is
returned as ``INVALID`` (its issue is already recorded), so a reader can go on and report
every problem of a file in one pass. Nothing here knows what a site is: that schema is in
``clusterjob.site.loader``.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Final, TypeVar

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.resolver import VersionedResolver

from clusterjob.errors import ConfigIssue

_YAML_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {f"{_YAML_TAG}{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}

_T = TypeVar("_T")


class Invalid(Enum):
    """The type of ``INVALID``: a value that failed validation (the issue is recorded)."""

    INVALID = "invalid"


INVALID: Final = Invalid.INVALID


def line_of(node: Node) -> int:
    """The 1-based line a node starts on."""
    return int(node.start_mark.line) + 1


def join_path(path: str, key: str) -> str:
    """``models`` + ``A100`` -> ``models.A100``; a key at the top is its own path."""
    return f"{path}.{key}" if path else key


def _describe(node: Node) -> str:
    """How a value reads in an error message: the text as written, or its kind."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == f"{_YAML_TAG}null":
        return "nothing (null)"
    if node.tag == f"{_YAML_TAG}str":
        return repr(node.value)
    return str(node.value)


def _to_int(text: str) -> int:
    cleaned = text.replace("_", "")
    try:
        return int(cleaned, 0)
    except ValueError:
        return int(cleaned, 10)  # YAML 1.2 reads 010 as ten


def _to_float(text: str) -> float:
    cleaned = text.replace("_", "").lower()
    specials = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
    return specials[cleaned] if cleaned in specials else float(cleaned)


@dataclass
class Entry:
    """A key of a mapping with the nodes of the key and of its value."""

    key: ScalarNode
    value: Node


class Validator:
    """Walks the composed YAML tree, records issues, and returns plain values."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.issues: list[ConfigIssue] = []
        self._seen_anchors: set[int] = set()

    # -- recording ------------------------------------------------------------------------

    def error(self, line: int | None, path: str, message: str) -> None:
        self.issues.append(ConfigIssue(self.file, line, path, message))

    def warn(self, line: int | None, path: str, message: str) -> None:
        self.issues.append(ConfigIssue(self.file, line, path, message, warning=True))

    @property
    def failed(self) -> bool:
        return any(not i.warning for i in self.issues)

    # -- generic node checks --------------------------------------------------------------

    def usable(self, node: Node, path: str) -> bool:
        """Refuse anchors/aliases (alias bombs, and values that silently change in two
        places) and explicit tags (no object construction from a config)."""
        anchor = getattr(node, "anchor", None)
        if anchor is not None:
            name = getattr(anchor, "value", anchor)
            if id(node) not in self._seen_anchors:
                self._seen_anchors.add(id(node))
                self.error(
                    line_of(node),
                    path,
                    f"YAML anchors and aliases (&{name}, *{name}) are not supported in site "
                    "configs; write the value out",
                )
            return False
        tag = str(node.tag)
        if tag not in _PLAIN_TAGS:
            shown = "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag
            self.error(line_of(node), path, f"YAML tags are not supported here (found {shown})")
            return False
        return True

    def mapping(
        self, node: Node, path: str, keys: Mapping[str, bool], what: str = "a mapping"
    ) -> dict[str, Entry] | None:
        """A mapping with a fixed key set (name -> required): unknown keys name the valid
        ones."""
        entries = self.any_mapping(node, path, what)
        if entries is None:
            return None
        valid = ", ".join(sorted(keys))
        for name, entry in entries.items():
            if name not in keys:
                close = difflib.get_close_matches(name, list(keys), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.error(
                    line_of(entry.key),
                    join_path(path, name),
                    f"unknown key{hint}; valid keys: {valid}",
                )
        for name, required in keys.items():
            if required and name not in entries:
                self.error(line_of(node), join_path(path, name), "required key missing")
        return {k: v for k, v in entries.items() if k in keys}

    def any_mapping(
        self, node: Node, path: str, what: str = "a mapping"
    ) -> dict[str, Entry] | None:
        """A mapping with free-form string keys (model and partition names), checked for
        duplicates (which YAML forbids but many parsers silently resolve)."""
        if not self.usable(node, path):
            return None
        if not isinstance(node, MappingNode):
            self.error(line_of(node), path, f"expected {what}, got {_describe(node)}")
            return None
        entries: dict[str, Entry] = {}
        for key, value in node.value:
            if (
                not isinstance(key, ScalarNode)
                or str(key.tag) != f"{_YAML_TAG}str"
                or getattr(key, "anchor", None) is not None
            ):
                shown = _describe(key) if isinstance(key, ScalarNode) else "a complex key"
                self.error(line_of(key), path, f"keys must be plain text, got {shown}")
                continue
            name = str(key.value)
            if name in entries:
                first = line_of(entries[name].key)
                self.error(
                    line_of(key),
                    join_path(path, name),
                    f"duplicate key (first defined at line {first})",
                )
                continue
            entries[name] = Entry(key, value)
        return entries

    def sequence(self, node: Node, path: str, what: str = "a list") -> list[Node] | None:
        if not self.usable(node, path):
            return None
        if not isinstance(node, SequenceNode):
            self.error(line_of(node), path, f"expected {what}, got {_describe(node)}")
            return None
        return list(node.value)

    def scalar(self, node: Node, path: str, tags: Iterable[str], what: str) -> ScalarNode | None:
        if not self.usable(node, path):
            return None
        if not isinstance(node, ScalarNode) or str(node.tag) not in {
            f"{_YAML_TAG}{t}" for t in tags
        }:
            hint = ""
            if isinstance(node, ScalarNode) and what == "a string":
                hint = f' (write "{node.value}" for text)'
            self.error(line_of(node), path, f"expected {what}, got {_describe(node)}{hint}")
            return None
        return node

    # -- typed values ---------------------------------------------------------------------

    def string(self, node: Node, path: str) -> str | Invalid:
        """Non-empty text."""
        got = self.scalar(node, path, ("str",), "a string")
        if got is None:
            return INVALID
        text = str(got.value)
        if not text.strip():
            self.error(line_of(node), path, "expected a non-empty string")
            return INVALID
        return text

    def nullable_string(self, node: Node, path: str) -> str | None | Invalid:
        """Non-empty text, or null written out (``gres_type: null``: none on purpose)."""
        if isinstance(node, ScalarNode) and str(node.tag) == f"{_YAML_TAG}null":
            return None if self.usable(node, path) else INVALID
        return self.string(node, path)

    def integer(self, node: Node, path: str, *, minimum: int | None = None) -> int | Invalid:
        got = self.scalar(node, path, ("int",), "an integer")
        if got is None:
            return INVALID
        try:
            value = _to_int(str(got.value))
        except ValueError:  # more digits than Python converts (4300)
            self.error(line_of(node), path, f"number too large: {len(str(got.value))} digits")
            return INVALID
        if minimum is not None and value < minimum:
            self.error(line_of(node), path, f"expected an integer >= {minimum}, got {value}")
            return INVALID
        return value

    def positive_number(self, node: Node, path: str) -> float | Invalid:
        got = self.scalar(node, path, ("int", "float"), "a number")
        if got is None:
            return INVALID
        text = str(got.value)
        try:
            value = float(_to_int(text)) if str(got.tag).endswith("int") else _to_float(text)
        except (ValueError, OverflowError):  # too many digits for an int, or for a float
            value = math.inf
        if not math.isfinite(value) or value <= 0:
            self.error(line_of(node), path, f"expected a positive number, got {text}")
            return INVALID
        return value

    def boolean(self, node: Node, path: str) -> bool | Invalid:
        got = self.scalar(node, path, ("bool",), "true or false")
        if got is None:
            return INVALID
        return str(got.value).lower() == "true"

    def choice(self, node: Node, path: str, choices: Iterable[str]) -> str | Invalid:
        options = list(choices)
        text = self.string(node, path)
        if text is INVALID:
            return INVALID
        if text not in options:
            self.error(line_of(node), path, f"expected one of {', '.join(options)}, got {text!r}")
            return INVALID
        return text

    def string_list(self, node: Node, path: str) -> list[tuple[str, Node]] | None:
        """Each string with its node (for its line); the bad ones left out and reported."""
        items = self.sequence(node, path, "a list of strings")
        if items is None:
            return None
        out: list[tuple[str, Node]] = []
        for i, item in enumerate(items):
            text = self.string(item, f"{path}[{i}]")
            if text is not INVALID:
                out.append((text, item))
        return out


def read_key(
    entries: Mapping[str, Entry], key: str, read: Callable[[Node, str], _T], path: str
) -> _T | None:
    """Read ``key`` with ``read`` when present; None when absent."""
    entry = entries.get(key)
    if entry is None:
        return None
    return read(entry.value, join_path(path, key))


def key_line(entries: Mapping[str, Entry], key: str, default: int | None = None) -> int | None:
    """The line of ``key``'s value, or ``default`` when the key is absent."""
    entry = entries.get(key)
    return line_of(entry.value) if entry is not None else default


# -- reading the file -----------------------------------------------------------------------


def _yaml_issue(file: str, exc: BaseException) -> ConfigIssue:
    """One line for a parser error: where the parser stopped, and what it expected."""
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = int(mark.line) + 1 if mark is not None else None
        problem = exc.problem or ""
        context = exc.context or ""
        start = exc.context_mark
        if context and start is not None and mark is not None and start.line != mark.line:
            context += f" (started at line {int(start.line) + 1})"
        text = ": ".join(p for p in (context, problem) if p)
        return ConfigIssue(file, line, "", f"YAML syntax error: {text}")
    return ConfigIssue(file, None, "", f"YAML error: {str(exc).splitlines()[0]}")


def read_text(
    path: Path, file: str, max_bytes: int, fd: int | None = None
) -> tuple[str | None, list[ConfigIssue]]:
    """The file as text; refused before parsing when larger than ``max_bytes``.

    With ``fd``, the text is read from that open descriptor (from its start), not by name.
    """
    too_large = f"file is larger than {max_bytes // (1024 * 1024)} MiB"
    try:
        if fd is not None:
            os.lseek(fd, 0, os.SEEK_SET)
        with path.open("rb") if fd is None else os.fdopen(os.dup(fd), "rb") as fh:
            if os.fstat(fh.fileno()).st_size > max_bytes:
                return None, [ConfigIssue(file, None, "", too_large)]
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        return None, [ConfigIssue(file, None, "", f"cannot read: {exc.strerror or exc}")]
    if len(raw) > max_bytes:  # grew since the fstat
        return None, [ConfigIssue(file, None, "", too_large)]
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return None, [
            ConfigIssue(
                file, line, "", f"not UTF-8 text: byte 0x{raw[exc.start]:02x} cannot be decoded"
            )
        ]
    return text, []


def compose(text: str, file: str, expected: str) -> tuple[Node | None, list[ConfigIssue]]:
    """The YAML node tree (with line numbers); an empty document is an issue that says
    ``expected`` instead.

    libyaml (ruamel.yaml.clib) composes a large file ~5x faster than the pure-Python parser.
    The pure parser takes a document that libyaml rejects (its error messages are the ones
    reported) and any document that may use anchors or aliases: only its nodes carry the
    anchor that the validator refuses."""
    if "&" not in text and "*" not in text:
        try:
            return _compose_with(text, file, expected, pure=False)
        except YAMLError:
            pass
    return _compose_with(text, file, expected, pure=True)


class _RememberingResolver(VersionedResolver):
    """ruamel's resolver, answering each (kind, value, implicit) once per document.

    Resolving a scalar's tag walks YAML 1.2's implicit patterns (and re-reads the document's
    version twice) in Python for every node: 40% of composing a 10,000-node site written one
    entry per node, whose nodes repeat a few dozen values (keys, models, bus ids). The answer
    depends only on those three and the document's YAML version, fixed for one document.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._answers: dict[tuple[Any, Any, Any], Any] = {}

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        key = (kind, value, implicit)
        try:
            return self._answers[key]
        except KeyError:
            tag = self._answers[key] = super().resolve(kind, value, implicit)
            return tag
        except TypeError:  # an unhashable value: ask without remembering
            return super().resolve(kind, value, implicit)


def _compose_with(
    text: str, file: str, expected: str, *, pure: bool
) -> tuple[Node | None, list[ConfigIssue]]:
    yaml = YAML(typ="safe", pure=pure)  # composing only; the rt scanner is slower
    yaml.Resolver = _RememberingResolver
    try:
        root = yaml.compose(text)
    except YAMLError as exc:
        if not pure:
            raise
        position = getattr(exc, "position", None)
        if position is not None and not isinstance(exc, MarkedYAMLError):
            line = text[:position].count("\n") + 1
            reason = getattr(exc, "reason", None) or str(exc).splitlines()[0]
            return None, [ConfigIssue(file, line, "", f"YAML error: {reason}")]
        return None, [_yaml_issue(file, exc)]
    except RecursionError:
        return None, [ConfigIssue(file, None, "", "YAML nesting is too deep")]
    if root is None:
        return None, [ConfigIssue(file, 1, "", f"empty file: expected {expected}")]
    return root, []
