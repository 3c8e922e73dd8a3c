"""Rendering in this process, exact: the interpreter lines of the script, what a site
template gets and how its errors are reported (file, line, key path, message).

The whole rendered scripts of the shipped sites are golden files (test_render_golden.py);
this file is about the choices ``render`` makes around the template.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_request import GRES_SITE, make_site

from clusterjob.errors import ConfigError, UsageError
from clusterjob.jobscript.interpreter import Interpreter
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve


def job(site=GRES_SITE, **kw: object):
    return resolve(site, JobRequest("train.py", model="A100", **kw), choose_interpreter=False)  # type: ignore[arg-type]


def python_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith(("# Python:", "python="))]


def test_with_no_interpreter_chosen_the_script_names_clusterjobs_own() -> None:
    script = render(GRES_SITE, job()).script
    assert f"# Python: {sys.executable} (clusterjob's own interpreter (nothing chose one))" in (
        python_lines(script)
    )


def test_an_interpreter_given_to_render_wins_over_the_chosen_one() -> None:
    chosen = replace(
        job(), interpreter=Interpreter("/opt/py/bin/python", "--python", bin_dir="/opt/py/bin")
    )
    script = render(GRES_SITE, chosen, python="/usr/bin/python3").script
    assert "# Python: /usr/bin/python3 (given to render)" in python_lines(script)
    assert "export PATH=/opt/py/bin:" not in script  # the chosen env's bin dir is not used
    script = render(GRES_SITE, chosen).script
    assert "# Python: /opt/py/bin/python (--python)" in python_lines(script)
    assert 'export PATH=/opt/py/bin:"$PATH"' in script


def test_a_conda_env_has_no_interpreter_path_until_activated() -> None:
    chosen = replace(
        job(),
        interpreter=Interpreter(None, "--conda", conda="torch", conda_exe="/opt/conda/bin/conda"),
    )
    script = render(GRES_SITE, chosen).script
    assert "# Python: conda env torch (--conda), activated through conda's own shell hook." in (
        script.splitlines()
    )
    assert "conda_exe=/opt/conda/bin/conda" in script.splitlines()
    assert f"# Python: {sys.executable}" not in script


def site_with_template(tmp_path: Path, text: str):
    (tmp_path / "job.sh.j2").write_text(text)
    return make_site(templates_dir=tmp_path)


def test_whitespace_around_template_blocks_is_trimmed(tmp_path: Path) -> None:
    site = site_with_template(
        tmp_path, "#!/bin/bash\n    {% if job %}\nhello {{ job.job_name }}\n    {% endif %}\n"
    )
    assert render(site, job(site)).script == "#!/bin/bash\nhello train\n"


def test_a_missing_included_template_names_the_site_template_dir(tmp_path: Path) -> None:
    site = site_with_template(tmp_path, '{% include "nope.j2" %}\n')
    with pytest.raises(ConfigError) as info:
        render(site, job(site))
    [issue] = info.value.issues
    assert (issue.file, issue.line, issue.key_path, issue.message) == (
        str(tmp_path),
        None,
        "templates",
        "template not found: nope.j2",
    )


def test_a_template_error_names_the_file_line_and_the_error(tmp_path: Path) -> None:
    site = site_with_template(tmp_path, "#!/bin/bash\n\n{{ no_such_thing.x }}\n")
    with pytest.raises(ConfigError) as info:
        render(site, job(site))
    [issue] = info.value.issues
    assert (issue.file, issue.line, issue.key_path, issue.message) == (
        str(tmp_path / "job.sh.j2"),
        3,
        "templates",
        "UndefinedError: 'no_such_thing' is undefined",
    )


def test_a_template_that_writes_nul_is_refused(tmp_path: Path) -> None:
    site = site_with_template(tmp_path, "#!/bin/bash\necho {{ '\\x00' }}\n")
    with pytest.raises(UsageError) as info:
        render(site, job(site))
    assert str(info.value).startswith("NUL character in the rendered job script is not allowed")


@pytest.mark.parametrize(
    ("expression", "shown"),
    [
        ("{{ job.partition.name }}", "gpu"),
        ("{{ job.request.args }}", "('--lr', '1')"),
        ("{{ job.model == job.model }}", "True"),
        ("{{ job.model != job.request }}", "True"),
        ("{{ job['job_name'] }}", "train"),
        ("{{ job.partition.defaults.account }}", "ml"),
        ("{{ site.name }}", "mllab"),
        ("{{ token|length }}", "16"),
    ],
)
def test_what_a_template_sees(tmp_path: Path, expression: str, shown: str) -> None:
    site = site_with_template(tmp_path, f"#!/bin/bash\n# {expression}\n")
    rendered = render(site, job(site, args=("--lr", "1")))
    assert rendered.script == f"#!/bin/bash\n# {shown}\n"


@pytest.mark.parametrize("expression", ["{{ job._fields }}", "{{ job['nope'] }}", "{{ job.nope }}"])
def test_what_a_template_cannot_reach(tmp_path: Path, expression: str) -> None:
    site = site_with_template(tmp_path, f"#!/bin/bash\n# {expression}\n")
    with pytest.raises(ConfigError) as info:
        render(site, job(site))
    assert info.value.issues[0].key_path == "templates"
