"""Rank bodies for the tensor-parallel tests: each runs several checks in one spawned job.

Every check compares against the dense ``transformers`` model run in the same
process on the whole batch and records plain numbers (max differences, bytes,
element counts) in a per-rank JSON file that the test process asserts on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from workbench.core.rundir import make_event
from workbench.core.timeline import Event
from workbench.core.topology import Topology
from workbench.runtime.groups import build_groups
from workbench.runtime.strategies.tensor1d import parallelize_1d, tp_axis
from workbench.runtime.strategies.tensor2d.comm import CommCounter, Grid2D
from workbench.runtime.strategies.tensor2d.layers import Linear2D
from workbench.runtime.strategies.tensor2d.memory import measure_saved_bytes, parameter_bytes
from workbench.runtime.strategies.tensor2d.sharding import parallelize_2d
from workbench.runtime.strategies.tensor2d.train import (
    TensorParallelConfig, dense_gpt2, local_rows, run_tensor_parallel, synthetic_batch)

TINY = dict(n_embd=64, n_head=4, n_layer=2, vocab_size=256, n_positions=64, batch_size=4, seq_len=16)


def max_diff(a: dict, b: dict) -> float:
    """Largest absolute difference over the keys of ``b`` (missing key: infinity)."""
    return max(((a[k].float() - v.float()).abs().max().item() if k in a else float("inf")) for k, v in b.items())


def dense_losses(config: TensorParallelConfig) -> list[float]:
    """The reference: the dense model trained alone on the whole global batch."""
    model = dense_gpt2(config)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr) if config.optimizer == "adamw" else torch.optim.SGD(model.parameters(), lr=config.lr)
    losses = []
    for step in range(config.steps):
        ids = synthetic_batch(config, step)
        opt.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def check_gpt2_2d(q: int, sizes: dict | None = None) -> dict:
    config = TensorParallelConfig(mode="2d", q=q, **{**TINY, **(sizes or {})})
    grid = Grid2D.from_groups(build_groups(Topology(dp=1, tp_row=q, tp_col=q)))
    dense = dense_gpt2(config)
    ids = synthetic_batch(config, 0)
    module, rules = parallelize_2d(dense, grid)
    out = dense(ids, labels=ids, output_hidden_states=True)
    out.loss.backward()
    mine = local_rows(ids, grid.i, q)
    width = config.n_embd // q
    hidden = module.hidden_states(mine)
    dense_hidden = local_rows(out.hidden_states[-1], grid.i, q)[..., grid.j * width:(grid.j + 1) * width]
    with measure_saved_bytes(module) as saved:
        loss = module.loss(mine)
    loss.backward()
    logits = module(mine)
    grads = rules.gather_dense_state_dict(module, grid, grads=True)
    weights = rules.gather_dense_state_dict(module, grid)
    fresh = dense_gpt2(TensorParallelConfig(mode="2d", q=q, **{**TINY, **(sizes or {})}, seed=7))
    fresh.load_state_dict(weights)
    with measure_saved_bytes(dense) as dense_saved:
        dense(ids, labels=ids)
    return {
        "hidden_diff": (hidden - dense_hidden).abs().max().item(),
        "logits_diff": (logits - local_rows(out.logits, grid.i, q)).abs().max().item(),
        "loss_diff": abs(loss.item() - out.loss.item()),
        "grad_diff": max_diff(grads, {k: p.grad for k, p in dense.named_parameters()}),
        "roundtrip_diff": max_diff(weights, dense.state_dict()),
        "reload_diff": max_diff(fresh.state_dict(), dense.state_dict()),
        "param_bytes": parameter_bytes(module), "dense_param_bytes": parameter_bytes(dense),
        "activation_bytes": saved.bytes, "dense_activation_bytes": dense_saved.bytes,
    }


def check_bert_2d(q: int) -> dict:
    from transformers import BertConfig, BertForSequenceClassification

    grid = Grid2D.from_groups(build_groups(Topology(dp=1, tp_row=q, tp_col=q)))
    config = BertConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1, intermediate_size=128,
                        vocab_size=120, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, num_labels=3)
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    dense = BertForSequenceClassification(config)
    ids = torch.randint(0, 120, (4, 12))
    mask = torch.ones(4, 12)
    mask[1, 8:] = 0
    mask[3, 5:] = 0
    labels = torch.tensor([0, 2, 1, 2])
    module, rules = parallelize_2d(dense, grid)
    out = dense(ids, attention_mask=mask, labels=labels, output_hidden_states=True)
    out.loss.backward()
    rows = lambda t: local_rows(t, grid.i, q)
    width = 64 // q
    mine = module(rows(ids), rows(mask))
    loss = module.loss(rows(ids), rows(labels), rows(mask))
    loss.backward()
    grads = rules.gather_dense_state_dict(module, grid, grads=True)
    return {
        "sequence_diff": (mine["sequence"] - rows(out.hidden_states[-1])[..., grid.j * width:(grid.j + 1) * width]).abs().max().item(),
        "logits_diff": (mine["logits"] - rows(out.logits)).abs().max().item(),
        "loss_diff": abs(loss.item() - out.loss.item()),
        "grad_diff": max_diff(grads, {k: p.grad for k, p in dense.named_parameters()}),
    }


def check_gpt2_1d(degree: int) -> dict:
    config = TensorParallelConfig(mode="1d", q=degree, **TINY)
    axis = tp_axis(build_groups(Topology(dp=1, tp=degree)))
    dense = dense_gpt2(config)
    ids = synthetic_batch(config, 0)
    module, rules = parallelize_1d(dense, axis)
    out = dense(ids, labels=ids)
    out.loss.backward()
    with measure_saved_bytes(module) as saved:
        loss = module.loss(ids)
    loss.backward()
    grads = rules.gather_dense_state_dict(module, axis, grads=True)
    return {"loss_diff": abs(loss.item() - out.loss.item()),
            "grad_diff": max_diff(grads, {k: p.grad for k, p in dense.named_parameters()}),
            "roundtrip_diff": max_diff(rules.gather_dense_state_dict(module, axis), dense.state_dict()),
            "param_bytes": parameter_bytes(module), "activation_bytes": saved.bytes}


def check_linear_volume(q: int, rows: int, seq: int, k: int, n: int, algorithm: str) -> dict:
    """Counted elements of one Linear2D forward and backward on [rows, seq, k] x [k, n]."""
    counter = CommCounter()
    grid = Grid2D.from_groups(build_groups(Topology(dp=1, tp_row=q, tp_col=q)), counter, algorithm=algorithm)
    layer = Linear2D(grid, k, n, bias=False)
    x = torch.randn(rows // q, seq, k // q, requires_grad=True)
    y = layer(x)
    forward = counter.total_elements
    y.sum().backward()
    return {"forward": forward, "backward": counter.total_elements - forward}


def check_training(mode: str, q: int, dp: int, summa: str = "broadcast", steps: int = 5) -> dict:
    config = TensorParallelConfig(mode=mode, q=q, dp=dp, steps=steps, summa=summa, **TINY)
    events = []
    emit = lambda kind, **fields: events.append(make_event(kind, dist.get_rank(), **fields))
    result = run_tensor_parallel(config, build_groups(config.topology()), emit=emit)
    stage_events = [Event(rank=e["rank"], stage=e["stage"], op=e["op"], start=e["start"], end=e["end"],
                          microbatch=e["microbatch"], iteration=e["iteration"], source="measured")
                    for e in events if e["kind"] == "stage"]
    return {"losses": result["losses"], "dense_losses": dense_losses(config),
            "step_events": [e["step"] for e in events if e["kind"] == "step"],
            "stage_ops": sorted({e.op for e in stage_events}),
            "comm_per_step": result["comm"]["total_elements"] / steps,
            "calls_per_step": result["comm"]["total_calls"] / steps}


def worker(rank: int, world: int, init_file: str, out_dir: str, checks: list) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {}
    try:
        for name, fn, args in checks:
            results[name] = globals()[fn](*args)
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()
