"""Evaluation during training: eval events, TensorBoard scalars, time to target, and equality with the reference.

Real runs (torchrun, gloo) of an MLP on the digits evaluate every few steps
and after the last one. A run launched as a job learns (validation accuracy
rises past a threshold), writes its eval events and TensorBoard scalars, and
reports the time to its target accuracy in ``workbench status --json``. Under
DDP, a 1F1B pipeline, GroPipe (dp=2, pp=2, one-step-late update) and the
asynchronous pipeline (one micro-batch in flight, which computes what one
process computes), each evaluation equals evaluating the single-process
reference trained for the same number of steps; so does the evaluation of a
run resumed from a checkpoint, whose training clock carries over.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from runtime_launch import Sweep, make_config, torchrun
from workbench.core.config import RunConfig, merge_changes
from workbench.runtime.batches import run_model, validation_batches
from workbench.runtime.evaluation import evaluate_model, load_dense_state
from workbench.runtime.events import read_events
from workbench.runtime.reference import reference_train

DIGITS = {"data": {"kind": "digits"}, "training": {"global_batch": 32, "optimizer": {"name": "adam", "lr": 0.01}},
          "evaluation": {"batches": 4}}


def digits(**tables) -> dict:
    """:data:`DIGITS` with ``tables`` (a table's dict changes the entries it names)."""
    return merge_changes(DIGITS, tables)
EVAL_FIELDS = {"step", "val_loss", "accuracy", "perplexity", "samples", "eval_s", "train_s", "wall_s"}


def evals(run_dir, rank=0):
    return [e for e in read_events(run_dir, rank) if e["kind"] == "eval"]


def reference_eval(config: RunConfig, steps: int) -> dict:
    """The single-process reference trained ``steps`` steps, evaluated on the run's validation batches."""
    model = run_model(config)
    trained = reference_train(config, steps=steps)
    load_dense_state(model, {**trained.params, **trained.buffers})
    return evaluate_model(model, validation_batches(config, model))


def assert_same_evaluation(got: dict, want: dict) -> None:
    assert got["samples"] == want["samples"]
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5, abs=1e-5)
    assert abs(got["accuracy"] - want["accuracy"]) <= 1.0 / want["samples"]  # at most one near-tie flips


# -- single process -------------------------------------------------------------------------------------------------

class _Fixed(nn.Module):
    def __init__(self, out: torch.Tensor) -> None:
        super().__init__()
        self.out = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out[: x.shape[0]]


def test_classifier_accuracy_and_language_model_perplexity():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0], [0.0, 2.0]])
    targets = torch.tensor([0, 1, 1, 1])
    result = evaluate_model(_Fixed(logits), [(torch.zeros(4, 1), targets)])
    assert result["accuracy"] == 0.75 and result["perplexity"] is None and result["samples"] == 4
    assert result["val_loss"] == pytest.approx(float(nn.functional.cross_entropy(logits, targets)))
    tokens = torch.randn(2, 3, 5)  # [B, T, V]
    target = tokens.argmax(-1)
    target[0, 0] = (target[0, 0] + 1) % 5  # one wrong token
    target[1, 2] = -100  # ignored
    lm = evaluate_model(_Fixed(tokens), [(torch.zeros(2, 3), target)])
    kept = target.reshape(-1) != -100
    mean = float(nn.functional.cross_entropy(tokens.reshape(-1, 5)[kept], target.reshape(-1)[kept]))
    assert lm["tokens"] == 5 and lm["accuracy"] == pytest.approx(4 / 5)
    assert lm["val_loss"] == pytest.approx(mean) and lm["perplexity"] == pytest.approx(math.exp(mean))


def test_missing_parameters_are_an_error_not_a_default():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    state = {n: p.detach() for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match="running_mean"):
        load_dense_state(model, state)


@pytest.mark.parametrize("plan", ["tp1d-2-dp2", "tp2d-2x2-dp1"])
def test_uniform_tensor_parallel_plans_refuse_evaluation(plan):
    with pytest.raises(ValueError, match="evaluation.every.*shards"):
        RunConfig.from_dict({"model": "mlp", "plan": plan, "training": {"global_batch": 16},
                             "evaluation": {"every": 2}})
    RunConfig.from_dict({"model": "mlp", "plan": plan, "training": {"global_batch": 16}})  # fine without evaluation


# -- real runs -------------------------------------------------------------------------------------------------------

