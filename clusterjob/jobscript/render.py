"""Turn a ``ResolvedJob`` into a job script with sandboxed Jinja2 templates.

Templates are looked up in the site's template directory first, then in the shipped
``templates/``. A site may override ``job.sh.j2`` outright or extend it: inside a site's own
``job.sh.j2``, ``{% extends "job.sh.j2" %}`` means the shipped one (also reachable anywhere
as ``clusterjob/job.sh.j2``). Every value that reaches the shell goes through the ``q``
filter; every value on an ``#SBATCH`` line through ``sbatch`` / ``sbatch_option``.

Where the site uses a shipped template as it is, its compiled form renders it
(``shipped_templates``, written by scripts/gen_compiled.py): the same bytes, without importing
Jinja2 (a third of a ``submit``'s start-up). Jinja2 renders everything else.
"""

from __future__ import annotations

import hashlib
import shlex
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from pathlib import Path, PurePath

from clusterjob import resources
from clusterjob.errors import ClusterjobError, ConfigError, ConfigIssue, printable
from clusterjob.jobscript.backends import backend_for
from clusterjob.jobscript.interpreter import Interpreter
from clusterjob.jobscript.request import ResolvedJob
from clusterjob.jobscript.requeues import LIMIT_EXIT, PREFLIGHT_EXIT
from clusterjob.jobscript.shell import (
    check_no_nul,
    sbatch_option,
    sbatch_value,
    shell_join,
    shell_quote,
)
from clusterjob.jobscript.steps import job_steps
from clusterjob.record import Record
from clusterjob.site.model import Site

JOB_TEMPLATE = "job.sh.j2"
SHIPPED_PREFIX = "clusterjob"  # "clusterjob/job.sh.j2" always names the shipped template


@dataclass(frozen=True)
class RenderedJob:
    """A job script and the exact sbatch command that submits it once written to disk."""

    script: str
    sbatch_argv: list[str]  # ["sbatch", "--parsable", <script path>]
    token: str

    @property
    def script_path(self) -> str:
        return self.sbatch_argv[-1]

    def sbatch_argv_for(self, path: str | Path, *, test_only: bool = False) -> list[str]:
        """The sbatch command for the script written at ``path`` (``--test-only``: validate,
        submit nothing; sbatch then prints its estimate on stderr)."""
        return ["sbatch", "--test-only" if test_only else "--parsable", str(path)]

    def sbatch_command(self) -> str:
        """``sbatch_argv`` as one line a person can paste into a shell."""
        return shell_join(self.sbatch_argv)


def comment_text(value: object) -> str:
    """``value`` for a ``#`` comment line of the script: control characters (a newline that
    would end the comment) escaped."""
    return printable(str(value))


# The filters every job template may use, by name (the Jinja2 environment's and the compiled
# templates' alike).
TEMPLATE_FILTERS: dict[str, Callable[..., str]] = {
    "q": shell_quote,
    "sbatch": sbatch_value,
    "sbatch_option": sbatch_option,
    "comment": comment_text,
}


class TemplateRecord:
    """A read-only view of one of our dataclasses or records (``clusterjob.record``) for
    templates: its fields, as plain values.

    The Jinja2 sandbox only hides underscore names; it still lets a template call any public
    method of any object it reaches (``pathlib.Path.read_text``, ``write_text``...). So what a
    template sees holds only strings, numbers, booleans, None, lists, tuples, dicts and these
    records, converted on access (a 10,000-node map costs nothing unless a template walks it),
    each field once per view: the shipped template reads a sweep's task list five times.
    """

    __slots__ = ("_converted", "_fields", "_obj")
    _converted: dict[str, object]
    _fields: frozenset[str]
    _obj: object

    def __init__(self, obj: object) -> None:
        object.__setattr__(self, "_obj", obj)
        names = obj._fields if isinstance(obj, Record) else [f.name for f in fields(obj)]  # type: ignore[arg-type]
        object.__setattr__(self, "_fields", frozenset(names))
        object.__setattr__(self, "_converted", {})

    def __getattr__(self, name: str) -> object:
        if name.startswith("_") or name not in self._fields:
            raise AttributeError(name)
        converted = self._converted
        if name not in converted:
            converted[name] = template_value(getattr(self._obj, name))
        return converted[name]

    def __getitem__(self, name: str) -> object:
        try:
            return self.__getattr__(name)
        except AttributeError:
            raise KeyError(name) from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("template values are read-only")

    def __str__(self) -> str:
        return str(self._obj)

    def __eq__(self, other: object) -> bool:
        other = other._obj if isinstance(other, TemplateRecord) else other
        return bool(self._obj == other)

    def __hash__(self) -> int:
        return hash(self._obj)


def template_value(value: object) -> object:
    """``value`` as a template may see it: plain data only (see ``TemplateRecord``)."""
    if isinstance(value, Enum):
        return template_value(value.value)
    if value is None or type(value) in (bool, int, float, str):
        return value
    for plain in (bool, int, float, str):  # a subclass: its plain value, not its methods
        if isinstance(value, plain):
            return plain(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Record) or (is_dataclass(value) and not isinstance(value, type)):
        return TemplateRecord(value)
    if isinstance(value, tuple):
        return tuple(template_value(v) for v in value)
    if isinstance(value, (list, set, frozenset)):
        return [template_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): template_value(v) for k, v in value.items()}
    return str(value)  # any other object: its text, never its methods


