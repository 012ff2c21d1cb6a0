"""Drive headless Debian Chromium over the DevTools protocol, with the standard library only.

Used by the dashboard browser test, and usable against a real run:

    python tests/api/chromium_cdp.py http://127.0.0.1:8765/ --token T --rise 3 --screenshot out.png

opens the dashboard, waits until its done count (``#done``) has risen ``--rise`` times without a
page reload (so the rise came over the live event stream), saves a screenshot and prints the path.

The WebSocket client below is the minimum CDP needs (client-masked text frames out, unmasked
frames in, continuation, ping/pong, close); no third-party package is required.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit, parse_qsl

__all__ = ["chromium_binary", "Browser", "BrowserError", "watch_dashboard"]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio"]


class BrowserError(RuntimeError):
    pass


def chromium_binary() -> str | None:
    """Path of the Chromium binary (``$CHROMIUM``, else ``chromium`` on PATH), or None."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _WebSocket:
    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout_s)
        key = base64.b64encode(os.urandom(16)).decode()
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        request = (f"GET {path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
                   "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise BrowserError("DevTools closed the connection during the handshake")
            head += chunk
        head, _, self._buf = head.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise BrowserError(f"DevTools WebSocket handshake failed: {status.decode(errors='replace')}")

    def send_text(self, text: str) -> None:
        self._send(0x1, text.encode())

    def _send(self, opcode: int, payload: bytes) -> None:
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise BrowserError("DevTools connection closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def recv_text(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            fin, opcode, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x8:
                raise BrowserError("DevTools sent close")
            if opcode == 0x9:
                self._send(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            message += payload
            if fin:
                return message.decode()

    def close(self) -> None:
        try:
            self._send(0x8, b"")
        except OSError:
            pass
        self.sock.close()


class Browser:
    """One headless Chromium with a fresh profile directory and one page, driven over CDP."""

    def __init__(self, *, binary: str | None = None, window: tuple[int, int] = (1280, 1000),
                 timeout_s: float = 30.0) -> None:
        self.binary = binary or chromium_binary()
        if not self.binary:
            raise BrowserError("chromium not found (apt-get install -y chromium, or set $CHROMIUM)")
        self.window = window
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen | None = None
        self._profile: str | None = None
        self._ws: _WebSocket | None = None
        self._next_id = 0
        self.events: list[dict] = []

    def __enter__(self) -> "Browser":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="hallulog-chromium-")
        self._log = open(os.path.join(self._profile, "chromium.log"), "wb")
        w, h = self.window
        cmd = [self.binary, *FLAGS, f"--user-data-dir={self._profile}",
               "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
               f"--window-size={w},{h}", "about:blank"]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT)
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self._proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self._proc.returncode}: {self._tail()}")
            if port_file.exists():
                text = port_file.read_text().split()
                if text:
                    port = int(text[0])
                    break
            if time.monotonic() > deadline:
                raise BrowserError(f"chromium gave no DevTools port in {self.timeout_s:.0f} s: "
                                   f"{self._tail()}")
            time.sleep(0.05)
        page = self._page_target(port, deadline)
        self._ws = _WebSocket(page["webSocketDebuggerUrl"], self.timeout_s)
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _page_target(self, port: int, deadline: float) -> dict:
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("GET", "/json/list")
                targets = json.loads(conn.getresponse().read())
            except (OSError, ValueError):
                targets = []
            finally:
                conn.close()
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return pages[0]
            if time.monotonic() > deadline:
                raise BrowserError("chromium has no page target")
            time.sleep(0.1)

    def call(self, method: str, params: dict | None = None) -> dict:
        """Send one CDP command and return its result (events received meanwhile are kept)."""
        assert self._ws is not None, "browser not started"
        self._next_id += 1
        msg_id = self._next_id
        self._ws.send_text(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        while True:
            msg = json.loads(self._ws.recv_text())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def navigate(self, url: str) -> None:
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"cannot open {url}: {result['errorText']}")
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"JS error in {expression!r}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression!r}")
            time.sleep(0.1)

    def screenshot(self, path: str | Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except OSError:
                pass
            self._ws = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
            self._proc = None
            self._log.close()
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None

    def _tail(self) -> str:
        try:
            self._log.flush()
            return Path(self._profile, "chromium.log").read_text(errors="replace")[-800:]
        except OSError:
            return "(no log)"


def dashboard_url(url: str, token: str | None) -> str:
    """``url`` with ``#token=`` added (the page sends it to /events as a bearer header; a
    fragment never reaches the server)."""
    if not token:
        return url
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query,
                       urlencode({"token": token})))


def watch_dashboard(url: str, *, token: str | None = None, rises: int = 2,
                    timeout_s: float = 60.0, screenshot: str | Path | None = None,
                    browser: Browser | None = None) -> dict:
    """Open the dashboard at ``url`` and wait until ``#done`` has risen ``rises`` times.

    The page gets a marker after it loads; the marker must survive until the end, which proves
    the count rose through the live event stream and not by a reload. Returns ``{"values": the
    distinct done counts seen, "connection": the page's connection label, "screenshot": path}``.
    """
    own = browser is None
    browser = browser or Browser()
    try:
        if own:
            browser.start()
        browser.navigate(dashboard_url(url, token))
        browser.evaluate("window.__hallulogMarker = 'loaded-once'")
        read = "(function(){var e=document.getElementById('done');" \
               "return e && e.dataset.value !== undefined ? Number(e.dataset.value) : null;})()"
        values: list[int] = []
        deadline = time.monotonic() + timeout_s
        while len(values) < rises + 1:
            if time.monotonic() > deadline:
                raise BrowserError(f"done count rose only through {values} in {timeout_s:.0f} s")
            if browser.evaluate("window.__hallulogMarker") != "loaded-once":
                raise BrowserError("the dashboard reloaded instead of updating live")
            value = browser.evaluate(read)
            if value is not None and (not values or value > values[-1]):
                values.append(int(value))
            time.sleep(0.1)
        connection = browser.evaluate("document.getElementById('conn').textContent")
        shot = None
        if screenshot is not None:
            shot = browser.screenshot(screenshot)
        return {"values": values, "connection": connection, "screenshot": shot}
    finally:
        if own:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="watch a hallulog status dashboard in headless Chromium")
    ap.add_argument("url", help="dashboard URL, e.g. http://127.0.0.1:8765/")
    ap.add_argument("--token", default=None)
    ap.add_argument("--rise", type=int, default=2, help="how many rises of the done count to see")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--screenshot", default="dashboard.png")
    args = ap.parse_args(argv)
    result = watch_dashboard(args.url, token=args.token, rises=args.rise, timeout_s=args.timeout,
                             screenshot=args.screenshot)
    print(f"done counts seen: {result['values']} (connection: {result['connection']})")
    print(f"screenshot: {Path(result['screenshot']).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
