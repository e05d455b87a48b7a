"""The plan explorer's progress bar in a real JupyterLab: it moves while the planner searches.

A notebook written for the test shows a ``PlanExplorer`` for a 48-layer model
on two 8-GPU nodes, with the per-layer search on (a few seconds of planning
on this machine). The test presses Plan and reads the progress bar in every
animation frame of the page, as a person watching it would see it: the bar
must appear, name the planner's phases with how far each has got, fill up,
and disappear when the ranking is shown; the Plan button is disabled while
the search runs and enabled after it.
"""

from __future__ import annotations

import os
import shutil

import pytest

from test_widget_render_browser import write_notebook

_EXPLORER = """\
import random
from workbench.core.costs import LayerCost, ModelCosts
from workbench.planning import SearchOptions, Workload, plan
from workbench.widgets import PlanExplorer
rng = random.Random(1)
costs = ModelCosts("synthetic-48", 8, "synthetic", tuple(
    LayerCost(f"layer{i}", rng.uniform(0.5, 2.0), rng.uniform(1.0, 4.0), param_bytes=2**24, activation_bytes=2**22,
              saved_bytes=2**22, flops=10**10) for i in range(48)))
cluster = "2x8xH100-IB"
first = plan(Workload(costs, 64), cluster, options=SearchOptions(strategies=("dp16",), top=4))
explorer = PlanExplorer(costs, cluster, 64, top=4, result=first, options=SearchOptions(fine_grained=True))
explorer.widget"""

# One reading of the explorer: the progress bar (shown or not, its label, how full) and the Plan button.
_READ_JS = """() => {
    const root = document.querySelector('.wb-plan-explorer');
    if (!root) return null;
    const bar = root.querySelector('.wb-plan-progress');
    const fill = bar && bar.querySelector('.progress-bar');
    const button = root.querySelector('button.wb-plan-button');
    const label = bar && bar.querySelector('.widget-label');
    return {
        shown: !!bar && getComputedStyle(bar).visibility === 'visible',
        label: label ? label.textContent.trim() : '',
        fill: fill ? Math.round(fill.getBoundingClientRect().width / Math.max(1, bar.querySelector(
            '.progress').getBoundingClientRect().width) * 100) : -1,
        disabled: button ? button.disabled : null,
        title: ((root.querySelector('.js-plotly-plot .gtitle') || {}).textContent || ''),
    };
}"""
_SAMPLE_JS = f"""() => {{
    window.__wbReadings = [];
    const read = {_READ_JS};
    const sample = () => {{
        const reading = read();
        const last = window.__wbReadings[window.__wbReadings.length - 1];
        if (reading && (!last || JSON.stringify(last) !== JSON.stringify(reading))) window.__wbReadings.push(reading);
        if (!window.__wbStop) requestAnimationFrame(sample);
    }};
    requestAnimationFrame(sample);
}}"""


@pytest.fixture
def explorer_notebook(lab_server):
    folder = lab_server.root / "runs" / f"browser-plan-explorer-{os.getpid()}"
    write_notebook(folder / "explorer.ipynb", [_EXPLORER])
    yield str((folder / "explorer.ipynb").relative_to(lab_server.root))
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_the_progress_bar_moves_while_the_planner_searches(lab_page, explorer_notebook):
    lab_page.open(explorer_notebook)
    lab_page.run_all(timeout_s=120)
    lab_page.page.wait_for_function(f"() => {{ const r = ({_READ_JS})(); return r && r.title.includes('1 plans'); }}",
                                    timeout=60_000)
    before = lab_page.page.evaluate(_READ_JS)
    assert before["shown"] is False and before["disabled"] is False, before
    lab_page.page.evaluate(_SAMPLE_JS)
    lab_page.page.click(".wb-plan-explorer button.wb-plan-button")
    lab_page.page.wait_for_function(
        f"() => {{ const r = ({_READ_JS})(); return r && !r.shown && !r.disabled && !r.title.includes('1 plans'); }}",
        timeout=180_000, polling=250)
    lab_page.page.evaluate("() => { window.__wbStop = true; }")
    readings = lab_page.page.evaluate("() => window.__wbReadings")
    shown = [r for r in readings if r["shown"]]
    shot = lab_page.screenshot("plan-explorer")
    assert shown, f"the progress bar never appeared (screenshot {shot}): {readings[:5]}"
    assert all(r["disabled"] for r in shown), "Plan stayed pressable during the search"
    labels = [r["label"] for r in shown if r["label"]]
    phases = {label.rsplit(" ", 1)[0] for label in labels}
    assert {"projecting", "simulating"} <= phases and "per-layer search" in phases, phases
    assert len(set(labels)) >= 6, labels  # the label counts each phase up, not just once
    fills = [r["fill"] for r in shown]
    assert any(0 < f < 100 for f in fills) and max(fills) >= 90, fills  # part-way, then (nearly) full
    after = readings[-1]
    assert not after["shown"] and not after["disabled"] and "plans of" in after["title"], after
