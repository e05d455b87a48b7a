"""Runtime calibration: the profile's compute scaled to what a run's ranks measured."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

from workbench.core.costs import ModelCosts
from workbench.core.partition import Partition
from workbench.core.plan import ParallelPlan
from workbench.core.timeline import Event, Timeline
from workbench.planning import Budget, SearchOptions, Workload, plan
from workbench.planning.costs.run_calibration import (calibrate_from_run, calibrate_from_timeline,
                                                      calibrate_tensor_from_timeline)
from workbench.planning.costs.compute_scaling import (ComputeModel, RuntimeCalibration, compute_models, fit_factor,
                                                      profiled_compute_models, runtime_family)
from workbench.planning.costs.tensor_costs import TransformerShape
from workbench.planning.costs.clusters import core_sharing, get_cluster
from workbench.scheduling import generators
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts

COSTS = ModelCosts.uniform(8, forward_ms=2.0, backward_ms=4.0, batch_size=8)


def measured_like(costs: ModelCosts, partition: Partition, microbatch: int, factor: float, cluster: str):
    """A timeline as a run would measure it: the profile's stage times x ``factor``, sharing the cores."""
    spec = get_cluster(cluster)
    sc = StageCosts.from_model(costs, partition, microbatch)
    sc = replace(sc, forward_ms=tuple(f * factor for f in sc.forward_ms),
                 backward_ms=tuple(b * factor for b in sc.backward_ms))
    sim = simulate(generators.one_f_one_b(partition.num_stages, 4), sc, spec, sharing=core_sharing(spec))
    return Timeline(tuple(replace(e, source="measured") for e in sim.timeline.events))


@pytest.mark.parametrize("cluster", ["8xA100-NVLink", "local"])
def test_calibration_recovers_how_much_slower_the_run_computed(cluster):
    partition = Partition.from_sizes([2, 2, 2, 2])
    timeline = measured_like(COSTS, partition, 2, 1.6, cluster)
    cal = calibrate_from_timeline(COSTS, timeline, partition, 2, cluster=cluster, warmup=0)
    # on the GPU cluster exactly; on shared cores through the processor-sharing round trip
    assert cal.compute_scale == pytest.approx(1.6, rel=1e-9 if cluster != "local" else 0.12)
    assert cal.events == 2 * 4 * 4  # forward and backward of 4 micro-batches on 4 stages


def test_apply_scales_every_layers_compute_and_records_itself():
    cal = RuntimeCalibration(1.5, 10, 15.0, 10.0, "somewhere", "pp4")
    scaled = cal.apply(COSTS)
    assert [l.forward_ms for l in scaled.layers] == [3.0] * 8
    assert [l.backward_ms for l in scaled.layers] == [6.0] * 8
    assert [l.param_bytes for l in scaled.layers] == [l.param_bytes for l in COSTS.layers]
    assert scaled.meta["runtime_calibration"]["compute_scale"] == 1.5
    assert RuntimeCalibration.from_dict(cal.to_dict()) == cal


def test_plan_with_a_calibration_equals_plan_on_the_scaled_profile():
    cal = RuntimeCalibration(2.0, 10, 20.0, 10.0)
    names = ["dp4", "pp4-1f1b-m4", "gropipe-2x2-1f1b-m4-d1"]
    a = plan(Workload(COSTS, 16), "8xA100-NVLink", Budget(world_size=4),
             SearchOptions(strategies=names, calibration=cal))
    b = plan(Workload(cal.apply(COSTS), 16), "8xA100-NVLink", Budget(world_size=4), SearchOptions(strategies=names))
    base = plan(Workload(COSTS, 16), "8xA100-NVLink", Budget(world_size=4), SearchOptions(strategies=names))
    for n in names:
        assert a[n].estimate.iteration_ms == pytest.approx(b[n].estimate.iteration_ms)
        assert a[n].estimate.compute_ms == pytest.approx(2.0 * base[n].estimate.compute_ms, rel=1e-6)
    assert any("calibrated by 2.000" in note for note in a.notes)


