"""The built documentation site in a real browser: every page at a desktop (1280 px) and a
phone (390 px) width, loaded from a local HTTP server into headless Chromium (Debian's
`chromium`; scripts/test.sh installs it), driven over the DevTools protocol on a pipe with the
standard library only. A page fails on horizontal overflow (the page, not a table or code
block that scrolls in its own box), an image that did not load, a link to a page or anchor
the site lacks, a console error or an uncaught exception, and a console block whose copy
button would copy a prompt or an output line. Screenshots of the key pages are written to
build/screenshots/ (or $CLUSTERJOB_SCREENSHOTS), whose path the test prints."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
WIDTHS = (1280, 390)
# The pages a reader starts from, screenshotted at each width.
KEY_PAGES = {
    "home": "",
    "researcher": "getting-started/researcher/",
    "site-admin": "getting-started/site-admin/",
    "node-checks": "reference/checks/",
}
SCREENSHOT_MAX_HEIGHT = 6000  # px: the top of a long page is what a reader sees first


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


pytestmark = pytest.mark.skipif(
    _chromium() is None,
    reason="no chromium on PATH: apt-get install chromium (scripts/test.sh does)",
)


class Browser:
    """Chromium with its DevTools protocol on file descriptors 3 (commands in) and 4 (replies
    and events out), NUL-separated JSON messages: no websocket, no extra package."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [
            binary,
            "--headless=new",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-gpu",
            "--disable-dev-shm-usage",  # a container's small /dev/shm
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--mute-audio",
            "--font-render-hinting=none",
            "about:blank",
        ]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # root: Chromium's sandbox refuses to start
        # The child reads commands on fd 3 and writes replies on fd 4.
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=functools.partial(_dup_pipes, to_browser_r, from_browser_w),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str = "") -> Any:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout=60)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for n, event in enumerate(self.events):
                if event.get("method") == method and event.get("sessionId") == session:
                    return self.events.pop(n)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(method)
            self.events.append(self._read(timeout=left))

    def _read(self, timeout: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], timeout)
            if not ready:
                raise TimeoutError("no message from chromium")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe (did it start?)")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return dict(json.loads(message))

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            self.send("Browser.close")
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


def _dup_pipes(read_end: int, write_end: int) -> None:
    """In the child: its end of each pipe at fd 3 and 4, where Chromium looks for them."""
    read_copy, write_copy = os.dup(read_end), os.dup(write_end)
    os.dup2(read_copy, 3)
    os.dup2(write_copy, 4)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[Path]:
    """The site as CI builds it (strict), into a directory of this test's own."""
    with tempfile.TemporaryDirectory(prefix="clusterjob-site-") as tmp:
        out = Path(tmp) / "site"
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        yield out


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    binary = _chromium()
    assert binary is not None
    with tempfile.TemporaryDirectory(prefix="clusterjob-chromium-") as profile:
        chromium = Browser(binary, Path(profile))
        try:
            yield chromium
        finally:
            chromium.close()


def _pages(site: Path) -> list[str]:
    """Every page of the built site, as a path under its root ("" for the home page)."""
    pages = []
    for index in sorted(site.rglob("index.html")):
        rel = index.parent.relative_to(site).as_posix()
        pages.append("" if rel == "." else rel + "/")
    return [p for p in pages if not p.startswith("assets/")]


# Run in the page once it has loaded: what the test judges, as plain data.
_INSPECT = r"""(() => {
  const root = document.documentElement;
  const wide = [];
  if (root.scrollWidth > window.innerWidth) {
    for (const el of document.querySelectorAll('body *')) {
      const r = el.getBoundingClientRect();
      if (r.right > window.innerWidth + 1 && r.width > 0) {
        let clipped = false;
        for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
          const s = getComputedStyle(p);
          const inside = p.getBoundingClientRect().right <= window.innerWidth + 1;
          if (s.overflowX !== 'visible' && inside) {
            clipped = true; break;
          }
        }
        if (!clipped) wide.push(el.tagName.toLowerCase() + (el.className ? '.' + el.className : '')
                                + ' ' + (el.textContent || '').trim().slice(0, 60));
      }
      if (wide.length >= 5) break;
    }
  }
  const images = [...document.images]
    .filter(img => !img.complete || img.naturalWidth === 0)
    .map(img => img.getAttribute('src'));
  const links = [...document.querySelectorAll('a[href]')]
    .map(a => a.href)
    .filter(h => h.startsWith(location.origin));
  const copies = [];
  for (const code of document.querySelectorAll('.highlight code')) {
    if (!code.querySelector('.gp')) continue;  // a console block: `$ ` prompts
    const shown = [];
    let more = false;  // a command continued by a trailing backslash
    for (const line of code.innerText.split('\n')) {
      if (line.startsWith('$ ') || more) {
        shown.push((line.startsWith('$ ') ? line.slice(2) : line).replace(/\s+# exit \d+$/, ''));
        more = line.endsWith('\\');
      }
    }
    // What Material's copy button copies: the data-copy attribute of the block, else the
    // text it reads while the block is marked data-md-copying.
    code.setAttribute('data-md-copying', '');
    const holder = code.closest('[data-copy]');
    const copied = holder ? holder.getAttribute('data-copy') : code.innerText;
    copies.push({copied, commands: shown.join('\n')});
    code.removeAttribute('data-md-copying');
  }
  return {scrollWidth: root.scrollWidth, innerWidth: window.innerWidth, wide, images,
          links, copies,
          height: Math.min(root.scrollHeight, MAX_HEIGHT)};
})()""".replace("MAX_HEIGHT", str(SCREENSHOT_MAX_HEIGHT))


