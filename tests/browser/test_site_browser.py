"""The static site (`make site`) opened in a real browser with no network: every lesson shows its figures.

``scripts/build_site.py`` builds the site into a temporary folder, as
``make site`` does: it takes each lesson's executed copy from the ignored
``build/lessons/`` when its stamp matches the lesson as it is now (the
notebook tests leave one for each lesson that passes) and executes the
others itself. Chromium, whose every request to anywhere but the site is
refused, then

1. opens the home page from a local HTTP server, finds a link to every
   lesson (every ``notebooks/NN_*.ipynb``), follows each from the home page
   and sees at least one figure drawn on the lesson's page (a plotly plot
   with its SVG, or an image with its pixels), and
2. opens it from disk (``file://``): the home page links every lesson, and
   the first two, followed, draw their figures.

A page error, a failed request or a request that had to be refused fails
the test. Where a lesson would be executed here that the suite runs alone
(``EXCLUSIVE_NOTEBOOKS``, checks of measured speed), the first test runs
alone as well (``tests/conftest.py``: marker ``site``).
"""

from __future__ import annotations

import functools
import http.server
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.site]

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"
VIEWPORT = {"width": 1400, "height": 1000}
BUILD_TIMEOUT_S = 1500  # executing every lesson, when no executed copy is there, on a loaded 2-core machine
FIGURE_TIMEOUT_S = 60
LESSON = re.compile(r"/notebooks/(\d\d_[\w-]+)\.html$")

# the lesson's figures that are drawn: a plotly plot with its SVG at a non-zero size, or an image with its pixels
_DRAWN_FIGURES_JS = """() => {
    const visible = el => { const box = el.getBoundingClientRect(); return box.width > 0 && box.height > 0; };
    const plots = [...document.querySelectorAll('.jupyter-wrapper .js-plotly-plot')]
        .filter(plot => [...plot.querySelectorAll('svg.main-svg')].some(visible));
    const images = [...document.querySelectorAll('.jupyter-wrapper .jp-OutputArea-output img')]
        .filter(img => img.complete && img.naturalWidth > 0 && visible(img));
    return plots.length + images.length;
}"""


def _lessons() -> list[str]:
    return sorted({path.stem for path in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
                  | {path.stem for path in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py")})


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built by scripts/build_site.py into a fresh folder; returns that folder."""
    where = tmp_path_factory.mktemp("site")
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "build_site.py"),
                           "--site-dir", str(where / "site"), "--work-dir", str(where / "src")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    print(done.stdout)
    assert done.returncode == 0, f"scripts/build_site.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    print(f"site built in {time.monotonic() - began:.0f} s")
    return where / "site"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def served(site):
    """The site on a local HTTP server; yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _Offline:
    """A browser context that refuses every request outside ``base`` and records what went wrong."""

    def __init__(self, chromium, base: str, name: str) -> None:
        self.base, self.name = base, name
        self.refused: list[str] = []
        self.failed: list[str] = []
        self.errors: list[str] = []
        self.context = chromium.new_context(viewport=VIEWPORT)
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda error: self.errors.append(f"{self.page.url}: {error}"))
        self.page.on("requestfailed", self._request_failed)
        self.page.on("response", self._response)

    def _local(self, url: str) -> bool:
        return url.startswith(self.base) or url.split(":", 1)[0] in ("data", "blob", "about")

    def _route(self, route) -> None:
        url = route.request.url
        if self._local(url):
            route.continue_()
        else:
            self.refused.append(url)
            route.abort("internetdisconnected")

    def _request_failed(self, request) -> None:
        if not self._local(request.url) or request.url.startswith("about:"):  # refused, or MathJax's font probe
            return
        if request.failure == "net::ERR_ABORTED":  # cancelled by leaving the page (MathJax's fonts, the search)
            return
        self.failed.append(f"{request.url}: {request.failure}")

    def _response(self, response) -> None:
        if response.status >= 400:
            self.failed.append(f"{response.url}: HTTP {response.status}")

    def lesson_links(self) -> dict[str, str]:
        """The lessons the current page links, each to the URL it links."""
        hrefs = self.page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
        return {match.group(1): href.split("#")[0] for href in hrefs if (match := LESSON.search(href.split("#")[0]))}

    def follow_to_lesson(self, home: str, lesson: str) -> int:
        """From the home page, click the first visible link to ``lesson``; returns how many figures are drawn."""
        self.page.goto(home)
        link = self.page.locator(f"a[href*='notebooks/{lesson}.html']:visible").first
        link.click()
        self.page.wait_for_url(re.compile(rf"/notebooks/{lesson}\.html(#.*)?$"))
        assert self.page.locator(".jupyter-wrapper .jp-Cell").count() > 0, f"{lesson}: no notebook on the page"
        try:
            return self.page.wait_for_function(_DRAWN_FIGURES_JS, timeout=FIGURE_TIMEOUT_S * 1000).json_value()
        except Exception:
            ARTIFACTS_DIR.mkdir(exist_ok=True)
            shot = ARTIFACTS_DIR / f"{self.name}-{lesson}.png"
            self.page.screenshot(path=str(shot), timeout=120_000)
            raise AssertionError(f"{lesson}: no figure drawn within {FIGURE_TIMEOUT_S} s (screenshot {shot}); "
                                 f"page errors {self.errors}, failed {self.failed}, refused {self.refused}") from None

    def check_clean(self) -> None:
        assert self.errors == [], f"page errors: {self.errors}"
        assert self.failed == [], f"failed requests: {self.failed}"
        assert self.refused == [], f"requests outside the site (refused): {self.refused}"

    def close(self) -> None:
        self.context.close()


def _every_lesson_from_the_home_page(chromium, base: str, name: str, visit: int | None = None) -> dict[str, int]:
    """Follow the home page's link to every lesson (the first ``visit`` of them, when given) and count the
    figures drawn on each."""
    browser = _Offline(chromium, base, name)
    try:
        home = base + "index.html"
        browser.page.goto(home)
        links = browser.lesson_links()
        lessons = _lessons()
        assert sorted(links) == lessons, f"the home page links the lessons {sorted(links)}, not {lessons}"
        drawn = {lesson: browser.follow_to_lesson(home, lesson) for lesson in lessons[:visit]}
        print(f"{name}: figures drawn per lesson: {drawn}")
        assert all(count >= 1 for count in drawn.values()), drawn
        browser.check_clean()
        return drawn
    finally:
        browser.close()


@pytest.mark.timeout(BUILD_TIMEOUT_S + 300)
def test_every_lesson_served_offline_shows_its_figures(chromium, served):
    _every_lesson_from_the_home_page(chromium, served, "site-served")


@pytest.mark.timeout(300)
def test_the_site_opened_from_disk_links_every_lesson_and_draws_figures(chromium, site):
    # every lesson's page is the same kind of file served or not: the served test visits all nine, this one
    # checks that file:// finds the home page's links to all of them and draws the figures of the first two
    _every_lesson_from_the_home_page(chromium, site.as_uri() + "/", "site-file", visit=2)
