"""User models with in-place first ops run under every pipeline, and their stage inputs stay exact.

The models (``tests/fixtures/user_models.py``) are torchvision models that are
not in the zoo, flattened so ``ReLU(inplace=True)`` is a layer of its own, and
a non-chain module traced by fx whose residual blocks modify their input in
place. Partitions put such a layer first on a stage, where the stage input
used to be a leaf requiring grad and autograd refused the in-place op.

Unit tests: a :class:`Stage` pair's gradients equal the dense model's (with and
without recompute, fp32 and bf16 autocast), a recomputed layer of the
layer-by-layer runtime, and profiling a flattened model. Multi-process tests
(torchrun, gloo): 1F1B, GroPipe and the asynchronous pipeline equal the
single-process reference (for the asynchronous pipeline, the weight-stashing
rule applied by hand).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fixtures import user_models
from fixtures.user_models import MODULE, PreActBlock
from runtime_launch import Sweep, dumped_params, stashing_reference, step_losses
from workbench.core.partition import Partition
from workbench.models.boundary import stage_input
from workbench.models.sequence import InputSpec, LayerSequence
from workbench.runtime.reference import reference_train
from workbench.runtime.stage import Stage

CPU = torch.device("cpu")
IMAGE = InputSpec((3, 32, 32), torch.float32)


class AddShift(nn.Module):
    """``x += shift`` on its input: an in-place first op with a parameter."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.shift = nn.Parameter(torch.linspace(-1, 1, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x += self.shift
        return x


def _first_ops():
    return {"relu-inplace": lambda: nn.ReLU(inplace=True), "add-shift": lambda: AddShift(64)}


def _two_stage_grads(dense: nn.Sequential, cut: int, x, y, *, recompute: bool, autocast=None, microbatches=2):
    """Parameter gradients of ``dense`` cut before layer ``cut`` into two Stages, run F F B B over micro-batches."""
    model = copy.deepcopy(dense)
    s0 = Stage(0, model[:cut], CPU, is_first=True, is_last=False, recompute=recompute, autocast_dtype=autocast)
    s1 = Stage(1, model[cut:], CPU, is_first=False, is_last=True, loss_fn=nn.functional.cross_entropy,
               loss_scale=1.0 / microbatches, recompute=recompute, autocast_dtype=autocast)
    xs, ys = x.chunk(microbatches), y.chunk(microbatches)
    for mb in range(microbatches):
        s1.forward(mb, s0.forward(mb, xs[mb]), ys[mb])
    for mb in range(microbatches):
        assert s0.backward(mb, s1.backward(mb)) is None
    return {n: p.grad for n, p in model.named_parameters()}, (s0, s1)


def _dense_grads(dense: nn.Sequential, x, y, *, autocast=None, microbatches=2):
    model = copy.deepcopy(dense)
    for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            loss = nn.functional.cross_entropy(model(xm), ym).float()
        (loss / microbatches).backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("recompute", [False, True], ids=["plain", "recompute"])
@pytest.mark.parametrize("first_op", sorted(_first_ops()))
def test_stage_starting_with_in_place_op_has_the_dense_gradients(first_op, recompute):
    """The repro of the bug: the uniform cut of this model puts the in-place op first on stage 1."""
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Flatten(), nn.Linear(16, 64), _first_ops()[first_op](), nn.Linear(64, 4))
    assert Partition.uniform(4, 2).bounds[1][0] == 2  # the uniform partition starts stage 1 at the in-place op
    x, y = torch.randn(8, 4, 4), torch.randint(0, 4, (8,))
    grads, (_, s1) = _two_stage_grads(dense, 2, x, y, recompute=recompute)
    expected = _dense_grads(dense, x, y)
    assert sorted(grads) == sorted(expected)
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)
    if recompute:  # the block overwrites its input, so the no-grad forward ran on a copy (and learnt that)
        assert s1._modifies_input is True


