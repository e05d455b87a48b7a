"""Notebooks and their py:percent pairs agree, and the notebooks are committed clean.

Clean means what scripts/nbsync.py checks: no outputs, no execution counts,
no saved widget state, a ``python3`` kernelspec, and nbstripout would change
nothing. A failure names the notebook and the fix (`python scripts/nbsync.py --fix`).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load_nbsync():
    name = "workbench_scripts_nbsync"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / "nbsync.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


nbsync = _load_nbsync()
NOTEBOOKS = nbsync.notebook_paths()


def test_there_is_a_tour_and_a_jupytext_config():
    assert REPO_ROOT / "notebooks" / "00_tour.ipynb" in NOTEBOOKS
    config = (REPO_ROOT / "jupytext.toml").read_text()
    assert 'formats = "ipynb,py:percent"' in config


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_matches_its_script(notebook):
    assert nbsync.pair_problems(notebook) == []


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stripped_with_a_kernelspec(notebook):
    assert nbsync.strip_problems(notebook) == []


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_nbstripout_would_change_nothing(notebook):
    result = subprocess.run([sys.executable, "-m", "nbstripout", "--verify", str(notebook)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{notebook.name} is not stripped: {result.stdout}{result.stderr}"


def _copy_tour(tmp_path: Path) -> Path:
    for suffix in (".ipynb", ".py"):
        source = REPO_ROOT / "notebooks" / f"00_tour{suffix}"
        (tmp_path / source.name).write_text(source.read_text())
    return tmp_path / "00_tour.ipynb"


def test_checker_catches_outputs_counts_widgets_and_a_missing_kernelspec(tmp_path):
    notebook = _copy_tour(tmp_path)
    data = json.loads(notebook.read_text())
    code = next(cell for cell in data["cells"] if cell["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}]
    code["execution_count"] = 3
    data["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    del data["metadata"]["kernelspec"]
    notebook.write_text(json.dumps(data))
    found = "\n".join(nbsync.strip_problems(notebook))
    for expected in ("saved output", "execution_count 3", "widget state", "kernelspec"):
        assert expected in found


def test_checker_catches_a_script_edited_alone(tmp_path):
    notebook = _copy_tour(tmp_path)
    script = notebook.with_suffix(".py")
    script.write_text(script.read_text().replace("tour OK", "tour still OK"))
    assert any("differs from 00_tour.py" in problem for problem in nbsync.pair_problems(notebook))
    script.unlink()
    assert any("no paired script" in problem for problem in nbsync.pair_problems(notebook))


def test_fix_syncs_and_strips(tmp_path):
    notebook = _copy_tour(tmp_path)
    data = json.loads(notebook.read_text())
    next(cell for cell in data["cells"] if cell["cell_type"] == "code")["execution_count"] = 7
    notebook.write_text(json.dumps(data))
    (tmp_path / "jupytext.toml").write_text((REPO_ROOT / "jupytext.toml").read_text())
    assert nbsync.strip_problems(notebook)
    nbsync.fix(notebook)
    assert nbsync.problems(notebook) == []


def test_fix_creates_the_notebook_of_a_new_script_with_a_kernelspec(tmp_path):
    (tmp_path / "jupytext.toml").write_text((REPO_ROOT / "jupytext.toml").read_text())
    script = tmp_path / "01_new.py"
    script.write_text("# %% [markdown]\n# # A new lesson\n\n# %%\nanswer = 6 * 7\nassert answer == 42\n")
    notebook = script.with_suffix(".ipynb")
    assert nbsync.notebook_paths(tmp_path) == [notebook]
    assert nbsync.problems(notebook) == [f"01_new.py: no 01_new.ipynb (run: python scripts/nbsync.py --fix {script})"]
    nbsync.fix(notebook)
    assert nbsync.problems(notebook) == []
    assert json.loads(notebook.read_text())["metadata"]["kernelspec"]["name"] == "python3"
