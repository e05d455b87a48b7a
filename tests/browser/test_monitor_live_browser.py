"""The live job monitor in a real JupyterLab, in a real browser, while a real job trains.

A notebook written for the test (under the ignored ``runs/``) launches a
short 2-rank 1F1B pipeline job under torchrun (an MLP on the digits, 60
steps, 20 to 40 s on a 2-core machine) and shows ``job.monitor()``.
While the job runs, the test reads the page the way a person watches it:

* the loss and throughput charts gain points (from the plots' own data and
  drawn markers), and the log box shows the lines rank 0 logs;
* the validation chart (the run evaluates every 12 steps) gains its first
  point while the job trains and ends with one per evaluation, the target
  accuracy drawn as a line;
* the timeline changes between two polls, and every animation frame of the
  page (a sampler started before the job's first stage event) draws all the
  traces of the reading it shows: no frame with part of a figure;
* its lanes list rank 0 above rank 1;
* the status reaches SUCCEEDED, and the Cancel button is then disabled, grey
  and labelled with that state.

A second test presses Cancel while the job trains: the status ends in
CANCELLED and the button is disabled. The browser console must never report
a widget model that failed to initialise. The first test refreshes
``docs/monitor.png`` (a screenshot of the monitor) each time it passes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from test_widget_render_browser import write_notebook

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "monitor.png"

_LAUNCH = """\
import os
from workbench.core.config import RunConfig
from workbench.jobs import LaunchSpec, launch
config = RunConfig.from_dict({{
    "name": "monitor-live", "model": {{"name": "mlp", "overrides": {{"hidden": 2048, "depth": 4}}}},
    "plan": "pp2-1f1b-m4", "data": {{"kind": "digits"}}, "events": {{"heartbeat_s": 1.0}},
    "training": {{"global_batch": 64, "steps": {steps}, "optimizer": {{"name": "adam", "lr": 0.001}}}},
    "evaluation": {{"every": {eval_every}, "batches": 4, "target_accuracy": 0.5}}}})
