"""Speed of the PartitionEditor: the kernel-side update after a boundary move, and the browser round trip.

Target (wall clock, on a machine not shared with other work): moving one
stage boundary of a 100-layer model cut into 8 stages with 32 micro-batches
(re-cost the partition, re-simulate 1F1B with communication, rebuild the
figure data and encode the widget messages) takes under 100 ms in the kernel.

The model is a real one, profiled here: GPT-2 with 98 blocks of hidden 64
(embeddings + 98 blocks + head = 100 layers), batch 32, on this CPU, on the
``local-cpu`` cluster preset. Widget messages are JSON-encoded by a comm that
encodes what a kernel would send, so serialisation is inside the timing.

Peer (paired, interleaved A B B A ..., median): the same move redrawn the way
widgets are usually refreshed, building new figures and replacing the
FigureWidgets' traces and layout, against the editor's in-place update. The
kernel-side cost is also split into partition cost, simulation and figures.
CPU time is reported beside wall time: on a shared machine the wall time of
one move includes waiting for a core.

Browser round trip: JupyterLab on 127.0.0.1 (the tests' lab server helper)
in Debian's Chromium driven by Playwright; a notebook shows the editor, a
boundary handle is moved with the keyboard, and the page records when the
partition label changes and when the last change to the editor's DOM
(the redrawn figures) lands (DOM updated, before the browser paints). Skipped with the reason when no browser is
available. Writes ``bench/results/widgets.json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
RESULTS = HERE / "results" / "widgets.json"
NOTEBOOK_DIR = REPO_ROOT / "runs" / "bench-widgets"
TARGET_MS = 100.0
PAIRS = 15
BROWSER_MOVES = 9

STAGES, MICROBATCHES, BATCH, BLOCKS = 8, 32, 32, 98


def profiled_model():
    """The 100-layer GPT-2 profile (cached on disk by the profiler)."""
    from workbench.models import build_model
    from workbench.profiling import profile

    return profile(build_model("gpt2-tiny", n_layer=BLOCKS), batch=BATCH, progress=False)


class EncodingComm:
    """A widget comm that JSON-encodes every message, as a kernel does before sending it."""

    def __init__(self, **kwargs):
        self.comm_id = kwargs.get("comm_id") or os.urandom(8).hex()
        self.kernel = True
        self.encoded_bytes = 0

    def send(self, data=None, metadata=None, buffers=None):
        self.encoded_bytes += len(json.dumps(data, default=str)) + sum(len(memoryview(b)) for b in buffers or ())

    def open(self, *args, **kwargs):
        self.send(kwargs.get("data"))

    def close(self, *args, **kwargs):
        pass

    def on_msg(self, callback):
        pass

    def on_close(self, callback):
        pass


def install_encoding_comm() -> None:
    import comm

    comm.create_comm = lambda **kwargs: EncodingComm(**kwargs)


def rebuild_figures(editor, state) -> None:
    """The peer: draw new figures and replace the widgets' traces and layout."""
    from workbench.viz.balance import balance_figure
    from workbench.viz.timeline import timeline_figure

    editor.state = state
    editor._update_labels(state)
    for widget, fresh in ((editor.balance_fig, balance_figure(editor._balance_data(state))),
                          (editor.timeline_fig, timeline_figure(state.sim.timeline))):
        with widget.batch_update():
            widget.data = ()
            widget.add_traces(list(fresh.data))
            widget.layout = fresh.layout


