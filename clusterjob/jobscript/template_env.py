"""The sandboxed Jinja2 environment of the job templates: a site's own templates, and the
shipped ones wherever their compiled form (``shipped_templates``) cannot stand in.

Kept apart from ``render`` so that rendering the shipped template imports no Jinja2.
"""

from __future__ import annotations

import contextlib

import jinja2
import jinja2.bccache
from jinja2.sandbox import SandboxedEnvironment

from clusterjob import resources
from clusterjob.jobscript.render import SHIPPED_PREFIX, TEMPLATE_FILTERS
from clusterjob.site.model import Site


class _JobTemplateEnvironment(SandboxedEnvironment):
    """A template that extends or includes its own name means the shipped one."""

    def join_path(self, template: str, parent: str) -> str:
        if template == parent and not template.startswith(SHIPPED_PREFIX + "/"):
            return f"{SHIPPED_PREFIX}/{template}"
        return template


class _CompiledTemplates(jinja2.FileSystemBytecodeCache):
    """Compiled templates kept in the user's cache, so that a submit reads the template's
    code instead of compiling it (Jinja2's lexer, parser and code generator: about half of
    ``submit --dry-run``'s own time). Jinja2 checks each entry against the template's source
    and its own and Python's version; the key adds this environment's settings."""

    def get_cache_key(self, name: str, filename: str | None = None) -> str:
        return super().get_cache_key(f"{_ENVIRONMENT_KEY}|{name}", filename)

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # unreadable or damaged entry: compile again, as without a cache
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):  # a full disk costs the next submit a compile
            super().dump_bytecode(bucket)


_ENVIRONMENT_KEY = "clusterjob-sandboxed:strict:trim:lstrip:keep-newline:1"


def _compiled_templates() -> jinja2.BytecodeCache | None:
    """The compiled-template cache: ``$XDG_CACHE_HOME/clusterjob/templates``, when private."""
    directory = resources.private_cache_dir("templates")
    return _CompiledTemplates(str(directory)) if directory is not None else None


def template_environment(site: Site) -> SandboxedEnvironment:
    """The sandboxed environment for ``site``: its templates first, then the shipped ones."""
    shipped = jinja2.FileSystemLoader(str(resources.templates_dir()))
    loaders: list[jinja2.BaseLoader] = []
    if site.templates_dir is not None:
        loaders.append(jinja2.FileSystemLoader(str(site.templates_dir)))
    loaders.append(jinja2.PrefixLoader({SHIPPED_PREFIX: shipped}))
    loaders.append(shipped)
    env = _JobTemplateEnvironment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        bytecode_cache=_compiled_templates(),
    )
    env.filters.update(TEMPLATE_FILTERS)
    return env
