"""PartitionEditor driven from Python: set a control, check the state and the figure data (no kernel)."""

import json
import random
from pathlib import Path

import plotly.graph_objects as go
import pytest


from workbench.core.costs import LayerCost, ModelCosts
from workbench.core.partition import Partition
from workbench.core.plan import ParallelPlan
from workbench.planning import partition as run_partitioner
from workbench.widgets.partition_editor import PartitionEditor


def uneven_costs(num_layers: int = 40, *, model: str = "synthetic", batch: int = 16, seed: int = 0) -> ModelCosts:
    rng = random.Random(seed)
    layers = tuple(LayerCost(f"layer{i}", rng.uniform(0.5, 2.0), rng.uniform(1.0, 4.0),
                             param_bytes=rng.randint(1, 8) * 2**20, activation_bytes=2**18, saved_bytes=2**18)
                   for i in range(num_layers))
    return ModelCosts(model, batch, "synthetic", layers)


@pytest.fixture
def editor():
    return PartitionEditor(uneven_costs(), num_stages=4, num_microbatches=8, cluster="8xV100-PCIe")


def test_starts_at_ampas_partition_with_zero_gap(editor):
    state = editor.state
    assert state.partition == state.optimum.partition
    assert state.gap == 0.0
    assert len(editor.boundaries) == 3 and all("wb-boundary" in b._dom_classes for b in editor.boundaries)
    assert editor.cuts == state.partition.cuts
    assert "+0.0%" in editor.labels["gap"].value and "(ampa)" in editor.labels["partition"].value


def test_moving_a_boundary_changes_costs_bottleneck_bubble_and_figures(editor):
    before = editor.state
    balance_y = list(editor.balance_fig.data[0].y)
    timeline_base = list(editor.timeline_fig.data[0].base)
    bottleneck_text, bubble_text = editor.labels["bottleneck"].value, editor.labels["bubble"].value
    worst = before.bottleneck_stage
    # move a boundary next to the bottleneck by four layers so the stage before it grows
    k = worst if worst < 3 else worst - 1
    editor.boundaries[k].value = editor.cuts[k] + 4
    after = editor.state
    assert after.partition != before.partition
    assert after.partition.cuts[k] == before.partition.cuts[k] + 4
    assert after.result.stage_cost_ms[k] > before.result.stage_cost_ms[k]
    assert after.result.stage_cost_ms[k + 1] < before.result.stage_cost_ms[k + 1]
    assert after.bottleneck_ms > before.bottleneck_ms and after.gap > 0
    assert after.bubble_fraction != pytest.approx(before.bubble_fraction)
    assert after.iteration_ms > before.iteration_ms
    assert list(editor.balance_fig.data[0].y) == pytest.approx(after.result.stage_forward_ms)
    assert list(editor.balance_fig.data[0].y) != pytest.approx(balance_y)
    assert list(editor.timeline_fig.data[0].base) != timeline_base
    assert editor.labels["bottleneck"].value != bottleneck_text and editor.labels["bubble"].value != bubble_text
    assert "edited" in editor.labels["partition"].value


def test_gap_to_ampa_is_never_negative(editor):
    L = editor.costs.num_layers
    for k in range(3):
        for value in range(editor.boundaries[k].min, editor.boundaries[k].max + 1, 3):
            editor.boundaries[k].value = value
            assert editor.state.gap >= -1e-12
            assert editor.state.partition.num_layers == L and editor.state.partition.num_stages == 4


def test_a_boundary_pushes_its_neighbours_instead_of_crossing_them(editor):
    cuts = editor.cuts
    editor.boundaries[0].value = cuts[2] + 2
    new = editor.cuts
    assert new[0] == cuts[2] + 2 and new[1] == new[0] + 1 and new[2] == new[1] + 1
    Partition.from_cuts(new, editor.costs.num_layers)  # still a valid partition
    assert [b.value for b in editor.boundaries] == new == editor.state.partition.cuts


def test_baseline_algorithms_and_reset(editor):
    editor.algorithm.value = "uniform"
    assert editor.state.partition == Partition.uniform(editor.costs.num_layers, 4)
    assert "(uniform)" in editor.labels["partition"].value
    assert editor.state.gap >= 0
    editor.algorithm.value = "time"
    expected = run_partitioner(editor.costs, 4, "time", num_microbatches=8, cluster=editor.cluster_spec).partition
    assert editor.state.partition == expected
    editor.algorithm.value = "ampa"
    editor.boundaries[1].value += 2
    editor.reset_button.click()
    assert editor.state.gap == 0.0