def move_positions(editor, count: int) -> list[list[int]]:
    """Cut lists one single-layer move apart, walking boundary 3 right then left (every one a new partition)."""
    start = editor.cuts
    out, cuts = [], list(start)
    for i in range(count):
        cuts = list(cuts)
        cuts[3] += 1 if (i // 4) % 2 == 0 else -1
        out.append(cuts)
    return out


def kernel_side(costs) -> dict:
    from workbench.core.partition import Partition
    from workbench.widgets.partition_editor import PartitionEditor

    install_encoding_comm()
    inplace = PartitionEditor(costs, num_stages=STAGES, num_microbatches=MICROBATCHES, cluster="local-cpu")
    peer = PartitionEditor(costs, num_stages=STAGES, num_microbatches=MICROBATCHES, cluster="local-cpu")
    positions = move_positions(inplace, PAIRS)
    a_ms, b_ms, a_cpu, b_cpu, loads = [], [], [], [], []

    def move_inplace(cuts):
        t0, c0 = time.perf_counter(), time.process_time()
        inplace.boundaries[3].value = cuts[3]  # what the slider does: observer -> re-cost, simulate, redraw
        a_ms.append((time.perf_counter() - t0) * 1e3)
        a_cpu.append((time.process_time() - c0) * 1e3)
        assert inplace.cuts == cuts

    def move_peer(cuts):
        t0, c0 = time.perf_counter(), time.process_time()
        with peer._quiet():
            peer.boundaries[3].value = cuts[3]
        rebuild_figures(peer, peer.evaluate(Partition.from_cuts(cuts, costs.num_layers)))
        b_ms.append((time.perf_counter() - t0) * 1e3)
        b_cpu.append((time.process_time() - c0) * 1e3)

    for i, cuts in enumerate(positions):
        first, second = (move_inplace, move_peer) if i % 2 == 0 else (move_peer, move_inplace)
        first(cuts)
        second(cuts)
        loads.append(os.getloadavg()[0])
    assert inplace.state.partition == peer.state.partition
    ratios = [b / a for a, b in zip(a_ms, b_ms)]

    parts = {"partition_cost_ms": [], "stage_costs_and_simulate_ms": [], "figures_and_labels_ms": []}
    cpu_parts = {name: [] for name in parts}

    def clocks() -> tuple[float, float]:
        return time.perf_counter() * 1e3, time.process_time() * 1e3

    for cuts in positions:
        partition = Partition.from_cuts(cuts, costs.num_layers)
        t0 = clocks()
        inplace.projection.evaluate(partition, "manual", inplace.memory_cap)
        t1 = clocks()
        state = inplace.evaluate(partition)  # includes the partition cost again
        t2 = clocks()
        inplace._update_labels(state)
        inplace._update_figures(state)
        t3 = clocks()
        for out, i in ((parts, 0), (cpu_parts, 1)):
            out["partition_cost_ms"].append(t1[i] - t0[i])
            out["stage_costs_and_simulate_ms"].append(t2[i] - t1[i] - (t1[i] - t0[i]))
            out["figures_and_labels_ms"].append(t3[i] - t2[i])
    return {
        "model": f"gpt2-tiny n_layer={BLOCKS} ({costs.num_layers} layers), batch {BATCH}",
        "stages": STAGES, "microbatches": MICROBATCHES, "cluster": "local-cpu", "pairs": PAIRS,
        "inplace_update_ms": a_ms, "rebuild_update_ms": b_ms,
        "inplace_cpu_ms": a_cpu, "rebuild_cpu_ms": b_cpu,
        "inplace_median_ms": statistics.median(a_ms), "rebuild_median_ms": statistics.median(b_ms),
        "inplace_cpu_median_ms": statistics.median(a_cpu), "rebuild_cpu_median_ms": statistics.median(b_cpu),
        "rebuild_over_inplace_median": statistics.median(ratios),
        "breakdown_median_ms": {k: statistics.median(v) for k, v in parts.items()},
        "breakdown_cpu_median_ms": {k: statistics.median(v) for k, v in cpu_parts.items()},
        "events_in_timeline": len(inplace.state.sim.timeline), "target_ms": TARGET_MS,
        "load_average_1min": loads, "load_average_1min_median": statistics.median(loads),
    }


# -- browser round trip ---------------------------------------------------------------------------------
_OBSERVE_JS = """() => {
    const editor = document.querySelector('.wb-partition-editor');
    const label = editor.querySelector('.wb-partition');
    window.__wb = {start: 0, label: 0, last: 0};
    new MutationObserver(() => { if (window.__wb.start && !window.__wb.label) window.__wb.label = performance.now(); })
        .observe(label, {subtree: true, childList: true, characterData: true});
    new MutationObserver(() => { if (window.__wb.start) window.__wb.last = performance.now(); })
        .observe(editor, {subtree: true, childList: true, attributes: true, characterData: true});
}"""
_QUIET_JS = "(quiet) => window.__wb.label > 0 && performance.now() - window.__wb.last > quiet"


def _load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def write_notebook(costs_path: Path) -> Path:
    import nbformat

    NOTEBOOK_DIR.mkdir(parents=True, exist_ok=True)
    source = (f"from workbench.core.costs import ModelCosts\nfrom workbench.widgets import PartitionEditor\n"
              f"editor = PartitionEditor(ModelCosts.load({str(costs_path)!r}), num_stages={STAGES}, "
              f"num_microbatches={MICROBATCHES}, cluster='local-cpu')\neditor")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)], metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}})
    path = NOTEBOOK_DIR / "partition_editor_roundtrip.ipynb"
    nbformat.write(nb, path)
    return path


