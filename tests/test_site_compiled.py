"""The compiled node map (``site validate --compile``): every node's view beside the site
file, read by the Prolog on a node's first job instead of the YAML, only while the site file
is the very text it was built from and only if it is trusted as the site file is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_hooks_nvml import NODE, PYTHONPATH, Node, mixed
from trusted_tree import trusted_tmp_dir

from clusterjob import resources
from clusterjob.cli.app import run
from clusterjob.node.epilog import EPILOG_LOG_NAME
from clusterjob.site.admin import write_compiled
from clusterjob.site.nodeview import (
    CACHE_FORMAT,
    COMPILED_FORMAT,
    compiled_map_problem,
    compiled_nodes,
    compiled_path,
    find_sorted_line,
    load_node_view_fd,
)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """The Prolog trusts no path through sticky /tmp: these trees live under a root-owned dir."""
    yield from trusted_tmp_dir()


@pytest.fixture
def node(tmp_path: Path, standin_lib: Path) -> Node:
    return Node(tmp_path, standin_lib.parent)


def _view(site: Path, name: str, *, compiled: bool) -> object:
    fd = os.open(site, os.O_RDONLY)
    try:
        opener = (lambda: os.open(compiled_path(site), os.O_RDONLY)) if compiled else None
        return load_node_view_fd(fd, str(site), site, name, None, opener)
    finally:
        os.close(fd)


@pytest.mark.parametrize("example", ["mllab.yaml", "h100farm.yaml", "perlmutter.yaml"])
def test_every_node_reads_as_from_the_yaml(tmp_path: Path, example: str) -> None:
    """A node in the map, in a partition only, or in neither: the same view either way."""
    site = tmp_path / example
    site.write_text((resources.site_configs_dir() / example).read_text())
    write_compiled(site)
    names = compiled_nodes(compiled_path(site).read_text())
    for name in [*names[:20], *names[-20:], "not-a-node", "", "a"]:
        assert _view(site, name, compiled=True) == _view(site, name, compiled=False), name


@pytest.mark.parametrize("line_bytes", [3, 40, 5000])
def test_a_node_line_is_found_by_binary_search(tmp_path: Path, line_bytes: int) -> None:
    """Every key is found, and none between them, whatever the line lengths (short lines:
    many per 4 KiB block; long ones: a block holds no line start), in a few reads."""
    keys = sorted({f"n{i * 7 % 1000:04d}" for i in range(1000)})[::3]
    path = tmp_path / "lines"
    path.write_text("HEADER\n" + "".join(f"{k}\t{k}{'x' * line_bytes}\n" for k in keys))
    reads = 0
    real_pread = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        nonlocal reads
        reads += 1
        return real_pread(fd, n, offset)

    fd = os.open(path, os.O_RDONLY)
    try:
        start, end = len("HEADER\n"), path.stat().st_size
        for i, key in enumerate(keys[::5]):
            found = find_sorted_line(fd, start, end, key.encode())
            assert found == f"{key}{'x' * line_bytes}".encode()
            missing = f"{key}a".encode() if i % 2 else f"n{int(key[1:]) - 1:04d}".encode()
            if missing.decode() not in keys:
                assert find_sorted_line(fd, start, end, missing) is None
        for key in (b"", b"a", b"zzz", b"n"):
            assert find_sorted_line(fd, start, end, key) is None
        os.pread = counted  # type: ignore[assignment]
        try:
            assert find_sorted_line(fd, start, end, keys[len(keys) // 3].encode()) is not None
        finally:
            os.pread = real_pread
    finally:
        os.close(fd)
    assert reads <= 4 * (end // 4096).bit_length() + 6, reads  # a few per halving


def test_a_large_compiled_map_is_not_parsed_whole(tmp_path: Path) -> None:
    """A node's first Prolog reads its own line of the compiled map, not every node's."""
    site = tmp_path / "mllab.yaml"
    site.write_text((resources.site_configs_dir() / "mllab.yaml").read_text())
    write_compiled(site)
    text = compiled_path(site).read_text()
    head, *lines = text.splitlines()
    name = compiled_nodes(text)[0]
    filler = [f"zz{i:06d}\t{{broken" for i in range(5000)]  # never parsed: never reached
    compiled_path(site).write_text("\n".join([head, *lines, *filler]) + "\n")
    assert _view(site, name, compiled=True) == _view(site, name, compiled=False)


def test_an_edited_site_is_read_from_the_yaml(tmp_path: Path) -> None:
    site = tmp_path / "mllab.yaml"
    text = (resources.site_configs_dir() / "mllab.yaml").read_text()
    site.write_text(text)
    write_compiled(site)
    site.write_text(text.replace("deadline_seconds:", "deadline_seconds: 7 #", 1))
    fresh = _view(site, "gpu-a01", compiled=True)
    assert fresh == _view(site, "gpu-a01", compiled=False)
    assert fresh.prolog.deadline_seconds == 7  # type: ignore[attr-defined]


def _outside_imports(node: Node, call: str, **env: str) -> list[str]:
    """What running ``call`` (Python lines that print) on the node prints, then every module
    it imported that is neither stdlib nor clusterjob's, as test_hooks_nvml counts them."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"{call}\n"
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before\n"
        "              if m.split('.')[0] not in sys.stdlib_module_names | {'clusterjob'}}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": PYTHONPATH,
            "LD_LIBRARY_PATH": str(node.lib_dir),
            "FAKE_NVML_SCENARIO": str(node.scenario_path),
            "SLURMD_NODENAME": NODE,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout.splitlines()


