"""Every notebook runs top to bottom in a fresh kernel, with small (smoke) parameters.

Each notebook asserts its own results in its last cells (a real run
finished and its loss fell, a grid equals dense, a formula equals the
simulation), so a notebook that runs to the end has checked something real.
The kernel is this environment's ``python3`` (jupyter_client resolves the
kernelspec's ``python`` to the interpreter running the tests).
``WORKBENCH_SMOKE=1`` asks notebooks for their small parameters and
``WORKBENCH_RUN_ROOT`` sends the runs they launch to a fresh folder under the
repository's ignored ``runs/`` (not /tmp: a multi-node spec refuses node-local
storage), which is checked afterwards (every run ended and left no process
behind) and removed.
Notebooks are found by ``scripts/nbsync.py`` (a notebook whose ``.ipynb``
is not written yet runs from its py:percent script). They are executed by
``scripts/lesson_runs.py``, which the site build shares: a notebook that
passes here is saved, executed and stamped with its source's hash, under
the ignored ``build/lessons/``, where ``scripts/build_site.py`` takes it
instead of executing it again.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

from notebook_files import load_lesson_runs, notebook_paths

NOTEBOOKS = notebook_paths()
lesson_runs = load_lesson_runs()
NOTEBOOK_TIMEOUT_S = lesson_runs.TIMEOUT_S


def _execute(notebook: nbformat.NotebookNode, cwd: Path, run_root: Path | None = None) -> nbformat.NotebookNode:
    return lesson_runs.execute(notebook, cwd, run_root)


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", []) if out.get("name") == "stdout")


@pytest.mark.notebook
def test_kernel_is_this_environment_with_smoke_parameters(tmp_path):
    probe = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os, sys; print(sys.prefix); print(os.environ.get('WORKBENCH_SMOKE')); print(os.getcwd()); "
        "print(os.environ.get('WORKBENCH_RUN_ROOT'))")])
    executed = _execute(probe, tmp_path, tmp_path / "runs")
    prefix, smoke, cwd, run_root = _stdout(executed.cells[0]).splitlines()
    assert Path(prefix).resolve() == Path(sys.prefix).resolve()
    assert smoke == "1"
    assert Path(cwd).resolve() == tmp_path.resolve()
    assert Path(run_root) == tmp_path / "runs"


@pytest.mark.notebook
@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S + 120)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_to_the_end(path, request):
    slurm = None
    if "submitted to Slurm" in path.read_text():  # a notebook that submits where a cluster answers gets one here
        try:
            slurm = request.getfixturevalue("slurm_cluster")
        except pytest.skip.Exception as reason:  # no cluster here: the notebook takes its dry-run path
            print(f"{path.name} without Slurm: {reason}")
    source_stamp = lesson_runs.stamp(path)  # of the source as it is executed, not as it may be by the end
    with lesson_runs.holding(path):  # a site build that needs this lesson waits for it
        run = lesson_runs.run_lesson(path, "notebook-test")
        executed, runs, leftovers = run.executed, run.runs, run.leftovers
        print(f"{path.name}: {run.seconds:.0f} s, {len(runs)} run(s) launched")
        code_cells = [cell for cell in executed.cells if cell.cell_type == "code"]
        assert code_cells, f"{path.name} has no code cells"
        assert all(cell.execution_count is not None for cell in code_cells), "some cells did not run"
        assert lesson_runs.error_outputs(executed) == []
        assert any("assert " in cell.source for cell in code_cells[-2:]), \
            f"{path.name} should check its results at the end"
        assert leftovers == [], f"{path.name} left runs with live processes: {leftovers}"
        if slurm is not None:
            assert "submitted to Slurm" in "".join(map(_stdout, code_cells)), \
                f"{path.name} did not use the running cluster"
        unfinished = [launched for launched in runs if launched["backend"] != "dryrun"
                      and launched["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED")]
        assert unfinished == [], f"{path.name} left runs that never ended: {unfinished}"
        lesson_runs.save(executed, path, source_stamp=source_stamp)  # for the site (scripts/build_site.py)
