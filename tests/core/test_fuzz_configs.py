"""Plans and run configs, generated (Hypothesis): names round-trip, valid configs load, invalid ones are refused.

* Every generated plan survives name -> plan, ``[plan]`` dict -> plan and
  TOML text -> plan unchanged.
* Every config built by the rules the docs state (a batch that splits into
  the replicas' micro-batches, positive counts, a known model, optimizer and
  data kind) is accepted.
* Every config with one field made invalid is refused by ``workbench run``
  with exit status 2 and one line that names the field, before anything is
  launched, never with a traceback.
"""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from workbench.cli import main
from workbench.cli import run_commands
from workbench.core.config import RunConfig
from workbench.core.plan import ParallelPlan
from workbench.core.toml_text import to_toml

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.filter_too_much])

small = st.integers(min_value=1, max_value=4)


@st.composite
def pipelines(draw) -> tuple[dict, int]:
    """A [plan.pipeline] table and the replicas it runs (GroPipe's groups, asynchronous pipelines)."""
    kind = draw(st.sampled_from(["gpipe", "1f1b", "interleaved", "zbh1", "zbh2", "zbv", "dualpipev", "zb-auto",
                                 "gropipe", "async", "torch"]))
    table: dict = {"kind": kind}
    replicas = 1
    if kind == "interleaved":
        table["chunks"] = draw(st.integers(2, 3))
    elif kind == "zb-auto":
        table["memory_limit_mb"] = draw(st.sampled_from([0.0, 1.0, 64.0]))
    elif kind == "gropipe":
        table.update(inner=draw(st.sampled_from(["1f1b", "gpipe", "zbh1"])), delay=draw(st.integers(0, 1)))
        replicas = draw(small)
    elif kind == "async":
        mode = draw(st.sampled_from(["stash", "2bw"]))
        table.update(mode=mode, inflight=draw(st.sampled_from(["auto", 1, 2, 4])),
                     adapt_every=draw(st.sampled_from([0, 4])))
        if mode == "stash":
            table.update(vertical_sync=draw(st.booleans()), stash=draw(st.booleans()))
        replicas = draw(small)
    elif kind == "torch":
        table["schedule"] = draw(st.sampled_from(["gpipe", "1f1b", "interleaved-zb", "zbv", "dualpipev"]))
    return table, replicas


@st.composite
def plans(draw) -> ParallelPlan:
    """A plan of any family: data parallel, a pipeline kind, tensor parallel 1D / 2D, or per-layer options."""
    family = draw(st.sampled_from(["dp", "pipeline", "tp1d", "tp2d", "layers"]))
    microbatches = draw(st.sampled_from([1, 2, 4, 8]))
    if family == "dp":
        table = {"mesh": {"dp": draw(small)}, "microbatches": microbatches}
        if draw(st.booleans()):
            table["layers"] = [{"layers": "all", "recompute": True}]
    elif family == "pipeline":
        pipeline, replicas = draw(pipelines())
        stages = draw(st.integers(2, 4))
        table = {"mesh": {"dp": replicas, "pp": stages}, "pipeline": pipeline, "microbatches": microbatches}
    elif family == "tp1d":
        table = {"mesh": {"dp": draw(small), "tp": draw(st.integers(2, 4))}}
    elif family == "tp2d":
        q = draw(st.integers(2, 3))
        table = {"mesh": {"dp": draw(small), "tp_row": q, "tp_col": q}}
    else:
        tp = draw(st.sampled_from([1, 2]))
        dp_kinds = st.sampled_from(["replicate", "zero2", "fsdp"])
        layers = [{"layers": "0", "dp": draw(dp_kinds)},
                  {"layers": "1-2", "dp": draw(dp_kinds), "recompute": draw(st.booleans()),
                   **({"tp": "1d", "tp_degree": 2} if tp == 2 and draw(st.booleans()) else
                      {"tp": "none", "tp_degree": 1})}]
        table = {"mesh": {"dp": draw(st.integers(1, 2)), "tp": tp} if tp > 1 else {"dp": draw(st.integers(2, 4))},
                 "microbatches": microbatches, "layers": layers}
    try:
        return ParallelPlan.from_dict(table)
    except ValueError:
        assume(False)  # a combination the plan refuses (its refusals have their own tests)
        raise


@SETTINGS
@given(plans())
def test_every_plan_round_trips_through_its_name_its_table_and_toml(plan):
    assert ParallelPlan.parse(plan.name) == plan, plan.name
    assert ParallelPlan.from_dict(plan.to_dict()) == plan, plan.to_dict()
    text = to_toml({"plan": plan.to_dict()})
    assert ParallelPlan.from_dict(tomllib.loads(text)["plan"]) == plan, text
    assert ParallelPlan.parse(ParallelPlan.parse(plan.name).name).name == plan.name


MODELS = {"mlp": "digits", "vgg-tiny": "digits", "gpt2-tiny": "bytes-lm", "bert-tiny": "synthetic"}


