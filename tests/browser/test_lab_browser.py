"""The tour runs in a real JupyterLab, in a real browser, and shows its results.

JupyterLab (started by scripts/lab.sh) is driven by Python Playwright in
Debian's Chromium: open notebooks/00_tour.ipynb, Run > Run All Cells, wait for
the kernel, then check the page itself: the schedule grid, the bubble line and
the final "tour OK" line are displayed, nothing was written to stderr, and the
notebook and its script on disk are untouched. A screenshot is kept in test-artifacts/.
"""

from __future__ import annotations

import hashlib
import json

import pytest

TOUR = "notebooks/00_tour.ipynb"


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_tour_runs_all_cells_in_jupyterlab(lab_page, lab_server):
    tour_file = lab_server.root / TOUR
    tour_files = (tour_file, tour_file.with_suffix(".py"))
    digests_before = [hashlib.sha256(path.read_bytes()).hexdigest() for path in tour_files]
    code_cells = sum(cell["cell_type"] == "code" for cell in json.loads(tour_file.read_text())["cells"])

    lab_page.open(TOUR)
    assert lab_page.count(".jp-Dialog") == 0
    # the first screen shows a picture of a run: the monitor screenshot, loaded
    picture = lab_page.page.locator(".jp-Notebook .jp-MarkdownCell img").first
    picture.wait_for(state="visible", timeout=20_000)
    assert picture.evaluate("img => img.complete && img.naturalWidth > 100"), picture.get_attribute("src")
    assert picture.evaluate("img => img.getBoundingClientRect().top < window.innerHeight * 1.5")
    hrefs = lab_page.page.locator(".jp-Notebook .jp-MarkdownCell a").evaluate_all("as => as.map(a => a.href)")
    lessons = {h.split("?")[0].split("#")[0].rsplit("/", 1)[-1] for h in hrefs if ".ipynb" in h} - {"00_tour.ipynb"}
    assert len(lessons) == 8 and "01_data_parallel_and_sharding.ipynb" in lessons, hrefs  # "where next" links every lesson
    assert lab_page.count(".jp-Notebook .jp-CodeCell") == code_cells
    assert "Python 3 (ipykernel)" in lab_page.page.locator(".jp-Toolbar-kernelName").first.inner_text()

    lab_page.run_all()
    shot = lab_page.screenshot("tour")

    text = lab_page.output_text()
    assert "rank0 rank1" in text and "0F0" in text and "1B0" in text, text[:2000]
    assert "rank 0: bubble 25% (GPipe formula: 25%)" in text
    assert "text round trip holds: True | JSON round trip holds: True" in text
    assert "tour OK: 8 steps, bubble 25%, 12 trace slices" in text
    prompts = lab_page.page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").all_inner_texts()
    assert [p.strip() for p in prompts] == [f"[{n}]:" for n in range(1, code_cells + 1)]
    assert lab_page.stderr_outputs() == []
    assert shot.stat().st_size > 10_000
    digests_after = [hashlib.sha256(path.read_bytes()).hexdigest() for path in tour_files]
    assert digests_after == digests_before, "the browser run wrote into the committed notebook"