def test_recomputing_stage_copies_only_blocks_that_modify_their_input():
    torch.manual_seed(1)
    dense = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    grads, (s0, s1) = _two_stage_grads(dense, 2, x, y, recompute=True, microbatches=3)
    expected = _dense_grads(dense, x, y, microbatches=3)
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)
    assert s0._modifies_input is False and s1._modifies_input is False


@pytest.mark.parametrize("recompute", [False, True], ids=["plain", "recompute"])
def test_bf16_autocast_stage_with_in_place_first_op(recompute):
    torch.manual_seed(2)
    dense = nn.Sequential(nn.Flatten(), nn.Linear(16, 64), nn.ReLU(inplace=True), nn.Linear(64, 4))
    x, y = torch.randn(8, 4, 4), torch.randint(0, 4, (8,))
    grads, _ = _two_stage_grads(dense, 2, x, y, recompute=recompute, autocast=torch.bfloat16)
    expected = _dense_grads(dense, x, y, autocast=torch.bfloat16)
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-2, atol=1e-3, msg=name)


def test_stage_input_is_zero_copy_and_leaves_the_version_counter_alone():
    """The boundary aliases the received buffer (no copy) and bumps no version: a local hand-over of
    ``out.detach()`` from a stage whose graph saved ``out`` (tanh saves its output) still back-propagates."""
    a = torch.randn(5, requires_grad=True)
    out = torch.tanh(a)
    received = out.detach()
    x, box = stage_input(received)
    assert x.data_ptr() == received.data_ptr() and not x.is_leaf and x.requires_grad
    assert received._version == 0
    (x * 3).sum().backward()
    torch.testing.assert_close(box.grad, torch.full((5,), 3.0))
    out.backward(box.grad)  # would fail had the boundary bumped the shared version counter
    torch.testing.assert_close(a.grad, 3 * (1 - out.detach() ** 2))


@pytest.mark.parametrize("first_op", sorted(_first_ops()))
def test_recomputed_layer_with_in_place_first_op(first_op):
    """The layer-by-layer runtime's per-layer recompute (checkpoint) replays on the original input."""
    from workbench.runtime.layer_parallel import Recomputed

    torch.manual_seed(3)
    lin, layer = nn.Linear(64, 64), _first_ops()[first_op]()
    x = torch.randn(4, 64)
    (layer(lin(x)) ** 2).sum().backward()
    expected = [p.grad.clone() for p in [*lin.parameters(), *layer.parameters()]]
    for p in [*lin.parameters(), *layer.parameters()]:
        p.grad = None
    wrapped = Recomputed(layer)
    (wrapped(lin(x)) ** 2).sum().backward()
    for got, want in zip([p.grad for p in [*lin.parameters(), *layer.parameters()]], expected):
        torch.testing.assert_close(got, want)
    assert wrapped.modifies_input is True


@pytest.mark.parametrize("factory", ["squeezenet", "tiny_resnet"])
def test_profiling_a_model_with_in_place_layers(factory):
    from workbench.models.source import model_from_factory
    from workbench.profiling import profile

    seq = model_from_factory(f"{MODULE}:{factory}", seed=0, input_spec=IMAGE)
    assert any(_starts_in_place(seq, i) for i in range(1, len(seq)))
    inputs, targets = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    costs = profile(seq, (inputs, targets), device="cpu", warmup=1, repeats=2, cache=False, progress=False)
    assert [layer.name for layer in costs.layers] == seq.layer_names
    assert all(layer.forward_ms > 0 and layer.backward_ms >= 0 for layer in costs.layers)
    assert sum(layer.flops for layer in costs.layers) > 0


# -- multi-process runs --------------------------------------------------------------------------------------------

DATA = {"kind": "factory", "factory": f"{MODULE}:images", "args": {"n_train": 48, "n_val": 8}}
SGD = {"name": "sgd", "lr": 0.01}