def _prolog_imports(node: Node) -> list[str]:
    call = (
        "from clusterjob.__main__ import main\n"
        f"print(main(['prolog', '--site', {str(node.site)!r}, '--cache-dir', "
        f"{str(node.cache)!r}]), end=' ')"
    )
    return [" ".join(_outside_imports(node, call))]


def test_the_first_prolog_reads_the_compiled_map(node: Node) -> None:
    node.setup(mixed())
    write_compiled(node.site)
    assert _prolog_imports(node) == ["0 []"]  # no ruamel, no hostlist: no YAML parsed


def test_an_untrusted_compiled_map_is_not_read(node: Node) -> None:
    node.setup(mixed())
    write_compiled(node.site)
    compiled_path(node.site).chmod(0o666)  # anyone could have written it
    cold = _prolog_imports(node)
    assert cold[-1].startswith("0 [") and "'ruamel'" in cold[-1]


def test_validate_compile_writes_it_and_json_stays_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "mllab.yaml"
    site.write_text((resources.site_configs_dir() / "mllab.yaml").read_text())
    assert run(["site", "validate", "--compile", "--json", str(site)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)[0]["ok"] is True
    assert err == f"{site}: compiled node map written to {compiled_path(site)}\n"
    assert oct(compiled_path(site).stat().st_mode & 0o777) == "0o644"


def test_a_compiled_map_that_cannot_answer_says_why(tmp_path: Path) -> None:
    """Each reason the Prolog would read the YAML instead: the one pure check both the hooks
    and `site validate` use."""
    site = tmp_path / "mllab.yaml"
    site.write_text((resources.site_configs_dir() / "mllab.yaml").read_text())
    write_compiled(site)
    head = compiled_path(site).read_bytes().split(b"\n", 1)[0]
    text = site.read_bytes()
    assert compiled_map_problem(head, text) is None
    assert compiled_map_problem(head, text + b"# edited\n") == (
        "built from another version of the site file"
    )
    for field, older in (("compiled", COMPILED_FORMAT - 1), ("format", CACHE_FORMAT - 1)):
        header = {**json.loads(head), field: older}
        assert compiled_map_problem(json.dumps(header).encode(), text) == (
            "written by another clusterjob version"
        )
    for foreign in (b"{not json", b"[1, 2]", b""):
        assert compiled_map_problem(foreign, text) == "not a compiled node map"


def _spoil(site: Path, how: str) -> None:
    """The compiled map beside ``site`` made one the hooks cannot use (or left fresh)."""
    if how == "edited":  # the admin edited the site file after compiling it
        site.write_text(site.read_text() + "# edited after `site validate --compile`\n")
    elif how == "untrusted":
        compiled_path(site).chmod(0o666)  # anyone could have written it


@pytest.mark.parametrize("kind", ["prolog", "epilog"])
@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("fresh", None),
        ("edited", "(built from another version of the site file)"),
        ("untrusted", "is group/world-writable (mode 0666)"),
    ],
)
def test_a_hook_says_when_the_compiled_map_was_not_used(
    node: Node, kind: str, how: str, why: str | None
) -> None:
    """Not used, the map costs each node's first job a parse of the YAML (seconds on a large
    site) with nothing to show for it: both hooks pass, say so on stderr, and log it."""
    node.setup(mixed())
    write_compiled(node.site)
    _spoil(node.site, how)
    done = node.hook(kind)
    assert done.returncode == 0, done.stderr
    log = node.log if kind == "prolog" else node.log.with_name(EPILOG_LOG_NAME)
    notes = json.loads(log.read_text().splitlines()[-1])["notes"]
    if why is None:
        assert notes == [] and "compiled node map" not in done.stderr
        return
    assert len(notes) == 1, notes
    assert notes[0].startswith(f"compiled node map {compiled_path(node.site)} not used ")
    assert why in notes[0]
    assert notes[0].endswith(
        f"run `clusterjob site validate --compile {node.site}` after each edit"
    )
    assert f"warning: {notes[0]}" in done.stderr