def test_each_runtime_family_is_scaled_by_its_own_calibration():
    scheduled = RuntimeCalibration(2.0, 10, 20.0, 10.0, strategy="pp4-gpipe-m4", runtime="gpipe")
    asynchronous = RuntimeCalibration(2.5, 10, 25.0, 10.0, strategy="async-1x4-m8", runtime="async")
    assert (scheduled.family, asynchronous.family) == ("scheduled", "async")
    names = ["dp4", "pp4-1f1b-m4", "async-2x2-m4"]
    both = plan(Workload(COSTS, 16), "8xA100-NVLink", Budget(world_size=4),
                SearchOptions(strategies=names, calibration=[asynchronous, scheduled]))
    only_scheduled = plan(Workload(COSTS, 16), "8xA100-NVLink", Budget(world_size=4),
                          SearchOptions(strategies=names, calibration=scheduled))
    only_async = plan(Workload(COSTS, 16), "8xA100-NVLink", Budget(world_size=4),
                      SearchOptions(strategies=names, calibration=asynchronous))
    base = plan(Workload(COSTS, 16), "8xA100-NVLink", Budget(world_size=4), SearchOptions(strategies=names))
    for n in ("dp4", "pp4-1f1b-m4"):  # the scheduled runtimes: the pipeline run's scale
        assert both[n].estimate.iteration_ms == pytest.approx(only_scheduled[n].estimate.iteration_ms)
    # the asynchronous pipeline: its own run's scale, 2.5 x the profile's compute
    assert both["async-2x2-m4"].estimate.iteration_ms == pytest.approx(only_async["async-2x2-m4"].estimate.iteration_ms)
    assert both["async-2x2-m4"].estimate.compute_ms == pytest.approx(2.5 * base["async-2x2-m4"].estimate.compute_ms)
    assert both["async-2x2-m4"].estimate.iteration_ms > only_scheduled["async-2x2-m4"].estimate.iteration_ms
    assert sum("calibrated by" in note for note in both.notes) == 2


def test_runs_at_two_micro_batch_sizes_fit_a_per_micro_batch_cost():
    # 1.5 x the profile at micro-batches of 4 samples and 3.0 x at 1: factor(b) = 1 + 2 / b
    four = RuntimeCalibration(1.5, 10, 15.0, 10.0, strategy="pp4-gpipe-m4", runtime="gpipe", microbatch_size=4)
    one = RuntimeCalibration(3.0, 10, 30.0, 10.0, strategy="pp4-gpipe-m16", runtime="gpipe", microbatch_size=1)
    model = compute_models([four, one])["scheduled"]
    assert (model.k, model.c) == (pytest.approx(1.0), pytest.approx(2.0))
    assert model.factor(2) == pytest.approx(2.0)
    names = ["dp4", "pp4-1f1b-m16", "gropipe-2x2-1f1b-m4-d0"]  # micro-batches of 4, 1 and 2 samples
    fitted = plan(Workload(COSTS, 16), "8xA100-NVLink", Budget(world_size=4),
                  SearchOptions(strategies=names, calibration=[four, one]))
    base = plan(Workload(COSTS, 16), "8xA100-NVLink", Budget(world_size=4), SearchOptions(strategies=names))
    for name, factor in zip(names, (1.5, 3.0, 2.0)):
        assert fitted[name].estimate.compute_ms == pytest.approx(factor * base[name].estimate.compute_ms), name
    assert any("2.000 / micro-batch" in note for note in fitted.notes)
    # runs at one size, or runs that show no per-micro-batch cost, give a constant: their mean
    assert compute_models([four, replace(four, compute_scale=1.7)])["scheduled"] == ComputeModel(
        "scheduled", pytest.approx(1.6), 0.0, 2, (4,))
    assert compute_models([replace(four, compute_scale=3.0), replace(one, compute_scale=1.5)])["scheduled"].c == 0.0
    assert RuntimeCalibration.from_dict(four.to_dict()) == four


