"""Every widget's plotly figures are drawn with their data in a real JupyterLab, also when the browser is busy.

A notebook written for the test (under the ignored ``runs/``) shows each
widget; each draws its figures as ``FigureWidget`` children of ipywidgets
boxes. Plots are found in the page and counted: drawn traces, bars, size and
title (the balance figure's title names the partition it draws).

1. A busy browser. plotly's widget code is a 5 MB module that anywidget
   imports for every figure; when that takes more than 2 s, anywidget gives
   up on the figure's model and drops its comm messages, and a figure that
   arrived in a message after the comm opened is drawn as empty axes. A
   script added to the page holds the main thread for 2.1 s whenever such a
   module is about to be imported, so every figure of the PartitionEditor,
   ScheduleExplorer, TopologyView and PlanExplorer goes that way; each must
   still be drawn with its data at a non-zero size.
2. Updates. With the hold switched off, a second PartitionEditor and a
   JobMonitor of a finished synthetic run (its curves are all added after
   its figures were built) are shown; a boundary of the editor is moved with
   the keyboard and its figures must follow.

No widget here uses tabs or accordions, so nothing is drawn hidden.
Screenshots are kept in test-artifacts/.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

_SETUP = """\
import random, sys, time
from pathlib import Path
sys.path.insert(0, str(Path.cwd().parents[1] / "tests" / "jobs"))
from job_test_helpers import write_synthetic_run
from workbench.core.costs import LayerCost, ModelCosts
from workbench.core.topology import Topology
from workbench.jobs import attach
from workbench.planning import SearchOptions, Workload, plan
from workbench.widgets import JobMonitor, PartitionEditor, PlanExplorer, ScheduleExplorer, TopologyView
rng = random.Random(1)
costs = ModelCosts("synthetic", 32, "synthetic", tuple(
    LayerCost(f"layer{i}", rng.uniform(0.5, 2.0), rng.uniform(1.0, 4.0), param_bytes=2**20,
              activation_bytes=2**20, saved_bytes=2**20) for i in range(16)))"""
_EDITOR = "PartitionEditor(costs, num_stages=4, num_microbatches=8, cluster=None, models=[])"
_BUSY_CELLS = [  # shown while the page holds every import of plotly's widget code
    _SETUP,
    _EDITOR,
    'ScheduleExplorer("1f1b", stages=4, microbatches=8, compare="gpipe")',
    "TopologyView(Topology(dp=2, tp_row=2, tp_col=2))",
    'PlanExplorer(costs, "4xV100-NVLink", 32, result=plan(Workload(costs, 32), "4xV100-NVLink",'
    ' options=SearchOptions(top=4, recompute=(False,))))',
]
_LATER_CELLS = [
    _EDITOR,
    'JobMonitor(attach(write_synthetic_run(Path("job"), steps=6)), mode="widget")',
]
_FIGURES_PER_CELL = {1: 2, 2: 1, 3: 1, 4: 2, 5: 2, 6: 3}  # code cell index -> plotly figures it shows

# Before any page script: hold the main thread 2.1 s whenever a JavaScript module is made into a blob URL
# (anywidget's way of importing a widget's code), while window.__wbHoldWidgetCode is true.
_HOLD_WIDGET_CODE_JS = """(() => {
    const createObjectURL = URL.createObjectURL.bind(URL);
    window.__wbHoldWidgetCode = true;
    URL.createObjectURL = (object) => {
        if (window.__wbHoldWidgetCode && object instanceof Blob && object.type === 'text/javascript') {
            const until = performance.now() + 2100;
            while (performance.now() < until) { /* busy */ }
        }
        return createObjectURL(object);
    };
})();"""
# make code cell ``index`` the active one, then run ``command`` ('notebook:run-all-above' / '...-below')
_RUN_AROUND_CELL_JS = """([index, command]) => { const notebook = window.jupyterapp.shell.currentWidget.content;
    notebook.activeCellIndex = index; window.jupyterapp.commands.execute(command); }"""
_CELLS_RAN_JS = r"""(count) => {
    const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')].slice(0, count);
    return prompts.length === count && prompts.every(p => /\[\d+\]/.test(p.textContent));
}"""
_PLOTS_JS = """() => [...document.querySelectorAll('.jp-Notebook .js-plotly-plot')].map(plot => {
    const box = plot.getBoundingClientRect();
    return {cell: [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].indexOf(plot.closest('.jp-CodeCell')),
            traces: plot.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
            bars: plot.querySelectorAll('.barlayer .point').length,
            width: Math.round(box.width), height: Math.round(box.height),
            title: (plot.querySelector('.gtitle') || {textContent: ''}).textContent};
})"""


def write_notebook(path, cells) -> None:
    """A notebook of code ``cells`` (sources) for the Python 3 kernel, outputs empty."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "metadata": {}, "source": source, "outputs": [], "execution_count": None}
                  for source in cells],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))


