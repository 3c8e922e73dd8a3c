"""Rendering: quoting into bash and #SBATCH lines, rendered scripts run under real bash with
stand-ins for python/srun/scontrol, site templates that extend or override, template errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_request import (
    CONSTRAINT_SITE,
    GPN_SITE,
    GPUS_SITE,
    GRES_SITE,
    make_site,
)

from clusterjob.errors import ConfigError, UsageError
from clusterjob.jobscript.render import RenderedJob, default_node_command, render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.jobscript.shell import (
    check_directive_value,
    sbatch_option,
    sbatch_value,
    shell_quote,
)
from clusterjob.site.model import Site

BASH = shutil.which("bash") or "/bin/bash"
NASTY_ARGS = [
    "'$(touch pwned)'; rm -rf ~",
    "$(touch pwned2)",
    "`touch pwned3`",
    "; touch pwned4",
    "a\nb\n#SBATCH --nodes=99",
    "--lr",
    "3e-4",
    "",
    "  spaced  ",
    "*",
    "~",
    "$HOME",
    "\\",
    "'",
    '"',
    "tab\there",
    "\x1b[31mred",
    "ünïcødé ✓",
]

# -- shell_quote -------------------------------------------------------------------------

text_without_nul = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=40,
)


def _bash_printf(quoted: str) -> str:
    out = subprocess.run(
        [BASH, "-c", f"printf %s {quoted}"], capture_output=True, check=True, env={}
    ).stdout
    return out.decode("utf-8", "surrogateescape")


@settings(max_examples=150, deadline=None)
@given(text_without_nul)
def test_shell_quote_round_trips_through_bash(text: str) -> None:
    quoted = shell_quote(text)
    assert "\n" not in quoted and "\r" not in quoted  # every quoted value stays on one line
    assert _bash_printf(quoted) == text


@settings(max_examples=40, deadline=None)
@given(st.lists(text_without_nul, max_size=5))
def test_shell_quote_list_is_one_word_per_item(items: list[str]) -> None:
    script = f'for a in {shell_quote(items)}; do printf "%s\\0" "$a"; done'
    out = subprocess.run([BASH, "-c", script], capture_output=True, check=True, env={}).stdout
    assert out.decode().split("\0")[:-1] == items


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("plain", "plain"),
        ("a b", "'a b'"),
        ("it's", "'it'\"'\"'s'"),
        ("a\nb", "$'a\\nb'"),
        ("x'\\\n", "$'x\\'\\\\\\n'"),
        ("\x1b", "$'\\x1b'"),
        ("tab\there", "$'tab\\there'"),  # the readable escapes, not \x09 and \x0d
        ("a\rb", "$'a\\rb'"),
        (3, "3"),
    ],
)
def test_shell_quote_forms(value: object, quoted: str) -> None:
    assert shell_quote(value) == quoted


def test_shell_quote_refuses_nul_and_non_text() -> None:
    with pytest.raises(UsageError, match=r"^NUL character is not allowed: 'a\\x00b'$"):
        shell_quote("a\x00b")
    with pytest.raises(TypeError):
        shell_quote(None)


# -- #SBATCH values ----------------------------------------------------------------------


def _sbatch_get_argument(line: str) -> tuple[str, str]:
    """sbatch's reading of one argument on an #SBATCH line (src/sbatch/opt.c, _get_argument):
    backslash escapes, single or double quotes group, an unquoted # starts a comment."""
    i, out, quote, escaped = 0, [], "", False
    while i < len(line) and line[i].isspace():
        i += 1
    while i < len(line) and (quote or not line[i].isspace()):
        ch = line[i]
        i += 1
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
            continue
        elif quote:
            if ch == quote:
                quote = ""
                continue
        elif ch in "\"'":
            quote = ch
            continue
        elif ch == "#":
            break
        out.append(ch)
    return "".join(out), line[i:]


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\n\r"),
        min_size=1,
        max_size=30,
    )
)
def test_sbatch_value_is_read_back_as_one_argument(value: str) -> None:
    argument, rest = _sbatch_get_argument(f"--job-name={sbatch_value(value)}  # comment")
    assert argument == f"--job-name={value}"
    assert rest.strip() == "# comment"


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("train", "train"),
        ("gpu:a100:2", "gpu:a100:2"),
        ("a100&ib", "a100&ib"),
        ("logs/%x-%j.out", "logs/%x-%j.out"),
        ("my job #1", '"my job #1"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
    ],
)
def test_sbatch_value_forms(value: str, written: str) -> None:
    assert sbatch_value(value) == written


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x00b"])
def test_sbatch_value_refuses_line_breaks_and_nul(bad: str) -> None:
    with pytest.raises(UsageError, match="job name"):
        sbatch_value(bad, "the job name")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: check_directive_value("a\nb"), "line break is not allowed: 'a\\nb'"),
        (lambda: sbatch_value("a\rb"), "line break is not allowed: 'a\\rb'"),
        (
            lambda: sbatch_option("--x=a\nb"),
            "line break in --x=a\nb is not allowed: '--x=a\\nb'",
        ),
        (
            lambda: sbatch_option("--x=a\nb", "--sbatch-arg"),
            "line break in --sbatch-arg is not allowed: '--x=a\\nb'",
        ),
    ],
)
def test_directive_line_break_messages(call: Callable[[], object], message: str) -> None:
    """The whole message: where the value came from (when told), the value, and why."""
    with pytest.raises(UsageError) as info:
        call()
    assert str(info.value) == f"{message} (an #SBATCH directive must fit on one line)"