def test_changing_stages_schedule_and_chunks_rebuilds_the_controls(editor):
    editor.stages.value = 6
    assert len(editor.boundaries) == 5 and editor.state.partition.num_stages == 6
    editor.schedule.value = "interleaved"  # 6 ranks x 2 chunks = 12 virtual stages; 8 micro-batches not multiple
    assert "multiple" in editor.error.value
    editor.boundaries[0].value += 1  # the last valid configuration (1f1b, 6 stages) stays in force meanwhile
    assert editor.state.sim.schedule.name == "1f1b" and editor.state.partition.num_stages == 6
    assert "multiple" in editor.error.value
    editor.stages.value = 4
    assert editor.error.value == ""
    assert len(editor.boundaries) == 7 and editor.state.sim.schedule.name == "interleaved"
    assert not editor.chunks.disabled and editor.groups.disabled
    assert len(editor.state.peak_memory_bytes) == 4
    editor.schedule.value = "gpipe"
    assert len(editor.boundaries) == 3
    assert editor.state.sim.schedule.name == "gpipe"
    assert editor.chunks.disabled and editor.groups.disabled and editor.delay.disabled


def test_gropipe_on_a_cluster_too_small_reports_the_error_without_raising():
    editor = PartitionEditor(uneven_costs(), num_stages=4, num_microbatches=4, schedule="gropipe", groups=2,
                             cluster="4xV100-NVLink")
    assert "4 devices" in editor.error.value and editor.state is None
    editor.cluster.value = "8xV100-PCIe"
    assert editor.error.value == "" and editor.state.sim.metrics["num_ranks"] == 8


def test_memory_over_the_cap_is_flagged():
    costs = uneven_costs()
    big = ModelCosts(costs.model, costs.batch_size, costs.device,
                     tuple(LayerCost(l.name, l.forward_ms, l.backward_ms, param_bytes=l.param_bytes * 100)
                           for l in costs.layers))
    editor = PartitionEditor(big, num_stages=4, num_microbatches=8, cluster="8xV100-PCIe")
    assert editor.error.value == ""
    editor.set_cuts([1, 2, 3])  # all but three layers on the last stage
    assert "over the" in editor.labels["memory"].value


def test_bad_arguments_name_the_field():
    costs = uneven_costs(6)
    with pytest.raises(ValueError, match="num_stages=8 is more than the model's 6 layers"):
        PartitionEditor(costs, num_stages=8)
    with pytest.raises(ValueError, match=r"num_microbatches=5 does not divide .* valid: \[1, 2, 4, 8, 16\]"):
        PartitionEditor(costs, num_stages=2, num_microbatches=5)
    with pytest.raises(ValueError, match="schedule must be one of gpipe, 1f1b, interleaved, gropipe; got 'zb'"):
        PartitionEditor(costs, schedule="zb")
    with pytest.raises(ValueError, match="cluster must be one of"):
        PartitionEditor(costs, cluster="moon")
    with pytest.raises(ValueError, match="launch_backend must be one of local, dryrun; got 'slurm'"):
        PartitionEditor(costs, launch_backend="slurm")
    editor = PartitionEditor(costs, num_stages=2, num_microbatches=2, cluster=None)
    with pytest.raises(ValueError, match="set_cuts needs 1 cuts"):
        editor.set_cuts([1, 2])


def test_static_figures_match_the_live_ones(editor):
    editor.boundaries[0].value += 1
    balance, timeline = editor.figures()
    assert isinstance(balance, go.Figure) and not isinstance(balance, go.FigureWidget)
    assert list(balance.data[0].y) == pytest.approx(list(editor.balance_fig.data[0].y))
    assert sorted(timeline.data[0].base) == pytest.approx(sorted(editor.timeline_fig.data[0].base))
    assert "bottleneck" in editor.summary() and "gap to AMPA" in editor.summary()


def test_profile_json_loads_as_a_new_model(editor, tmp_path):
    other = uneven_costs(12, model="from-disk", batch=8, seed=3)
    path = other.save(tmp_path / "costs.json")
    editor.profile_path.value = str(path)
    assert editor.costs.model == "from-disk" and editor.model.value == "from-disk"
    assert editor.state.partition.num_layers == 12 and 8 in editor.microbatches.options
    editor.profile_path.value = str(tmp_path / "missing.json")
    assert "missing.json" in editor.error.value


