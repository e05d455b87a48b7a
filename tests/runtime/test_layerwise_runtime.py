"""Per-layer plans under real torchrun (4 gloo ranks) equal the single-process dense reference.

Each plan mixes replicated (DDP), fully sharded (FSDP2) and 2-way tensor
parallel (DTensor) layers of a small GPT-2, one without a pipeline and with
recomputation on a subset of the layers, one as a 1F1B pipeline of two
stages. After the steps every loss and every final parameter equals the
dense model trained in one process on the same micro-batches (fp32, no
dropout), and each rank's start event records the options its layers ran.
"""

from __future__ import annotations

import pytest
import torch

from runtime_launch import Sweep, dumped_params, step_losses
from workbench.core.config import RunConfig, merge_changes
from workbench.core.plan import ParallelPlan
from workbench.core.rundir import make_event
from workbench.runtime.events import read_events
from workbench.runtime.reference import reference_train

GPT2 = {"model": {"name": "gpt2-tiny", "overrides": {"n_layer": 2, "seq_len": 16, "resid_pdrop": 0.0,
                                                    "embd_pdrop": 0.0, "attn_pdrop": 0.0}},
        "data": {"kind": "bytes-lm", "seq_len": 16},
        "training": {"global_batch": 8, "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}, "steps": 3}}


def assert_equals_reference(run_dir, config):
    reference = reference_train(config)
    torch.testing.assert_close(step_losses(run_dir), reference.losses, rtol=0, atol=1e-5)
    params = dumped_params(run_dir, list(range(config.world_size)))
    assert sorted(params) == sorted(reference.params)
    for name, value in reference.params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-5, msg=f"parameter {name}")


def realized_layers(run_dir, rank):
    start = next(e for e in read_events(run_dir, rank) if e["kind"] == "start")
    return {layer["index"]: (layer["dp"], layer["tp_degree"], layer["recompute"]) for layer in start["layers"]}


# embeddings: DDP over 4 ranks; block 0: FSDP x 2-way TP, recomputed; block 1: DDP x strided 2-way TP; head: zero2
MIXED = "tp1d-2-dp2-m2-L[0=ddp;1=fsdp.tp1d2.rc;2=ddp.tp1d2.strided.rc;3=zero2]"
# stage 0 (ranks 0, 1): embeddings DDP, block 0 2-way TP, block 1 FSDP;
# stage 1 (ranks 2, 3): block 2 zero2 recomputed, block 3 FSDP x 2-way TP, head DDP
PIPELINED = "pp2-1f1b-m4-tp1d2-L[0=ddp;1=ddp.tp1d2;2=fsdp;3=zero2.rc;4=fsdp.tp1d2;5=ddp]"
# the same layers under split backwards: ZB-H1 (every backward split in I and W) and DualPipeV (a V of two chunks
# per rank, whole backwards and split ones mixed on one stage)
SPLIT = {"zbh1": "pp2-zbh1-m4-tp1d2-L[0=ddp;1=ddp.tp1d2;2=fsdp;3=zero2.rc;4=fsdp.tp1d2;5=ddp]",
         "dualpipev": "pp2-dualpipev-m4-tp1d2-L[0=zero2;1=fsdp.tp1d2;2=ddp;3=fsdp.rc;4=ddp;5=fsdp]"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Both 4-rank runs in one sweep."""
    deeper = merge_changes(GPT2, {"model": {"overrides": {**GPT2["model"]["overrides"], "n_layer": 4}}})
    return Sweep(tmp_path_factory.mktemp("layerwise"), {"mixed": (4, {"plan": MIXED, **GPT2}),
                                                       "pipelined": (4, {"plan": PIPELINED, **deeper}),
                                                       **{k: (4, {"plan": p, **deeper}) for k, p in SPLIT.items()}})


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mixed_layers_with_recomputation_equal_reference(sweep):
    config, run_dir = sweep.run("mixed"), sweep.dir("mixed")
    assert not ParallelPlan.parse(MIXED).is_uniform
    assert_equals_reference(run_dir, config)
    for rank in range(4):
        assert realized_layers(run_dir, rank) == {0: ("replicate", 1, False), 1: ("fsdp", 2, True),
                                                  2: ("replicate", 2, True), 3: ("zero2", 1, False)}


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mixed_layers_in_a_two_stage_pipeline_equal_reference(sweep):
    config, run_dir = sweep.run("pipelined"), sweep.dir("pipelined")
    assert_equals_reference(run_dir, config)
    assert realized_layers(run_dir, 1) == {0: ("replicate", 1, False), 1: ("replicate", 2, False),
                                           2: ("fsdp", 1, False)}
    assert realized_layers(run_dir, 2) == {3: ("zero2", 1, True), 4: ("fsdp", 2, False), 5: ("replicate", 1, False)}


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(SPLIT))
def test_mixed_layers_under_a_split_backward_equal_reference(sweep, kind):
    """FSDP2's reductions, which a whole backward's hooks run, happen after the weight passes instead."""
    config, run_dir = sweep.run(kind), sweep.dir(kind)
    assert config.plan.pipeline.split_backward
    assert_equals_reference(run_dir, config)
    ops = {e["op"] for e in read_events(run_dir, 0) if e["kind"] == "stage"}
    assert ops >= {"I", "W"} and ("B" in ops) == (kind == "dualpipev")
    assert realized_layers(run_dir, 2)[4] == (("fsdp", 2, False) if kind == "zbh1" else ("replicate", 1, False))


def test_the_status_shows_each_rank_s_layers_as_run():
    from workbench.jobs.monitor_model import RunState
    from workbench.jobs.status import JobStatus, RankStatus

    layers = [{"index": 3, "name": "block_2", "dp": "fsdp", "tp_degree": 1, "recompute": True},
              {"index": 4, "name": "block_3", "dp": "replicate", "tp_degree": 2, "recompute": False}]
    state = RunState()
    state.apply([make_event("start", 2, t=1.0, world_size=4, layers=layers)])
    rows = state.summary_rows(now=2.0)
    assert rows[0]["layers"] == ("block_2:fsdp+rc", "block_3:replicate+tp2")
    text = JobStatus(state="RUNNING", run_id="r", ranks=tuple(RankStatus(**row) for row in rows)).text()
    assert "block_2:fsdp+rc block_3:replicate+tp2" in text


# -- dispatch and refusals before launch (no processes) ------------------------------------------------------------

@pytest.mark.parametrize(("plan", "layerwise"), [
    ("dp2", False), ("pp2-1f1b-m4", False), ("tp1d-2-dp1", False), ("tp2d-2x2-dp1", False),
    ("dp2-fsdp", True), ("dp2-zero2", True), ("pp2-1f1b-m4-tp1d2", True), ("tp1d-2-dp1-rc", True),
    ("pp2-1f1b-m4-L[0-1=ddp.rc;2-3=ddp]", True), ("tp1d-2-dp1-L[all=ddp]", True),
])
def test_dispatch_sends_per_layer_and_sharded_plans_to_the_layerwise_runtime(plan, layerwise):
    from workbench.core.config import runs_layer_by_layer
    from workbench.runtime.strategies import strategy_class

    parsed = ParallelPlan.parse(plan)
    assert runs_layer_by_layer(parsed) is layerwise
    assert (strategy_class(parsed).__name__ == "Layerwise") is layerwise


@pytest.mark.parametrize(("fields", "words"), [
    ({"plan": "tp2d-2x2-dp1-L[0=ddp.tp2d4;1-3=ddp]"}, ["'layers[1]'", "2D tensor-parallel mesh"]),
    ({"plan": "tp1d-4-dp1-L[0=ddp;1=ddp.tp1d4;2-3=ddp]", "model": {"name": "gpt2-tiny", "overrides": {"n_head": 2}}},
     ["'layers[1].tp_degree'", "option 'ddp.tp1d4'", "does not divide the 2 attention heads", "[2]"]),
    ({"plan": "async-1x2-m4-L[0-1=ddp;2-3=fsdp]"}, ["'pipeline.kind'", "'async'", "1f1b"]),
    ({"plan": "torchpp2-1f1b-m4-fsdp"}, ["'pipeline.kind'", "kind 'torch' runs one option for all layers"]),
    ({"plan": "pp2-zbauto-m4-fsdp"}, ["'pipeline.kind'", "'zb-auto' builds its schedule from stage costs", "zbh1"]),
])
def test_what_the_layerwise_runtime_cannot_run_is_refused_before_launch(fields, words):
    with pytest.raises(ValueError) as info:
        RunConfig.from_dict({"model": "gpt2-tiny", "training": {"global_batch": 8}, **fields})
    for word in words:
        assert word in str(info.value)


def test_a_mismatch_between_realised_and_planned_options_raises():
    from torch import nn

    from workbench.core.plan import LayerPlan
    from workbench.runtime.layer_parallel import Layout, ParallelLayer, check_realized, realized_options

    layer = nn.Linear(4, 4)
    applied = ParallelLayer(index=2, name="fc", module=layer, layer=layer, plan=LayerPlan(dp="fsdp", recompute=True),
                            layout=Layout(2), fused={})
    with pytest.raises(RuntimeError, match=r"layer 2 'fc' ran dp='none', recompute=False but the plan asks for "
                                           r"dp='fsdp', recompute=True"):
        check_realized(applied, realized_options(applied))


def test_tensor_parallel_rules_name_what_they_do_not_split():
    from torch import nn

    from workbench.runtime.layer_parallel import tensor_parallel_rules

    with pytest.raises(ValueError, match="this layer is a Conv2d"):
        tensor_parallel_rules(nn.Conv2d(3, 8, 3), 2)
    rules = tensor_parallel_rules(nn.Sequential(nn.Flatten(1), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), 2)
    assert [type(style).__name__ for style in rules.plan.values()] == ["Colwise", "Rowwise"]


# -- the memory count -----------------------------------------------------------------------------------------------

def test_saved_activations_count_each_storage_once_until_backward_frees_it():
    from torch import nn

    from workbench.runtime.layer_parallel import SavedActivations

    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(5, 8, requires_grad=True)
    count = SavedActivations()
    with count:
        out = layer(x).sum()
    # saved: the input of the first linear (5x8), the ReLU's output (5x16, also the second linear's input, counted
    # once); the weights are parameters, not activations
    assert count.live == count.peak == (5 * 8 + 5 * 16) * 4
    out.backward()
    assert count.live == 0 and count.peak == (5 * 8 + 5 * 16) * 4
    count.reset_peak()
    assert count.peak == 0


def test_a_recomputed_layer_counts_only_the_input_it_keeps():
    from torch import nn

    from workbench.runtime.layer_parallel import Recomputed, SavedActivations

    layer = Recomputed(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    x = torch.randn(5, 8).requires_grad_(True) * 2  # an activation, not a leaf
    count = SavedActivations()
    with count:
        out = layer(x).sum()
    assert count.peak == 5 * 8 * 4
    out.backward()
    assert count.live == 0


def _memory_worker(rank: int, world: int, init_file: str, plan: str, queue) -> None:
    import torch.distributed as dist

    from workbench.models import build_model
    from workbench.runtime.batches import global_batches, split_rounds
    from workbench.runtime.entry import resolve_partition
    from workbench.runtime.strategies.base import RunContext
    from workbench.runtime.strategies.layerwise import Layerwise

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        config = RunConfig.from_dict(merge_changes(GPT2, {"plan": plan, "training": {"steps": 2}}))
        model = build_model(config.model.name, seed=config.training.seed, **config.model.overrides)
        dense = {name: sum(p.numel() * p.element_size() for p in model[i].parameters())
                 for i, name in enumerate(model.layer_names)}
        batches = global_batches(config, model, 0)
        example = split_rounds(next(global_batches(config, model, 0)), config, 0)[0].inputs[0]
        ctx = RunContext(config=config, rank=rank, world_size=world, device=torch.device("cpu"), autocast_dtype=None,
                         model=model, partition=resolve_partition(config, model, example), example_input=example,
                         record_events=False)
        strategy = Layerwise(ctx)
        assert strategy.memory_report() == {}
        reports = []
        for step in range(2):
            strategy.train_step(step, next(batches))
            reports.append(strategy.memory_report()["memory"])
        params = [p for g in strategy.optimizer().param_groups for p in g["params"]]
        local = sum(p.to_local().numel() * p.element_size() if hasattr(p, "to_local") else p.numel() * p.element_size()
                    for p in params)
        queue.put((rank, reports, local, dense, strategy.layers_report()))
    finally:
        dist.destroy_process_group()


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_each_rank_counts_its_shards_of_parameters_gradients_and_optimizer_state(tmp_path):
    import torch.multiprocessing as mp

    # embeddings fully sharded, block 0 zero2 and recomputed, block 1 replicated, head fully sharded; 2 ranks
    plan = "dp2-L[0=fsdp;1=zero2.rc;2=ddp;3=fsdp]"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_memory_worker, args=(r, 2, str(tmp_path / "init"), plan, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((item[0], item[1:]) for item in (queue.get(timeout=100) for _ in procs))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    dense = results[0][2]
    names = list(dense)
    for rank, (reports, local, _dense, layers) in results.items():
        for memory in reports:
            assert memory["source"] == "count"
            assert memory["params_bytes"] == local == sum(layer["param_bytes"] for layer in layers)
            assert memory["grads_bytes"] == memory["params_bytes"]  # every gradient is reduced to its shard
            assert memory["optimizer_bytes"] == memory["params_bytes"]  # SGD: one momentum buffer per parameter
            # zero2 keeps block 0 gathered from forward to backward; replicate computes block 1 on a gathered copy
            assert memory["unsharded_params_bytes"] == dense[names[1]] + dense[names[2]]
            assert memory["activations_peak_bytes"] > 0
            assert memory["counted_bytes"] == memory["peak_bytes"] == sum(
                memory[k] for k in ("params_bytes", "unsharded_params_bytes", "grads_bytes", "optimizer_bytes",
                                    "activations_peak_bytes"))
        assert reports[0]["activations_peak_bytes"] == reports[1]["activations_peak_bytes"]
    # the two ranks' shards make up the sharded layers once and the replicated block twice
    assert sum(results[r][1] for r in range(2)) == sum(dense.values()) + dense[names[2]]


# -- the loss on each rank's rows -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("size", "tp", "consecutive"), [(4, 1, True), (6, 2, True), (6, 2, False), (4, 4, True),
                                                         (8, 1, True)])
def test_the_rows_losses_of_a_stage_add_up_to_its_loss_and_gradient(size, tp, consecutive):
    from workbench.models.sequence import token_cross_entropy
    from workbench.runtime.layer_parallel import Layout
    from workbench.runtime.strategies.layerwise import RowsLoss

    torch.manual_seed(0)
    replicas, replica_rows = 2, 12
    rows = replicas * replica_rows
    logits = torch.randn(rows, 5, 7, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 7, (rows, 5))
    target[3:6, :] = -100  # ignored tokens, unevenly spread over the rows (every token of one 8-rank block)
    target[14, 1:] = -100
    whole = sum(token_cross_entropy(o, t) for o, t in zip(logits.split(replica_rows), target.split(replica_rows)))
    (expected,) = torch.autograd.grad(whole, logits)

    layout = Layout(size, tp, consecutive)
    block = rows // layout.dp
    total, grad, counting = 0.0, torch.zeros_like(logits), 0
    for rank in range(size):
        loss = RowsLoss(token_cross_entropy, replica_rows, layout, rank)
        group = layout.coords(rank)[0]
        mine = logits.detach()[group * block:(group + 1) * block].requires_grad_(True)
        part = loss(mine, target)
        (mine_grad,) = torch.autograd.grad(part, mine)
        if loss.counts():  # one rank per tensor-parallel group reports, and its gradient stands for the group's
            counting += 1
            total += float(part.detach())
            grad[group * block:(group + 1) * block] += mine_grad
    assert counting == layout.dp
    assert total == pytest.approx(float(whole.detach()), abs=1e-12)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


def test_a_rows_loss_refuses_an_output_of_other_rows():
    from workbench.models.sequence import token_cross_entropy
    from workbench.runtime.layer_parallel import Layout
    from workbench.runtime.strategies.layerwise import RowsLoss

    loss = RowsLoss(token_cross_entropy, 4, Layout(4), 1)
    with pytest.raises(RuntimeError, match="has 8 rows, its data group holds 2 of the 8 rows"):
        loss(torch.zeros(8, 3, 5), torch.zeros(8, 3, dtype=torch.long))


def test_replicated_layers_reduce_once_a_step_at_the_stages_last_backward():
    """As DDP under no_sync: the backwards before the step's last one accumulate without communicating."""
    from contextlib import nullcontext

    from workbench.runtime.strategies.layerwise import _CountedStage

    class Recorder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[bool] = []

        def set_requires_gradient_sync(self, sync: bool) -> None:
            self.calls.append(sync)

    class Memory:
        activations = nullcontext()

        def note_unsharded(self) -> None:
            pass

    recorder = Recorder()
    stage = _CountedStage(index=0, module=torch.nn.Linear(3, 3), device=torch.device("cpu"), is_first=True,
                          is_last=True, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    stage.memory, stage.replicated, stage.last_backward = Memory(), [recorder], 2
    for sync_round in (False, True):  # two accumulation rounds of three micro-batches
        stage.sync_round = sync_round
        for m in range(3):
            stage.forward(m, torch.randn(2, 3), torch.randn(2, 3))
            stage.backward(m)
    assert recorder.calls == [False, False, False, False, False, True]
    stage.last_backward, recorder.calls = None, []  # a split-backward schedule: every backward synchronises as before
    stage.forward(0, torch.randn(2, 3), torch.randn(2, 3))
    stage.backward(0)
    assert recorder.calls == []
