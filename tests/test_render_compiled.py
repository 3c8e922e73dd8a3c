"""The shipped template's compiled form (clusterjob/jobscript/shipped_templates.py) renders
the same bytes as Jinja2, is up to date with templates/, and stands in only where it may."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_render_golden import CASES, TOKEN

import clusterjob.jobscript.render as render_module
from clusterjob import resources
from clusterjob.errors import ConfigError
from clusterjob.jobscript import template_compiler
from clusterjob.jobscript.render import JOB_TEMPLATE, render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site

REPO = Path(__file__).resolve().parents[1]

# Beyond the golden cases: the template's other branches (interpreters, setup, containers,
# launchers, snapshots, CPU-only jobs).
EXTRA = {
    "conda": ("mllab", dict(model="a100", gpus=1, conda="torch")),
    "venv": ("mllab", dict(model="a100", gpus=1, venv=str(Path(sys.executable).parents[1]))),
    "setup": (
        "mllab",
        dict(
            model="a100",
            gpus=2,
            env=("WANDB_MODE=offline", "NAME=it's me"),
            modules=("cuda/12.1", "nccl"),
            setup=("source ~/.bashrc", "echo ready"),
        ),
    ),
    "pyxis-torchrun": (
        "mllab",
        dict(
            model="a100",
            gpus=2,
            nodes=2,
            container_image="nvcr.io/nvidia/pytorch:24.01-py3",
            container_mounts="/data:/data",
            launcher_args=("--max-restarts=3",),
        ),
    ),
    "pyxis-one-node": (
        "mllab",
        dict(model="a100", gpus=2, container_image="img", launcher="torchrun"),
    ),
    "pyxis-none": ("mllab", dict(model="a100", gpus=1, container_image="img")),
    "apptainer-srun": (
        "mllab",
        dict(model="a100", gpus=2, apptainer="train.sif", launcher="srun", tasks_per_node=2),
    ),
    "snapshot-relative": ("mllab", dict(model="a100", gpus=1, snapshot="snap/abc")),
    "snapshot-absolute": ("mllab", dict(model="a100", gpus=1, snapshot="/tmp/snap/abc")),
    "cpu-only": ("mllab", dict(gpus=0)),
    "command": ("mllab", dict(model="a100", gpus=1, command=True, args=("--x", "y z"))),
    "retry-bad-node": ("mllab", dict(model="a100", gpus=1, retry_bad_node=2, gres=("nvme:1",))),
    "any-v100": ("jeanzay", dict(model="v100", gpus=1, project="abc")),
    "warn-preflight": ("lumi", dict(gpus=8, nodes=1, project="465000000")),
}


def _both(site_name: str, request_kw: dict[str, object], monkeypatch: pytest.MonkeyPatch):
    site = load_site(resources.site_configs_dir() / f"{site_name}.yaml")
    job = resolve(site, JobRequest("train.py", token=TOKEN, **request_kw))  # type: ignore[arg-type]
    with monkeypatch.context() as m:  # the compiled form only: Jinja2 may not stand in
        m.setattr(render_module, "_render_jinja", _no_jinja)
        compiled = render(site, job, python="/usr/bin/python3").script
    with monkeypatch.context() as m:
        m.setattr(render_module, "_render_compiled", lambda *a: None)
        jinja = render(site, job, python="/usr/bin/python3").script
    return compiled, jinja


def _no_jinja(*args: object) -> str:
    raise AssertionError("rendered by Jinja2, not by the compiled template")


@pytest.mark.parametrize("name", sorted(CASES) + sorted(EXTRA))
def test_compiled_and_jinja2_render_the_same_bytes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDA_EXE", "/bin/true")  # any executable: the script names it
    compiled, jinja = _both(*(CASES.get(name) or EXTRA[name]), monkeypatch)
    assert compiled == jinja


def test_the_compiled_module_is_up_to_date() -> None:
    """scripts/gen_compiled.py was run after the last change to templates/ (or the compiler)."""
    templates = template_compiler.shipped_templates(REPO / "templates")
    expected = template_compiler.compiled_module(templates, "scripts/gen_compiled.py")
    module = REPO / "clusterjob" / "jobscript" / "shipped_templates.py"
    assert module.read_text() == expected, "run: python scripts/gen_compiled.py"


def test_an_edited_shipped_template_is_rendered_by_jinja2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled form stands in only for the source it was compiled from."""
    edited = tmp_path / "templates"
    edited.mkdir()
    source = (resources.templates_dir() / JOB_TEMPLATE).read_text()
    (edited / JOB_TEMPLATE).write_text(source.replace("#!/bin/bash\n", "#!/bin/bash\n# edited\n"))
    monkeypatch.setattr(resources, "templates_dir", lambda: edited)
    site_name, request_kw = CASES["mllab-a100x2"]
    site = load_site(resources.site_configs_dir() / f"{site_name}.yaml")
    job = resolve(site, JobRequest("train.py", token=TOKEN, **request_kw))  # type: ignore[arg-type]
    assert render(site, job).script.startswith("#!/bin/bash\n# edited\n")


