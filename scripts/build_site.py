"""Build the static site: the docs pages and every lesson executed in its short mode, with its outputs.

Usage::

    python scripts/build_site.py                  # into site/ (what `make site` runs)
    python scripts/build_site.py --site-dir DIR   # somewhere else

The site is MkDocs (``mkdocs.yml``, the Material theme) with mkdocs-jupyter
for the lessons. Its home page is README.md; ``docs/*.md``,
``bench/RESULTS.md`` and ``notebooks/NN_*.ipynb`` keep their paths, so the
links between them work as they do in the repository. It needs no network,
neither to build nor to read: plotly.js, MathJax and the theme's scripts
are files of the site, and the build fails if a page still loads anything
from elsewhere. Open ``site/index.html`` in a browser, or serve the folder
(``python -m http.server -d site``).

Each lesson is executed as the notebook tests execute it
(``scripts/lesson_runs.py``: ``WORKBENCH_SMOKE=1``, plotly figures carrying
plotly.js), unless ``build/lessons/`` holds an executed copy whose stamp
matches the lesson as it is now (the notebook tests leave one for each
lesson that passes); a lesson that is being executed elsewhere right now is
waited for. A lesson whose execution ends in an error fails the build.
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat

import lesson_runs
import nbsync

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG = REPO_ROOT / "mkdocs.yml"
DEFAULT_SITE_DIR = REPO_ROOT / "site"
DEFAULT_WORK_DIR = REPO_ROOT / "build" / "site-src"
PLOTLY_JS = "assets/javascripts/plotly.min.js"  # under the site's root
MATHJAX_DIR = "assets/mathjax"
# MathJax 2 as jupyter-server-mathjax ships it has the STIX-Web fonts only (its default, TeX, is not there); the
# pages name this file after the combined configuration (mkdocs.yml, custom_mathjax_url)
MATHJAX_CONFIG = ("config/workbench.js", """\
MathJax.Hub.Config({
  "HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null},
  SVG: {font: "STIX-Web"}
});
MathJax.Ajax.loadComplete("[MathJax]/config/workbench.js");
""")
STYLESHEET = ("assets/stylesheets/workbench.css", """\
/* the lessons' code and figures are wider than the theme's column of prose */
.md-grid { max-width: 90rem; }
""")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ('<p class="wb-site-widget"><em>An interactive widget: it runs in JupyterLab '
               '(<code>make lab</code>), not on this page.</em></p>')
# a script, style sheet, image or frame that a page would fetch from another host
REMOTE_RESOURCE = re.compile(
    r"<(?:script|link|img|iframe|source|audio|video|embed)\b[^>]*\s(?:src|href)\s*=\s*[\"']?((?:https?:)?//[^\"'\s>]+)",
    re.IGNORECASE)
REMOTE_CSS = re.compile(r"(?:@import\s+(?:url\()?|url\()\s*[\"']?((?:https?:)?//[^\"')\s]+)", re.IGNORECASE)
# nbconvert's page script imports mermaid from its CDN, but only for a page that has a mermaid diagram
MERMAID_DIAGRAM = 'class="jp-Mermaid"'
REMOTE_MERMAID = re.compile(r"import\(\s*[\"']((?:https?:)?//[^\"']*mermaid[^\"']*)[\"']")


def log(message: str) -> None:
    print(f"build_site: {message}", flush=True)


# -- the lessons, executed ------------------------------------------------------------------------------------------

def executed_lessons(paths: list[Path], directory: Path) -> dict[Path, nbformat.NotebookNode]:
    """Every lesson executed: the fresh copies in ``directory``, and the others executed now (the last lesson
    first: the notebook tests go from the first, so while they run the two meet in the middle)."""
    found = {path: lesson_runs.load_fresh(path, directory) for path in paths}
    for path in paths:
        if found[path] is not None:
            log(f"{path.name}: executed copy reused ({lesson_runs.copy_path(path, directory)})")
    for path in reversed([path for path in paths if found[path] is None]):
        if not lesson_runs.wait_for_run(path, directory):
            log(f"{path.name}: another run of it still holds its lock; executing it here as well")
        found[path] = lesson_runs.load_fresh(path, directory)
        if found[path] is not None:
            log(f"{path.name}: executed copy reused, written while this build waited")
            continue
        found[path] = execute_lesson(path, directory)
    return found


def execute_lesson(path: Path, directory: Path) -> nbformat.NotebookNode:
    source_stamp = lesson_runs.stamp(path)
    log(f"{path.name}: executing (WORKBENCH_SMOKE=1) ...")
    from nbclient.exceptions import CellExecutionError

    try:
        with lesson_runs.holding(path, directory):
            run = lesson_runs.run_lesson(path, "site")
    except CellExecutionError as error:
        raise SystemExit(f"build_site: {path.name} failed: {error.ename}: {error.evalue}") from None
    unrun = [cell for cell in run.executed.cells if cell.cell_type == "code" and cell.execution_count is None]
    if unrun:
        raise SystemExit(f"build_site: {path.name}: {len(unrun)} code cells did not run")
    lesson_runs.save(run.executed, path, directory, source_stamp=source_stamp)
    log(f"{path.name}: executed in {run.seconds:.0f} s, {len(run.runs)} run(s) launched")
    return run.executed


# -- the lessons, made for the site ---------------------------------------------------------------------------------

def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def for_the_site(notebook: nbformat.NotebookNode, depth: int) -> nbformat.NotebookNode:
    """A copy of the executed lesson as the site shows it: the plotly.js that its first figure carries becomes a
    script of the site (one file for every page), the MathJax that plotly's figures would fetch from a CDN is
    dropped (the page loads the site's own), and a widget, which needs a kernel, is named instead of left blank."""
    notebook = nbformat.from_dict(notebook)
    notebook.metadata.pop(lesson_runs.STAMP_KEY, None)
    bundle = plotly_js()
    up = "../" * depth
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data:
                output["data"] = {"text/html": WIDGET_NOTE}
                continue
            if "text/html" not in data:
                continue
            text = data["text/html"]
            if isinstance(text, list):
                text = "".join(text)
            if bundle in text:
                text = text.replace(f"<script>{bundle}</script>", f'<script src="{up}{PLOTLY_JS}"></script>')
            text = re.sub(r"<script\b[^>]*\bsrc=\"https?://[^\"]*mathjax[^\"]*\"[^>]*>\s*</script>", "", text,
                          flags=re.IGNORECASE)
            data["text/html"] = text
    return notebook


# -- staging and building -------------------------------------------------------------------------------------------

def doc_pages() -> list[Path]:
    """docs/*.md in the order of README.md's table of them, then the rest by name."""
    pages = sorted((REPO_ROOT / "docs").glob("*.md"))
    readme = (REPO_ROOT / "README.md").read_text()
    linked = [m.group(1) for m in re.finditer(r"^\| \[docs/[\w.-]+\.md\]\(docs/([\w.-]+\.md)\)", readme, re.M)]
    order = {name: index for index, name in reversed(list(enumerate(linked)))}
    return sorted(pages, key=lambda page: (order.get(page.name, len(order)), page.name))


def stage(work_dir: Path, lessons: dict[Path, nbformat.NotebookNode]) -> list:
    """Lay out the site's sources in ``work_dir`` (emptied first); returns the site's navigation."""
    if work_dir.exists():
        shutil.rmtree(work_dir)
    (work_dir / "notebooks").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "README.md", work_dir / "index.md")
    shutil.copytree(REPO_ROOT / "docs", work_dir / "docs", ignore=shutil.ignore_patterns(".*"))
    (work_dir / "bench").mkdir()
    shutil.copy2(REPO_ROOT / "bench" / "RESULTS.md", work_dir / "bench" / "RESULTS.md")
    for path, executed in lessons.items():
        nbformat.write(for_the_site(executed, depth=1), work_dir / "notebooks" / path.name)
    scripts = work_dir / Path(PLOTLY_JS).parent
    scripts.mkdir(parents=True)
    (work_dir / PLOTLY_JS).write_text(plotly_js(), encoding="utf-8")
    name, text = STYLESHEET
    (work_dir / name).parent.mkdir(parents=True)
    (work_dir / name).write_text(text, encoding="utf-8")
    import jupyter_server_mathjax

    shutil.copytree(Path(jupyter_server_mathjax.__file__).parent / "static", work_dir / MATHJAX_DIR)
    name, text = MATHJAX_CONFIG
    (work_dir / MATHJAX_DIR / name).write_text(text, encoding="utf-8")
    return [{"Home": "index.md"},
            {"Lessons": [f"notebooks/{path.name}" for path in lessons]},
            {"Documentation": [f"docs/{page.name}" for page in doc_pages()]},
            {"Benchmark results": "bench/RESULTS.md"}]


