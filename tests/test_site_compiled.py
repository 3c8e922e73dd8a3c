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
from clusterjob.site.admin import write_compiled
from clusterjob.site.nodeview import (
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


def _prolog_imports(node: Node) -> list[str]:
    code = (  # anything neither stdlib nor clusterjob, as test_hooks_nvml counts them
        "import sys\n"
        "before = set(sys.modules)\n"
        "from clusterjob.__main__ import main\n"
        f"rc = main(['prolog', '--site', {str(node.site)!r}, '--cache-dir', "
        f"{str(node.cache)!r}])\n"
        "print(rc, sorted({m.split('.')[0] for m in set(sys.modules) - before\n"
        "                  if m.split('.')[0] not in sys.stdlib_module_names | {'clusterjob'}}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": PYTHONPATH,
            "LD_LIBRARY_PATH": str(node.lib_dir),
            "FAKE_NVML_SCENARIO": str(node.scenario_path),
            "SLURMD_NODENAME": NODE,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout.splitlines()


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