def test_a_site_template_of_the_same_name_is_rendered_by_jinja2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / JOB_TEMPLATE).write_text(
        '{% extends "job.sh.j2" %}{% block launch %}echo mine\n{% endblock %}'
    )
    site_name, request_kw = CASES["mllab-a100x2"]
    site = load_site(resources.site_configs_dir() / f"{site_name}.yaml")
    site = type(site)(**{**vars(site), "templates_dir": tmp_path})
    job = resolve(site, JobRequest("train.py", token=TOKEN, **request_kw))  # type: ignore[arg-type]
    assert render_module._render_compiled(site, JOB_TEMPLATE, {}) is None
    assert render(site, job).script.endswith("echo mine\n")


def test_an_error_is_reported_by_jinja2_with_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value a filter refuses: the compiled form gives way, and the error is Jinja2's, with
    the template line (the compiled form knows none)."""
    site_name, request_kw = CASES["mllab-a100x2"]
    site = load_site(resources.site_configs_dir() / f"{site_name}.yaml")
    job = resolve(site, JobRequest("train.py", token=TOKEN, **request_kw))  # type: ignore[arg-type]
    monkeypatch.setitem(render_module.TEMPLATE_FILTERS, "q", _refuse)
    with pytest.raises(ConfigError, match=r"job\.sh\.j2:\d+: templates: ValueError: refused"):
        render(site, job)


def _refuse(value: object) -> str:
    raise ValueError("refused")


@pytest.mark.parametrize(
    "source",
    [
        '{% include "other.j2" %}',
        "{{ x|upper }}",
        "{{ x is defined }}",
        "{% for x in y recursive %}{% endfor %}",
        "{{ range(3) }}",
        "{% for x in y %}{{ loop.length }}{% endfor %}",
        "{{ x.__class__ }}",
    ],
)
def test_what_the_compiler_does_not_translate_stops_the_build(source: str) -> None:
    with pytest.raises(template_compiler.UnsupportedTemplate, match=r"t\.j2"):
        template_compiler.compile_template("t.j2", source)


def test_rendering_the_shipped_template_imports_no_jinja2() -> None:
    code = (
        "import sys\n"
        "from clusterjob import resources\n"
        "from clusterjob.jobscript.render import render\n"
        "from clusterjob.jobscript.request import JobRequest, resolve\n"
        "from clusterjob.site.loader import load_site\n"
        "site = load_site(resources.site_configs_dir() / 'mllab.yaml')\n"
        "script = render(site, resolve(site, JobRequest('t.py', gpus=1, model='a100'))).script\n"
        "assert script.startswith('#!/bin/bash'), script\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jinja2', 'markupsafe')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