def _starts_in_place(seq: LayerSequence, index: int) -> bool:
    layer = seq[index]
    modules = list(layer.modules())
    return (isinstance(layer, nn.ReLU) and layer.inplace) or any(isinstance(m, PreActBlock) for m in modules)


def _model_of(config) -> LayerSequence:
    from workbench.runtime.batches import run_model

    return run_model(config)


def _partition_of(config, num_layers: int) -> Partition:
    text = config.plan.partition
    return Partition.uniform(num_layers, config.plan.pp) if text == "uniform" else Partition.parse(text, num_layers)


def _assert_in_place_first_on_a_stage(config) -> None:
    seq = _model_of(config)
    partition = _partition_of(config, len(seq))
    firsts = [partition.bounds[s][0] for s in range(1, partition.num_stages)]
    assert any(_starts_in_place(seq, i) for i in firsts), (partition, firsts)


ONE_F_ONE_B = [
    ("squeezenet", "pp2-1f1b-m4@0-0|1-17"),  # stage 1 starts with features' ReLU(inplace=True)
    ("tiny_resnet", "pp2-1f1b-m4"),  # uniform: stage 1 starts with block3 (x += shift; ReLU in place)
    ("tiny_resnet", "pp2-1f1b-m4-rc"),  # the recomputing stage replays block3 on its original input
]
ONE_F_ONE_B_IDS = ["squeezenet", "tiny-resnet", "tiny-resnet-recompute"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The module's runs, one sweep per process count; the workers import ``fixtures.user_models``."""
    patch = pytest.MonkeyPatch()
    patch.setenv("PYTHONPATH", user_models.worker_env_pythonpath())
    def run(factory: str, plan: str, steps: int) -> dict:
        return {"model": f"{MODULE}:{factory}", "plan": plan, "data": DATA,
                "training": {"global_batch": 8, "optimizer": SGD, "steps": steps}}

    runs = {key: (2, run(factory, plan, 2)) for key, (factory, plan) in zip(ONE_F_ONE_B_IDS, ONE_F_ONE_B)}
    runs["gropipe"] = (4, run("squeezenet", "gropipe-2x2-1f1b-m2-d1@0-0|1-17", 3))  # stage 1 starts with a ReLU
    runs["async"] = (2, run("shufflenet", "async-1x2-m4-if2@0-1|2-24", 3))  # stage 1 starts with conv1's ReLU
    yield Sweep(tmp_path_factory.mktemp("user_models"), runs)
    patch.undo()


def _assert_equals_reference(run_dir, config, ranks, *, delay=None):
    reference = reference_train(config, delay=delay)
    torch.testing.assert_close(step_losses(run_dir), reference.losses, rtol=1e-6, atol=1e-6)
    params = dumped_params(run_dir, ranks)
    assert sorted(params) == sorted(reference.params)
    for name, value in reference.params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")


@pytest.mark.multiproc
@pytest.mark.parametrize("key", ONE_F_ONE_B_IDS)
def test_1f1b_equals_reference(sweep, key):
    config = sweep.run(key)
    _assert_in_place_first_on_a_stage(config)
    _assert_equals_reference(sweep.dir(key), config, [0, 1])


@pytest.mark.multiproc
def test_gropipe_delay1_equals_reference(sweep):
    config = sweep.run("gropipe")
    assert (config.plan.family, config.plan.dp, config.plan.pp) == ("gropipe", 2, 2)
    _assert_in_place_first_on_a_stage(config)
    _assert_equals_reference(sweep.dir("gropipe"), config, [0, 1], delay=1)


@pytest.mark.multiproc
def test_async_pipeline_equals_the_stashing_rule(sweep):
    config = sweep.run("async")
    _assert_in_place_first_on_a_stage(config)
    expected = stashing_reference(config)
    params = dumped_params(sweep.dir("async"), [0, 1])
    assert sorted(params) == sorted(expected)
    for name, value in expected.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")
