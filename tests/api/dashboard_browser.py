"""Watch the status dashboard in headless Chromium through Selenium (Debian's chromium and
chromium-driver): used by the dashboard tests and runnable by hand against a real run::

    python tests/api/dashboard_browser.py http://127.0.0.1:PORT/ --screenshot shot.png
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

__all__ = ["missing_browser", "watch_dashboard", "dashboard_url"]

_READ_DONE = (
    "var e = document.getElementById('done');"
    "return e && e.dataset.value !== undefined ? Number(e.dataset.value) : null;"
)


def _binaries() -> tuple[str | None, str | None]:
    chromium = (
        os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    return chromium, os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")


def missing_browser() -> str | None:
    """Why a browser test cannot run here (None when it can)."""
    chromium, driver = _binaries()
    if chromium is None:
        return "Debian chromium not installed (apt-get install -y chromium)"
    if driver is None:
        return "Debian chromium-driver not installed (apt-get install -y chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install -e .[dev])"
    return None


def dashboard_url(url: str, token: str | None) -> str:
    """``url`` with ``#token=`` added (the page sends it to /events as a bearer header; a
    fragment never reaches the server)."""
    if not token:
        return url
    parts = urlsplit(url)
    return urlunsplit(
        (parts.scheme, parts.netloc, parts.path or "/", parts.query, urlencode({"token": token}))
    )


def _driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = _binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium  # type: ignore[assignment]
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def watch_dashboard(
    url: str,
    *,
    token: str | None = None,
    rises: int = 2,
    timeout_s: float = 60.0,
    screenshot: str | Path | None = None,
    on_loaded: Callable[[], None] | None = None,
) -> dict:
    """Open the dashboard at ``url`` and wait until ``#done`` has risen ``rises`` times.

    The page gets a marker after it loads; the marker must survive until the end, which proves
    the count rose through the live event stream and not by a reload. Returns ``{"values": the
    distinct done counts seen, "connection": the page's connection label, "screenshot": path}``.
    ``on_loaded`` is called once the page is up (e.g. to start feeding a test board).
    """
    driver = _driver()
    try:
        driver.set_page_load_timeout(timeout_s)
        driver.get(dashboard_url(url, token))
        driver.execute_script("window.__hallulogMarker = 'loaded-once';")
        if on_loaded is not None:
            on_loaded()
        values: list[int] = []
        deadline = time.monotonic() + timeout_s
        while len(values) < rises + 1:
            if time.monotonic() > deadline:
                raise AssertionError(f"done count rose only through {values} in {timeout_s:.0f} s")
            if driver.execute_script("return window.__hallulogMarker;") != "loaded-once":
                raise AssertionError("the dashboard reloaded instead of updating live")
            value = driver.execute_script(_READ_DONE)
            if value is not None and (not values or value > values[-1]):
                values.append(int(value))
            time.sleep(0.1)
        connection = driver.find_element("id", "conn").text
        shot = None
        if screenshot is not None:
            Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(screenshot))
            shot = str(screenshot)
        return {"values": values, "connection": connection, "screenshot": shot}
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="watch a hallulog status dashboard in Chromium")
    ap.add_argument("url")
    ap.add_argument("--token", default=None)
    ap.add_argument("--rise", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--screenshot", default=None)
    args = ap.parse_args(argv)
    print(
        watch_dashboard(
            args.url,
            token=args.token,
            rises=args.rise,
            timeout_s=args.timeout,
            screenshot=args.screenshot,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
