"""Finding and reading the notebooks, shared by the execution and the sync tests.

Problem: the notebooks are written by several people, and a new one must be
covered by both suites the moment it lands, even when only its py:percent
script exists yet. Approach: one list, ``scripts/nbsync.py``'s
``notebook_paths`` (every stem that has an ``.ipynb`` or a ``.py``), and one
reader that takes the ``.ipynb`` when it exists and the script otherwise.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nbformat

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_script(stem: str):
    """scripts/STEM.py as a module (scripts/ is not a package)."""
    name = f"workbench_scripts_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def load_nbsync():
    """scripts/nbsync.py as a module."""
    return load_script("nbsync")


def load_lesson_runs():
    """scripts/lesson_runs.py as a module: the executor the notebook tests and the site build share."""
    return load_script("lesson_runs")


def notebook_paths() -> list[Path]:
    """The ``.ipynb`` path of every notebook in notebooks/, whether or not the file exists yet."""
    return load_nbsync().notebook_paths()


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook at ``path``, or, while only its paired script exists, the notebook jupytext builds from it."""
    return load_lesson_runs().read_notebook(path)