@st.composite
def valid_configs(draw) -> dict:
    """A run config by the documented rules: the global batch splits into replicas x micro-batches x rounds."""
    plan = draw(plans())
    assume(plan.tp_kind == "none" or not plan.is_uniform)  # uniform TP trains GPT-2 only; below: any model
    model = draw(st.sampled_from(sorted(MODELS)))
    # a micro-batch splits over every layer's data-parallel ranks: dp, times tp for a layer that does not split
    # its tensors on a tensor-parallel mesh
    replicas = plan.dp * (plan.tp if not plan.is_uniform else 1)
    global_batch = replicas * plan.microbatches * draw(st.integers(1, 3))
    return {"model": model, "plan": plan.name, "data": {"kind": MODELS[model]},
            "training": {"global_batch": global_batch, "steps": draw(st.integers(1, 500)),
                         "seed": draw(st.integers(0, 2**31 - 1)),
                         "optimizer": {"name": draw(st.sampled_from(["sgd", "adam"])),
                                       "lr": draw(st.floats(1e-5, 1.0, allow_nan=False))},
                         "checkpoint_every": draw(st.sampled_from([0, 5]))},
            "events": {"tensorboard": draw(st.booleans())}}


@SETTINGS
@given(valid_configs())
def test_every_config_built_by_the_rules_is_accepted(fields):
    try:
        config = RunConfig.from_dict(fields)
    except ValueError as exc:
        # the documented limits of the runtimes: named refusals that depend on the plan, not on a bad field value
        assert any(words in str(exc) for words in ("per-layer options", "trains one batch per step",
                                                   "does not recompute", "grad_accum", "evaluat")), (fields, exc)
        assume(False)
    assert config.plan.name == fields["plan"] and config.training.global_batch == fields["training"]["global_batch"]
    assert RunConfig.from_dict(config.to_dict()) == config


# one field made invalid: (dotted field, value, words the refusal must contain)
INVALID = [
    ("training.steps", 0, "training.steps"), ("training.steps", -3, "training.steps"),
    ("training.steps", "ten", "training.steps"), ("training.steps", 1.5, "training.steps"),
    ("training.steps", True, "training.steps"), ("training.global_batch", 0, "training.global_batch"),
    ("training.global_batch", 7, "training.global_batch"), ("training.seed", "x", "training.seed"),
    ("training.seed", -1, "training.seed"), ("training.checkpoint_every", -2, "training.checkpoint_every"),
    ("evaluation.every", -1, "evaluation.every"), ("training.precision", "fp8", "training.precision"),
    ("events.tensorboard", "yes", "events.tensorboard"),
    ("plan", "pp0-1f1b-m4", "plan"), ("plan", "nonsense-plan", "plan"), ("plan", "pp2-1f1b-m0", "microbatches"),
    ("training.optimizer.lr", -0.1, "lr"), ("training.optimizer.lr", "fast", "lr"),
    ("training.optimizer.name", "lion", "training.optimizer.name"),
    ("model.name", "no-such-model", "model"), ("data.kind", "imagenet-online", "data.kind"), ("stepz", 3, "stepz"),
    ("training.optimizer.momentun", 0.9, "momentun"), ("model.overrides.widht", 3, "widht"),
    ("training.grad_accum", 0, "training.grad_accum"), ("training.stepz", 3, "training.stepz"),
    ("run.device", "tpu", "run.device"), ("faults.step", "x", "faults.step"),
]


def _set(fields: dict, dotted: str, value) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in fields.items()}
    *parents, last = dotted.split(".")
    target = out
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    return out


@settings(SETTINGS, suppress_health_check=[HealthCheck.function_scoped_fixture])  # capsys: read before each example
@given(st.sampled_from(INVALID), st.sampled_from(["pp2-1f1b-m4", "dp2-m2", "gropipe-2x2-1f1b-m2-d1",
                                                  "async-1x2-m4", "pp2-zbh1-m4"]),
       st.integers(1, 3))
def test_one_invalid_field_is_refused_by_workbench_run_with_one_line_naming_it(tmp_path_factory, monkeypatch_module,
                                                                                capsys, invalid, plan, rounds):
    dotted, value, words = invalid
    base = {"model": {"name": "mlp"}, "plan": plan, "training": {"global_batch": 8 * rounds, "steps": 5},
            "data": {"kind": "digits"}}
    RunConfig.from_dict(base)  # the base is valid: the refusal below is the mutated field's
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "run.toml"
    path.write_text(to_toml(_set(base, dotted, value)))
    capsys.readouterr()
    assert main(["run", str(path), "--run-root", str(folder / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert words in err[0] and "Traceback" not in err[0], (dotted, value, err[0])
    assert not (folder / "runs").exists()


@pytest.fixture(scope="module")
def monkeypatch_module():
    """Nothing reaches torchrun here: a launch would fail the test instead of training."""
    patch = pytest.MonkeyPatch()

    def refuse(*args, **kwargs):
        raise AssertionError("an invalid config reached the launch")

    patch.setattr(run_commands, "launch_foreground", refuse)
    yield patch
    patch.undo()