def test_run_config_carries_the_edited_partition_and_dry_run_launch_writes_it(tmp_path):
    # costs with as many layers as the zoo's mlp: a dry run checks the partition against the model too
    editor = PartitionEditor(uneven_costs(4, model="mlp", batch=16), num_stages=2, num_microbatches=4,
                             schedule="gropipe", groups=2, delay=1, cluster="local-cpu", run_root=str(tmp_path),
                             launch_backend="dryrun", models=[])
    editor.set_cuts([3])
    config = editor.run_config()
    assert config.plan == ParallelPlan.parse("gropipe-2x2-1f1b-m4-d1@0-2|3-3")
    assert config.training.global_batch == 32 and config.plan.microbatches == 4
    job = editor.launch()
    written = json.loads((Path(job.run_dir) / "config.json").read_text())
    assert ParallelPlan.from_dict(written["plan"]) == config.plan
    assert editor.monitor is None


def test_dry_run_refuses_a_partition_the_model_does_not_have(tmp_path):
    editor = PartitionEditor(uneven_costs(8, model="mlp", batch=16), num_stages=2, num_microbatches=4,
                             cluster="local-cpu", run_root=str(tmp_path), launch_backend="dryrun", models=[])
    editor.set_cuts([5])
    with pytest.raises(ValueError, match="does not fit model 'mlp' with 4 layers"):
        editor.launch()
    assert not any(tmp_path.iterdir())  # refused before a run directory was made


def test_launching_a_model_outside_the_zoo_is_refused(editor):
    editor.launch_backend = "dryrun"
    with pytest.raises(ValueError, match="'synthetic' is not in the zoo"):
        editor.launch()
    editor.launch_button.click()
    assert "not in the zoo" in editor.error.value


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_launch_trains_the_edited_partition_under_torchrun(tmp_path):
    editor = PartitionEditor("mlp", num_stages=2, num_microbatches=4, schedule="1f1b", profile_batch=16,
                             launch_steps=3, run_root=str(tmp_path), models=[])
    edited = [editor.cuts[0] + 1] if editor.cuts[0] + 1 < editor.costs.num_layers else [editor.cuts[0] - 1]
    editor.set_cuts(edited)
    editor.launch_button.click()
    assert editor.error.value == "" and editor.job is not None and editor.monitor is not None
    try:
        status = editor.job.wait(timeout=240)
    finally:
        editor.monitor.stop()
    assert status.state == "SUCCEEDED", status.text()
    written = json.loads((Path(editor.job.run_dir) / "config.json").read_text())
    assert written["plan"]["partition"] == str(editor.state.partition)
    assert written["plan"]["pipeline"] == {"kind": "1f1b"}
    metrics = editor.job.metrics()
    assert sorted(metrics["step"].unique().tolist()) == [1, 2, 3]


def test_the_cluster_choice_projects_the_profile_onto_its_gpu():
    import torch

    from workbench.profiling import profile

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        costs = profile("mlp", batch=16, repeats=1, progress=False)
    finally:
        torch.set_num_threads(threads)
    editor = PartitionEditor(costs, num_stages=2, num_microbatches=4, cluster="local-cpu", models=[])
    here = editor.state.sim.metrics["iteration_ms"]
    assert editor.cluster_costs is editor.costs
    editor.cluster.value = "8xV100-PCIe"
    projected = editor.cluster_costs
    assert projected.device != costs.device and projected is editor.cluster_costs  # projected once, then cached
    assert editor.state.sim.metrics["iteration_ms"] < here / 2, (editor.state.sim.metrics, here)  # a V100 beats two shared cores


def test_launch_data_is_real_data_of_the_models_kind():
    vision = PartitionEditor(uneven_costs(8, model="mlp", batch=16), num_stages=2, num_microbatches=4, models=[])
    assert vision.run_config().data.kind == "digits"
    lm = uneven_costs(8, model="gpt2-tiny", batch=16)
    from dataclasses import replace

    lm = replace(lm, meta={"input_shape": [16, 48]})
    text = PartitionEditor(lm, num_stages=2, num_microbatches=4, models=[]).run_config()
    assert text.data.kind == "bytes-lm" and text.data.seq_len == 48