def test_sbatch_option() -> None:
    assert sbatch_option("--exclusive") == "--exclusive"
    assert sbatch_option("--reservation=my res") == '--reservation="my res"'
    with pytest.raises(UsageError, match="not an sbatch option"):
        sbatch_option("exclusive")
    with pytest.raises(UsageError, match="not an sbatch option"):
        sbatch_option("-w node1")


# -- rendered scripts --------------------------------------------------------------------


def _render(site: Site, **kw: object) -> RenderedJob:
    render_kw = {k: kw.pop(k) for k in ("python", "node_command") if k in kw}
    kw.setdefault("script", "train.py")
    return render(site, resolve(site, JobRequest(**kw)), **render_kw)  # type: ignore[arg-type]


def _bash_n(script: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(script)
    result = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("site", [GRES_SITE, CONSTRAINT_SITE, GPN_SITE, GPUS_SITE])
@pytest.mark.parametrize("nodes", [1, 2])
def test_every_rendered_script_is_valid_bash(site: Site, nodes: int, tmp_path: Path) -> None:
    rendered = _render(
        site,
        model="V100",
        gpus=2,
        nodes=nodes,
        args=tuple(NASTY_ARGS),
        job_name="name with spaces # and hash",
        output="logs/%x-%j.out",
        signal="B:USR1@90",
        requeue=True,
        sbatch_args=("--exclusive", "--reservation=maint window"),
    )
    _bash_n(rendered.script, tmp_path)
    directives = [ln for ln in rendered.script.splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --signal=B:USR1@90" in directives
    assert "#SBATCH --requeue" in directives
    assert '#SBATCH --reservation="maint window"' in directives
    assert '#SBATCH --job-name="name with spaces # and hash"' in directives
    assert f"#SBATCH --comment=clusterjob:{rendered.token}" in directives
    assert f"#SBATCH --nodes={nodes}" in directives
    # no argument leaked onto a line of its own, let alone an #SBATCH line
    assert "#SBATCH --nodes=99" not in directives
    # sbatch stops reading directives at the first line that is not a comment
    body = rendered.script.splitlines()[1:]
    first_command = next(i for i, ln in enumerate(body) if ln and not ln.startswith("#"))
    assert all(not ln.startswith("#SBATCH") for ln in body[first_command:])


def test_sbatch_command_and_token() -> None:
    rendered = _render(GRES_SITE, model="A100", token="abc123")
    assert rendered.token == "abc123"
    assert rendered.sbatch_argv == ["sbatch", "--parsable", "clusterjob-abc123.sh"]
    assert rendered.sbatch_argv_for("/x/job.sh") == ["sbatch", "--parsable", "/x/job.sh"]
    assert rendered.sbatch_argv_for("/x/job.sh", test_only=True) == [
        "sbatch",
        "--test-only",
        "/x/job.sh",
    ]
    site = GRES_SITE
    with_path = render(site, resolve(site, JobRequest("t.py", model="A100")), script_path="/a b")
    assert with_path.sbatch_command() == "sbatch --parsable '/a b'"


def test_default_node_command_is_this_interpreter() -> None:
    assert default_node_command(GRES_SITE) == [sys.executable, "-m", "clusterjob"]


def _write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """Stand-ins: a python that records its argv, a preflight that records its environment,
    and srun/scontrol that behave like Slurm's for a two-node job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "calls.jsonl"
    (bin_dir / "record.py").write_text(
        "import json, os, sys\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    env = {k: v for k, v in os.environ.items()\n"
        "           if k.startswith(('CLUSTERJOB_', 'CUDA_', 'MASTER_'))}\n"
        "    node = os.environ.get('SLURM_NODEID')\n"
        "    f.write(json.dumps(dict(argv=sys.argv[1:], node=node, env=env)) + '\\n')\n"
    )
    recorder = f'#!/bin/sh\nexec {sys.executable} {bin_dir / "record.py"} "$0" "$@"\n'
    _write_exe(bin_dir / "fake-python", recorder)
    _write_exe(bin_dir / "fake-clusterjob", recorder)
    _write_exe(
        bin_dir / "srun",
        "#!/bin/bash\n"
        "while [[ $# -gt 0 && $1 == -* ]]; do shift; done\n"
        'for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do SLURM_NODEID=$i "$@" || exit; done\n',
    )
    _write_exe(
        bin_dir / "scontrol",
        "#!/bin/bash\n"
        'case "$1 $2" in\n'
        '  "show hostnames") printf "node1\\nnode2\\n" ;;\n'
        '  "show node") echo "NodeName=node1 Arch=x86_64 NodeAddr=10.1.2.3 NodeHostName=h1" ;;\n'
        "  *) exit 1 ;;\n"
        "esac\n",
    )
    return bin_dir


def _run_script(script: str, tmp_path: Path, fake_bin: Path) -> list[dict]:
    work = tmp_path / "work"
    home = tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (home / "canary").write_text("still here")
    (work / "job.sh").write_text(script)
    env = {
        "PATH": f"{fake_bin}:/usr/bin:/bin",
        "HOME": str(home),
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "node[1-2]",
    }
    result = subprocess.run(
        [BASH, "job.sh"], cwd=work, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert (home / "canary").read_text() == "still here"
    assert sorted(p.name for p in work.iterdir()) == ["job.sh"]  # nothing was created
    calls_file = tmp_path / "calls.jsonl"
    calls = [json.loads(line) for line in calls_file.read_text().splitlines()]
    # the GPU usage sampler runs in the background (it may not have started yet): left out
    return [c for c in calls if "sample-usage" not in c["argv"]]


def test_hostile_arguments_reach_the_program_literally(tmp_path: Path, fake_bin: Path) -> None:
    rendered = _render(
        GRES_SITE,
        model="A100",
        gpus=2,
        args=tuple(NASTY_ARGS),
        python=str(fake_bin / "fake-python"),
        node_command=[str(fake_bin / "fake-clusterjob")],
    )
    preflight, launch = _run_script(rendered.script, tmp_path, fake_bin)
    assert preflight["argv"][1:] == ["preflight"]
    assert preflight["env"] == {
        "CLUSTERJOB_EXPECT_MODEL": "A100",
        "CLUSTERJOB_EXPECT_COUNT": "2",
        "CLUSTERJOB_SITE": "/etc/clusterjob/mllab.yaml",
        "CLUSTERJOB_TOKEN": rendered.token,
        "CLUSTERJOB_MAX_REQUEUES": "3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert launch["argv"][1:] == ["train.py", *NASTY_ARGS]


def test_several_nodes_preflight_each_and_launch_torchrun(tmp_path: Path, fake_bin: Path) -> None:
    rendered = _render(
        GPN_SITE,
        model="V100",
        gpus=2,
        nodes=2,
        args=("--lr", "3e-4", "'$(touch pwned)'; rm -rf ~"),
        python=str(fake_bin / "fake-python"),
        node_command=[str(fake_bin / "fake-clusterjob")],
    )
    calls = _run_script(rendered.script, tmp_path, fake_bin)
    preflights = [c for c in calls if c["argv"][1:] == ["preflight"]]
    launches = [c for c in calls if c not in preflights]
    assert [c["node"] for c in preflights] == ["0", "1"]  # every node is checked
    assert [c["node"] for c in launches] == ["0", "1"]
    for rank, call in enumerate(launches):
        assert call["argv"][1:] == [
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc-per-node=2",
            f"--node-rank={rank}",
            "--master-addr=10.1.2.3",
            "--master-port=21234",
            "--tee=3",
            "train.py",
            "--lr",
            "3e-4",
            "'$(touch pwned)'; rm -rf ~",
        ]
        assert call["env"]["MASTER_ADDR"] == "10.1.2.3"


# -- site templates ----------------------------------------------------------------------


def _site_with_templates(tmp_path: Path, text: str, name: str = "job.sh.j2") -> Site:
    templates = tmp_path / "site-templates"
    templates.mkdir(exist_ok=True)
    (templates / name).write_text(text)
    return make_site(templates_dir=templates)


def test_site_template_extends_the_shipped_one(tmp_path: Path) -> None:
    site = _site_with_templates(
        tmp_path,
        '{% extends "job.sh.j2" %}\n'
        "{% block environment %}\n"
        "{{ super() }}\n"
        "module load cuda/12.4\n"
        "{% endblock %}\n"
        "{% block preflight %}\n"
        "echo site preflight for {{ job.partition.name|q }}\n"
        "{{ super() }}\n"
        "{% endblock %}\n",
    )
    script = _render(site, model="A100", gpus=2).script
    assert "#SBATCH --gres=gpu:a100:2" in script
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID\n" in script
    assert re.search(r"^python=.*\n+module load cuda/12.4$", script, re.M)
    assert re.search(
        r"^echo site preflight for gpu\n(#.*\n)*.* -m clusterjob preflight \|\| .*exit 78; }$",
        script,
        re.M,
    )
    assert script.rstrip().endswith('exec "$python" train.py')
    _bash_n(script, tmp_path)


def test_site_template_can_reach_the_shipped_one_by_prefix(tmp_path: Path) -> None:
    site = _site_with_templates(
        tmp_path, '{% extends "clusterjob/job.sh.j2" %}{% block launch %}echo custom{% endblock %}'
    )
    script = _render(site, model="A100").script
    assert script.endswith("echo custom\n")
    assert "#SBATCH --partition=gpu" in script


def test_site_template_overrides_the_shipped_one(tmp_path: Path) -> None:
    site = _site_with_templates(
        tmp_path, "#!/bin/bash\n#SBATCH {{ job.gres.options[0] }}\nrun {{ request.args|q }}\n"
    )
    script = _render(site, model="A100", args=("a b",)).script
    assert script == "#!/bin/bash\n#SBATCH --gres=gpu:a100:1\nrun 'a b'\n"


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("#!/bin/bash\n\necho {{ job.no_such_thing }}\n", 3, "no_such_thing"),
        ("#!/bin/bash\necho {{ nope }}\n", 2, "'nope' is undefined"),
        ("#!/bin/bash\n{% if %}\n", 2, "TemplateSyntaxError"),
        ("#!/bin/bash\n\n\necho {{ job.account|q }}\n", 4, "refusing to shell-quote None"),
        ("#!/bin/bash\n{{ job.__class__.__mro__ }}\n", 2, "__class__"),
        (
            '{% extends "job.sh.j2" %}\n{% block launch %}\n\necho {{ missing }}\n{% endblock %}\n',
            4,
            "'missing' is undefined",
        ),
    ],
)
def test_template_errors_point_at_template_and_line(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    site = _site_with_templates(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        _render(site, model="V100", partition="debug")
    (issue,) = info.value.issues
    assert issue.file == str(tmp_path / "site-templates" / "job.sh.j2")
    assert issue.line == line
    assert message in issue.message
    assert str(issue).startswith(f"{issue.file}:{line}: templates: ")


def test_error_in_a_template_the_site_includes(tmp_path: Path) -> None:
    site = _site_with_templates(tmp_path, "line1\n{{ oops }}\n", name="extra.sh.j2")
    (tmp_path / "site-templates" / "job.sh.j2").write_text(
        '{% extends "job.sh.j2" %}{% block launch %}{% include "extra.sh.j2" %}{% endblock %}'
    )
    with pytest.raises(ConfigError) as info:
        _render(site, model="A100")
    (issue,) = info.value.issues
    assert (Path(issue.file).name, issue.line) == ("extra.sh.j2", 2)


def test_shipped_template_environment_is_sandboxed(tmp_path: Path) -> None:
    """Refused by the sandbox itself, at the line that tried (any other ConfigError, such as
    a template not found, would not show the sandbox is on)."""
    site = _site_with_templates(tmp_path, "{{ ''.__class__.__mro__[1].__subclasses__() }}")
    unsafe = "SecurityError: access to attribute '__class__' of 'str' object is unsafe"
    with pytest.raises(ConfigError, match=re.escape(f"job.sh.j2:1: templates: {unsafe}")):
        _render(site, model="A100")


def test_run_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert "#SBATCH --gres=gpu:a100:1" in _render(GRES_SITE, model="A100").script
    assert os.getcwd() == str(tmp_path)
