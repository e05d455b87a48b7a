"""Two torchrun "nodes" on loopback meet through c10d rendezvous and train as one job."""

import pytest

from job_test_helpers import assert_no_processes, worker_spec
from workbench.jobs import launch

pytestmark = pytest.mark.multiproc


def test_two_loopback_nodes_rendezvous_and_finish(tmp_path):
    spec = worker_spec(tmp_path, nproc=1, name="nodes", steps=5).replace(nnodes=2)
    job = launch(spec, backend="multinode")
    assert len(job.launch_info["agents"]) == 2 and job.launch_info["rdzv_endpoint"].startswith("127.0.0.1:")
    assert len(job.commands) == 2 and all(f"--rdzv-id {job.run_id}" in c for c in job.commands)
    status = job.wait(timeout=120)
    assert status.state == "SUCCEEDED", status.text()
    assert status.exit_codes == {"node0": 0, "node1": 0}
    assert [r.rank for r in status.ranks] == [0, 1] and all(r.step == 4 for r in status.ranks)
    assert job.metrics().groupby("rank")["loss"].last().nunique() == 1  # one job: ranks agree on the mean loss
    assert_no_processes(job.run_id)
