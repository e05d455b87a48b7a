"""Every notebook runs top to bottom in a fresh kernel, with small (smoke) parameters.

Each notebook asserts its own results in its last cells, so a notebook that
runs to the end has checked something real. The kernel is this environment's
``python3`` (jupyter_client resolves the kernelspec's ``python`` to the
interpreter running the tests), and ``WORKBENCH_SMOKE=1`` asks notebooks for
their small parameters.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
NOTEBOOK_TIMEOUT_S = 180


def _execute(notebook: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    client = NotebookClient(notebook, timeout=NOTEBOOK_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}, store_widget_state=False)
    env = {**os.environ, "WORKBENCH_SMOKE": "1", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return client.execute(env=env)


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("name") == "stdout")


@pytest.mark.notebook
def test_kernel_is_this_environment_with_smoke_parameters(tmp_path):
    probe = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os, sys; print(sys.prefix); print(os.environ.get('WORKBENCH_SMOKE')); print(os.getcwd())")])
    executed = _execute(probe, tmp_path)
    prefix, smoke, cwd = _stdout(executed.cells[0]).splitlines()
    assert Path(prefix).resolve() == Path(sys.prefix).resolve()
    assert smoke == "1"
    assert Path(cwd).resolve() == tmp_path.resolve()


@pytest.mark.notebook
@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S + 30)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_to_the_end(path):
    notebook = nbformat.read(path, as_version=4)
    executed = _execute(notebook, path.parent)
    code_cells = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert code_cells, f"{path.name} has no code cells"
    assert all(cell.execution_count is not None for cell in code_cells), "some cells did not run"
    errors = [out for cell in code_cells for out in cell.outputs if out.output_type == "error"]
    assert errors == []
    assert any("assert" in cell.source for cell in code_cells[-2:]), f"{path.name} should check its results at the end"
