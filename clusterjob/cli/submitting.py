"""What ``clusterjob submit`` does with its options, without Typer.

The options are declared once, for Typer, in ``clusterjob.cli.submit``, whose command passes
them all here by name; the fast path (``clusterjob.cli.fastpath``) reads the usual command
lines from the table generated from those declarations and calls ``run_submit`` with the same
names and values, so both ways run this one function.
"""

from __future__ import annotations

import json
import sys

from clusterjob.cli.common import the_cluster
from clusterjob.errors import UsageError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

# The command's own options; every other one is a field of the request (``Cluster.prepare``),
# under the option's name or, where the option is repeatable, the name of the tuple it fills.
_COMMAND_OPTIONS = (
    "script",
    "args",
    "site",
    "dry_run",
    "test_only",
    "mkdir",
    "as_json",
    "parsable",
)
_REPEATED = {
    "gres": "gres",
    "sbatch_arg": "sbatch_args",
    "launcher_arg": "launcher_args",
    "setup": "setup",
    "module": "modules",
    "env": "env",
    "sweep": "sweep",
}


def run_submit(**options: Any) -> int | None:
    """Submit SCRIPT (or -- CMD ARGS) with GPUs of one model, in this site's own sbatch syntax."""
    script, args, site, dry_run, test_only, mkdir, as_json, parsable = (
        options.pop(name) for name in _COMMAND_OPTIONS
    )
    if dry_run and test_only:
        raise UsageError("--dry-run and --test-only exclude each other")
    if as_json and parsable:
        raise UsageError("--json and --parsable exclude each other")
    if options["sweep"] and options["params"] is not None:
        raise UsageError("--sweep and --params exclude each other")
    if script is None:
        raise UsageError("submit needs a SCRIPT, or -- and a command (submit -- CMD ARGS)")
    request: dict[str, Any] = {
        _REPEATED.get(k, k): (v or () if k in _REPEATED else v) for k, v in options.items()
    }
    cluster = the_cluster(site)
    prepared = cluster.prepare(script, list(args or []), **request)
    rendered = prepared.rendered
    for note in prepared.notes:
        print(f"note: {note}", file=sys.stderr)
    if dry_run:
        print(rendered.script, end="")
        print(
            f"# dry run: nothing submitted. To submit by hand, save this script as "
            f"{rendered.script_path} and run:"
        )
        print(f"# {rendered.sbatch_command()}")
        return None
    from clusterjob.jobs import submit as job_submit

    result = cluster.submit_prepared(prepared, test_only=test_only, mkdir=mkdir)
    if isinstance(result, job_submit.Submitted) and (as_json or parsable):
        print(json.dumps(result.to_dict()) if as_json else result.job_id)
        return None
    print(str(result))
    return None
