"""What the documentation site shows of the pages' Markdown (scripts/mkdocs_hooks.py): the
block markers the tests read (``# illustrative``, ``# fragment``) become captions, and a
command named in a code span links to its reference entry."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from doc_blocks import FRAGMENT, ILLUSTRATIVE, SHELLS, blocks

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "mkdocs_hooks", REPO / "scripts" / "mkdocs_hooks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mkdocs_hooks", module)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()
CONFIG = {"docs_dir": str(DOCS)}


def _shown(page: Path) -> str:
    uri = page.relative_to(DOCS).as_posix()
    fake = SimpleNamespace(file=SimpleNamespace(src_uri=uri))
    hooks.on_config(CONFIG)
    return str(hooks.on_page_markdown(page.read_text(encoding="utf-8"), fake, CONFIG, None))


def test_no_block_marker_reaches_a_reader(tmp_path: Path) -> None:
    marked = 0
    for page in sorted(DOCS.rglob("*.md")):
        for block in blocks(page):
            first = block.first_line.lower()
            marked += first.startswith(ILLUSTRATIVE) or first.startswith(FRAGMENT)
        shown = tmp_path / page.name
        shown.write_text(_shown(page), encoding="utf-8")
        for block in blocks(shown):
            if block.lang in (*SHELLS, "yaml"):
                first = block.first_line.lower()
                assert not first.startswith((ILLUSTRATIVE, FRAGMENT)), f"{page}: {first}"
    assert marked > 10  # the markers are there in the sources, and were taken out


def test_a_marker_becomes_the_caption() -> None:
    page = (
        "```sh\n# illustrative: not run by the tests (your own site)\nclusterjob site show\n```\n"
    )
    fake = SimpleNamespace(file=SimpleNamespace(src_uri="how-to/x.md"))
    shown = hooks.on_page_markdown(page, fake, CONFIG, None)
    assert shown.startswith('```sh title="Your own site"\nclusterjob site show\n```')


def test_command_names_link_to_their_reference_entry() -> None:
    shown = _shown(DOCS / "reference" / "checks.md")
    assert "[`clusterjob site gres-conf`](commands.md#clusterjob-site-gres-conf)" in shown
    shown = _shown(DOCS / "getting-started" / "researcher.md")
    links = re.findall(r"\]\(\.\./reference/commands\.md#([a-z-]+)\)", shown)
    assert "clusterjob-shell" in links


def test_readme_sections_are_on_the_site_from_one_source() -> None:
    """Install, the Python API, SSH, troubleshooting and the changelog are written once (the
    README's marked sections, CHANGELOG.md) and included into their pages: no page holds a
    copy that could drift, and each page shows its section's text."""
    included = hooks.includes(CONFIG)
    assert {
        ("README.md", "install"),
        ("README.md", "python-api"),
        ("README.md", "ssh"),
        ("README.md", "troubleshooting"),
        ("CHANGELOG.md", None),
    } <= set(included)
    raw = {p: p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md")}
    for (file, name), uri in included.items():
        part = hooks._section(REPO, file, name)
        lines = [ln for ln in part.splitlines() if len(ln) > 60 and "](" not in ln]
        assert len(lines) > 5, (file, name)
        assert "--8<--" not in _shown(DOCS / uri)
        shown = hooks._expand_includes(raw[DOCS / uri], uri, CONFIG)
        missing = [ln for ln in lines if ln not in shown and not ln.startswith(("# ", "```"))]
        assert not missing[:1], f"{uri}: {missing[:1]}"
        for page, text in raw.items():  # the README's sentences appear in no page's source
            copied = [ln for ln in lines if ln in text and not ln.lstrip().startswith("#")]
            assert not copied, f"{page}: a copy of {file}:{name}: {copied[0]!r}"


def test_an_included_sections_links_are_rewritten_for_its_page() -> None:
    shown = _shown(DOCS / "getting-started" / "install.md")
    links = re.findall(r"\]\(([^)\s]+)\)", shown)
    assert "../how-to/python-api.md" in links  # README's #from-python: its section's page
    assert "../how-to/install-on-nodes.md" in links  # README's docs/how-to/...
    assert "../changelog.md" in links  # README's CHANGELOG.md: the page including it
    for link in links:
        path = link.split("#")[0]
        if path and "://" not in path:
            assert (DOCS / "getting-started" / path).resolve().is_file(), link


def test_an_included_link_to_nowhere_warns(caplog: pytest.LogCaptureFixture) -> None:
    """`mkdocs build --strict` fails on the warning: a README link the site has no page
    for (a test file, an anchor of a section no page includes) is not silently broken."""
    with caplog.at_level("WARNING", logger="mkdocs.hooks.clusterjob"):
        text = hooks._relink(
            "[a](tests/test_real_sites.py) [b](#benchmarks) [c](https://x.org/y)",
            "README.md", "how-to/ssh.md", CONFIG,
        )  # fmt: skip
    assert "tests/test_real_sites.py" in caplog.text and "#benchmarks" in caplog.text
    assert "https://x.org/y" in text and "x.org" not in caplog.text
