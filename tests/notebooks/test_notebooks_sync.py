"""Notebooks and their py:percent pairs agree, and the notebooks are committed clean.

Clean means what scripts/nbsync.py checks: no outputs, no execution counts,
no saved widget state, a ``python3`` kernelspec, and nbstripout would change
nothing. A failure names the notebook and the fix (`python scripts/nbsync.py --fix`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from notebook_files import REPO_ROOT, load_nbsync, read_notebook

nbsync = load_nbsync()
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
    if not notebook.exists():
        pytest.fail(f"{notebook.name} is missing (run: python scripts/nbsync.py --fix {notebook.with_suffix('.py')})")
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


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_a_lesson_with_parameters_and_final_checks(notebook):
    cells = read_notebook(notebook).cells
    assert cells and cells[0].cell_type == "markdown" and cells[0].source.startswith("# "), \
        f"{notebook.name} should open with a markdown cell holding its title ('# ...')"
    tagged = [cell for cell in cells if "parameters" in cell.metadata.get("tags", ())]
    assert len(tagged) == 1 and tagged[0].cell_type == "code", \
        f"{notebook.name} should have one code cell tagged 'parameters' (small sizes under WORKBENCH_SMOKE=1)"
    markdown = sum(cell.cell_type == "markdown" for cell in cells)
    code = [cell for cell in cells if cell.cell_type == "code"]
    assert markdown >= len(code) // 2, f"{notebook.name}: {markdown} markdown cells for {len(code)} code cells"
    assert any("assert " in cell.source for cell in code[-2:]), f"{notebook.name} should check its results at the end"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_that_launches_runs_sends_them_where_workbench_run_root_says(notebook):
    """The suite runs every notebook with WORKBENCH_RUN_ROOT set and checks the runs there; a notebook that chose
    its own folder would leave its runs in the project's runs/ unchecked."""
    source = "\n".join(cell.source for cell in read_notebook(notebook).cells if cell.cell_type == "code")
    if not re.search(r"\blaunch(_sweep)?\(", source):
        return
    # workbench.lessons.runs.lesson_run_root() is WORKBENCH_RUN_ROOT when set (tests/lessons/test_runs.py)
    reads_it = 'os.environ.get("WORKBENCH_RUN_ROOT")' in source or "run_root = lesson_run_root()" in source
    assert reads_it and "run_root=run_root" in source, notebook.name
    assert all("run_root=run_root" in line or "run_root=shared_run_root" in line
               for line in source.splitlines() if "run_root=" in line and "LaunchSpec(" in line), notebook.name
