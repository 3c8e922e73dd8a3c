"""Rendering in this process, exact: the interpreter lines of the script, what a site
template gets and how its errors are reported (file, line, key path, message).

The whole rendered scripts of the shipped sites are golden files (test_render_golden.py);
this file is about the choices ``render`` makes around the template.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

import pytest
from test_request import GRES_SITE, make_site

from clusterjob import resources
from clusterjob.errors import ConfigError, UsageError
from clusterjob.jobscript.interpreter import Interpreter
from clusterjob.jobscript.render import (
    TemplateRecord,
    comment_text,
    default_node_command,
    render,
    template_value,
)
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.jobscript.template_env import _ENVIRONMENT_KEY, template_environment
from clusterjob.record import Record


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


def test_a_template_keeps_its_own_trailing_blank_line(tmp_path: Path) -> None:
    site = site_with_template(tmp_path, "#!/bin/bash\necho hi\n\n")
    assert render(site, job(site)).script == "#!/bin/bash\necho hi\n\n"


def test_a_conda_env_gives_templates_no_python_path(tmp_path: Path) -> None:
    site = site_with_template(tmp_path, "#!/bin/bash\n# [{{ python }}]\n")
    chosen = replace(job(site), interpreter=Interpreter(None, "--conda", conda="torch"))
    assert render(site, chosen).script == "#!/bin/bash\n# []\n"


def test_comment_text_escapes_line_breaks_and_tabs() -> None:
    assert comment_text("a\nb\tc\x1b") == "a\\nb\\tc\\x1b"


# --- the compiled-template cache ---------------------------------------------------------


def cache_dir() -> Path:
    return Path(os.environ["XDG_CACHE_HOME"]) / "clusterjob" / "templates"


def test_compiled_templates_are_kept_under_the_environments_key(tmp_path: Path) -> None:
    site = site_with_template(tmp_path, "#!/bin/bash\necho hi\n")
    render(site, job(site))
    filename = str(tmp_path / "job.sh.j2")
    key = hashlib.sha1(f"{_ENVIRONMENT_KEY}|job.sh.j2|{filename}".encode()).hexdigest()
    assert sorted(p.name for p in cache_dir().iterdir()) == [f"__jinja2_{key}.cache"]


def test_a_compiled_template_in_the_cache_is_what_runs(tmp_path: Path) -> None:
    """The cache is read, not only written: an entry for this source is used as it is."""
    source = "#!/bin/bash\necho from-the-file\n"
    site = site_with_template(tmp_path, source)
    env = template_environment(site)
    cache = env.bytecode_cache
    assert cache is not None
    filename = str(tmp_path / "job.sh.j2")
    bucket = cache.get_bucket(env, "job.sh.j2", filename, source)
    bucket.code = env.compile("#!/bin/bash\necho from-the-cache\n", "job.sh.j2", filename)
    cache.set_bucket(bucket)
    assert render(site, job(site)).script == "#!/bin/bash\necho from-the-cache\n"


def test_a_damaged_cache_entry_is_compiled_again(tmp_path: Path) -> None:
    site = site_with_template(tmp_path, "#!/bin/bash\necho hi\n")
    render(site, job(site))
    [entry] = cache_dir().iterdir()
    entry.write_bytes(b"not a compiled template")
    assert render(site, job(site)).script == "#!/bin/bash\necho hi\n"


def test_a_cache_dir_that_cannot_be_written_costs_only_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "gone"  # checked private, then removed before the entry is written
    monkeypatch.setattr(resources, "private_cache_dir", lambda name: gone)
    site = site_with_template(tmp_path, "#!/bin/bash\necho hi\n")
    assert render(site, job(site)).script == "#!/bin/bash\necho hi\n"
    assert not gone.exists()


def test_no_cache_when_the_cache_dir_is_not_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared-cache"
    (shared / "clusterjob" / "templates").mkdir(parents=True)
    (shared / "clusterjob" / "templates").chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    site = site_with_template(tmp_path, "#!/bin/bash\necho hi\n")
    assert template_environment(site).bytecode_cache is None
    assert render(site, job(site)).script == "#!/bin/bash\necho hi\n"
    assert list((shared / "clusterjob" / "templates").iterdir()) == []
    assert list(work.iterdir()) == []


def test_a_template_named_with_the_shipped_prefix_is_not_prefixed_twice(tmp_path: Path) -> None:
    env = template_environment(site_with_template(tmp_path, "#!/bin/bash\n"))
    shipped = "clusterjob/job.sh.j2"
    assert env.join_path(shipped, shipped) == shipped
    assert env.join_path("job.sh.j2", "job.sh.j2") == shipped
    assert env.join_path("other.j2", "job.sh.j2") == "other.j2"


# --- what templates are given --------------------------------------------------------------


class Colour(Enum):
    RED = "red"


class Name(str):
    """A str subclass: a template gets its text as a plain str."""


class Opaque:
    def __str__(self) -> str:
        return "opaque"


@dataclass(frozen=True)
class Shown:
    visible: str = "v"
    _hidden: str = "h"

    @property
    def computed(self) -> str:
        return "c"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Colour.RED, "red"),
        (Name("x"), "x"),
        (["a", Colour.RED], ["a", "red"]),
        (frozenset({Colour.RED}), ["red"]),
        ({1: Colour.RED}, {"1": "red"}),
        ((Colour.RED, 2), ("red", 2)),
        (Opaque(), "opaque"),
        (Path("/a/b"), "/a/b"),
    ],
)
def test_template_value_gives_plain_data(value: object, expected: object) -> None:
    seen = template_value(value)
    assert seen == expected
    assert type(seen) is type(expected)


def test_a_template_record_shows_fields_only() -> None:
    record = template_value(Shown())
    assert isinstance(record, TemplateRecord)
    assert record.visible == "v"
    assert record["visible"] == "v"
    for name in ("_hidden", "computed", "__dict__"):
        with pytest.raises(AttributeError) as attr_info:
            getattr(record, name)
        assert attr_info.value.args == (name,)
        with pytest.raises(KeyError) as key_info:
            record[name]
        assert key_info.value.args == (name,)


@dataclass(frozen=True)
class Swept:
    task_args: tuple[tuple[str, ...], ...] = (("--lr", "0.1"), ("--lr", "0.2"))


def test_a_template_record_converts_each_field_once() -> None:
    """The shipped template reads a sweep's task list five times: converted at the first,
    the same plain value after (a 200-task sweep converted it 1,000 times)."""
    record = template_value(Swept())
    assert isinstance(record, TemplateRecord)
    first = record.task_args
    assert first == (("--lr", "0.1"), ("--lr", "0.2"))
    assert record.task_args is first and record["task_args"] is first
    assert TemplateRecord(Swept()).task_args is not first  # a view of its own, converted anew


class ShownRecord(Record):
    __slots__ = ("visible",)
    visible: str

    def __init__(self, visible: str = "v") -> None:
        self._fill(visible)


def test_a_record_is_shown_to_templates_as_a_dataclass_is() -> None:
    """The node side's values (the site's node map, its Prolog policy) are records, not
    dataclasses: a template sees their fields, and none of their methods."""
    record = template_value(ShownRecord())
    assert isinstance(record, TemplateRecord)
    assert record.visible == "v" and record["visible"] == "v"
    for name in ("replace", "as_dict", "_values", "_fill"):
        with pytest.raises(AttributeError):
            getattr(record, name)


def test_a_template_record_compares_hashes_and_prints_as_its_object() -> None:
    shown = Shown()
    record = TemplateRecord(shown)
    assert record == TemplateRecord(Shown())
    assert record == shown
    assert record != "v"
    assert hash(record) == hash(shown)
    assert str(record) == str(shown) == "Shown(visible='v', _hidden='h')"
    with pytest.raises(AttributeError, match="^template values are read-only$"):
        record.visible = "w"  # type: ignore[misc]


def test_a_sites_node_command_is_split_as_a_shell_would() -> None:
    site = replace(GRES_SITE, node_command="'/opt/cj env/bin/clusterjob' --quiet")
    assert default_node_command(site) == ["/opt/cj env/bin/clusterjob", "--quiet"]
    assert default_node_command(GRES_SITE) == [sys.executable, "-m", "clusterjob"]
