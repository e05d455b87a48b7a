"""Strategy ``async`` under real torchrun (gloo, 4 ranks): the weight versions each micro-batch used.

The versions come from the events every rank recorded: a forward records the
version it bound, a backward the version whose weights its autograd graph
reads at that moment. With weight stashing every backward reads its
forward's version on every stage (and with vertical sync, or PipeDream-2BW,
one version per micro-batch across all stages); without stashing the check
fails, which is what stashing is for. The stage keeps as many versions as
its in-flight micro-batches span (the memory model's count), measured from
the run.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import torch

from runtime_launch import Sweep, dumped_params, step_losses
from workbench.runtime.events import load_measured_timeline
from workbench.scheduling.generators import async_1f1b

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

ASYNC = {"plan": "async-1x4-m4-if4", "training": {"steps": 4, "global_batch": 16}}


def versions_by_microbatch(run_dir):
    """(rank, stage, iteration, micro-batch) -> {op: version} from the measured F and B events."""
    out: dict[tuple, dict[str, int]] = defaultdict(dict)
    for e in load_measured_timeline(run_dir).events:
        if e.op in ("F", "B", "I", "W"):
            out[(e.rank, e.stage, e.iteration, e.microbatch)][e.op] = e.version
    return out


def versions_in_flight(schedule, rank):
    """The most distinct versions a rank holds at once: the newest plus those of its in-flight micro-batches."""
    steps, live, most = 0, {}, 1
    for a in schedule.actions(rank):
        if a.op.value == "F":
            live[(a.iteration, a.microbatch)] = a.version
        elif a.op.value == "B":
            live.pop((a.iteration, a.microbatch))
        elif a.op.value == "STEP":
            steps += 1
        most = max(most, len(set(live.values()) | {steps}))
    return most


SGD = {"name": "sgd", "lr": 0.1, "momentum": 0.9}
RUNS = {"stash": (4, ASYNC), "vertical-sync": (4, {**ASYNC, "plan": "async-1x4-m4-vsync-if4"}),
        "2bw": (4, {**ASYNC, "plan": "async-1x4-m4-2bw-if4"}),
        "nostash": (4, {**ASYNC, "plan": "async-1x4-m4-nostash-if4"}),
        "groups": (4, {"plan": "async-2x2-m2", "training": {"steps": 4, "global_batch": 16, "optimizer": SGD}}),
        "split": (4, {**ASYNC, "plan": "async-1x4-m4-split-if4"}),
        "recompute": (4, {**ASYNC, "plan": "async-1x4-m4-if4-rc"}),
        "split-recompute": (4, {**ASYNC, "plan": "async-1x4-m4-split-if4-rc"}),
        "groups-split": (4, {"plan": "async-2x2-m2-split", "training": {"steps": 4, "global_batch": 16,
                                                                         "optimizer": SGD}})}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The module's nine 4-rank runs in one sweep."""
    return Sweep(tmp_path_factory.mktemp("async_versions"), RUNS)


@pytest.fixture(scope="module")
def stashed(sweep):
    return sweep.dir("stash"), sweep.run("stash")


def test_every_backward_reads_its_forwards_version_on_every_stage(stashed):
    run_dir, config = stashed
    versions = versions_by_microbatch(run_dir)
    assert len(versions) == config.training.steps * config.plan.microbatches * config.plan.pp
    assert all(v["B"] == v["F"] for v in versions.values())
    assert {v["F"] for v in versions.values()} == set(range(config.training.steps))  # several versions really in use
    plan = async_1f1b(4, 4, config.training.steps)
    for rank in range(4):  # the runtime bound exactly the planned versions, in the schedule's order
        planned = [(a.iteration, a.microbatch, a.version) for a in plan.actions(rank) if a.op.value == "F"]
        recorded = [(e.iteration, e.microbatch, e.version) for e in sorted(
            (e for e in load_measured_timeline(run_dir).events if e.rank == rank and e.op == "F"),
            key=lambda e: e.start)]
        assert recorded == planned


def test_versions_kept_match_the_microbatches_in_flight(stashed):
    run_dir, config = stashed
    plan = async_1f1b(4, 4, config.training.steps)
    for rank in range(4):
        report = json.loads((run_dir / "memory" / f"rank{rank}.json").read_text())
        assert report["versions"] == versions_in_flight(plan, rank)
        assert (report["stashed_weights"] > 0) == (report["versions"] > 1)
    assert json.loads((run_dir / "memory" / "rank0.json").read_text())["versions"] == 2