def _visit(browser: Browser, url: str, width: int) -> tuple[dict[str, Any], list[str], str, str]:
    """Load url at width in a new tab: (what _INSPECT found, console errors, session, tab)."""
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
        "sessionId"
    ]
    for domain in ("Page", "Runtime", "Log"):
        browser.send(f"{domain}.enable", session=session)
    browser.send(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 600},
        session=session,
    )
    browser.events.clear()
    browser.send("Page.navigate", {"url": url}, session=session)
    browser.wait_event("Page.loadEventFired", session, timeout=60)
    # Material builds its copy buttons and search index after load: let it run, then ask.
    browser.send("Runtime.evaluate", {"expression": "new Promise(r => setTimeout(r, 300))",
                                      "awaitPromise": True}, session=session)  # fmt: skip
    found = browser.send(
        "Runtime.evaluate", {"expression": _INSPECT, "returnByValue": True}, session=session
    )["result"]["value"]
    errors = []
    for event in browser.events:
        if event.get("sessionId") != session:
            continue
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(
                " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            errors.append(details.get("exception", {}).get("description") or details["text"])
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            errors.append(f"{entry['text']} {entry.get('url', '')}".strip())
    return found, errors, session, target


def _screenshot(browser: Browser, session: str, width: int, height: int, path: Path) -> None:
    import base64

    shot = browser.send(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        },
        session=session,
    )
    path.write_bytes(base64.b64decode(shot["data"]))


def _screenshot_dir() -> Path:
    where = Path(os.environ.get("CLUSTERJOB_SCREENSHOTS") or REPO / "build" / "screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def _broken_links(site: Path, base: str, links: list[str]) -> list[str]:
    """Links (absolute, on the local server) to a file or an anchor the built site lacks."""
    broken = []
    for link in sorted(set(links)):
        parts = urllib.parse.urlsplit(link)
        rel = urllib.parse.unquote(parts.path)[len(urllib.parse.urlsplit(base).path) :]
        target = site / rel
        if target.is_dir() or rel.endswith("/") or not rel:
            target = target / "index.html"
        if not target.is_file():
            broken.append(link)
        elif parts.fragment and target.suffix == ".html":
            ids = _ids(target)
            if urllib.parse.unquote(parts.fragment) not in ids:
                broken.append(link)
    return broken


@functools.cache
def _ids(page: Path) -> frozenset[str]:
    import re

    text = page.read_text(encoding="utf-8")
    return frozenset(re.findall(r'\bid="([^"]+)"', text)) | frozenset(
        re.findall(r'\bname="([^"]+)"', text)
    )


def test_every_page_reads_at_desktop_and_phone_width(
    site: Path, server: str, browser: Browser, capsys: pytest.CaptureFixture[str]
) -> None:
    pages = _pages(site)
    assert len(pages) > 15, pages
    shots = _screenshot_dir()
    keys = {path: name for name, path in KEY_PAGES.items()}
    assert set(keys) <= set(pages), f"a key page is gone: {set(keys) - set(pages)}"
    problems: list[str] = []
    for page in pages:
        for width in WIDTHS:
            where = f"/{page} at {width} px"
            found, errors, session, tab = _visit(browser, server + page, width)
            if found["scrollWidth"] > found["innerWidth"]:
                problems.append(
                    f"{where}: the page is {found['scrollWidth']} px wide, wider than the "
                    f"window ({found['innerWidth']} px): {found['wide']}"
                )
            problems += [f"{where}: image not loaded: {src}" for src in found["images"]]
            problems += [f"{where}: console: {e}" for e in errors]
            problems += [
                f"{where}: link to nothing: {link}"
                for link in _broken_links(site, server, found["links"])
            ]
            for block in found["copies"]:
                copied = block["copied"].rstrip().splitlines()
                commands = block["commands"].splitlines()
                if copied != commands:
                    problems.append(
                        f"{where}: the copy button copies {copied!r}, not the commands {commands!r}"
                    )
            if page in keys:
                path = shots / f"{keys[page]}-{width}.png"
                _screenshot(browser, session, width, found["height"], path)
            browser.send("Target.closeTarget", {"targetId": tab})
    with capsys.disabled():
        print(f"\nscreenshots of the documentation's key pages: {shots}")
    assert not problems, "\n".join(problems)
