"""The zoo's layer chains compute exactly what the original models compute."""

import pytest
import torch
import torchvision
from torch import nn

from workbench.models import LayerSequence, build_model, describe_models, list_models, sample_batch
from workbench.models.zoo import build_reference, get_entry

# Small inputs keep the big models cheap: the layer structure does not depend on the image size.
SMALL = {
    "resnet18": {"image_size": 64}, "resnet50": {"image_size": 64}, "resnet101": {"image_size": 32},
    "vgg11": {"image_size": 32}, "vgg16": {"image_size": 32}, "vgg19": {"image_size": 32},
    "bert-base": {"seq_len": 16}, "gpt2-small": {"seq_len": 16},
}
CONTRACT_NAMES = ["resnet18", "resnet50", "resnet101", "vgg11", "vgg16", "vgg19", "bert-base", "bert-tiny",
                  "gpt2-small", "gpt2-tiny", "mlp", "toy-transformer", "vgg-tiny"]


def _logits(output):
    return output.logits if hasattr(output, "logits") else output


BIG = {"resnet101", "vgg11", "vgg16", "vgg19", "bert-base", "gpt2-small"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in CONTRACT_NAMES])
def test_sequence_output_identical_to_original_model(name):
    reference, config = build_reference(name, seed=0, **SMALL.get(name, {}))
    seq = get_entry(name).to_sequence(reference, name, config)
    reference.eval()
    inputs, targets = sample_batch(seq, 1 if name in SMALL else 2)
    with torch.no_grad():
        expected = _logits(reference(inputs))
        got = seq(inputs)
    assert torch.equal(got, expected)
    # The chain owns the original parameters (no copies), each in exactly one layer.
    assert {id(p) for p in seq.parameters()} == {id(p) for p in reference.parameters()}
    per_layer = sum(sum(p.numel() for p in layer.parameters()) for layer in seq)
    assert per_layer == seq.num_parameters()
    assert seq.loss_fn(got, targets).dim() == 0


def test_registry_lists_contract_names_with_parameter_counts():
    assert set(CONTRACT_NAMES) <= set(list_models())
    counts = {row["name"]: row["num_params"] for row in describe_models()}
    assert counts["resnet50"] == 25_557_032  # torchvision's published count
    assert counts["vgg16"] == 138_357_544
    assert counts["gpt2-tiny"] < 300_000 and counts["bert-tiny"] < 300_000


def test_tied_embeddings_give_published_transformer_sizes():
    with torch.device("meta"):
        bert = build_model("bert-base", tie_word_embeddings=True)
        gpt2 = build_model("gpt2-small", tie_word_embeddings=True)
    assert abs(bert.num_parameters() - 110e6) / 110e6 < 0.01
    assert abs(gpt2.num_parameters() - 124.4e6) / 124.4e6 < 0.01


def test_unknown_model_lists_available_ones():
    with pytest.raises(ValueError, match="unknown model 'resnet7'.*resnet18.*gpt2-tiny"):
        build_model("resnet7")


def test_unknown_config_key_names_valid_keys():
    with pytest.raises(ValueError, match=r"unknown config keys \['hidden'\].*n_embd"):
        build_model("gpt2-tiny", hidden=3)


def test_same_seed_same_weights_other_seed_differs():
    a, b, c = build_model("mlp", seed=1), build_model("mlp", seed=1), build_model("mlp", seed=2)
    for pa, pb, pc in zip(a.parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_wrong_shape_names_rejecting_layer_and_expected_shape():
    seq = build_model("vgg-tiny")
    with pytest.raises(ValueError, match=r"layer 0 'conv1'.*shape \(2, 1, 32, 32\).*expected \[batch, 3, 32, 32\]"):
        seq(torch.randn(2, 1, 32, 32))
    with pytest.raises(ValueError, match=r"layer 2 'fc1'.*expected \[batch, 2048\]"):
        seq(torch.randn(2, 3, 16, 16))


def test_wrong_dtype_for_language_model_is_reported():
    seq = build_model("gpt2-tiny")
    with pytest.raises(ValueError, match=r"layer 0 'embeddings'.*expected \[batch, 64\] \(torch.int64\)"):
        seq(torch.randn(2, 64))


def test_stages_share_modules_and_compose_to_the_whole():
    seq = build_model("resnet18", image_size=32).eval()
    first, second = seq.stage(0, 4), seq.stage(5, len(seq) - 1)
    assert isinstance(first, nn.Sequential) and first[0] is seq[0]
    x, _ = sample_batch(seq, 2)
    with torch.no_grad():
        assert torch.equal(second(first(x)), seq(x))
    with pytest.raises(ValueError, match="last must be a layer index"):
        seq.stage(0, len(seq))


def test_gpt2_blocks_are_causal():
    seq = build_model("gpt2-tiny").eval()
    tokens, _ = sample_batch(seq, 1)
    changed = tokens.clone()
    changed[0, 40:] = (changed[0, 40:] + 1) % 256
    with torch.no_grad():
        a, b = seq(tokens), seq(changed)
    assert torch.equal(a[:, :40], b[:, :40])
    assert not torch.allclose(a[:, 40:], b[:, 40:])


def test_from_sequential_and_chain_shaped_module():
    user = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    seq = LayerSequence.from_sequential(user, loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), name="user")
    assert seq.layer_names == ["layer0", "layer1", "layer2"] and seq[0] is user[0] and len(seq) == 3
    logits, target = torch.randn(2, 3), torch.tensor([0, 2])
    expected = nn.functional.cross_entropy(logits, target, label_smoothing=0.1)
    assert torch.equal(seq.loss_fn(logits, target), expected)
    resnet = torchvision.models.resnet18(weights=None, num_classes=10).eval()
    traced = LayerSequence.from_module(resnet).eval()
    assert traced.layer_names[:4] == ["conv1", "bn1", "relu", "maxpool"] and traced.layer_names[-1] == "fc"
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(traced(x), resnet(x))


class SkipOverChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        return self.c(self.b(h)) + h


def test_model_with_branch_across_cut_is_refused_with_explanation():
    with pytest.raises(ValueError, match=r"branch crosses the cut after unit 'b'.*2 values.*'a'"):
        LayerSequence.from_module(SkipOverChild())


def test_layer_returning_tuple_is_refused():
    seq = LayerSequence.from_sequential(nn.Sequential(nn.LSTM(4, 4, batch_first=True), nn.Linear(4, 2)))
    with pytest.raises(ValueError, match="layer 0 'layer0' returned tuple"):
        seq(torch.randn(1, 3, 4))
