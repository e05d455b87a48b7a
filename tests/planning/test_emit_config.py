"""``workbench plan --pp`` restricts the pipeline degree; ``--emit-config`` writes a compact run config that records
the command and the per-layer options, keeps an existing config's run settings, and reads back as the plan."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.core.config import RunConfig
from workbench.planning import Budget, SearchOptions, Workload, plan

from test_hybrid import mixed_model

ROOT = Path(__file__).resolve().parents[2]


def test_pipeline_degrees_restrict_templates_and_the_per_layer_search():
    costs = mixed_model()
    result = plan(Workload(costs, 64), "8xA100-NVLink", Budget(memory_cap_gib=3),
                  SearchOptions(fine_grained=True, pipeline_degrees=[2]))
    assert result.plans and all(p.plan.pp == 2 for p in result.plans)
    assert any(p.estimate.method == "per-layer DP" for p in result.plans)
    assert all(p.plan.pp == 2 for p in result.per_layer.plans)
    unrestricted = plan(Workload(costs, 64), "8xA100-NVLink", Budget(memory_cap_gib=3),
                        SearchOptions(fine_grained=True))
    assert {p.plan.pp for p in unrestricted.plans} != {2}, "the restriction is what made every plan pp=2"
    with pytest.raises(ValueError, match="pipeline_degrees must be ints"):
        plan(Workload(costs, 64), "8xA100-NVLink", options=SearchOptions(pipeline_degrees=[0]))


def test_cli_pp_is_checked(tmp_path, capsys):
    path = mixed_model().save(tmp_path / "costs.json")
    assert main(["plan", str(path), "--cluster", "local", "--batch", "16", "--pp", "two"]) == 2
    assert "--pp takes comma-separated pipeline degrees" in capsys.readouterr().err


def test_emit_config_is_compact_records_the_command_and_reads_back(tmp_path, capsys):
    out = tmp_path / "run.toml"
    args = ["plan", "gpt2-tiny", "--model-arg", "n_layer=2", "--cluster", "local", "--world-size", "4",
            "--exact-world-size", "--pp", "2", "--batch", "16", "--fine-grained", "--emit-config", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    best = re.search(r"wrote the run config of (\S+) to", printed).group(1)
    text = out.read_text()
    assert text.splitlines()[0] == "# Written by: workbench " + " ".join(args)
    config = RunConfig.from_dict(tomllib.loads(text))
    assert config.model.name == "gpt2-tiny" and config.model.overrides == {"n_layer": 2}, "the model the plan is for"
    assert config.plan.pp == 2 and config.plan.world_size == 4 and config.training.global_batch == 16
    assert config.plan.replace(partition="uniform").name == \
        RunConfig.from_dict({"model": "x", "plan": best.split("@")[0]}).plan.replace(partition="uniform").name
    body = tomllib.loads(text)
    assert "events" not in body and "evaluation" not in body and "run" not in body, "defaults are left out"
    assert set(body["training"]) <= {"global_batch", "steps", "optimizer"}
    # the header names every layer with its options
    layers = [line[4:] for line in text.splitlines() if line.startswith("#   ")]
    assert [l.split(":")[0] for l in layers] == ["embeddings", "block_0", "block_1", "head"]

    # over an existing config of the same model: its run settings stay, its plan is replaced
    kept = config.replace(name="mine", training={"steps": 7, "optimizer": {"name": "sgd", "lr": 0.5}}).to_dict()
    kept["plan"] = "dp4"
    out.write_text(RunConfig.from_dict(kept).to_toml())
    assert main(args) == 0
    again = RunConfig.from_toml(out)
    assert (again.training.steps, again.name, again.training.optimizer.name, again.training.optimizer.lr) == \
        (7, "mine", "sgd", 0.5)
    assert again.plan == config.plan
    assert "kept from the config this file held" in out.read_text()


def test_the_shipped_finegrained_config_is_a_planned_mix():
    """launch/finegrained_gpt2.toml was written by `workbench plan ... --emit-config`: its header's layer lines are
    its plan's, and the plan is the mix it is shipped to show (2 stages of 2 ranks; replicated and sharded layers;
    recompute on some blocks only)."""
    path = ROOT / "launch" / "finegrained_gpt2.toml"
    text = path.read_text()
    command = text.splitlines()[0]
    assert command.startswith("# Written by: workbench plan gpt2-tiny ") and "--fine-grained" in command
    assert f"--emit-config launch/{path.name}" in command and "--memory-cap" in command
    config = RunConfig.from_toml(path)
    plan_ = config.plan
    assert (plan_.pp, plan_.world_size) == (2, 4)
    layers = plan_.layers_for(6)
    names = ["embeddings", "block_0", "block_1", "block_2", "block_3", "head"]
    described = [line[4:] for line in text.splitlines() if line.startswith("#   ")]
    assert described == [f"{n}: {l.dp}" + (", recompute" if l.recompute else "") for n, l in zip(names, layers)]
    kinds = {l.dp for l in layers}
    assert "replicate" in kinds or "zero2" in kinds
    assert "fsdp" in kinds
    blocks = [l.recompute for l in layers[1:5]]
    assert any(blocks) and not all(blocks)


@pytest.mark.parametrize("path", sorted((ROOT / "launch").glob("*.toml")), ids=lambda p: p.stem)
def test_compact_toml_reads_back_as_the_same_config(path):
    config = RunConfig.from_toml(path)
    compact = config.to_toml(defaults=False)
    assert RunConfig.from_dict(tomllib.loads(compact)) == config
    assert len(compact) < len(config.to_toml())