job = launch(LaunchSpec(config=config, run_root=os.environ["WORKBENCH_RUN_ROOT"], name="monitor-live"))
monitor = job.monitor(refresh_hz=3.0)
monitor"""
_LIVE_STEPS = 60
_CANCEL_STEPS = 400
_EVAL_EVERY = 12  # five evaluations in the live run, the first while it trains

# The monitor's parts, found the way a person finds them: its output area holds three plots (loss, samples/s,
# timeline), the validation chart (the run evaluates), a read-only log box and one button.
_MONITOR_JS = """() => {
    const out = document.querySelector('.jp-Notebook .jp-CodeCell .jp-OutputArea');
    if (!out) return null;
    const all = [...out.querySelectorAll('.js-plotly-plot')];
    const plots = all.filter(p => !p.closest('.wb-monitor-eval'));
    const evalPlot = all.find(p => p.closest('.wb-monitor-eval'));
    const button = out.querySelector('button');
    const log = out.querySelector('textarea');
    const points = p => (p && p.data ? p.data.map(t => (t.x ? t.x.length : 0)) : []);
    const header = out.querySelector('.widget-html-content');
    return {
        plots: plots.length,
        loss: points(plots[0]), rate: points(plots[1]), eval: points(evalPlot),
        evalMarkers: evalPlot ? evalPlot.querySelectorAll('.scatterlayer .point').length : 0,
        markers: plots.slice(0, 2).map(p => p.querySelectorAll('.scatterlayer .point').length),
        log: log ? log.value : '',
        button: button ? {text: button.textContent.trim(), disabled: button.disabled,
                          danger: button.classList.contains('mod-danger')} : null,
        header: header ? header.innerText : '',
    };
}"""
# One reading of the timeline plot: its title, lanes from the top, the bar traces it holds (with their bars)
# and how many bars it draws.
_TIMELINE_JS = """() => {
    const plot = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-OutputArea .js-plotly-plot')]
        .filter(p => !p.closest('.wb-monitor-eval'))[2];
    if (!plot || !plot.data) return null;
    const held = plot.data.filter(t => t.type === 'bar' && t.x && t.x.length);
    return {
        title: (plot.querySelector('.gtitle') || {textContent: ''}).textContent,
        lanes: [...plot.querySelectorAll('.ytick text')].map(t => [t.textContent, t.getBoundingClientRect().top])
            .sort((a, b) => a[1] - b[1]).map(t => t[0]),
        traces: held.map(t => t.name),
        bars: held.reduce((n, t) => n + t.x.length, 0),
        data: held.map(t => Array.from(t.base).join(',')).join(';'),
        drawn: plot.querySelectorAll('.barlayer .point').length,
    };
}"""
# Take a reading of the timeline in every animation frame: what a person sees in that frame.
_SAMPLE_FRAMES_JS = f"""() => {{
    window.__wbFrames = [];
    const read = {_TIMELINE_JS};
    const sample = () => {{
        const reading = read();
        if (reading) {{
            const last = window.__wbFrames[window.__wbFrames.length - 1];
            delete reading.data;
            if (!last || JSON.stringify(last.reading) !== JSON.stringify(reading))
                window.__wbFrames.push({{t: Math.round(performance.now()), reading}});
        }}
        if (!window.__wbStopFrames) requestAnimationFrame(sample);
    }};
    requestAnimationFrame(sample);
}}"""


@pytest.fixture
def monitor_notebook(lab_server, request):
    """A notebook that launches a short job and shows its monitor; its path from the served root."""
    steps = _CANCEL_STEPS if "cancel" in request.node.name else _LIVE_STEPS
    folder = lab_server.root / "runs" / f"browser-monitor-{os.getpid()}-{request.node.name[:40]}"
    write_notebook(folder / "monitor.ipynb", [_LAUNCH.format(steps=steps, eval_every=_EVAL_EVERY)])
    yield str((folder / "monitor.ipynb").relative_to(lab_server.root))
    shutil.rmtree(folder, ignore_errors=True)


def _console(lab_page) -> list[str]:
    """The page's console messages and uncaught errors, from now on."""
    lines: list[str] = []
    lab_page.page.on("console", lambda message: lines.append(f"{message.type}: {message.text}"))
    lab_page.page.on("pageerror", lambda error: lines.append(f"pageerror: {error}"))
    return lines


def _monitor(lab_page) -> dict:
    return lab_page.page.evaluate(_MONITOR_JS) or {}


def _wait(lab_page, predicate_js: str, timeout_s: float, what: str) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # the fixtures have skipped without it

    try:
        lab_page.page.wait_for_function(predicate_js, timeout=timeout_s * 1000, polling=250)
    except PlaywrightTimeout:
        shot = lab_page.screenshot("monitor-timeout")
        raise AssertionError(f"{what} within {timeout_s:.0f} s (screenshot {shot}); monitor: {_monitor(lab_page)!r}; "
                             f"timeline: {lab_page.page.evaluate(_TIMELINE_JS)!r}") from None


def _launch(lab_page, notebook: str) -> None:
    lab_page.open(notebook)
    lab_page.run_all(timeout_s=120)
    _wait(lab_page, f"() => {{ const m = ({_MONITOR_JS})(); "
          f"return m && m.plots === 3 && m.eval.length === 3 && m.button; }}", 60,
          "the monitor did not appear")


def _failed_models(console: list[str]) -> list[str]:
    return [line for line in console if "Failed to initialize model" in line]


