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
    assert all(layer["input_grad_ms"] >= 0 and layer["weight_grad_ms"] > 0 for layer in data["layers"])  # kept


def test_profile_prints_and_writes_the_split_backward(tmp_path, capsys):
    out = tmp_path / "costs.json"
    assert main(["profile", "mlp", "--batch", "4", "--repeats", "1", "--out", str(out)]) == 0
    costs = ModelCosts.load(out)
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("layer"))
    assert header.split()[:9] == ["layer", "fwd", "ms", "bwd", "ms", "I", "ms", "W", "ms"]
    rows = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in costs.names + ["total"]}
    for layer in costs.layers:
        assert rows[layer.name][1:5] == [f"{layer.forward_ms:.2f}", f"{layer.backward_ms:.2f}",
                                         f"{layer.input_grad_ms:.2f}", f"{layer.weight_grad_ms:.2f}"]
    assert rows["total"][3:5] == [f"{costs.total('input_grad_ms'):.2f}", f"{costs.total('weight_grad_ms'):.2f}"]
    assert main(["profile", "mlp", "--batch", "4", "--repeats", "1", "--json"]) == 0  # the cached profile
    layers = json.loads(capsys.readouterr().out)["layers"]
    assert [(l["input_grad_ms"], l["weight_grad_ms"]) for l in layers] == [l.split_backward_ms for l in costs.layers]


def test_costs_table_marks_layers_without_a_measured_split():
    from workbench.cli.profile_commands import _costs_table

    table = _costs_table(ModelCosts.uniform(2, param_bytes=8)).splitlines()
    assert table[2].split()[3:5] == ["-", "-"] and table[-1].split()[3:5] == ["-", "-"]


def test_unknown_model_exits_2_listing_models(capsys):
    assert main(["profile", "resnet-50"]) == 2
    assert "available models: resnet18" in capsys.readouterr().err


def test_models_lists_zoo(capsys):
    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row["num_params"] for row in json.loads(capsys.readouterr().out)["models"]}
    assert rows["resnet18"] == 11_689_512 and "gpt2-tiny" in rows


@pytest.mark.slow
def test_profile_with_micro_batch_passes_prints_and_writes_them(tmp_path, capsys, monkeypatch):
    # a 4 MiB "cache" to flush: this machine reports the host's whole last-level cache (hundreds of MiB), and
    # writing 1.5 times that before every pass is nearly all of the passes' time; what is checked needs no size
    monkeypatch.setattr("workbench.profiling.microbatch._cache_bytes", lambda: 4 << 20)
    out = tmp_path / "costs.json"
    assert main(["profile", "mlp", "--batch", "4", "--repeats", "1", "--microbatch-passes", "--out", str(out)]) == 0
    factors = ModelCosts.load(out).meta["microbatch_factors"]
    assert factors["sizes"] == [1, 2, 4]
    printed = capsys.readouterr().out
    assert "micro-batch passes against the profile's share: 1: " in printed and "(hot / cache flushed" in printed
    assert f"{factors['cold'][0]:.2f}" in printed


def test_profile_takes_model_args_as_plan_does(capsys):
    """The variant a user plans (`plan ... --model-arg image_size=64`) is the variant they can profile."""
    sizes = {}
    for size in (32, 64):
        assert main(["profile", "vgg-tiny", "--batch", "2", "--repeats", "1", "--json",
                     "--model-arg", f"image_size={size}"]) == 0
        sizes[size] = json.loads(capsys.readouterr().out)["layers"][0]["activation_bytes"]
    assert sizes[64] == 4 * sizes[32]  # a conv's output grows with the image's area
    assert main(["profile", "vgg-tiny", "--model-arg", "image_size"]) == 2
    assert "--model-arg takes KEY=VALUE" in capsys.readouterr().err
    assert main(["profile", "no-such-model", "--model-arg", "image_size=64"]) == 2
    assert "--model-arg applies to a zoo model" in capsys.readouterr().err


def test_profile_says_which_layers_share_a_timing_and_every_layer_times_them_all(capsys):
    args = ["profile", "gpt2-tiny", "--model-arg", "n_layer=4", "--batch", "2", "--repeats", "1"]
    assert main(args) == 0
    assert "4 identical layers share one timing (block_0 .. block_3), taken on block_0, block_1, block_2" in \
        capsys.readouterr().out
    assert main(args + ["--every-layer", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["meta"]["identical_layers"] == [] and data["meta"]["share_identical"] is False


def test_profile_times_the_linear_layers_fused_when_asked(capsys):
    assert main(["profile", "mlp", "--batch", "4", "--repeats", "1", "--fused-weight-grads"]) == 0
    assert "linear layers timed fused" in capsys.readouterr().out
    assert main(["profile", "mlp", "--batch", "4", "--repeats", "1", "--fused-weight-grads", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["meta"]["fused_weight_grads"] is True and data["meta"]["cache"] == "hit"
