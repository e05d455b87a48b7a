"""Suite-wide settings: small thread counts, GPU tests skipped without CUDA (unless rehearsed, see tests/gpu)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


# Tests that start JupyterLab share one server and browser per worker: under pytest-xdist (make test runs
# -n 2 --dist loadgroup) they all go to one worker, one at a time, while the other worker runs the rest.
ONE_WORKER_GROUPS = {"browser": "jupyterlab", "lab": "jupyterlab"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        room = item.path.parent.name
        if room in ONE_WORKER_GROUPS:
            item.add_marker(pytest.mark.xdist_group(ONE_WORKER_GROUPS[room]))
    _skip_gpu_tests(items)


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
