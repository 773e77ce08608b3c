"""Debian's headless chromium on the platform's Dagster UI: the rendered page as text (the UI tests) or as
a PNG (the README's screenshots, `scripts/ui_screenshots.py`).

The UI is a single-page app: chromium runs its JavaScript for `wait_ms` of virtual time (the app's
GraphQL requests to the live webserver included) before it dumps the DOM or paints the screenshot.
What a click opens (a dialog, a menu) needs a page to drive: `open_page` starts chromium with its
DevTools protocol on a local port and gives a `Page` that waits for text, clicks a control named by
its text or label, reads the visible text and paints a PNG, all of one rendered state.
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import websocket

INSTALL_HINT = "install Debian's chromium (`apt-get install -y chromium`; `make test` does it when run as root)"
_HIDDEN = re.compile(r"<(script|style)\b.*?</\1>", re.S | re.I)
_TAG = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"\s+")


def chromium() -> str:
    """The chromium executable; a `RuntimeError` saying how to install it when there is none."""
    found = shutil.which("chromium")
    if found is None:
        raise RuntimeError(f"no `chromium` on PATH: {INSTALL_HINT}")
    return found


def _flags(profile: str) -> list[str]:
    return [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--hide-scrollbars",
        "--window-size=1600,1000",
    ]


def _render(url: str, output: list[str], wait_ms: int) -> str:
    with tempfile.TemporaryDirectory(prefix="xirang-chromium-") as profile:
        done = subprocess.run(
            [*_flags(profile), f"--virtual-time-budget={wait_ms}", *output, url],
            timeout=300,
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed on {url} (exit {done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def rendered_text(url: str, wait_ms: int = 25000) -> str:
    """The visible text of `url` once the app has rendered: the DOM without scripts, styles and markup,
    entities decoded, whitespace collapsed to single spaces."""
    dom = _render(url, ["--dump-dom"], wait_ms)
    return _SPACE.sub(" ", html.unescape(_TAG.sub(" ", _HIDDEN.sub(" ", dom)))).strip()


def screenshot(url: str, path: Path, wait_ms: int = 25000) -> None:
    """A 1600x1000 PNG of `url` at `path` once the app has rendered."""
    _render(url, [f"--screenshot={path}"], wait_ms)


# What `Page.click` finds: the first control (in document order) whose text is the name, or, for a
# control showing only an icon, whose icon's `aria-label` is (Dagster labels each icon by its name).
_CLICK = """(name) => {
  const named = el => el.innerText.trim() === name
    || (el.innerText.trim() === '' && el.querySelector(`[role=img][aria-label="${name}"]`) !== null);
  const hit = [...document.querySelectorAll('button, a, [role=menuitem]')].find(named);
  if (!hit) return false;
  hit.click();
  return true;
}"""


class Page:
    """One chromium tab on the DevTools protocol (`open_page`)."""

    def __init__(self, socket: Any) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command and its result (events arriving meanwhile are skipped); a
        `RuntimeError` with chromium's message when it fails."""
        sent = next(self._ids)
        self._socket.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            reply = json.loads(self._socket.recv())
            if reply.get("id") != sent:
                continue
            if "error" in reply:
                raise RuntimeError(f"chromium refused {method}: {reply['error']}")
            return dict(reply.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"the page could not evaluate {expression[:80]!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def text(self) -> str:
        """The page's visible text, whitespace collapsed to single spaces."""
        return _SPACE.sub(" ", str(self.evaluate("document.body ? document.body.innerText : ''"))).strip()

    def wait_for(self, fragments: list[str], timeout: float = 120) -> str:
        """Wait until every fragment is in the visible text; that text. A `RuntimeError` naming the
        fragments still missing, with the text, after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            missing = [f for f in fragments if f not in text]
            if not missing:
                return text
            if time.monotonic() > deadline:
                raise RuntimeError(f"the page never showed {missing}; it shows: {text[:3000]}")
            time.sleep(0.5)

    def click(self, name: str, timeout: float = 60) -> None:
        """Click the first control named `name` (its text, or its icon's name for an icon button), once
        it is there; a `RuntimeError` after `timeout` seconds without one."""
        deadline = time.monotonic() + timeout
        while not self.evaluate(f"({_CLICK})({json.dumps(name)})"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no control named {name!r} on the page; it shows: {self.text()[:3000]}")
            time.sleep(0.5)

    def screenshot(self, path: Path) -> None:
        """A PNG of the window (1600x1000) as it is now."""
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))


@contextmanager
def open_page(url: str, timeout: float = 60) -> Iterator[Page]:
    """A headless chromium showing `url`, driven over its DevTools protocol; chromium ends with the block."""
    with tempfile.TemporaryDirectory(prefix="xirang-chromium-") as profile:
        browser = subprocess.Popen(
            [*_flags(profile), "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            socket = websocket.create_connection(_page_socket(Path(profile), browser, timeout), timeout=timeout)
            try:
                page = Page(socket)
                page.call("Page.enable")
                # the window's size (`_flags`) less what headless chromium keeps of it for itself
                page.call(
                    "Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1, mobile=False
                )
                page.call("Page.navigate", url=url)
                yield page
            finally:
                socket.close()
        finally:
            browser.terminate()
            try:
                browser.wait(timeout=30)
            except subprocess.TimeoutExpired:
                browser.kill()
                browser.wait()


def _page_socket(profile: Path, browser: subprocess.Popen[bytes], timeout: float) -> str:
    """The DevTools address of the browser's first tab, once chromium has written its port
    (`DevToolsActivePort` in its profile) and opened the tab."""
    deadline = time.monotonic() + timeout
    while True:
        if browser.poll() is not None:
            raise RuntimeError(f"chromium exited with {browser.returncode} before its DevTools port opened")
        try:
            port = (profile / "DevToolsActivePort").read_text().split()[0]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as reply:
                tabs = [t for t in json.loads(reply.read()) if t.get("type") == "page"]
            if tabs:
                return str(tabs[0]["webSocketDebuggerUrl"])
        except (OSError, IndexError, ValueError):
            pass  # not written or not listening yet
        if time.monotonic() > deadline:
            raise RuntimeError(f"chromium's DevTools port did not open within {timeout:g} s")
        time.sleep(0.2)
