"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``): the
tests that need layout (where a column ends, whether a panel covers it) open one page, wait, and run
JavaScript in it. No websocket client is needed: the protocol's JSON messages go over file
descriptors 3 (commands in) and 4 (replies out), each ending with a NUL byte."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conftest import require_chromium


class Page:
    """One tab of a fresh browser profile, sized like a window of ``width`` x ``height``."""

    def __init__(self, proc: subprocess.Popen[bytes], out: Any, inp: Any) -> None:
        self._proc, self._out, self._in, self._buf, self._n = proc, out, inp, b"", 0
        self._session: str | None = None

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._n += 1
        msg: dict[str, Any] = {"id": self._n, "method": method, "params": params or {}}
        if self._session is not None and not method.startswith("Target."):
            msg["sessionId"] = self._session
        self._out.write(json.dumps(msg).encode("utf-8") + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = self._in.read(1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed its DevTools pipe")
                self._buf += chunk
            raw, _, self._buf = self._buf.partition(b"\0")
            reply = json.loads(raw)
            if reply.get("id") == self._n:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        out = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in out:
            raise RuntimeError(out["exceptionDetails"])
        return out["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60) -> None:
        """Poll ``expression`` until it is truthy (an error, e.g. no page body yet, counts as false);
        fails after ``timeout_s``."""
        check = f"(() => {{ try {{ return !!({expression}); }} catch (e) {{ return false; }} }})()"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.evaluate(check):
                return
            time.sleep(0.5)
        raise AssertionError(f"not true within {timeout_s:.0f} s: {expression}")

    def goto(self, url: str, ready: str, timeout_s: float = 60) -> None:
        """Open ``url`` in this tab (the same browser and profile: no second start of Chromium) and
        wait until the JavaScript expression ``ready`` is truthy."""
        self.send("Page.navigate", {"url": url})
        self.wait_for(ready, timeout_s)

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))


@contextlib.contextmanager
def open_page(url: str, profile: Path, width: int = 1600, height: int = 1100) -> Iterator[Page]:
    """``url`` in headless Chromium with a fresh profile (a first visit), at ``width`` x ``height``."""
    cmd_r, cmd_w = os.pipe()
    out_r, out_w = os.pipe()

    def fds() -> None:  # in the child: the protocol's descriptors 3 and 4
        a, b = os.dup(cmd_r), os.dup(out_w)
        os.dup2(a, 3)
        os.dup2(b, 4)

    args = [
        str(require_chromium()),
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        f"--user-data-dir={profile}",
        "--remote-debugging-pipe",
        f"--window-size={width},{height}",
        "about:blank",
    ]
    proc = subprocess.Popen(
        args, preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    os.close(cmd_r)
    os.close(out_w)
    with os.fdopen(cmd_w, "wb", buffering=0) as w, os.fdopen(out_r, "rb", buffering=0) as r:
        page = Page(proc, w, r)
        try:
            target = page.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            attached = page.send("Target.attachToTarget", {"targetId": target, "flatten": True})
            page._session = attached["sessionId"]
            size = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
            page.send("Emulation.setDeviceMetricsOverride", size)
            page.send("Page.navigate", {"url": url})
            yield page
        finally:
            with contextlib.suppress(Exception):
                page.send("Browser.close")
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


#: JavaScript: the assistant panel's width when MLflow shows it (0 when closed or absent).
ASSISTANT_PANEL = (
    "Math.max(0, ...[...document.querySelectorAll('[data-assistant-ui]')]"
    ".map(e => e.getBoundingClientRect().width).filter(w => w > 100))"
)


def visible(selector_js: str) -> str:
    """JavaScript: whether the element ``selector_js`` evaluates to is whole inside the window and
    inside every scrolled or clipped box around it (not cut by a table's edge), and on top at its
    centre (no panel or other element covers it)."""
    return (
        f"(() => {{ const e = {selector_js}; if (!e) return false; const r = e.getBoundingClientRect();"
        " if (r.width === 0 || r.left < 0 || r.top < 0 || r.right > innerWidth || r.bottom > innerHeight)"
        " return false;"
        " for (let a = e.parentElement; a; a = a.parentElement) {"
        "  if (getComputedStyle(a).overflowX === 'visible') continue;"
        "  const b = a.getBoundingClientRect(), right = b.left + a.clientLeft + a.clientWidth;"
        "  if (r.left < b.left - 1 || r.right > right + 1) return false; }"
        " const hit = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);"
        " return !!hit && (e.contains(hit) || hit.contains(e)); })()"
    )
