"""MkDocs hooks (mkdocs.yml `hooks:`): what the site shows of a page's Markdown that the
sources write for the tests.

- A shell block's ``# illustrative: WHY`` first line and a YAML block's ``# fragment ...``
  first line are how tests/doc_blocks.py knows which blocks it does not run (or validates
  as a part of a site file). Readers see neither marker: the line becomes the block's
  caption (its ``title``), without the marker word, and is not copied by the copy button.
- A code span naming a command (``clusterjob site gres-conf``) becomes a link to its entry in
  the command reference, once per section.
- Inline code of one word is marked so that it is not broken at its hyphens.
- A line ``--8<-- "README.md:install"`` is replaced by the README's section between
  ``<!-- --8<-- [start:install] -->`` and ``<!-- --8<-- [end:install] -->``, and
  ``--8<-- "CHANGELOG.md"`` by the whole file: one source for what the README and the site
  both show. pymdownx.snippets' syntax, expanded here instead because the included text's
  links are written from the repository's root (``docs/how-to/hydra.md``, ``#from-python``,
  ``CHANGELOG.md``) and are rewritten for the page, before MkDocs checks every link; one
  that points nowhere on the site is a build warning (an error with ``--strict``).

Only the built pages change; the Markdown files stay as the tests read them.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>```+)(?P<info>[^\n`]*)\n"
    r"(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.M | re.S,
)
_SHELLS = ("sh", "bash", "shell")
_COMMAND_HEADING = re.compile(r"^## (clusterjob(?: [a-z][a-z-]*)*) \{#([a-z-]+)\}$", re.M)
_CODE_SPAN = re.compile(r"(?<![\[`])`(clusterjob(?: [a-z][a-z-]*)+)([^`\n]*)`(?!\]\()")

_commands: dict[str, str] | None = None


def _caption(marker: str, line: str) -> str | None:
    """The caption for a marked first line, or None when ``line`` has no such marker."""
    text = line.lstrip("#").strip()
    if not text.lower().startswith(marker):
        return None
    rest = text[len(marker) :].lstrip(" :").strip()
    if marker == "illustrative":
        # "not run by the tests (your own scripts, models and site)": the reader's part.
        found = re.fullmatch(r"not run by the tests \((.+)\)", rest)
        rest = found.group(1) if found else rest
    else:  # "fragment of a site file: one slot of ..." / "fragment: a few of them together"
        rest = re.sub(r"^of a site file\b:?\s*", "", rest)
        rest = "Part of a site file" + (f": {rest}" if rest else "")
    return (rest[:1].upper() + rest[1:]).replace('"', "'")


def _untag(match: re.Match[str]) -> str:
    info = match.group("info").strip()
    lang, _, attrs = info.partition(" ")
    body = match.group("body")
    first, _, rest = body.partition("\n")
    indent = match.group("indent")
    marker = {**dict.fromkeys(_SHELLS, "illustrative"), "yaml": "fragment"}.get(lang.lower())
    if marker is None or "title=" in attrs:
        return match.group(0)
    caption = _caption(marker, first.strip())
    if caption is None:
        return match.group(0)
    title = f' title="{caption}"' if caption else ""
    fence = match.group("fence")
    return f"{indent}{fence}{lang}{title} {attrs}".rstrip() + f"\n{rest}{indent}{fence}"


def _command_anchors(config: Any) -> dict[str, str]:
    """``clusterjob site gres-conf`` -> its anchor, from the generated command reference."""
    global _commands
    if _commands is None:
        path = posixpath.join(config["docs_dir"], "reference", "commands.md")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        _commands = dict(_COMMAND_HEADING.findall(text))
    return _commands


def _link_commands(markdown: str, page_uri: str, config: Any) -> str:
    anchors = _command_anchors(config)
    if not anchors:
        return markdown
    target = "reference/commands.md"
    here = posixpath.dirname(page_uri)
    base = "" if page_uri == target else posixpath.relpath(target, here or ".")
    spans = [(m.start(), m.end()) for m in _FENCE.finditer(markdown)]
    out: list[str] = []
    linked: set[str] = set()  # the commands linked in this section

    def link(m: re.Match[str]) -> str:
        words = m.group(1).split(" ")
        while len(words) > 1 and " ".join(words) not in anchors:
            words.pop()
        name = " ".join(words)
        if name not in anchors or name == "clusterjob" or name in linked:
            return m.group(0)
        linked.add(name)
        return f"[{m.group(0)}]({base}#{anchors[name]})"

    offset = 0
    for line in markdown.splitlines(keepends=True):
        start = offset
        offset += len(line)
        if line.startswith("#"):
            if line.startswith("## "):
                linked.clear()  # once per section
            out.append(line)
            continue
        if any(a <= start < b for a, b in spans) or line.startswith("    "):
            out.append(line)
            continue
        out.append(_CODE_SPAN.sub(link, line))
    return "".join(out)


log = logging.getLogger("mkdocs.hooks.clusterjob")
_INCLUDE = re.compile(r'^--8<-- "(?P<file>[^":]+)(?::(?P<section>[a-z0-9-]+))?"[ \t]*$', re.M)
_SECTION = "<!-- --8<-- \\[{}:{}\\] -->\n"
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$", re.M)


def _slug(heading: str) -> str:
    """The anchor MkDocs (and GitHub) give a heading: lower case, punctuation dropped."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", text))