def render(work_dir: Path, site_dir: Path, nav: list) -> None:
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(str(CONFIG), docs_dir=str(work_dir), site_dir=str(site_dir), nav=nav)
    build(config)


def remote_resources(site_dir: Path) -> list[str]:
    """'page: URL' for every script, style sheet, font or image a page of the site would fetch from another host."""
    found = []
    for page in sorted(site_dir.rglob("*")):
        if page.suffix not in (".html", ".css", ".js") or page.is_relative_to(site_dir / MATHJAX_DIR):
            continue  # MathJax names its own site in comments and in settings nobody uses here
        text = page.read_text(encoding="utf-8", errors="replace")
        patterns = {".html": [REMOTE_RESOURCE], ".css": [REMOTE_CSS], ".js": []}[page.suffix]
        if page.suffix == ".html" and MERMAID_DIAGRAM in text:
            patterns.append(REMOTE_MERMAID)
        for pattern in patterns:
            for match in pattern.finditer(text):
                found.append(f"{page.relative_to(site_dir)}: {html.unescape(match.group(1))}")
    return found


def build_site(site_dir: Path = DEFAULT_SITE_DIR, work_dir: Path = DEFAULT_WORK_DIR,
               executed_dir: Path = lesson_runs.EXECUTED_DIR, lessons: list[Path] | None = None) -> Path:
    """Build the site into ``site_dir``; returns its home page."""
    began = time.monotonic()
    paths = nbsync.notebook_paths() if lessons is None else lessons
    executed = executed_lessons(paths, executed_dir)
    nav = stage(work_dir, executed)
    render(work_dir, site_dir, nav)
    remote = remote_resources(site_dir)
    if remote:
        raise SystemExit("build_site: the site would load these from the network:\n  " + "\n  ".join(remote))
    log(f"{site_dir / 'index.html'} ({len(paths)} lessons) in {time.monotonic() - began:.0f} s")
    return site_dir / "index.html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site-dir", type=Path, default=DEFAULT_SITE_DIR, help="where the site goes (default site/)")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                        help="where its sources are laid out first (default build/site-src/)")
    parser.add_argument("--executed-dir", type=Path, default=lesson_runs.EXECUTED_DIR,
                        help="executed lessons to reuse, and where new ones are saved (default build/lessons/)")
    args = parser.parse_args(argv)
    build_site(args.site_dir.resolve(), args.work_dir.resolve(), args.executed_dir.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
