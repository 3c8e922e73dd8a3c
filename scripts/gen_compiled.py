"""Write the generated modules that let a submit run without Jinja2 and without Typer:

- ``clusterjob/jobscript/shipped_templates.py``: every shipped template (templates/*.j2)
  compiled to plain Python (``clusterjob.jobscript.template_compiler``);
- ``clusterjob/cli/fast_commands.py``: the options of the hot commands, read from the click
  command Typer builds, and the command list Typer prints for ``clusterjob --help``
  (``clusterjob.cli.fastpath``).

    python scripts/gen_compiled.py           # rewrite them
    python scripts/gen_compiled.py --check   # exit 1 and name the modules that differ

"Build time" is this script, its output checked in, as scripts/gen_reference.py does for the
reference pages, rather than a hook in the wheel's build backend: a source checkout and an
editable install (how the tests, the benchmarks and the local cluster run clusterjob) then run
the same code as a wheel, mypy and the tests see it, and a review sees what changed. A stale
module cannot slip through: scripts/test.sh runs ``--check``, the tests compare both with what
Jinja2 and Typer give, and at run time a shipped template whose SHA-256 differs from the one
compiled is rendered by Jinja2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clusterjob.cli import fastpath  # noqa: E402
from clusterjob.jobscript import template_compiler  # noqa: E402

GENERATOR = "scripts/gen_compiled.py"
TEMPLATES_MODULE = ROOT / "clusterjob" / "jobscript" / "shipped_templates.py"
COMMANDS_MODULE = ROOT / "clusterjob" / "cli" / "fast_commands.py"


def modules() -> dict[Path, str]:
    templates = template_compiler.shipped_templates(ROOT / "templates")
    return {
        TEMPLATES_MODULE: template_compiler.compiled_module(templates, GENERATOR),
        COMMANDS_MODULE: fastpath.commands_module(GENERATOR),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args()
    stale = []
    for path, text in modules().items():
        current = path.read_text() if path.is_file() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date (run python {GENERATOR}): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