def browser_round_trip(costs) -> dict:
    browser_helpers = _load_module("workbench_bench_browser", REPO_ROOT / "tests" / "browser" / "conftest.py")
    if not browser_helpers.CHROMIUM.exists():
        return {"skipped": f"{browser_helpers.CHROMIUM} not found"}
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        return {"skipped": f"Python Playwright is not installed ({error})"}
    NOTEBOOK_DIR.mkdir(parents=True, exist_ok=True)
    costs_path = costs.save(NOTEBOOK_DIR / "costs.json")
    notebook = write_notebook(costs_path).relative_to(REPO_ROOT).as_posix()
    server = browser_helpers._load_lab_server().start_lab(NOTEBOOK_DIR, extra_args=(
        "--LabApp.expose_app_in_browser=True",), env={"OMP_NUM_THREADS": "1"})
    label_ms, full_ms, loads = [], [], []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(browser_helpers.CHROMIUM),
                                                 args=browser_helpers.CHROMIUM_ARGS)
            try:
                context = browser.new_context(viewport=browser_helpers.VIEWPORT)
                lab = browser_helpers.LabPage(context.new_page(), server, "bench-widgets")
                lab.open(notebook, timeout_s=180).run_all(timeout_s=240)
                page = lab.page
                page.wait_for_selector(".wb-partition-editor .wb-boundary .noUi-handle", timeout=120_000)
                page.wait_for_selector(".wb-partition-editor .js-plotly-plot", timeout=120_000)
                page.evaluate(_OBSERVE_JS)
                handle = page.locator(".wb-partition-editor .wb-boundary .noUi-handle").nth(3)
                handle.focus()
                time.sleep(1.0)
                for i in range(BROWSER_MOVES):
                    page.evaluate("() => { window.__wb = {start: performance.now(), label: 0, last: 0}; }")
                    handle.press("ArrowRight" if (i // 3) % 2 == 0 else "ArrowLeft")
                    page.wait_for_function(_QUIET_JS, arg=600, timeout=60_000, polling=50)
                    marks = page.evaluate("() => window.__wb")
                    label_ms.append(marks["label"] - marks["start"])
                    full_ms.append(marks["last"] - marks["start"])
                    loads.append(os.getloadavg()[0])
                lab.screenshot("partition-editor")
                lab.close()
            finally:
                browser.close()
    finally:
        leftovers = server.stop()
    return {"moves": BROWSER_MOVES, "label_round_trip_ms": label_ms, "figures_round_trip_ms": full_ms,
            "label_round_trip_median_ms": statistics.median(label_ms),
            "figures_round_trip_median_ms": statistics.median(full_ms),
            "load_average_1min": loads, "server_leftovers": leftovers}


def main() -> int:
    costs = profiled_model()
    if costs.num_layers != 100:
        raise SystemExit(f"expected a 100-layer profile, got {costs.num_layers} layers")
    result = {"kernel": kernel_side(costs)}
    k = result["kernel"]
    print(f"kernel-side update after a boundary move, {k['model']}, {STAGES} stages x {MICROBATCHES} micro-batches "
          f"(load average {k['load_average_1min_median']:.1f}):")
    verdict = {True: "ok", False: "OVER"}
    print(f"  in place   median {k['inplace_median_ms']:7.1f} ms (CPU {k['inplace_cpu_median_ms']:.1f} ms)   "
          f"target {TARGET_MS:.0f} ms: wall {verdict[k['inplace_median_ms'] < TARGET_MS]}, "
          f"CPU {verdict[k['inplace_cpu_median_ms'] < TARGET_MS]}")
    print(f"  rebuilt    median {k['rebuild_median_ms']:7.1f} ms (CPU {k['rebuild_cpu_median_ms']:.1f} ms)   "
          f"rebuilt / in place (paired median) {k['rebuild_over_inplace_median']:.2f}")
    print("  breakdown  " + ", ".join(f"{name} {v:.1f} (CPU {k['breakdown_cpu_median_ms'][name]:.1f})"
                                      for name, v in k["breakdown_median_ms"].items()))
    try:
        result["browser"] = browser_round_trip(costs)
    except Exception as error:  # the kernel-side numbers stand without the browser
        result["browser"] = {"failed": f"{type(error).__name__}: {error}"}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    b = result["browser"]
    if "label_round_trip_median_ms" in b:
        print(f"browser round trip (JupyterLab + Chromium, {b['moves']} moves, load average "
              f"{statistics.median(b['load_average_1min']):.1f}): label {b['label_round_trip_median_ms']:.0f} ms, "
              f"figures redrawn {b['figures_round_trip_median_ms']:.0f} ms (medians); results in {RESULTS}")
    else:
        print(f"browser round trip not measured: {b}; results in {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
