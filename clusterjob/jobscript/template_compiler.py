"""Compile the shipped job templates to plain Python, so a submit renders them without Jinja2.

Jinja2 stays the source of truth: a template is parsed by Jinja2 with the very settings of the
render environment (trim_blocks, lstrip_blocks, keep_trailing_newline), so the text between
tags is exactly what Jinja2 would write, and each node of its tree becomes a line of Python.
Only what the shipped templates use is translated (output, if, for with ``loop.index0``/
``loop.index``, set, set-blocks, blocks, one level of macros, attribute and item access,
filters, ``is none``, comparisons, and/or/not, conditional expressions, ``+``); anything
else stops the build with the template's line, never a module that renders differently.

Used at build time only (``scripts/gen_compiled.py``); nothing at run time imports this.
tests/test_render_compiled.py renders every golden case both ways and compares the bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jinja2
from jinja2 import nodes

# The Jinja2 filters the compiled code implements itself (as Jinja2 does without autoescape);
# every other filter is the render environment's own, passed in by name.
BUILTIN_FILTERS = {"join": "_join", "list": "list"}
OWN_FILTERS = ("q", "sbatch", "sbatch_option", "comment")
_COMPARE = {"eq": "==", "ne": "!=", "gt": ">", "gteq": ">=", "lt": "<", "lteq": "<=",
            "in": "in", "notin": "not in"}  # fmt: skip

RUNTIME = '''\
def _attr(obj: Any, name: str) -> Any:
    """``obj.name`` as the sandbox reads it: the attribute, else the item (a dict's key)."""
    try:
        return getattr(obj, name)
    except AttributeError:
        return obj[name]


def _item(obj: Any, key: Any) -> Any:
    """``obj[key]`` as Jinja2 reads it: the item, else (a name) the attribute."""
    try:
        return obj[key]
    except (TypeError, LookupError):
        if not isinstance(key, str):
            raise
        return getattr(obj, key)


def _join(value: Any, separator: Any = "") -> str:
    return str(separator).join(map(str, value))
'''


class UnsupportedTemplate(Exception):
    """The template uses something the compiler does not translate."""


def template_parser() -> jinja2.Environment:
    """An environment that parses as the render environment does (same whitespace rules)."""
    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


class _Compiler:
    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self.indent = 1
        self.counter = 0
        self.scopes: list[dict[str, str]] = [{}]
        self.context_names: set[str] = set()
        self.writer = "_w"
        self.loops: list[tuple[str, str]] = []  # (index variable, loop name shadowed) stack

    # --- emitting -------------------------------------------------------------------------

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    @contextmanager
    def block(self) -> Iterator[None]:
        self.indent += 1
        yield
        self.indent -= 1

    @contextmanager
    def scope(self) -> Iterator[None]:
        self.scopes.append({})
        yield
        self.scopes.pop()

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}_{self.counter}"

    def bind(self, name: str) -> str:
        """A Python name for a template variable set in the current scope."""
        if name in self.scopes[-1]:
            return self.scopes[-1][name]
        ident = self.fresh(f"l_{name}")
        self.scopes[-1][name] = ident
        return ident

    def fail(self, node: nodes.Node, what: str) -> UnsupportedTemplate:
        return UnsupportedTemplate(f"{self.name}:{node.lineno}: not compiled: {what}")

    # --- statements -----------------------------------------------------------------------

    def statements(self, body: list[nodes.Node]) -> None:
        for node in body:
            self.statement(node)

    def statement(self, node: nodes.Node) -> None:
        if isinstance(node, nodes.Output):
            for child in node.nodes:
                if isinstance(child, nodes.TemplateData):
                    if child.data:
                        self.emit(f"{self.writer}({child.data!r})")
                else:
                    self.emit(f"{self.writer}(str({self.expr(child)}))")
        elif isinstance(node, nodes.If):
            self.emit(f"if {self.expr(node.test)}:")
            self.body(node.body)
            for elif_ in node.elif_:
                self.emit(f"elif {self.expr(elif_.test)}:")
                self.body(elif_.body)
            if node.else_:
                self.emit("else:")
                self.body(node.else_)
        elif isinstance(node, nodes.For):
            self.for_loop(node)
        elif isinstance(node, nodes.Block):
            if node.scoped or node.required:
                raise self.fail(node, "scoped or required block")
            with self.scope():  # a block's own assignments are its own
                self.statements(node.body)
        elif isinstance(node, nodes.Assign):
            if not isinstance(node.target, nodes.Name):
                raise self.fail(node, "assignment to more than one name")
            value = self.expr(node.node)
            self.emit(f"{self.bind(node.target.name)} = {value}")
        elif isinstance(node, nodes.AssignBlock):
            if not isinstance(node.target, nodes.Name) or node.filter is not None:
                raise self.fail(node, "set block with a filter or several names")
            self.emit(f"{self.bind(node.target.name)} = {self.captured(node.body)}")
        elif isinstance(node, nodes.Macro):
            self.macro(node)
        else:
            raise self.fail(node, type(node).__name__)

    def body(self, body: list[nodes.Node]) -> None:
        with self.block():
            before = len(self.lines)
            self.statements(body)
            if len(self.lines) == before:
                self.emit("pass")

    def captured(self, body: list[nodes.Node]) -> str:
        """Emit ``body`` into a buffer of its own; the expression joining it."""
        buffer, writer = self.fresh("_buf"), self.fresh("_w")
        self.emit(f"{buffer}: list[str] = []")
        self.emit(f"{writer} = {buffer}.append")
        outer, self.writer = self.writer, writer
        self.statements(body)
        self.writer = outer
        return f'"".join({buffer})'

    def for_loop(self, node: nodes.For) -> None:
        if node.else_ or node.test is not None or node.recursive:
            raise self.fail(node, "for with else, a filter or recursion")
        iterable = self.expr(node.iter)
        with self.scope():
            index = self.fresh("_index")
            if isinstance(node.target, nodes.Name):
                target = self.bind(node.target.name)
            elif isinstance(node.target, nodes.Tuple) and all(
                isinstance(item, nodes.Name) for item in node.target.items
            ):
                names = [self.bind(item.name) for item in node.target.items]  # type: ignore[attr-defined]
                target = "(" + ", ".join(names) + ",)"
            else:
                raise self.fail(node, "this loop target")
            self.loops.append((index, "loop"))
            if any(n.name == "loop" for n in node.find_all(nodes.Name)):
                self.emit(f"for {index}, {target} in enumerate({iterable}):")
            else:
                self.emit(f"for {target} in {iterable}:")
            self.body(node.body)
            self.loops.pop()

    def macro(self, node: nodes.Macro) -> None:
        if node.defaults or any(
            isinstance(n, nodes.Name) and n.name in ("caller", "varargs", "kwargs")
            for n in node.find_all(nodes.Name)
        ):
            raise self.fail(node, "macro with defaults, caller, varargs or kwargs")
        ident = self.bind(node.name)
        with self.scope():
            params = [self.bind(arg.name) for arg in node.args]
            self.emit(f"def {ident}({', '.join(f'{p}: Any' for p in params)}) -> str:")
            outer_loops, self.loops = self.loops, []
            with self.block():
                joined = self.captured(node.body)
                self.emit(f"return {joined}")
            self.loops = outer_loops

    # --- expressions ----------------------------------------------------------------------

    def lookup(self, node: nodes.Name) -> str:
        for scope in reversed(self.scopes):
            if node.name in scope:
                return scope[node.name]
        self.context_names.add(node.name)
        return f"c_{node.name}"

    def expr(self, node: nodes.Node) -> str:
        if isinstance(node, nodes.Const):
            return repr(node.value)
        if isinstance(node, nodes.Name):
            if node.name == "loop":
                raise self.fail(node, "loop other than loop.index0 or loop.index")
            return self.lookup(node)
        if isinstance(node, nodes.Getattr):
            if isinstance(node.node, nodes.Name) and node.node.name == "loop" and self.loops:
                index = self.loops[-1][0]
                if node.attr == "index0":
                    return index
                if node.attr == "index":
                    return f"({index} + 1)"
                raise self.fail(node, f"loop.{node.attr}")
            if node.attr.startswith("_"):  # the sandbox refuses it: so does the build
                raise self.fail(node, f"attribute {node.attr}")
            return f"_attr({self.expr(node.node)}, {node.attr!r})"
        if isinstance(node, nodes.Getitem):
            if isinstance(node.arg, nodes.Slice):
                parts = [
                    "" if part is None else self.expr(part)
                    for part in (node.arg.start, node.arg.stop, node.arg.step)
                ]
                return f"{self.expr(node.node)}[{parts[0]}:{parts[1]}:{parts[2]}]"
            return f"_item({self.expr(node.node)}, {self.expr(node.arg)})"
        if isinstance(node, nodes.Filter):
            if node.node is None or node.kwargs or node.dyn_args or node.dyn_kwargs:
                raise self.fail(node, f"filter {node.name} with keywords or as a block")
            args = ", ".join([self.expr(node.node), *(self.expr(a) for a in node.args)])
            if node.name in BUILTIN_FILTERS:
                return f"{BUILTIN_FILTERS[node.name]}({args})"
            if node.name in OWN_FILTERS:
                return f"f_{node.name}({args})"
            raise self.fail(node, f"filter {node.name}")
        if isinstance(node, nodes.Test):
            if node.name != "none" or node.args or node.kwargs:
                raise self.fail(node, f"test {node.name}")
            return f"({self.expr(node.node)} is None)"
        if isinstance(node, nodes.Not):
            return f"(not {self.expr(node.node)})"
        if isinstance(node, nodes.And):
            return f"({self.expr(node.left)} and {self.expr(node.right)})"
        if isinstance(node, nodes.Or):
            return f"({self.expr(node.left)} or {self.expr(node.right)})"
        if isinstance(node, nodes.Add):
            return f"({self.expr(node.left)} + {self.expr(node.right)})"
        if isinstance(node, nodes.CondExpr):
            if node.expr2 is None:
                raise self.fail(node, "conditional expression without else")
            return (
                f"({self.expr(node.expr1)} if {self.expr(node.test)} else {self.expr(node.expr2)})"
            )
        if isinstance(node, nodes.Compare):
            text = self.expr(node.expr)
            for operand in node.ops:
                if operand.op not in _COMPARE:
                    raise self.fail(node, f"comparison {operand.op}")
                text += f" {_COMPARE[operand.op]} {self.expr(operand.expr)}"
            return f"({text})"
        if isinstance(node, nodes.Call):
            if (
                not isinstance(node.node, nodes.Name)
                or node.kwargs
                or node.dyn_args
                or node.dyn_kwargs
                or not any(node.node.name in scope for scope in self.scopes)
            ):
                raise self.fail(node, "a call of anything but the template's own macro")
            return f"{self.lookup(node.node)}({', '.join(self.expr(a) for a in node.args)})"
        if isinstance(node, (nodes.List, nodes.Tuple)):
            items = ", ".join(self.expr(item) for item in node.items)
            return f"[{items}]" if isinstance(node, nodes.List) else f"({items},)"
        raise self.fail(node, type(node).__name__)


def function_name(template: str) -> str:
    return "render_" + "".join(c if c.isalnum() else "_" for c in template)


def compile_template(name: str, source: str) -> list[str]:
    """The Python function (source lines) that renders template ``name`` from ``source``."""
    tree = template_parser().parse(source, name)
    if any(True for _ in tree.find_all((nodes.Extends, nodes.Include, nodes.Import))):
        raise UnsupportedTemplate(f"{name}: extends, include or import: not compiled")
    compiler = _Compiler(name)
    compiler.emit("_buf: list[str] = []")
    compiler.emit("_w = _buf.append")
    compiler.statements(tree.body)
    compiler.emit('return "".join(_buf)')
    head = [
        f"def {function_name(name)}(",
        "    context: Mapping[str, Any], filters: Mapping[str, Callable[..., Any]]",
        ") -> str:",
        f'    """{name}, compiled from the template with SHA-256 {source_digest(source)}."""',
    ]
    head += [f"    f_{f} = filters[{f!r}]" for f in OWN_FILTERS]
    head += [f"    c_{n} = context[{n!r}]" for n in sorted(compiler.context_names)]
    return head + compiler.lines


def compiled_module(templates: dict[str, str], generator: str) -> str:
    """The module of every template in ``templates`` (name -> source)."""
    lines = [
        f"# Generated by {generator} from templates/*.j2: do not edit by hand.",
        '"""The shipped job templates compiled to plain Python (see',
        "``clusterjob.jobscript.template_compiler``): rendering the shipped template imports no",
        "Jinja2. ``SHIPPED`` maps each template's name to the SHA-256 of the source it was",
        "compiled from and its function; a template whose source differs is rendered by",
        'Jinja2."""',
        "",
        "from __future__ import annotations",
        "",
        "from collections.abc import Callable, Mapping",
        "from typing import Any",
        "",
        "",
        RUNTIME,
    ]
    shipped = []
    for name in sorted(templates):
        lines += ["", *compile_template(name, templates[name]), ""]
        shipped.append(
            f"    {name!r}: ({source_digest(templates[name])!r}, {function_name(name)}),"
        )
    lines += [
        "",
        "SHIPPED: dict[str, tuple[str, Callable[[Mapping[str, Any], Mapping[str, Callable[..., "
        "Any]]], str]]] = {",
        *shipped,
        "}",
    ]
    return "\n".join(lines) + "\n"


def shipped_templates(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.glob("*.j2"))}
