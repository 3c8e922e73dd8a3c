"""What makes ``submit`` start fast without changing what it does: a site's templates compiled
once into the user's cache (the shipped one is compiled to Python at build time, see
test_render_compiled.py), and the python3 shim on PATH asked while the rest of the command
runs."""

from __future__ import annotations

import gc
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_request import GRES_SITE, make_site

import clusterjob.jobscript.template_env as template_env
from clusterjob import resources
from clusterjob.jobscript.interpreter import find_submit_python, start_find_submit_python
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.model import Site


def _script(site: Site) -> str:
    request = JobRequest(script="train.py", gpus=2, model="A100", submit_python=sys.executable)
    rendered = render(site, resolve(site, request))
    return rendered.script.replace(rendered.token, "TOKEN")


def _cached(tmp_path: Path) -> list[Path]:
    directory = Path(os.environ["XDG_CACHE_HOME"]) / "clusterjob" / "templates"
    return sorted(directory.glob("*.cache")) if directory.is_dir() else []


def _no_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("the template was compiled again")

    monkeypatch.setattr(template_env._JobTemplateEnvironment, "compile", refuse)


def _extending_site(tmp_path: Path) -> Site:
    """A site whose own job.sh.j2 extends the shipped one: both are Jinja2's to compile."""
    templates = tmp_path / "site-templates"
    templates.mkdir(exist_ok=True)
    (templates / "job.sh.j2").write_text(
        '{% extends "job.sh.j2" %}\n{% block launch %}echo site\n{% endblock %}\n'
    )
    return make_site(templates_dir=templates)


def test_a_second_render_reads_the_compiled_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = _extending_site(tmp_path)
    first = _script(site)
    entries = _cached(tmp_path)
    assert len(entries) == 2  # the site's template and the shipped one it extends
    assert stat.S_IMODE(entries[0].parent.stat().st_mode) == 0o700
    _no_compiling(monkeypatch)
    assert _script(site) == first


def test_an_edited_template_is_compiled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    template = templates / "job.sh.j2"
    template.write_text('{% extends "job.sh.j2" %}\n{% block launch %}echo one\n{% endblock %}\n')
    site = make_site(templates_dir=templates)
    assert "echo one" in _script(site)
    template.write_text('{% extends "job.sh.j2" %}\n{% block launch %}echo two\n{% endblock %}\n')
    later = _script(site)
    assert "echo two" in later and "echo one" not in later


def test_a_cache_others_may_write_to_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the cache holds is code this process runs: never from a directory another user
    could have written."""
    directory = Path(os.environ["XDG_CACHE_HOME"]) / "clusterjob" / "templates"
    directory.mkdir(parents=True)
    directory.chmod(0o777)
    _script(_extending_site(tmp_path))
    assert _cached(tmp_path) == []


def test_a_damaged_entry_is_compiled_again(tmp_path: Path) -> None:
    site = _extending_site(tmp_path)
    first = _script(site)
    for entry in _cached(tmp_path):
        entry.write_bytes(entry.read_bytes()[:40] + b"\x00garbage")
    assert _script(site) == first


def test_the_shipped_template_needs_no_cache(tmp_path: Path) -> None:
    """Its compiled form is in the package: nothing compiled, nothing written."""
    assert _script(GRES_SITE).startswith("#!/bin/bash\n")
    assert _cached(tmp_path) == []


def _shim(tmp_path: Path, wait_for: Path) -> dict[str, str]:
    """A pyenv-like python3 that answers only once ``wait_for`` exists."""
    shim = tmp_path / "shims" / "python3"
    shim.parent.mkdir()
    shim.write_text(
        f'#!/bin/sh\nwhile [ ! -e "{wait_for}" ]; do sleep 0.02; done\nexec {sys.executable} "$@"\n'
    )
    shim.chmod(0o755)
    return {"PATH": str(shim.parent)}


def test_the_shim_runs_while_the_caller_works(tmp_path: Path) -> None:
    """Starting does not wait for the shim: it answers only after the caller went on (had
    start waited, the shim would never see its file and the answer would be the shim)."""
    go = tmp_path / "go"
    environ = _shim(tmp_path, go)
    answer = start_find_submit_python(environ)
    go.touch()  # the rest of submit: imports, the site
    assert answer().python == sys.executable
    assert find_submit_python(environ).python == sys.executable


def test_a_shim_never_asked_for_its_answer_is_ended_quietly(tmp_path: Path) -> None:
    """A submit that fails before it resolves the request (a bad site) leaves no child and no
    ResourceWarning (which the test settings turn into an error)."""
    answer = start_find_submit_python(_shim(tmp_path, tmp_path / "never"))
    del answer
    gc.collect()


def test_a_start_kept_for_later_is_taken_once(tmp_path: Path) -> None:
    """``clusterjob submit`` starts the shim as the process starts; the command takes that
    same pending answer, and a later ask (another submit in this process) asks again."""
    go = tmp_path / "go"
    go.touch()
    environ = _shim(tmp_path, go)
    kept = start_find_submit_python(environ, for_later=True)
    assert start_find_submit_python(dict(environ, OTHER="1")) is not kept
    taken = start_find_submit_python(environ)
    assert taken is kept
    assert taken().python == taken().python == sys.executable  # asked twice: one answer
    assert start_find_submit_python(environ) is not kept


def test_submit_through_main_resolves_the_shim(tmp_path: Path) -> None:
    go = tmp_path / "go"
    go.touch()
    environ = dict(os.environ, **_shim(tmp_path, go))
    environ["PATH"] += os.pathsep + os.environ["PATH"]
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    site = resources.site_configs_dir() / "mllab.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", "submit", str(script), "--gpus", "1",
         "--model", "A100", "--site", str(site), "--dry-run"],
        env=environ, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"python={sys.executable}\n" in done.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["submit", "t.py", "--python", "/usr/bin/python3"], True),
        (["submit", "--venv=.venv", "t.py"], True),
        (["submit", "--conda", "torch", "t.py"], True),
        (["submit", "--container-image", "img", "t.py"], True),
        (["submit", "t.py", "--gpus", "1"], False),
        (["submit", "--", "run.sh", "--python", "x"], False),  # the command's own option
    ],
)
def test_the_shim_is_not_started_for_a_named_interpreter(args: list[str], named: bool) -> None:
    """`submit` with an interpreter named never asks python3 on PATH: no shim to run then,
    taking a core from the command's own start."""
    from clusterjob.__main__ import _names_interpreter

    assert _names_interpreter(args) is named