@pytest.mark.browser
@pytest.mark.multiproc
@pytest.mark.timeout(420)
def test_monitor_fills_live_and_ends_succeeded(lab_page, monitor_notebook):
    console = _console(lab_page)
    _launch(lab_page, monitor_notebook)
    lab_page.page.evaluate(_SAMPLE_FRAMES_JS)

    # while the job trains: both charts gain points, the log shows rank 0's lines, the timeline moves on
    _wait(lab_page, f"() => {{ const m = ({_MONITOR_JS})(); return m.loss.some(n => n >= 3) && "
          f"m.rate.some(n => n >= 3) && /step \\d+/.test(m.log); }}", 180,
          "the loss and throughput charts did not gain points, or the log stayed empty,")
    _wait(lab_page, f"() => {{ const t = ({_TIMELINE_JS})(); return t && t.traces.some(n => /measured/.test(n)); }}",
          120, "the timeline showed no measured iteration")
    first = lab_page.page.evaluate(_TIMELINE_JS)
    _wait(lab_page, f"() => ({_TIMELINE_JS})().data !== {json.dumps(first['data'])}", 60,
          "the timeline did not change between two polls")
    _wait(lab_page, f"() => ({_MONITOR_JS})().eval[0] >= 1", 120, "the validation chart gained no point")
    running = _monitor(lab_page)
    assert "RUNNING" in running["header"], f"the job ended before the checks were made: {running['header']!r}"
    assert min(running["markers"]) > 0 and min(running["loss"] + running["rate"]) >= 3, running

    _wait(lab_page, f"() => /SUCCEEDED/.test(({_MONITOR_JS})().header)", 240, "the status did not reach SUCCEEDED")
    _wait(lab_page, f"() => ({_MONITOR_JS})().button.disabled", 10, "the button stayed active after SUCCEEDED")
    lab_page.page.evaluate("() => { window.__wbStopFrames = true; }")
    frames = lab_page.page.evaluate("() => window.__wbFrames")
    ended = _monitor(lab_page)
    assert not ended["button"]["danger"] and "Succeeded" in ended["button"]["text"], ended["button"]
    assert min(ended["loss"] + ended["rate"]) >= _LIVE_STEPS, ended  # every step of every rank
    # validation accuracy and loss at every evaluation, drawn, and the target as a line
    assert ended["eval"] == [_LIVE_STEPS // _EVAL_EVERY] * 2 + [2] and ended["evalMarkers"] > 0, ended
    assert _failed_models(console) == [], console

    # every frame since the first measured iteration shows all of its reading: prediction and measurement,
    # every bar the plot holds, rank 0 on top
    shown = [f["reading"] for f in frames]
    start = next(i for i, r in enumerate(shown) if any("(measured)" in n for n in r["traces"]))
    bad = [r for r in shown[start:] if not (any("(measured)" in n for n in r["traces"])
                                            and any("(simulated)" in n for n in r["traces"])
                                            and r["drawn"] == r["bars"] and r["lanes"][:1] == ["rank 0"])]
    assert len(shown) - start >= 5 and bad == [], \
        f"{len(bad)} of {len(shown) - start} timeline readings show part of a figure or rank 1 on top: {bad[:3]}"
    lanes = shown[-1]["lanes"]
    assert lanes.index("rank 0") < lanes.index("rank 1"), lanes

    lab_page.screenshot("monitor-succeeded")
    DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
    monitor = lab_page.page.locator(".jp-Notebook .jp-CodeCell .jp-OutputArea-output").first
    monitor.scroll_into_view_if_needed()
    monitor.screenshot(path=str(DOCS_SCREENSHOT))


@pytest.mark.browser
@pytest.mark.multiproc
@pytest.mark.timeout(420)
def test_cancel_from_the_monitor_ends_cancelled(lab_page, monitor_notebook):
    console = _console(lab_page)
    _launch(lab_page, monitor_notebook)
    _wait(lab_page, f"() => ({_MONITOR_JS})().loss.some(n => n >= 2)", 180, "the job did not start training")
    lab_page.page.locator(".jp-Notebook .jp-CodeCell .jp-OutputArea button").first.click()
    _wait(lab_page, f"() => /CANCELLED/.test(({_MONITOR_JS})().header)", 90, "the status did not reach CANCELLED")
    _wait(lab_page, f"() => {{ const b = ({_MONITOR_JS})().button; return b.disabled && !/Cancelling/.test(b.text); }}",
          30, "the button did not settle")
    ended = _monitor(lab_page)
    lab_page.screenshot("monitor-cancelled")
    assert ended["button"]["text"] == "Cancelled" and not ended["button"]["danger"], ended["button"]
    assert _failed_models(console) == [], console
