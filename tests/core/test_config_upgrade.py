"""Run configs of the earlier flat format keep loading: each flat key moves into its table; the grouped form is
what is written back. ``RunConfig`` attributes of the flat format say where they moved."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from workbench.core.config import FLAT_KEYS, RunConfig
from workbench.core.config_upgrade import upgrade

ROOT = Path(__file__).resolve().parents[2]
FLAT_FILE = ROOT / "tests" / "fixtures" / "flat_own_squeezenet.toml"

# every flat key with a value that differs from its default: (zoo model keys, factory model keys)
ZOO_FLAT = {"model_overrides": {"n_layer": 2}, "global_batch": 8, "steps": 3, "seed": 4,
            "optimizer": {"name": "adam", "lr": 0.5}, "grad_accum": 2, "precision": "fp32", "checkpoint_every": 2,
            "resume": True, "eval_every": 2, "eval_batches": 3, "target_accuracy": 0.5, "target_perplexity": 0.0,
            "tensorboard": False, "fail_at_step": 1, "fail_rank": 1, "run_dir": "runs/x", "device": "cpu",
            "placement": [1, 0], "collective_timeout_s": 30.0, "dump_params": True}
FACTORY_FLAT = {"model_args": {"num_classes": 10}, "split_points": ["features.3"]}


def test_every_flat_key_has_a_place_and_is_tested():
    assert set(ZOO_FLAT) | set(FACTORY_FLAT) == set(FLAT_KEYS)
    tables = {"model", "training", "evaluation", "events", "faults", "run"}
    assert {table for table, _ in FLAT_KEYS.values()} == tables


def test_a_flat_config_loads_as_its_grouped_form():
    flat = {"model": "gpt2-tiny", "plan": "dp2", "name": "old", **ZOO_FLAT}
    grouped = {"name": "old", "model": {"name": "gpt2-tiny", "overrides": {"n_layer": 2}}, "plan": "dp2",
               "training": {"global_batch": 8, "steps": 3, "seed": 4, "optimizer": {"name": "adam", "lr": 0.5},
                            "grad_accum": 2, "precision": "fp32", "checkpoint_every": 2, "resume": True},
               "evaluation": {"every": 2, "batches": 3, "target_accuracy": 0.5},
               "events": {"tensorboard": False}, "faults": {"step": 1, "rank": 1},
               "run": {"dir": "runs/x", "device": "cpu", "placement": [1, 0], "collective_timeout_s": 30.0,
                       "dump_params": True}}
    config = RunConfig.from_dict(flat)
    assert config == RunConfig.from_dict(grouped)
    assert (config.training.steps, config.evaluation.every, config.faults.rank) == (3, 2, 1)
    assert config.run.placement == (1, 0)
    written = config.to_dict()
    assert not set(written) & set(FLAT_KEYS), "a config is written grouped"
    assert RunConfig.from_dict(written) == config
    assert RunConfig.from_dict({"model": {"name": "userpkg:chain"}, "plan": "dp2", **FACTORY_FLAT}).model.args == \
        {"num_classes": 10}


def test_the_old_own_squeezenet_file_loads_as_the_shipped_one():
    old = RunConfig.from_toml(FLAT_FILE)
    assert old == RunConfig.from_toml(ROOT / "launch" / "own_squeezenet.toml")
    assert old.model.split_points == ("features.3", "features.6", "features.9", "features.12")
    assert (old.training.steps, old.evaluation.every, old.evaluation.target_accuracy) == (150, 25, 0.4)
    text = old.to_toml()
    assert "[training]" in text and "[evaluation]" in text and "\neval_every" not in text
    assert RunConfig.from_dict(tomllib.loads(text)) == old


@pytest.mark.parametrize(("data", "message"), [
    ({"steps": 3, "training": {"steps": 4}}, "'steps' is the earlier flat form of 'training.steps', which is also "
                                            "given; keep 'training.steps'"),
    ({"eval_every": 2, "evaluation": 5}, "'evaluation' = 5 is invalid: expected a table"),
    ({"stages": 2}, "'stages' has moved into the parallel plan"),
])
def test_a_flat_key_beside_its_new_place_is_refused_naming_both(data, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.from_dict({"model": "mlp", "plan": "dp2", **data})


def test_upgrade_moves_keys_without_touching_what_it_is_given():
    data = {"model": "mlp", "model_overrides": {"width": 4}, "training": {"seed": 1}, "steps": 2}
    assert upgrade(data) == {"model": {"name": "mlp", "overrides": {"width": 4}}, "training": {"seed": 1, "steps": 2}}
    assert data["training"] == {"seed": 1} and "steps" in data
    grouped = {"model": "mlp", "training": {"steps": 2}}
    assert upgrade(grouped) is grouped


def test_flat_attributes_say_where_they_moved():
    config = RunConfig.from_dict({"model": "mlp", "plan": "dp2"})
    for name, where in (("steps", "config.training.steps"), ("eval_every", "config.evaluation.every"),
                        ("run_dir", "config.run.dir"), ("model_overrides", "config.model.overrides"),
                        ("model_from_factory", "config.model.from_factory")):
        with pytest.raises(AttributeError, match=rf"RunConfig.{name} has moved into its table: use {where}"):
            getattr(config, name)
    with pytest.raises(AttributeError, match="has no attribute 'nonsense'"):
        config.nonsense  # noqa: B018


def test_replace_changes_the_entries_a_table_names():
    config = RunConfig.from_toml(ROOT / "launch" / "gropipe_vgg.toml")
    changed = config.replace(training={"steps": 3, "optimizer": {"lr": 0.5}}, run={"dir": "x"})
    assert (changed.training.steps, changed.training.global_batch, changed.training.checkpoint_every) == (3, 64, 10)
    assert (changed.training.optimizer.lr, changed.training.optimizer.momentum) == (0.5, 0.9)
    assert changed.run.dir == "x" and changed.plan == config.plan
    assert config.replace(plan="dp4").plan.name == "dp4"  # the plan and the data are replaced whole
    assert config.replace(data={"kind": "synthetic"}).data.kind == "synthetic"
    assert config.replace(steps=5).training.steps == 5  # a flat key of the earlier format moves into its table