@pytest.fixture
def widget_notebook(lab_server):
    """The test's notebook under the served root's ignored runs/ (removed afterwards); its path from the root."""
    folder = lab_server.root / "runs" / f"browser-widgets-{os.getpid()}"
    write_notebook(folder / "widgets.ipynb", [*_BUSY_CELLS, *_LATER_CELLS])
    yield str((folder / "widgets.ipynb").relative_to(lab_server.root))
    shutil.rmtree(folder, ignore_errors=True)


def _run_cells(lab_page, command: str, count: int, timeout_s: float = 180.0) -> None:
    """Run the cells above (or from) the first later cell, then wait until the first ``count`` cells have run."""
    lab_page.page.evaluate(_RUN_AROUND_CELL_JS, [len(_BUSY_CELLS), command])
    lab_page.wait_for_cells(_CELLS_RAN_JS, timeout_s, arg=count)
    lab_page.wait_for_kernel_idle(timeout_s)


def _plots_of(lab_page, cells) -> list[dict]:
    """The plots of ``cells`` once all their figures are drawn with traces (or, after 30 s, as they are)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # the fixtures have skipped without it

    expected = sum(_FIGURES_PER_CELL[cell] for cell in cells)
    try:
        lab_page.page.wait_for_function(
            f"(cells) => ({_PLOTS_JS})().filter(p => cells.includes(p.cell) && p.traces > 0).length >= {expected}",
            arg=list(cells), timeout=30_000)
    except PlaywrightTimeout:  # a figure drawn empty stays empty: the assertions say which
        pass
    return [p for p in lab_page.page.evaluate(_PLOTS_JS) if p["cell"] in cells]


def _check_drawn(plots: list[dict], cells, shot) -> None:
    assert {cell: sum(p["cell"] == cell for p in plots) for cell in cells} == {c: _FIGURES_PER_CELL[c] for c in cells}
    empty = [p for p in plots if p["traces"] == 0 or p["width"] == 0 or p["height"] == 0]
    assert empty == [], f"{len(empty)} of {len(plots)} figures drawn without data (screenshot {shot}): {empty}"


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_every_widget_figure_is_drawn_with_data_when_busy_and_after_updates(lab_page, widget_notebook):
    lab_page.page.add_init_script(_HOLD_WIDGET_CODE_JS)
    lab_page.open(widget_notebook)
    _run_cells(lab_page, "notebook:run-all-above", len(_BUSY_CELLS))
    busy = range(1, len(_BUSY_CELLS))
    plots = _plots_of(lab_page, busy)
    shot = lab_page.screenshot("busy-browser")
    balance_figure = lab_page.page.locator(".wb-partition-editor .js-plotly-plot").first
    balance_figure.scroll_into_view_if_needed()
    balance_figure.screenshot(path=str(shot.with_name(shot.name.replace(".png", "-balance.png"))))
    _check_drawn(plots, busy, shot)
    assert any(p["title"].startswith("Stage balance") for p in plots), plots

    lab_page.page.evaluate("() => { window.__wbHoldWidgetCode = false; }")
    _run_cells(lab_page, "notebook:run-all-below", len(_BUSY_CELLS) + len(_LATER_CELLS))
    assert lab_page.page.locator("[data-mime-type='application/vnd.jupyter.error']").count() == 0, \
        lab_page.output_text()[-2000:]
    later = range(len(_BUSY_CELLS), len(_BUSY_CELLS) + len(_LATER_CELLS))
    before = _plots_of(lab_page, later)
    _check_drawn(before, later, lab_page.screenshot("later-widgets"))

    editor = lab_page.page.locator(".wb-partition-editor").last
    handle = editor.locator(".wb-boundary .noUi-handle").first
    value, top = int(float(handle.get_attribute("aria-valuenow"))), int(float(handle.get_attribute("aria-valuemax")))
    partition = editor.locator(".wb-partition").inner_text()
    handle.focus()
    lab_page.page.keyboard.press("ArrowRight" if value < top else "ArrowLeft")
    lab_page.page.wait_for_function("([el, before]) => el.innerText !== before",
                                    arg=[editor.locator(".wb-partition").element_handle(), partition], timeout=60_000)
    moved = re.search(r"\d+-\d+(\|\d+-\d+)+", editor.locator(".wb-partition").inner_text()).group(0)
    lab_page.page.wait_for_function(f"() => ({_PLOTS_JS})().some(p => p.title === 'Stage balance {moved}')",
                                    timeout=30_000)
    after = _plots_of(lab_page, later)
    _check_drawn(after, later, lab_page.screenshot("after-move"))
    balance = [p for p in after if p["cell"] == len(_BUSY_CELLS) and p["title"].startswith("Stage balance")]
    assert [p["title"] for p in balance] == [f"Stage balance {moved}"], after
    assert balance[0]["bars"] >= 4, balance  # at least one bar per stage
