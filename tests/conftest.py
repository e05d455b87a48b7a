"""Suite-wide settings: small thread counts, GPU tests skipped without CUDA (unless rehearsed, see tests/gpu)."""

import importlib.util
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from xdist_turns import lock_file, turn

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


# Tests that start JupyterLab share one server and browser per worker: under pytest-xdist (make test runs
# -n 2 --dist loadgroup) they all go to one worker, one at a time, while the other worker runs the rest.
ONE_WORKER_GROUPS = {"browser": "jupyterlab", "lab": "jupyterlab"}


def pytest_collection_modifyitems(config, items):
    # the site's tests last: by then the notebook tests have left most lessons executed for the site to take
    items[:] = [item for item in items if not item.get_closest_marker("site")] + \
        [item for item in items if item.get_closest_marker("site")]
    for item in items:
        room = item.path.parent.name
        if room in ONE_WORKER_GROUPS:
            item.add_marker(pytest.mark.xdist_group(ONE_WORKER_GROUPS[room]))
        elif item.get_closest_marker("slurm") or _submits_to_slurm(item):
            # one Slurm cluster for the session: every test that uses it on one worker
            item.add_marker(pytest.mark.xdist_group("slurm"))
    _skip_gpu_tests(items)


# Lessons whose checks compare measured speeds (notebook 05: both pipelines faster than naive model parallelism on
# two ranks): they need the machine's cores to themselves, so they run alone (pytest_runtest_protocol below).
EXCLUSIVE_NOTEBOOKS = {"05_async_pipeline.ipynb"}


def _exclusive(item) -> bool:
    path = _notebook(item)
    return bool(item.get_closest_marker("exclusive")) or (path is not None and path.name in EXCLUSIVE_NOTEBOOKS) \
        or (bool(item.get_closest_marker("site")) and _site_executes_an_exclusive_lesson())


def _site_executes_an_exclusive_lesson() -> bool:
    """Whether building the site now would execute one of EXCLUSIVE_NOTEBOOKS (scripts/build_site.py executes the
    lessons that build/lessons/ holds no fresh executed copy of)."""
    name = "workbench_scripts_lesson_runs"  # as tests/notebooks/notebook_files.py loads it
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "lesson_runs.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    lesson_runs = sys.modules[name]
    lessons = [ROOT / "notebooks" / lesson for lesson in sorted(EXCLUSIVE_NOTEBOOKS)]
    return any(lesson_runs.load_fresh(path) is None for path in lessons if lesson_runs.source_path(path).exists())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, a test marked ``exclusive`` runs (setup, call and teardown) while no other worker runs
    a test (tests/xdist_turns.py)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run_id:
        yield
        return
    with turn(run_id, _exclusive(item)):
        yield


def pytest_configure(config):
    # the controller names the run for its workers (pytest-xdist would otherwise pick the id where this file
    # cannot read it), so that it can remove the lock files afterwards
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput") \
            and getattr(config.option, "testrunuid", "") is None:
        config.option.testrunuid = uuid.uuid4().hex


def pytest_unconfigure(config):
    run_id = getattr(config.option, "testrunuid", None)
    if run_id and not hasattr(config, "workerinput"):
        for kind in ("gate", "lock"):
            lock_file(run_id, kind).unlink(missing_ok=True)


def _notebook(item) -> Path | None:
    """The notebook a notebook test runs (its ``path`` parameter), or None."""
    path = getattr(getattr(item, "callspec", None), "params", {}).get("path")
    return path if isinstance(path, Path) and path.suffix in (".ipynb", ".py") else None


def _submits_to_slurm(item) -> bool:
    """A notebook test whose notebook submits to Slurm (it asks for the ``slurm_cluster`` fixture when it runs)."""
    path = _notebook(item)
    return path is not None and "submitted to Slurm" in path.read_text()


@pytest.fixture(scope="session", autouse=True)
def warm_ranks(tmp_path_factory):
    """One warm rank server for the session (workbench.runtime.warm): every rank the tests, their notebooks and
    their JupyterLab kernels launch is forked from it instead of importing torch again. Its ranks are real
    processes under real torchrun, shown in /proc as cold ones are. ``WORKBENCH_COLD_RANKS=1`` turns it off, and
    a machine with a GPU runs cold (the GPU tier checks what users run). Yields the socket, or None."""
    from workbench.core.rundir import WARM_RANKS_ENV
    from workbench.runtime.warm import server_command, server_env

    if os.environ.get("WORKBENCH_COLD_RANKS") == "1" or shutil.which("nvidia-smi"):
        yield None
        return
    path = tmp_path_factory.mktemp("warm") / "ranks.sock"
    server = subprocess.Popen(server_command(str(path), sys.executable), env=server_env(),
                              stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    os.environ[WARM_RANKS_ENV] = str(path)  # until it listens, ranks start cold
    try:
        yield path
    finally:
        os.environ.pop(WARM_RANKS_ENV, None)
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def _skip_gpu_tests(items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    if os.environ.get("WORKBENCH_GPU_TIER_REHEARSAL") == "1":  # tests/gpu/gpu_tier.py: the tier on CPU ranks
        for item in gpu_items:
            if "cuda_only" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="needs CUDA itself (rehearsal on CPU)"))
        return
    skip = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A one-host Slurm cluster (slurmctld, slurmd, munge) for the session, started by scripts/ensure_slurm.sh.

    ``SLURM_CONF`` points the client commands at it while it lasts; where the script cannot have it (not
    root and Slurm missing, no apt-get, a daemon that does not start) the tests skip with its reason."""
    where = tmp_path_factory.mktemp("slurm")
    script = ROOT / "scripts" / "ensure_slurm.sh"
    out = subprocess.run(["bash", str(script), "start", str(where)], capture_output=True, text=True, timeout=600)
    last = (out.stdout.strip().splitlines() or [out.stderr.strip()])[-1]
    if out.returncode != 0 or not last.startswith("SLURM_CONF="):
        pytest.skip(f"no Slurm cluster here: {last}")
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = last.split("=", 1)[1]
    try:
        yield Path(os.environ["SLURM_CONF"])
    finally:
        subprocess.run(["bash", str(script), "stop", str(where)], capture_output=True, timeout=120)
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
