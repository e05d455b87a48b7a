"""Fixtures for tests that drive a real JupyterLab in Debian's Chromium through Playwright.

``lab_server`` (session): scripts/lab.sh on a free port with a known token,
throw-away settings (autosave off, so nothing a test runs is written into
the committed notebooks), ``WORKBENCH_SMOKE=1`` for its kernels and a run root
of its own (under the ignored ``runs/``, removed afterwards) for the jobs they
launch.
``chromium`` (session): a headless Chromium launched by Python Playwright.
``lab_page`` (per test): a :class:`LabPage` that opens a notebook, runs all
cells, waits for the kernel, reads outputs and keeps screenshots under
``test-artifacts/``; it shuts the notebook's kernel down afterwards.

Without Chromium or Playwright the tests skip with the reason, except under
``CI=true``, where a browser test that cannot run is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"
CHROMIUM = Path(os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
VIEWPORT = {"width": 1400, "height": 1000}

_KERNEL_OR_DIALOG_JS = """() => {
    if (document.querySelector('.jp-Dialog')) return 'dialog';
    const widget = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const kernel = widget && widget.sessionContext && widget.sessionContext.session
        && widget.sessionContext.session.kernel;
    return kernel && kernel.status === 'idle' ? 'idle' : null;
}"""
_ALL_CELLS_RAN_JS = r"""() => {
    const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')];
    return prompts.length > 0 && prompts.every(p => /\[\d+\]/.test(p.textContent));
}"""


def _load_lab_server():
    name = "workbench_tests_lab_server"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tests" / "lab" / "lab_server.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def browser_unavailable(reason: str) -> None:
    """Skip with ``reason``, or fail under CI=true where the browser tests must run."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: browser tests must run here)")
    print(f"browser test skipped: {reason}")
    pytest.skip(reason)


class LabPage:
    """One browser tab on the test JupyterLab, with the steps notebook tests repeat."""

    def __init__(self, page, server, name: str) -> None:
        self.page = page
        self.server = server
        self.name = name
        self.opened: list[str] = []

    def open(self, notebook: str, timeout_s: float = 90.0) -> "LabPage":
        """Open ``notebook`` (path from the repository root) and wait for its kernel to be idle."""
        self.page.goto(self.server.notebook_url(notebook) + "&reset")  # not the tabs an earlier test left open
        self.opened.append(notebook)
        self.page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout_s * 1000)
        self.wait_for_kernel_idle(timeout_s)
        return self

    def wait_for_kernel_idle(self, timeout_s: float = 90.0) -> None:
        state = self.page.wait_for_function(_KERNEL_OR_DIALOG_JS, timeout=timeout_s * 1000).json_value()
        if state == "dialog":
            text = self.page.locator(".jp-Dialog").first.inner_text()
            raise AssertionError(f"a dialog blocks the notebook (kernelspec missing?): {text!r}")

    def run_all(self, timeout_s: float = 120.0) -> "LabPage":
        """Run > Run All Cells from the menu bar, then wait until every code cell has run."""
        self.page.click(".lm-MenuBar-item:has-text('Run')")
        self.page.click(".lm-Menu-item:has-text('Run All Cells')")
        self.wait_for_cells(_ALL_CELLS_RAN_JS, timeout_s)
        self.wait_for_kernel_idle(timeout_s)
        return self

    def wait_for_cells(self, predicate_js: str, timeout_s: float, arg=None) -> None:
        """Wait until ``predicate_js`` holds; on a timeout keep a screenshot and report the notebook's errors."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            self.page.wait_for_function(predicate_js, arg=arg, timeout=timeout_s * 1000)
        except PlaywrightTimeout:
            shot = self.screenshot("timeout")
            errors = self.page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
            raise AssertionError(f"cells did not finish within {timeout_s:.0f} s (screenshot {shot}); error outputs: "
                                 f"{errors.all_inner_texts()!r}; last output: {self.output_text()[-1500:]!r}") from None

    def count(self, selector: str) -> int:
        return self.page.locator(selector).count()

    def output_text(self) -> str:
        """The text of every cell output, in order."""
        return "\n".join(self.page.locator(".jp-Notebook .jp-OutputArea-output").all_inner_texts())

    def stderr_outputs(self) -> list[str]:
        """Texts of outputs written to stderr, tracebacks included."""
        selector = ".jp-Notebook .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        return self.page.locator(selector).all_inner_texts()

    def screenshot(self, label: str) -> Path:
        """Save a PNG of the page under test-artifacts/ and return its path."""
        ARTIFACTS_DIR.mkdir(exist_ok=True)
        path = ARTIFACTS_DIR / f"{self.name}-{label}.png"
        self.page.screenshot(path=str(path), timeout=120_000)  # a loaded machine repaints a busy page slowly
        return path

    def close(self) -> None:
        for notebook in self.opened:
            self.server.shutdown_sessions(notebook)
        self.page.context.close()


@pytest.fixture(scope="session")
def chromium():
    """A headless Debian Chromium driven by Python Playwright."""
    if not CHROMIUM.exists():
        browser_unavailable(f"{CHROMIUM} not found; as root, `bash scripts/ensure_chromium.sh` installs it")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        browser_unavailable(f"Python Playwright is not installed ({error})")
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        except Exception as error:  # any launch failure means: no browser here
            browser_unavailable(f"{CHROMIUM} did not start under Playwright: {error}")
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory):
    """scripts/lab.sh serving the repository, with the app exposed to page scripts for kernel-state polling."""
    lab_server_module = _load_lab_server()
    run_root = REPO_ROOT / "runs" / f"browser-test-{os.getpid()}"  # ignored by git; not /tmp (see 08_scale_out)
    server = lab_server_module.start_lab(tmp_path_factory.mktemp("lab"),
                                         extra_args=("--LabApp.expose_app_in_browser=True",),
                                         env={"WORKBENCH_SMOKE": "1", "OMP_NUM_THREADS": "1",
                                              "WORKBENCH_RUN_ROOT": str(run_root)})
    yield server
    leftovers = server.stop()
    shutil.rmtree(run_root, ignore_errors=True)
    assert leftovers == [], f"JupyterLab left processes behind: {leftovers}"


@pytest.fixture
def lab_page(chromium, lab_server, request):
    """A fresh browser context on the test server; see :class:`LabPage`."""
    context = chromium.new_context(viewport=VIEWPORT)
    helper = LabPage(context.new_page(), lab_server, request.node.name)
    yield helper
    helper.close()