@pytest.mark.parametrize("key", ["vertical-sync", "2bw"])
def test_one_version_per_microbatch_on_all_stages(sweep, key):
    config = sweep.run(key)
    versions = versions_by_microbatch(sweep.dir(key))
    assert all(v["B"] == v["F"] for v in versions.values())
    per_microbatch: dict[tuple, set] = defaultdict(set)
    for (rank, stage, iteration, mb), v in versions.items():
        per_microbatch[(iteration, mb)].add(v["F"])
    assert all(len(used) == 1 for used in per_microbatch.values())
    if config.plan.pipeline.mode == "2bw":
        assert all(used == {max(0, it - 1)} for (it, _), used in per_microbatch.items())
    else:
        stage0 = {(it, mb): v["F"] for (rank, s, it, mb), v in versions.items() if s == 0}
        assert config.plan.pipeline.vertical_sync
        assert any(stage0[k] < stage0[(k[0], config.plan.microbatches - 1)] for k in stage0)


def test_without_stashing_backward_reads_newer_weights(sweep):
    config = sweep.run("nostash")
    assert not config.plan.pipeline.stash
    versions = versions_by_microbatch(sweep.dir("nostash"))
    stale = [k for k, v in versions.items() if v["B"] != v["F"]]
    assert stale and all(versions[k]["B"] > versions[k]["F"] for k in stale)
    assert {k[1] for k in stale} == {0, 1, 2}  # the last stage runs each backward right after its forward


def test_async_pipelines_in_groups_stay_identical(sweep):
    config, run_dir = sweep.run("groups"), sweep.dir("groups")
    versions = versions_by_microbatch(run_dir)
    assert len(versions) == 2 * config.training.steps * config.plan.microbatches * config.plan.pp
    assert all(v["B"] == v["F"] for v in versions.values())
    torch.testing.assert_close(dumped_params(run_dir, [2, 3]), dumped_params(run_dir, [0, 1]), rtol=0, atol=0)


@pytest.mark.parametrize(("split", "fused"), [("split", "stash"), ("groups-split", "groups"),
                                            ("split-recompute", "stash")])
def test_split_backward_reads_its_forwards_version_and_equals_the_fused_stream(sweep, split, fused):
    """Each backward runs as I then W, both on the version its forward bound, and the run is the fused
    stream's: the same losses and final weights."""
    config = sweep.run(split)
    assert config.plan.split_backward and not sweep.run(fused).plan.split_backward
    versions = versions_by_microbatch(sweep.dir(split))
    assert len(versions) == config.plan.dp * config.training.steps * config.plan.microbatches * config.plan.pp
    assert all(set(v) == {"F", "I", "W"} and v["I"] == v["W"] == v["F"] for v in versions.values())
    assert len({v["F"] for v in versions.values()}) > 1  # stashed versions really in use
    torch.testing.assert_close(step_losses(sweep.dir(split)), step_losses(sweep.dir(fused)), rtol=0, atol=1e-5)
    ranks = list(range(config.world_size))
    fused_params = dumped_params(sweep.dir(fused), ranks)
    for name, value in dumped_params(sweep.dir(split), ranks).items():
        torch.testing.assert_close(value, fused_params[name], rtol=0, atol=1e-5, msg=f"parameter {name}")


def test_a_recomputing_stage_replays_its_forward_on_the_stashed_version(sweep):
    """The backward's replay of a recomputed forward binds the version that forward used, not the newest
    weights: the run equals the one that kept its activations."""
    config = sweep.run("recompute")
    assert config.plan.recompute
    versions = versions_by_microbatch(sweep.dir("recompute"))
    assert all(v["B"] == v["F"] for v in versions.values())
    torch.testing.assert_close(step_losses(sweep.dir("recompute")), step_losses(sweep.dir("stash")), rtol=0,
                               atol=1e-5)
    kept = dumped_params(sweep.dir("stash"), list(range(4)))
    for name, value in dumped_params(sweep.dir("recompute"), list(range(4))).items():
        torch.testing.assert_close(value, kept[name], rtol=0, atol=1e-5, msg=f"parameter {name}")