def test_bad_calibration_input_is_explained(tmp_path):
    partition = Partition.from_sizes([4, 4])
    with pytest.raises(ValueError, match="no forward/backward events"):
        calibrate_from_timeline(COSTS, Timeline(()), partition, 2, cluster="8xA100-NVLink")
    with pytest.raises(ValueError, match="microbatch_size"):
        calibrate_from_timeline(COSTS, Timeline(()), partition, 0)
    with pytest.raises(ValueError, match="does not describe this run"):
        RuntimeCalibration(100.0, 1, 100.0, 1.0)
    with pytest.raises(ValueError, match="not a run directory"):
        calibrate_from_run(COSTS, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"name": "t", "model": "gpt2-tiny", "plan": "torchpp2-1f1b-m4",
                                                      "training": {"global_batch": 8}}))
    with pytest.raises(ValueError, match="cannot calibrate compute from a run of 'torchpp2-1f1b-m4'"):
        calibrate_from_run(COSTS, tmp_path)
    with pytest.raises(ValueError, match="needs the transformer's shape"):
        calibrate_tensor_from_timeline(COSTS, Timeline(()), "tp2d-2x2-dp1", 16, None, warmup=0)
    with pytest.raises(ValueError, match="no forward/backward events"):
        calibrate_tensor_from_timeline(COSTS, Timeline(()), "tp2d-2x2-dp1", 16, GPT, warmup=0)
    # a run faster than the communication charged for it: the links need calibrating first
    with pytest.raises(ValueError, match="calibrate the cluster's links"):
        calibrate_tensor_from_timeline(COSTS, tensor_timeline(4, 1.0), "tp2d-2x2-dp1", 16, GPT, cluster="local",
                                       warmup=0)


GPT = TransformerShape(hidden=128, heads=4, layers=8, vocab=256, positions=64, batch=16, seq=64)


def tensor_timeline(ranks: int, step_ms: float, steps: int = 4) -> Timeline:
    """Every rank's forward (1/3) and backward (2/3) of ``step_ms`` for ``steps`` iterations, as measured."""
    events, t = [], 0.0
    for it in range(steps):
        for r in range(ranks):
            events += [Event(r, 0, "F", t, t + step_ms / 3, iteration=it, source="measured"),
                       Event(r, 0, "B", t + step_ms / 3, t + step_ms, iteration=it, source="measured")]
        t += step_ms + 1.0
    return Timeline(tuple(events))


@pytest.mark.parametrize("name, cluster", [("tp2d-2x2-dp1", "local"), ("tp1d-4-dp1", "local"),
                                           ("tp2d-2x2-dp1", "8xA100-NVLink")])
def test_a_tensor_run_is_calibrated_against_the_planned_step_less_its_communication(name, cluster):
    base = plan(Workload(COSTS, 16, shape=GPT), cluster, Budget(world_size=4),
                SearchOptions(strategies=[name]))[name].estimate
    comm = base.detail["step_comm_ms"]
    assert comm > 0 and base.compute_ms > 0
    # the run computed 2.5 x what the profile predicts, and communicated what the planner charges
    timeline = tensor_timeline(4, comm + 2.5 * base.compute_ms)
    cal = calibrate_tensor_from_timeline(COSTS, timeline, name, 16, GPT, cluster=cluster, warmup=1,
                                         runtime="tensor2d" if name.startswith("tp2d") else "tensor1d")
    assert cal.compute_scale == pytest.approx(2.5)
    assert cal.events == 3 * 4 * 2 and cal.microbatch_size == 16
    assert cal.family == ("tensor2d" if name.startswith("tp2d") else "tensor1d")
    # planned with it: the tensor strategy's compute is 2.5 x, the other families are left as profiled
    others = ["dp4", "pp4-1f1b-m4"]
    calibrated = plan(Workload(COSTS, 16, shape=GPT), cluster, Budget(world_size=4),
                      SearchOptions(strategies=[name] + others, calibration=cal))
    assert calibrated[name].estimate.compute_ms == pytest.approx(2.5 * base.compute_ms)
    assert calibrated[name].estimate.iteration_ms == pytest.approx(base.iteration_ms + 1.5 * base.compute_ms)
    scheduled = RuntimeCalibration(1.5, 10, 15.0, 10.0, runtime="gpipe")
    with_both = plan(Workload(COSTS, 16, shape=GPT), cluster, Budget(world_size=4),
                     SearchOptions(strategies=[name] + others, calibration=[cal, scheduled]))
    only_scheduled = plan(Workload(COSTS, 16, shape=GPT), cluster, Budget(world_size=4),
                          SearchOptions(strategies=[name] + others, calibration=scheduled))
    for n in others:
        assert with_both[n].estimate.iteration_ms == pytest.approx(only_scheduled[n].estimate.iteration_ms)
    # a tensor runtime without a run of its own is scaled by the scheduled runtimes' calibration
    assert only_scheduled[name].estimate.compute_ms == pytest.approx(1.5 * base.compute_ms)


