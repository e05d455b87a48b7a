"""A placement from the planner decides which process runs which rank of the plan's mesh, and the run is the
same run: the mesh rank ``r`` runs in process ``placement[r]``, and losses and parameters do not change."""

from __future__ import annotations

import pytest
import torch

from runtime_launch import dumped_params, make_config, run_ok, step_losses
from workbench.core.config import RunConfig
from workbench.runtime.events import read_events


def test_placement_is_checked_and_maps_processes_to_mesh_ranks(tmp_path):
    config = make_config(tmp_path / "a", plan="gropipe-2x2-1f1b-m2-d0", run={"placement": [0, 2, 1, 3]})
    assert config.run.placement == (0, 2, 1, 3)
    assert [config.mesh_rank(p) for p in range(4)] == [0, 2, 1, 3]
    assert RunConfig.from_dict(config.to_dict()) == config
    assert make_config(tmp_path / "b", plan="pp2-1f1b-m2").mesh_rank(1) == 1  # no placement: the identity
    for bad, words in (([0, 1, 2], "each of the 4 processes"), ([0, 1, 1, 3], "each of the 4 processes"),
                       ("0,1,2,3", "list of process ranks"), ([0, 1, 2, 4], "each of the 4 processes")):
        with pytest.raises(ValueError, match="placement") as info:
            make_config(tmp_path / "c", plan="gropipe-2x2-1f1b-m2-d0", run={"placement": bad})
        assert words in str(info.value)


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_stage_major_placement_runs_the_same_gropipe_run(tmp_path):
    fields = {"plan": "gropipe-2x2-1f1b-m2-d0", "training": {"steps": 3}}
    run_ok(tmp_path / "plain", 4, **fields)
    run_ok(tmp_path / "placed", 4, run={"placement": [0, 2, 1, 3]}, **fields)  # both replicas of a stage side by side
    for run in ("plain", "placed"):
        starts = {r: [e for e in read_events(tmp_path / run, r) if e["kind"] == "start"][-1] for r in range(4)}
        expected = [0, 2, 1, 3] if run == "placed" else [0, 1, 2, 3]
        assert [starts[r]["process"] for r in range(4)] == expected
    torch.testing.assert_close(step_losses(tmp_path / "placed"), step_losses(tmp_path / "plain"), rtol=0, atol=0)
    placed, plain = dumped_params(tmp_path / "placed", [0, 1]), dumped_params(tmp_path / "plain", [0, 1])
    assert sorted(placed) == sorted(plain)
    for name, value in plain.items():
        torch.testing.assert_close(placed[name], value, rtol=0, atol=0)
