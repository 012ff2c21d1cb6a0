"""Headless Chromium (Selenium, Debian's chromium and chromium-driver, started as
tests/api/dashboard_browser.py starts it) on the explorer's pages: used by the browser tests
and, by hand, for the screenshots of docs/img/::

    python -m tests.view.view_browser RUN_ROOT docs/img [--study STUDY_ROOT]   (from the repository root)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.api.dashboard_browser import _driver, missing_browser

__all__ = ["browser", "missing_browser", "table_cells", "hover", "wait_for", "screenshots"]


def browser(width: int = 1400, height: int = 1000):
    d = _driver()
    d.set_window_size(width, height)
    d.set_page_load_timeout(120)
    return d


def wait_for(driver, css: str, timeout_s: float = 30.0):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout_s).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def table_cells(driver, css: str, attr: str) -> list[dict[str, str]]:
    """Every element matching ``css`` as a dict of its ``data-*`` attributes (and its text)."""
    script = (
        "return Array.from(document.querySelectorAll(arguments[0])).map(function (e) {"
        "  var o = {text: e.innerText}; for (var k in e.dataset) o[k] = e.dataset[k];"
        "  return o; });"
    )
    return driver.execute_script(script, css)


def hover(driver, element) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).move_to_element(element).perform()


def screenshots(url: str, out: Path, *, study_url: str | None = None) -> list[Path]:
    """The run, questions (sorted by the first detector), a hallucinated question with a
    token hovered, and the study page, as PNGs in ``out``."""
    from selenium.webdriver.common.by import By

    out.mkdir(parents=True, exist_ok=True)
    made = []
    d = browser(1400, 1000)
    try:
        d.get(url)
        wait_for(d, "#counts")
        d.save_screenshot(str(out / "view_run.png"))
        made.append(out / "view_run.png")
        d.get(url + "questions?filter=hallucinated")
        wait_for(d, "#questions")
        sort = d.find_elements(By.CSS_SELECTOR, "th.det a")
        if sort:
            sort[0].click()  # a detector's column: most suspicious first
            wait_for(d, "#questions")
        d.save_screenshot(str(out / "view_questions.png"))
        made.append(out / "view_questions.png")
        d.find_element(By.CSS_SELECTOR, "a.question-link").click()
        wait_for(d, "#gen-0")
        tokens = d.find_elements(By.CSS_SELECTOR, "#gen-0 .tok")
        d.execute_script("document.getElementById('gen-0').scrollIntoView(true); scrollBy(0, -60)")
        if tokens:
            low = min(tokens, key=lambda t: float(t.get_attribute("data-logprob") or 0))
            hover(d, low)
        d.save_screenshot(str(out / "view_question.png"))
        made.append(out / "view_question.png")
        if study_url:
            d.get(study_url)
            wait_for(d, "#cells")
            d.save_screenshot(str(out / "view_study.png"))
            made.append(out / "view_study.png")
    finally:
        d.quit()
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="a run root (evaluated)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--study", type=Path, default=None, help="a study root")
    args = ap.parse_args(argv)
    from hallulog.view.app import create_app
    from hallulog.view.server import ViewServer

    with ViewServer(create_app(args.root)) as run:
        if args.study is None:
            made = screenshots(run.url, args.out)
        else:
            with ViewServer(create_app(args.study)) as study:
                made = screenshots(run.url, args.out, study_url=study.url)
    for p in made:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
