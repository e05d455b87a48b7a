"""`workbench models` and `workbench profile` from the command line."""

import json

import pytest

from workbench.cli import main
from workbench.core.costs import ModelCosts


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path / "cache"))


def test_profile_writes_costs_json(tmp_path, capsys):
    out = tmp_path / "costs.json"
    assert main(["profile", "mlp", "--batch", "4", "--repeats", "1", "--out", str(out)]) == 0
    costs = ModelCosts.load(out)
    assert costs.model == "mlp" and costs.batch_size == 4 and costs.names == ["fc1", "fc2", "fc3", "out"]
    printed = capsys.readouterr().out
    assert "fc1" in printed and "total" in printed and str(out) in printed


def test_profile_json_projected(capsys):
    assert main(["profile", "vgg-tiny", "--batch", "2", "--repeats", "1", "--project", "H100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device"] == "H100" and data["meta"]["projection"]["dtype"] == "float32"


def test_unknown_model_exits_2_listing_models(capsys):
    assert main(["profile", "resnet-50"]) == 2
    assert "available models: resnet18" in capsys.readouterr().err


def test_models_lists_zoo(capsys):
    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row["num_params"] for row in json.loads(capsys.readouterr().out)["models"]}
    assert rows["resnet18"] == 11_689_512 and "gpt2-tiny" in rows


def test_profile_with_micro_batch_passes_prints_and_writes_them(tmp_path, capsys):
    out = tmp_path / "costs.json"
    assert main(["profile", "mlp", "--batch", "4", "--repeats", "1", "--microbatch-passes", "--out", str(out)]) == 0
    factors = ModelCosts.load(out).meta["microbatch_factors"]
    assert factors["sizes"] == [1, 2, 4]
    printed = capsys.readouterr().out
    assert "micro-batch passes against the profile's share: 1: " in printed and "(hot / cache flushed" in printed
    assert f"{factors['cold'][0]:.2f}" in printed