def test_validate_warns_of_a_compiled_map_the_prolog_would_ignore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "mllab.yaml"
    site.write_text((resources.site_configs_dir() / "mllab.yaml").read_text())
    assert run(["site", "validate", "--compile", str(site)]) == 0
    assert run(["site", "validate", str(site)]) == 0
    assert "warning" not in capsys.readouterr().out  # fresh: nothing to say
    _spoil(site, "edited")
    assert run(["site", "validate", str(site)]) == 0  # a warning, not an error
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        f"{compiled_path(site)}: warning: built from another version of the site file: the "
        "Prolog ignores it and reads the YAML on each node's first job (seconds on a large "
        f"site); write it again with `clusterjob site validate --compile {site}`"
    )
    assert run(["site", "validate", "--json", str(site)]) == 0
    issues = json.loads(capsys.readouterr().out)[0]["issues"]
    assert [(i["file"], i["severity"]) for i in issues] == [(str(compiled_path(site)), "warning")]
    assert run(["site", "validate", "--compile", str(site)]) == 0  # written again: no warning
    assert "warning" not in capsys.readouterr().out
    assert run(["site", "validate", str(site)]) == 0
    assert "warning" not in capsys.readouterr().out


# -- a job's own processes: flat with the site's size too --------------------------------------

_VIEW_CALL = (  # a job's view of its node, the hooks' cache (as the Prolog ran) at CACHE
    "from pathlib import Path\n"
    "from clusterjob.node import context\n"
    "context.DEFAULT_CACHE_DIR = {cache!r}\n"
    "print(repr(context.job_node_view(Path({site!r}), {node!r}).gpus))"
)


def test_the_in_job_preflight_reads_the_compiled_map(node: Node) -> None:
    """The step at the top of every job script: its node's line of the compiled map, not a
    parse of the YAML (~5 s a job on a 10,000-node site written one entry per node), and the
    same verdict."""
    node.setup(mixed())
    env = {"CLUSTERJOB_SITE": str(node.site), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env.update(SLURM_JOB_GPUS="1,2", CUDA_VISIBLE_DEVICES="1,2")
    from_yaml = node.run("preflight", env=env)
    assert from_yaml.returncode == 0, from_yaml.stderr
    write_compiled(node.site)
    compiled = node.run("preflight", env=env)
    assert (compiled.returncode, compiled.stderr) == (0, from_yaml.stderr)
    call = "from clusterjob.__main__ import main\nprint(int(main(['preflight'])), end=' ')"
    (line,) = _outside_imports(node, call, **env)  # Typer's command, but no YAML parsed:
    assert line.startswith("0 [") and "ruamel" not in line and "hostlist" not in line


def test_a_job_reads_the_entry_its_prolog_cached(node: Node) -> None:
    """The Prolog's cache (root's) answers for the job's processes on that node, read only;
    an entry someone else wrote there does not, nor one for another version of the file."""
    node.setup(mixed())
    assert node.prolog().returncode == 0  # fills node.cache with this node's entry
    call = _VIEW_CALL.format(site=str(node.site), node=NODE, cache=str(node.cache))
    from_cache = _outside_imports(node, call)
    assert from_cache[-1] == "[]"  # no YAML parsed
    uncached = _VIEW_CALL.format(site=str(node.site), node=NODE, cache=str(node.tmp / "none"))
    from_yaml = _outside_imports(node, uncached)
    assert from_yaml[-1] != "[]" and from_yaml[:-1] == from_cache[:-1]
    (entry,) = [p for p in node.cache.iterdir() if not p.name.startswith(".")]
    before = entry.stat().st_mode
    os.chown(entry, 65534, 65534)  # nobody's: not the Prolog's, not the job's
    assert _outside_imports(node, call)[-1] != "[]"
    os.chown(entry, 0, 0)
    entry.chmod(before | 0o002)  # root's, but anyone could have rewritten it
    assert _outside_imports(node, call)[-1] != "[]"
    entry.chmod(before)
    node.site.write_text(node.site.read_text() + "# edited\n")  # another version of the file
    assert _outside_imports(node, call)[-1] != "[]"