def _root(config: Any) -> Path:
    return Path(config["docs_dir"]).resolve().parent


def _section(root: Path, file: str, name: str | None) -> str:
    text = (root / file).read_text(encoding="utf-8")
    if name is None:
        return text
    found = re.search(
        _SECTION.format("start", name) + "(.*?)" + _SECTION.format("end", name), text, re.S
    )
    if found is None:
        raise ValueError(f"{file} has no section {name!r} (<!-- --8<-- [start:{name}] -->)")
    return found.group(1)


_included: dict[str, dict[tuple[str, str | None], str]] = {}  # per docs_dir, for one build


def includes(config: Any) -> dict[tuple[str, str | None], str]:
    """(file, section or None) -> the page (docs path) that includes it."""
    docs = Path(config["docs_dir"])
    if str(docs) in _included:
        return _included[str(docs)]
    found: dict[tuple[str, str | None], str] = {}
    for page in sorted(docs.rglob("*.md")):
        for m in _INCLUDE.finditer(page.read_text(encoding="utf-8")):
            found[(m.group("file"), m.group("section"))] = page.relative_to(docs).as_posix()
    _included[str(docs)] = found
    return found


def _anchor_page(root: Path, config: Any, file: str, anchor: str) -> str | None:
    """The page showing ``anchor`` of ``file`` (a heading of an included part, or the
    heading of an included section) as ``page.md`` or ``page.md#anchor``; None if none."""
    text = (root / file).read_text(encoding="utf-8")
    for (inc_file, name), page in includes(config).items():
        if inc_file != file:
            continue
        if name is None:
            if any(_slug(h) == anchor for _, h in _HEADING.findall(text)):
                return f"{page}#{anchor}"
            continue
        part = _section(root, file, name)
        if any(_slug(h) == anchor for _, h in _HEADING.findall(part)):
            return f"{page}#{anchor}"
        before = text[: text.index(_SECTION.format("start", name).replace("\\", ""))]
        headings = _HEADING.findall(before)
        if headings and _slug(headings[-1][1]) == anchor:  # the section's own heading
            return page
    return None


def _relink(text: str, file: str, page_uri: str, config: Any) -> str:
    """The included text's relative links, written from ``file``'s directory in the
    repository, pointed at the site's pages from ``page_uri``."""
    root = _root(config)
    here = posixpath.dirname(page_uri) or "."
    whole = {f: p for (f, name), p in includes(config).items() if name is None}

    def fix(m: re.Match[str]) -> str:
        target = m.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            return m.group(0)  # https://..., mailto:, an absolute path
        path, _, anchor = target.partition("#")
        if not path:
            found = _anchor_page(root, config, file, anchor)
            if found is None:
                log.warning(f"{file}: #{anchor}, included in {page_uri}, is on no page")
                return m.group(0)
            new = posixpath.relpath(found.split("#")[0], here) + (
                "#" + found.split("#", 1)[1] if "#" in found else ""
            )
        else:
            repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(file), path))
            if repo_path.startswith("docs/"):
                new = posixpath.relpath(repo_path[len("docs/") :], here)
            elif repo_path in whole:
                new = posixpath.relpath(whole[repo_path], here)
            else:
                log.warning(f"{file}: {target}, included in {page_uri}, is not on the site")
                return m.group(0)
            new += f"#{anchor}" if anchor else ""
        return f"[{m.group('text')}]({new})"

    return _LINK.sub(fix, text)


def _expand_includes(markdown: str, page_uri: str, config: Any) -> str:
    root = _root(config)

    def include(m: re.Match[str]) -> str:
        file, name = m.group("file"), m.group("section")
        text = _section(root, file, name)
        return _relink(text, file, page_uri, config).rstrip("\n")

    return _INCLUDE.sub(include, markdown)


def on_config(config: Any) -> Any:
    global _commands
    _commands = None  # mkdocs serve: read the reference again on a rebuild
    _included.clear()  # and which page includes what
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = _expand_includes(markdown, page.file.src_uri, config)
    markdown = _FENCE.sub(_untag, markdown)
    return _link_commands(markdown, page.file.src_uri, config)


_ONE_WORD = re.compile(r"<code>([^<\s]+)</code>")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Inline code without a space (a key, an option, an NVML call, a value such as
    ``gpus-per-node``) is one word: assets/extra.css keeps it on one line, so it never breaks
    at its hyphens (in tables always, in the text where the window is wide enough). Code
    with spaces still wraps between its words. Highlighted blocks hold spans and newlines:
    untouched."""
    return _ONE_WORD.sub(r'<code class="word">\1</code>', html)
