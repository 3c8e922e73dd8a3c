"""Move ``@check(...)`` registrations after their functions, for mutmut (scratch copies only).

mutmut 3 does not mutate a decorated function, and each node check is registered with the
``@check(...)`` decorator. ``scripts/mutation.sh`` runs this over the modules it is about to
mutate, in its scratch copy of the tree: each

    @check("cuda-order", ...)
    def cuda_order(facts): ...

becomes ``def cuda_order(facts): ...`` followed by ``check("cuda-order", ...)(cuda_order)``.
The decorator returns the function unchanged, so the same functions are registered in the
same order; the bodies are then mutated like any other function. Never run on the
repository's own files.

Usage: python scripts/mutation_undecorate.py MODULE.py ...
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REGISTRATIONS = {"check"}  # decorators that only register the function and return it


def undecorate(source: str) -> str:
    lines = source.splitlines(keepends=True)
    moves = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef) or len(node.decorator_list) != 1:
            continue
        deco = node.decorator_list[0]
        if (
            isinstance(deco, ast.Call)
            and isinstance(deco.func, ast.Name)
            and deco.func.id in REGISTRATIONS
        ):
            call = ast.get_source_segment(source, deco)
            assert call is not None and node.end_lineno is not None
            moves.append((deco.lineno, node.lineno, node.end_lineno, call, node.name))
    for first, def_line, end, call, func in reversed(moves):
        lines[end:end] = [f"{call}({func})\n"]
        del lines[first - 1 : def_line - 1]
    return "".join(lines)


def main(paths: list[str]) -> None:
    for name in paths:
        path = Path(name)
        before = path.read_text()
        after = undecorate(before)
        if after != before:
            path.write_text(after)


if __name__ == "__main__":
    main(sys.argv[1:])
