"""Executing a lesson in its short mode, shared by the notebook tests and the site build.

Problem: the lessons are executed twice for the same end: by
``tests/notebooks/test_notebooks_execute.py``, which checks that each runs to
the end, and by ``scripts/build_site.py``, which renders their outputs.
Each execution takes minutes, so the site reuses what the tests executed,
and both must execute a lesson the same way for the copy to be the same.

Approach: one executor with one environment (:data:`SHORT_MODE_ENV`: the
small parameters, one thread, plotly figures that carry plotly.js inside the
notebook rather than loading it from the network), one way to run a lesson
with a run root of its own and reap what it launched (:func:`run_lesson`),
and one store of executed copies, ``build/lessons/NAME.ipynb``
(:data:`EXECUTED_DIR`, ignored by git). A copy is written atomically and
carries a stamp, the hash of its source notebook and of the environment
(:func:`stamp`); :func:`load_fresh` returns it only while the stamp matches
the lesson as it is now. While a lesson runs, its lock file is held
(:func:`holding`), so that a site build that needs the lesson can wait for
a run in progress rather than start a second one (:func:`wait_for_run`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import nbformat
from nbclient import NotebookClient

REPO_ROOT = Path(__file__).resolve().parent.parent
EXECUTED_DIR = REPO_ROOT / "build" / "lessons"
TIMEOUT_S = 300  # per cell
STAMP_KEY = "workbench_executed"

# What every lesson's kernel gets on top of the caller's environment. "notebook" embeds plotly.js in the first
# figure's output (workbench's widgets read WORKBENCH_PLOTLY_RENDERER when they draw a static figure), so a saved
# lesson shows its figures without a network.
SHORT_MODE_ENV = {
    "WORKBENCH_SMOKE": "1",
    "OMP_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
    "PLOTLY_RENDERER": "notebook",
    "WORKBENCH_PLOTLY_RENDERER": "notebook",
}


def execute(notebook: nbformat.NotebookNode, cwd: Path, run_root: Path | None = None,
            shared_run_root: Path | None = None, timeout: int = TIMEOUT_S) -> nbformat.NotebookNode:
    """``notebook`` executed top to bottom in a fresh ``python3`` kernel started in ``cwd``, in the short mode."""
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}, store_widget_state=False)
    env = {**os.environ, **SHORT_MODE_ENV}
    if run_root is not None:
        env["WORKBENCH_RUN_ROOT"] = str(run_root)
    if shared_run_root is not None:
        env["WORKBENCH_SHARED_RUN_ROOT"] = str(shared_run_root)
    return client.execute(env=env)


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook at ``path``, or, while only its paired py:percent script exists, the one jupytext builds."""
    if path.exists():
        return nbformat.read(path, as_version=4)
    import jupytext

    return jupytext.read(path.with_suffix(".py"), fmt="py:percent")


@dataclass
class LessonRun:
    executed: nbformat.NotebookNode
    runs: list[dict]  # the runs it launched, as workbench.jobs.list_runs reads them
    leftovers: list  # runs whose processes were still alive and were reaped
    seconds: float


def run_lesson(path: Path, label: str) -> LessonRun:
    """Execute the lesson ``path`` (its ``.ipynb``) from its folder, its runs under a fresh folder of the ignored
    ``runs/`` (not /tmp: a multi-node spec refuses node-local storage) and its cluster examples' under
    ``~/.cache/workbench``; afterwards every run it left alive is reaped and both folders are removed."""
    from workbench.jobs import list_runs, reap

    name = f"{label}-{os.getpid()}-{path.stem}"
    run_root = REPO_ROOT / "runs" / name
    shared_run_root = Path.home() / ".cache" / "workbench" / name
    began = time.monotonic()
    try:
        executed = execute(read_notebook(path), path.parent, run_root, shared_run_root)
    finally:
        leftovers = reap(run_root, force=True)
        runs = list_runs(run_root)
        shutil.rmtree(run_root, ignore_errors=True)
        shutil.rmtree(shared_run_root, ignore_errors=True)
    return LessonRun(executed, runs, leftovers, time.monotonic() - began)


def error_outputs(notebook: nbformat.NotebookNode) -> list:
    return [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
            if out.output_type == "error"]


def source_path(path: Path) -> Path:
    """The file a lesson is executed from: its ``.ipynb``, or its script while the ``.ipynb`` is not written."""
    return path if path.exists() else path.with_suffix(".py")


def stamp(path: Path) -> str:
    """The hash of the lesson's source and of the environment it is executed in."""
    digest = hashlib.sha256(source_path(path).read_bytes())
    digest.update(json.dumps(SHORT_MODE_ENV, sort_keys=True).encode())
    return digest.hexdigest()


def copy_path(path: Path, directory: Path = EXECUTED_DIR) -> Path:
    return directory / f"{path.stem}.ipynb"


def save(executed: nbformat.NotebookNode, path: Path, directory: Path = EXECUTED_DIR,
         source_stamp: str | None = None) -> Path:
    """Write the executed lesson to ``directory`` with its stamp (of the source it was executed from: pass the
    stamp taken before executing), atomically: a reader sees the old copy or the new one, never a part."""
    directory.mkdir(parents=True, exist_ok=True)
    executed = nbformat.from_dict(executed)
    executed.metadata[STAMP_KEY] = {"source": source_path(path).name, "stamp": source_stamp or stamp(path)}
    target = copy_path(path, directory)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            nbformat.write(executed, out)
        os.chmod(temporary, 0o644)  # mkstemp's file is the owner's alone
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def load_fresh(path: Path, directory: Path = EXECUTED_DIR) -> nbformat.NotebookNode | None:
    """The saved executed copy of the lesson ``path`` if its stamp matches the lesson now, else None."""
    target = copy_path(path, directory)
    try:
        executed = nbformat.read(target, as_version=4)
    except (OSError, ValueError):  # none yet, or unreadable
        return None
    saved = executed.metadata.get(STAMP_KEY, {})
    return executed if saved.get("stamp") == stamp(path) else None


def _lock_path(path: Path, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f".{path.stem}.lock"


@contextlib.contextmanager
def holding(path: Path, directory: Path = EXECUTED_DIR) -> Iterator[None]:
    """Hold the lesson's lock (shared: several runs of one lesson may go on at once) while the body runs it."""
    with open(_lock_path(path, directory), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def wait_for_run(path: Path, directory: Path = EXECUTED_DIR, timeout_s: float = 900.0) -> bool:
    """Wait until no run of the lesson holds its lock (at most ``timeout_s``); False if one still does."""
    deadline = time.monotonic() + timeout_s
    with open(_lock_path(path, directory), "a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(1.0)
                continue
            fcntl.flock(lock, fcntl.LOCK_UN)
            return True