@pytest.mark.multiproc
def test_job_learns_writes_eval_events_tensorboard_and_time_to_target(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from workbench.cli import main as cli
    from workbench.jobs import LaunchSpec, launch

    config = RunConfig.from_dict(digits(model="mlp", plan="dp2", training={"steps": 10, "seed": 3},
                                        evaluation={"every": 4, "target_accuracy": 0.6}, events={"heartbeat_s": 1.0}))
    job = launch(LaunchSpec(config=config, run_root=str(tmp_path), name="eval"))
    status = job.wait(timeout=150)
    assert status.state == "SUCCEEDED", status.text()
    run_dir = job.run_dir
    got = evals(run_dir)
    assert [e["step"] for e in got] == [4, 8, 10]  # every 4 steps, and after the last
    assert evals(run_dir, 1) == []  # rank 0 evaluates
    assert all(EVAL_FIELDS <= set(e) for e in got)
    assert got[-1]["accuracy"] > 0.6 and got[-1]["accuracy"] > got[0]["accuracy"] - 0.05
    assert got[-1]["samples"] == 4 * 32 and all(e["perplexity"] is None for e in got)
    train = [e["train_s"] for e in got]
    assert train == sorted(train) and all(e["wall_s"] >= e["train_s"] > 0 and e["eval_s"] > 0 for e in got)
    step_s = sum(e["step_ms"] for e in read_events(run_dir, 0) if e["kind"] == "step") / 1e3
    assert got[-1]["train_s"] == pytest.approx(step_s, rel=1e-6)  # training time: the step times, no evaluation
    assert_same_evaluation(got[-1], reference_eval(config, 10))  # DDP computes what one process computes

    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    scalars = board.Tags()["scalars"]
    assert {"train/loss", "train/samples_per_s", "train/step_ms", "eval/val_loss", "eval/accuracy"} <= set(scalars)
    assert [s.step for s in board.Scalars("train/loss")] == list(range(1, 11))
    assert [(s.step, round(s.value, 5)) for s in board.Scalars("eval/accuracy")] == \
        [(e["step"], round(e["accuracy"], 5)) for e in got]

    reached = next(e for e in got if e["accuracy"] >= 0.6)
    assert cli(["status", str(run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    target = data["time_to_target"]
    assert target["metric"] == "accuracy" and target["reached"] and target["step"] == reached["step"]
    assert target["train_s"] == pytest.approx(reached["train_s"]) and target["wall_s"] == pytest.approx(reached["wall_s"])
    assert data["last_eval"]["step"] == 10
    text = job.status().text()
    assert f"target accuracy >= 0.6: reached at step {reached['step']}" in text and "eval at step 10" in text
    assert "val accuracy" in {t.name for t in job.summary_figure().data}
    assert list(job.evals()["step"]) == [4, 8, 10]


PIPELINES = [("pp2-1f1b-m4", 2), ("gropipe-2x2-1f1b-m4-d1", 4), ("async-1x2-m4-if1", 2)]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The module's straight runs, one sweep per process count; the ranks import ``eval_models`` from here."""
    here = str(Path(__file__).parent)
    patch = pytest.MonkeyPatch()
    patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    patch.syspath_prepend(here)
    quiet = {"events": {"tensorboard": False}}
    runs = {plan: (nproc, digits(plan=plan, training={"steps": 5}, evaluation={"every": 3}, **quiet))
            for plan, nproc in PIPELINES}
    runs["in-flight"] = (2, digits(plan="async-1x2-m4", training={"steps": 5}, evaluation={"every": 2}, **quiet))
    runs["batchnorm"] = (2, digits(model="eval_models:conv_bn", plan="pp2-1f1b-m4", training={"steps": 4},
                                   evaluation={"every": 4}, **quiet))
    yield Sweep(tmp_path_factory.mktemp("evaluation"), runs)
    patch.undo()


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("plan,nproc", PIPELINES)
def test_pipelines_evaluate_what_the_reference_evaluates(sweep, plan, nproc):
    config, run_dir = sweep.run(plan), sweep.dir(plan)
    assert config.world_size == nproc
    got = evals(run_dir)
    assert [e["step"] for e in got] == [3, 5]
    for event in got:
        assert_same_evaluation(event, reference_eval(config, event["step"]))
    assert not (run_dir / "tensorboard").exists()


@pytest.mark.multiproc
@pytest.mark.slow
def test_resumed_run_evaluates_the_resumed_weights_and_keeps_its_clock(tmp_path):
    fields = digits(plan="pp2-1f1b-m4", training={"steps": 6, "checkpoint_every": 2}, evaluation={"every": 2})
    make_config(tmp_path, **fields, faults={"step": 3, "rank": 1})
    assert torchrun(tmp_path, 2).returncode != 0
    before = evals(tmp_path)
    assert [e["step"] for e in before] == [2]
    config = make_config(tmp_path, **merge_changes(fields, {"training": {"resume": True}}))
    proc = torchrun(tmp_path, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = evals(tmp_path)
    assert [e["step"] for e in got] == [2, 4, 6]
    for event in got:
        assert_same_evaluation(event, reference_eval(config, event["step"]))
    steps = {}
    for e in read_events(tmp_path, 0):
        if e["kind"] == "step":
            steps[e["step"]] = e["step_ms"]  # the resumed attempt's step 3 and 4 replace the failed one's
    assert got[-1]["train_s"] == pytest.approx(sum(steps.values()) / 1e3, rel=1e-6)
    assert got[-1]["wall_s"] > got[1]["wall_s"] > before[0]["wall_s"]


@pytest.mark.multiproc
@pytest.mark.slow
def test_async_pipeline_with_micro_batches_in_flight_evaluates_its_final_weights(sweep):
    # several micro-batches cross each step boundary: the evaluation's gather must not meet the stream's traffic
    config, run_dir = sweep.run("in-flight"), sweep.dir("in-flight")
    got = evals(run_dir)
    assert [e["step"] for e in got] == [2, 4, 5]
    model = run_model(config)
    final = {}
    for rank in range(2):
        final.update(torch.load(run_dir / "params" / f"rank{rank}.pt", weights_only=True))
    load_dense_state(model, {**final, **dict(model.named_buffers())})
    assert_same_evaluation(got[-1], evaluate_model(model, validation_batches(config, model)))


@pytest.mark.multiproc
@pytest.mark.slow
def test_batchnorm_running_statistics_reach_the_evaluation(sweep):
    config, run_dir = sweep.run("batchnorm"), sweep.dir("batchnorm")
    reference = reference_train(config)
    assert any(name.endswith("running_mean") for name in reference.buffers)
    got = evals(run_dir)
    assert_same_evaluation(got[-1], reference_eval(config, 4))
    stale = run_model(config)  # the trained weights with the initial statistics evaluate differently
    load_dense_state(stale, {**reference.params, **dict(stale.named_buffers())})
    assert evaluate_model(stale, validation_batches(config, stale))["val_loss"] != \
        pytest.approx(got[-1]["val_loss"], rel=1e-3)