def test_runtime_families():
    names = ("tp2d-2x2-dp1", "tp1d-2-dp2", "async-1x2-m4", "gropipe-2x2-1f1b-m4-d1", "dp4", "pp4-interleaved-v2-m8",
             "torchpp2-1f1b-m4")
    assert [runtime_family(ParallelPlan.parse(n)) for n in names] == [
        "tensor2d", "tensor1d", "async", "scheduled", "scheduled", "scheduled", None]


def test_cli_calibrate_needs_a_run_directory(tmp_path, capsys):
    from workbench.cli import main

    path = COSTS.save(tmp_path / "costs.json")
    assert main(["plan", str(path), "--cluster", "local", "--batch", "16", "--world-size", "2",
                 "--calibrate", str(tmp_path / "nowhere")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


@pytest.mark.multiproc
@pytest.mark.skipif(importlib.util.find_spec("workbench.runtime.entry") is None, reason="needs the training entry")
def test_calibration_from_a_real_pipeline_run(tmp_path, capsys):
    from workbench.jobs import LaunchSpec, launch
    from workbench.profiling import profile

    config = {"name": "cal", "model": "mlp", "plan": "pp2-1f1b-m4", "training": {"global_batch": 16, "steps": 4},
              "data": {"kind": "synthetic"}}
    job = launch(LaunchSpec(config=config, name="cal", run_root=str(tmp_path)))
    assert job.wait(timeout=180).state == "SUCCEEDED"
    costs = profile("mlp", batch=8, repeats=3, cache=False, progress=False)
    cal = calibrate_from_run(costs, job.run_dir, cluster="local", warmup=1)
    assert cal.events == 3 * 4 * 2 * 2  # steps 1-3, 4 micro-batches, forward + backward, 2 stages
    assert cal.strategy == "cal" and cal.source == str(job.run_dir)
    assert cal.measured_ms > 0 and cal.predicted_ms > 0
    # a run directory given to plan() is calibrated the same way (on shared cores the simulated compute is not
    # linear in the scale, so the planned times are compared with a plan on the scaled profile)
    default = calibrate_from_run(costs, job.run_dir)  # what plan() does with a run directory: warmup 2 on `local`
    planned = plan(Workload(costs, 16), "local", Budget(world_size=2),
                   SearchOptions(strategies=["pp2-1f1b-m4"], calibration=job.run_dir))
    scaled = plan(Workload(default.apply(costs), 16), "local", Budget(world_size=2),
                  SearchOptions(strategies=["pp2-1f1b-m4"]))
    assert planned["pp2-1f1b-m4"].estimate.iteration_ms == pytest.approx(scaled["pp2-1f1b-m4"].estimate.iteration_ms)
    assert any(f"calibrated by {default.compute_scale:.3f}" in n for n in planned.notes)
    # the same from the command line
    from workbench.cli import main

    path = costs.save(tmp_path / "costs.json")
    assert main(["plan", str(path), "--cluster", "local", "--batch", "16", "--world-size", "2", "--strategies",
                 "pp2-1f1b-m4", "--calibrate", str(job.run_dir), "--json"]) == 0
    assert any("compute calibrated by" in n for n in json.loads(capsys.readouterr().out)["notes"])


@pytest.mark.multiproc
@pytest.mark.skipif(importlib.util.find_spec("workbench.runtime.entry") is None, reason="needs the training entry")
def test_calibration_from_a_real_tensor_parallel_run(tmp_path, capsys):
    from workbench.jobs import LaunchSpec, launch
    from workbench.models.zoo import build_model, get_entry
    from workbench.planning import transformer_shape
    from workbench.profiling import profile

    overrides, seq = {"n_embd": 128, "n_layer": 2, "n_head": 2}, 64  # compute well above the charged communication
    config = {"name": "tp1d-2-dp1", "model": {"name": "gpt2-tiny", "overrides": overrides}, "plan": "tp1d-2-dp1",
              "training": {"global_batch": 8, "steps": 4}, "data": {"kind": "bytes-lm", "seq_len": seq}}
    job = launch(LaunchSpec(config=config, name="tp-cal", run_root=str(tmp_path)))
    assert job.wait(timeout=180).state == "SUCCEEDED"
    costs = profile(build_model("gpt2-tiny", **overrides), batch=8, repeats=3, cache=False, progress=False)
    shape = transformer_shape({**get_entry("gpt2-tiny").config(overrides), "seq_len": seq}, 8)
    cal = calibrate_from_run(costs, job.run_dir, cluster="local", warmup=1, shape=shape)
    assert (cal.family, cal.runtime, cal.strategy, cal.microbatch_size) == ("tensor1d", "tensor1d", "tp1d-2-dp1", 8)
    assert cal.events == 3 * 2 * 2  # steps 1-3, forward + backward, 2 ranks
    assert cal.measured_ms > 0 and cal.predicted_ms > 0
    # planned at another batch with it: the 1D strategy's compute carries the run's factor
    base = plan(Workload(costs, 16, shape=shape), "local", Budget(world_size=2),
                SearchOptions(strategies=["tp1d-2-dp1"]))["tp1d-2-dp1"].estimate
    planned = plan(Workload(costs, 16, shape=shape), "local", Budget(world_size=2),
                   SearchOptions(strategies=["tp1d-2-dp1"], calibration=job.run_dir))["tp1d-2-dp1"].estimate
    default = calibrate_from_run(costs, job.run_dir, shape=shape)  # plan()'s defaults: warmup 2 on `local`
    assert planned.compute_ms == pytest.approx(default.compute_scale * base.compute_ms)
    with pytest.raises(ValueError, match="needs the transformer's shape"):
        calibrate_from_run(costs, job.run_dir)
    # the CLI plans a costs file, which has no shape: the tensor run's own model config gives it
    from workbench.cli import main

    path = costs.save(tmp_path / "costs.json")
    assert main(["plan", str(path), "--cluster", "local", "--batch", "16", "--world-size", "2", "--strategies",
                 "pp2-1f1b-m4", "--calibrate", str(job.run_dir), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("tensor1d runtime's compute calibrated by" in n for n in notes), notes
    # the zoo name with the run: profiled as the run built the model (its overrides), so the run calibrates it
    assert main(["plan", "gpt2-tiny", "--cluster", "local", "--batch", "16", "--world-size", "2", "--strategies",
                 "tp1d-2-dp1", "--calibrate", str(job.run_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert f"gpt2-tiny built as run {job.run_dir} built it: {overrides}" in out["notes"]
    assert any("tensor1d runtime's compute calibrated by" in n for n in out["notes"])
    assert [s["name"] for s in out["strategies"]] == ["tp1d-2-dp1"]


def test_the_per_call_cost_of_a_runtimes_collectives_is_fitted_from_one_run():
    from workbench.planning.costs.run_calibration import fit_call_ms
    from workbench.planning.strategy.hybrid import cost_plan

    costs = ModelCosts.uniform(6, forward_ms=2.0, backward_ms=4.0, param_bytes=2**20, activation_bytes=2**16,
                               batch_size=16)
    spec = get_cluster("local")

    def predict(name: str, call_ms: float) -> float:
        return cost_plan(costs, replace(spec, collective_call_ms=call_ms), 16, name).iteration_ms

    # a fully sharded run measured as the model predicts it at 2.5 ms a call: the fit gives 2.5 back
    measured = predict("dp4-fsdp", 2.5)
    assert predict("dp4-fsdp", 0.0) < measured  # the calls matter to this plan
    fitted = fit_call_ms(lambda x: predict("dp4-fsdp", x), measured)
    assert fitted == pytest.approx(2.5, abs=2e-3)
    # and a mixed plan predicted with the fitted value charges its own calls at that cost
    mixed = "dp4-L[0=fsdp;1-4=ddp.rc;5=zero2]"
    assert predict(mixed, fitted) == pytest.approx(predict(mixed, 2.5), rel=1e-3)
    assert predict(mixed, fitted) > predict(mixed, spec.collective_call_ms)
    # a run faster than the calls alone allow gives 0; one no call cost can reach is refused
    assert fit_call_ms(lambda x: predict("dp4-fsdp", x), predict("dp4-fsdp", 0.0) * 0.9) == 0.0
    with pytest.raises(ValueError, match="not in the collectives"):
        fit_call_ms(lambda x: predict("dp4-fsdp", x), 1e9)
    with pytest.raises(ValueError, match="measured_ms"):
        fit_call_ms(lambda x: 1.0, 0.0)


def _with_passes(costs: ModelCosts) -> ModelCosts:
    """``costs`` with micro-batch passes that follow ``k + c / b`` exactly: hot 1 + 1/b, cold 1 + 2/b, and
    weight binding 10% over hot."""
    sizes = [1, 2, 4, 8]
    hot = [1 + 1 / b for b in sizes]
    return replace(costs, meta={**costs.meta, "microbatch_factors": {
        "sizes": sizes, "hot": hot, "cold": [1 + 2 / b for b in sizes], "bound": [1.1 * h for h in hot]}})


def test_fit_factor_recovers_a_per_micro_batch_cost_and_falls_back_to_the_mean():
    assert fit_factor([1, 2, 4, 16], [0.8 + 0.6 / b for b in (1, 2, 4, 16)]) == (pytest.approx(0.8),
                                                                                 pytest.approx(0.6))
    assert fit_factor([4, 4], [1.2, 1.4]) == (pytest.approx(1.3), 0.0)  # one size: no per-micro-batch cost
    assert fit_factor([1, 4], [1.0, 2.0]) == (pytest.approx(1.5), 0.0)  # cheaper per sample when smaller: noise


def test_a_profile_with_micro_batch_passes_models_the_runtimes_compute_without_runs():
    costs = _with_passes(COSTS)
    crowded = profiled_compute_models(costs, ranks_per_node=4, cores=2)
    assert (crowded["scheduled"].k, crowded["scheduled"].c) == (pytest.approx(1.0), pytest.approx(2.0))  # cold
    assert (crowded["async"].k, crowded["async"].c) == (pytest.approx(1.1), pytest.approx(2.2))  # cold x bound/hot
    roomy = profiled_compute_models(costs, ranks_per_node=2, cores=2)
    assert (roomy["scheduled"].k, roomy["scheduled"].c) == (pytest.approx(1.0), pytest.approx(1.0))  # hot
    assert profiled_compute_models(costs, ranks_per_node=2, cores=2, background_load=1.0)["scheduled"].c == \
        pytest.approx(2.0)  # another runnable process crowds the cores
    assert profiled_compute_models(costs, 4, None) == {}  # GPUs: the passes were timed on the profiling CPU
    assert profiled_compute_models(COSTS, 4, 2) == {}  # a profile without passes


def test_plan_uses_the_profiles_passes_unless_runs_calibrate_it(monkeypatch):
    import workbench.planning.strategy.search as search

    monkeypatch.setattr(search, "shared_cores", lambda cluster: 2 if cluster.shared_compute else None)
    names = ["dp4", "pp4-1f1b-m16", "async-1x4-m8"]  # micro-batches of 4, 1 and 2 samples
    base = plan(Workload(COSTS, 16), "local", Budget(world_size=4), SearchOptions(strategies=names))
    passes = plan(Workload(_with_passes(COSTS), 16), "local", Budget(world_size=4), SearchOptions(strategies=names))
    for name, factor in zip(names, (1.5, 3.0, 1.1 * 2.0)):  # cold 1 + 2 / b, async 10% more
        assert passes[name].estimate.compute_ms == pytest.approx(factor * base[name].estimate.compute_ms, rel=0.02), name
    assert any("profile's own cold-cache passes" in note for note in passes.notes)
    # a calibration from runs replaces the profile's own model; off a CPU node the passes do not apply
    run = RuntimeCalibration(1.5, 10, 15.0, 10.0, strategy="pp4-gpipe-m4", runtime="gpipe", microbatch_size=4)
    calibrated = plan(Workload(_with_passes(COSTS), 16), "local", Budget(world_size=4),
                      SearchOptions(strategies=["dp4"], calibration=run))
    assert calibrated["dp4"].estimate.compute_ms == pytest.approx(1.5 * base["dp4"].estimate.compute_ms, rel=0.02)
    gpu = plan(Workload(_with_passes(COSTS), 16), "8xA100-NVLink", Budget(world_size=4),
               SearchOptions(strategies=["dp4"]))
    assert gpu["dp4"].estimate.iteration_ms == plan(Workload(COSTS, 16), "8xA100-NVLink", Budget(world_size=4),
                                                    SearchOptions(strategies=["dp4"]))["dp4"].estimate.iteration_ms