def default_node_command(site: Site) -> list[str]:
    """How the job script calls clusterjob on a node: the site's ``node_command`` if set,
    else this interpreter (``python -m clusterjob``), which shares the login node's install."""
    if site.node_command:  # one string in the site YAML, split as a shell would
        return shlex.split(site.node_command)
    return [sys.executable, "-m", "clusterjob"]


def _template_location(exc: BaseException) -> tuple[str, int | None]:
    """The template file and line an error was raised at, from Jinja's rewritten traceback."""
    import jinja2

    if isinstance(exc, jinja2.TemplateSyntaxError):
        return exc.filename or exc.name or JOB_TEMPLATE, exc.lineno
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        # Jinja rewrites the traceback so template frames carry the template's file name.
        if not frame.filename.endswith(".py") and not frame.filename.startswith("<"):
            return frame.filename, frame.lineno
    return JOB_TEMPLATE, None


def render(
    site: Site,
    resolved: ResolvedJob,
    *,
    script_path: str | Path | None = None,
    python: str | None = None,
    node_command: Sequence[str] | None = None,
) -> RenderedJob:
    """Render the job script for ``resolved`` at ``site``.

    ``script_path`` is where the caller will write the script (it only appears in the sbatch
    command); ``python`` overrides the interpreter ``resolve`` chose (when nothing chose one:
    this interpreter); ``node_command``
    runs clusterjob on the nodes (default: ``default_node_command(site)``).
    """
    chosen = resolved.interpreter or Interpreter(
        None, "clusterjob's own interpreter (nothing chose one)"
    )
    context = {  # plain values only: see TemplateRecord
        "job": template_value(resolved),
        "request": template_value(resolved.request),
        "steps": template_value(job_steps(site, resolved)),  # each srun step's own layout
        "site": template_value(site),
        "token": str(resolved.token),
        "requeue_limit_exit": LIMIT_EXIT,  # an attempt past --max-requeues (jobscript.requeues)
        "preflight_exit": PREFLIGHT_EXIT,  # a required preflight that failed (jobs/badnodes.py)
        "python": str(python or chosen.python or ("" if chosen.conda else sys.executable)),
        "interpreter": {
            "why": "given to render" if python else chosen.why,
            "venv": chosen.venv,
            "conda": chosen.conda,
            "conda_exe": chosen.conda_exe,
            "bin_dir": None if python else chosen.bin_dir,
        },
        "node_command": [str(a) for a in (node_command or default_node_command(site))],
        "site_file": str(Path(site.source).resolve()),
    }
    backend = backend_for(site)  # the scheduler's template and its directive lines
    context["directives"] = list(backend.directives(resolved))
    script = _render_compiled(site, backend.template, context)
    if script is None:
        script = _render_jinja(site, backend.template, context)
    check_no_nul(script, "the rendered job script")
    if not script.endswith("\n"):
        script += "\n"
    path = str(script_path) if script_path is not None else f"clusterjob-{resolved.token}.sh"
    return RenderedJob(script=script, sbatch_argv=backend.submit_argv(path), token=resolved.token)


def _render_compiled(site: Site, name: str, context: Mapping[str, object]) -> str | None:
    """The shipped template ``name`` rendered by its compiled form (no Jinja2), where the site
    uses the shipped one and the compiled form was built from the source installed beside it;
    None where Jinja2 must render it: a site's own template, a shipped template edited since
    scripts/gen_compiled.py ran, or any error (Jinja2 then says what and at which line)."""
    if site.templates_dir is not None and (Path(site.templates_dir) / name).is_file():
        return None
    from clusterjob.jobscript.shipped_templates import SHIPPED

    if name not in SHIPPED:
        return None
    digest, compiled = SHIPPED[name]
    try:
        with open(resources.templates_dir() / name, "rb") as fh:
            if hashlib.sha256(fh.read()).hexdigest() != digest:
                return None
        return compiled(context, TEMPLATE_FILTERS)
    except Exception:  # rendered again by Jinja2, which raises the error with its location
        return None


def _render_jinja(site: Site, name: str, context: Mapping[str, object]) -> str:
    """Template ``name`` rendered by the sandboxed Jinja2 environment of ``site``."""
    import jinja2

    from clusterjob.jobscript.template_env import template_environment

    env = template_environment(site)
    try:
        template = env.get_template(name)
        return template.render(context)
    except ClusterjobError:
        raise
    except jinja2.TemplateNotFound as exc:
        where = str(site.templates_dir or resources.templates_dir())
        raise ConfigError(
            ConfigIssue(where, None, "templates", f"template not found: {exc.name}")
        ) from None
    except (jinja2.TemplateError, TypeError, ValueError) as exc:
        file, line = _template_location(exc)
        message = getattr(exc, "message", None) or str(exc)
        raise ConfigError(
            ConfigIssue(file, line, "templates", f"{type(exc).__name__}: {message}")
        ) from None
