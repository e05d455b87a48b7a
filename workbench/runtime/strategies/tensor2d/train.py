"""Training loop for tensor-parallel GPT-2: 2D (SUMMA), 1D (Megatron) or dense, each with data parallelism.

Problem: the entry module, the benchmarks and the tests all need the same
loop: build the dense model from a config, convert it from the outside,
feed every rank its slice of one deterministic global batch, average gradients
over data-parallel replicas, step the optimizer, and report what happened as
run-directory events.

Approach: :class:`TensorParallelConfig` (validated at construction) names the
mode and sizes; :func:`run_tensor_parallel` runs on every rank after process
groups exist (``Topology(dp=D, tp_row=q, tp_col=q)`` for 2D,
``Topology(dp=D, tp=P)`` for 1D, ``Topology(dp=D)`` for dense; see
:meth:`TensorParallelConfig.topology`). Events go through a callback
``emit(kind, **fields)`` with the run-directory kinds (``step``, ``stage``),
so the caller decides where they are written. Element-wise optimizers (SGD,
AdamW) on the shards are exactly the dense optimizer, so losses match the
dense run step for step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ....core.fields import check_int, check_number, to_dict
from ....core.topology import Topology
from ...groups import pick_device
from .comm import LINEAR_ALGORITHMS, CommCounter, GroupAxis, Grid2D, all_reduce
from .memory import measure_saved_bytes, parameter_bytes
from .sharding import check_grid_size, parallelize_2d

__all__ = ["TensorParallelConfig", "run_tensor_parallel", "run_tensor2d", "build_parallel_model", "data_parallel_axis",
           "average_gradients", "synthetic_batch", "local_rows", "dense_gpt2"]

MODES = ("2d", "1d", "dense")
OPTIMIZERS = ("adamw", "sgd")
Emit = Callable[..., None]


@dataclass(frozen=True)
class TensorParallelConfig:
    """One tensor-parallel GPT-2 run. ``batch_size`` is the global batch (all replicas)."""

    mode: str = "2d"
    q: int = 2                 # grid side for 2d; tensor-parallel degree for 1d (ignored for dense)
    dp: int = 1
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2
    vocab_size: int = 256
    n_positions: int = 64
    batch_size: int = 8
    seq_len: int = 32
    steps: int = 5
    lr: float = 1e-3
    optimizer: str = "adamw"
    summa: str = "broadcast"   # 2d linear algorithm: broadcast (SUMMA steps) | allgather
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.summa not in LINEAR_ALGORITHMS:
            raise ValueError(f"summa must be one of {LINEAR_ALGORITHMS}, got {self.summa!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        for name in ("q", "dp", "n_embd", "n_head", "n_layer", "vocab_size", "n_positions", "batch_size", "seq_len", "steps"):
            value = getattr(self, name)
            check_int(name, value, 1)
        check_number("lr", self.lr, 0, strict=True)
        if self.seq_len > self.n_positions:
            raise ValueError(f"seq_len={self.seq_len} exceeds n_positions={self.n_positions}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        dims = {"hidden_size": self.n_embd, "num_attention_heads": self.n_head, "intermediate_size": 4 * self.n_embd}
        rows = self.q if self.mode == "2d" else 1
        if self.mode == "2d":
            check_grid_size(dims, self.q)
        elif self.mode == "1d":
            check_grid_size(dims, self.q, extra={"vocab_size": self.vocab_size}, name="q (1d degree)")
        if self.batch_size % (self.dp * rows):
            raise ValueError(f"batch_size={self.batch_size} must be divisible by dp x grid rows = {self.dp * rows}")

    @property
    def world_size(self) -> int:
        return self.topology().world_size

    def topology(self) -> Topology:
        if self.mode == "2d":
            return Topology(dp=self.dp, tp_row=self.q, tp_col=self.q)
        if self.mode == "1d":
            return Topology(dp=self.dp, tp=self.q)
        return Topology(dp=self.dp)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


def dense_gpt2(config: TensorParallelConfig) -> nn.Module:
    """The dense reference model, identical on every rank (seeded), dropout off."""
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2Config(n_embd=config.n_embd, n_head=config.n_head, n_layer=config.n_layer, vocab_size=config.vocab_size,
                    n_positions=config.n_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                    bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
    hf._attn_implementation = "eager"
    torch.manual_seed(config.seed)
    return GPT2LMHeadModel(hf)


def synthetic_batch(config: TensorParallelConfig, step: int) -> torch.Tensor:
    """The global batch of token ids [B, s] for ``step``, the same on every rank."""
    generator = torch.Generator().manual_seed(config.seed * 100_003 + step)
    return torch.randint(0, config.vocab_size, (config.batch_size, config.seq_len), generator=generator)


def local_rows(batch: torch.Tensor, index: int, parts: int) -> torch.Tensor:
    """Rows [index B/parts, (index+1) B/parts) of a batch."""
    if batch.shape[0] % parts:
        raise ValueError(f"batch size {batch.shape[0]} is not divisible by {parts} (data-parallel replicas x grid rows)")
    rows = batch.shape[0] // parts
    return batch[index * rows:(index + 1) * rows]


def data_parallel_axis(groups: Any, counter: CommCounter) -> GroupAxis:
    if "dp" not in groups.topology or groups.size("dp") == 1:
        return GroupAxis(None, [groups.rank], 0, counter)
    return GroupAxis(groups.group("dp"), groups.ranks("dp"), groups.coord("dp"), counter)


def average_gradients(dp: GroupAxis, params: list[nn.Parameter]) -> None:
    """Average gradients over the data-parallel replicas with one all-reduce of a flat buffer."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])  # [sum of numels]
    all_reduce(dp, flat)
    flat.div_(dp.size)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def build_parallel_model(config: TensorParallelConfig, groups: Any, counter: CommCounter,
                         device: torch.device) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor], Any, Any]:
    """(module, loss_fn(this replica's ids [B/dp, s]), shard rules, grid or tp axis) for the configured mode."""
    dense = dense_gpt2(config).to(device)
    if config.mode == "2d":
        grid = Grid2D.from_groups(groups, counter, algorithm=config.summa)
        module, rules = parallelize_2d(dense, grid)
        return module, lambda ids: module.loss(local_rows(ids, grid.i, grid.q)), rules, grid
    if config.mode == "1d":
        from ..tensor1d import parallelize_1d, tp_axis

        axis = tp_axis(groups, counter)
        module, rules = parallelize_1d(dense, axis)
        return module, module.loss, rules, axis
    return dense, lambda ids: dense(ids, labels=ids).loss, None, None


def run_tensor_parallel(config: TensorParallelConfig, groups: Any, *, emit: Emit | None = None,
                        measure_memory: bool = True) -> dict[str, Any]:
    """Train ``config.steps`` steps on this rank; returns losses, timings, bytes and communication counts.

    ``groups``: ``runtime.groups.build_groups(config.topology())``. ``emit(kind, **fields)`` receives a
    ``step`` event per step and ``stage`` events (F, B, AR, STEP) with ms relative to ``t0``. The result
    also holds ``module``, ``shard_rules`` and ``communicator`` (the grid, or the 1D axis): a dense checkpoint is
    ``shard_rules.gather_dense_state_dict(module, communicator)`` (collective; every rank of the grid calls it).
    """
    if groups.topology != config.topology():
        raise ValueError(f"groups were built for {groups.topology} but config {config.mode} needs {config.topology()}")
    emit = emit or (lambda kind, **fields: None)
    device = pick_device(config.device)
    counter = CommCounter()
    module, loss_fn, shard_rules, communicator = build_parallel_model(config, groups, counter, device)
    dp_counter = CommCounter()
    dp = data_parallel_axis(groups, dp_counter)
    params = list(module.parameters())
    optimizer = (torch.optim.AdamW(params, lr=config.lr) if config.optimizer == "adamw"
                 else torch.optim.SGD(params, lr=config.lr))
    activation_bytes = None
    if measure_memory:
        with measure_saved_bytes(module) as saved:
            loss_fn(local_rows(synthetic_batch(config, 0), dp.index, dp.size).to(device))
        activation_bytes = saved.bytes
    counter.reset()
    losses, step_ms = [], []
    t0 = time.time()

    def stage(op: str, start: float, step: int) -> None:
        emit("stage", stage=0, op=op, microbatch=0, iteration=step, start=(start - t0) * 1e3,
             end=(time.time() - t0) * 1e3, t0=t0)

    for step in range(config.steps):
        ids = local_rows(synthetic_batch(config, step), dp.index, dp.size).to(device)  # [B/dp, s]
        began = time.time()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ids)
        stage("F", began, step)
        mark = time.time()
        loss.backward()
        stage("B", mark, step)
        if dp.size > 1:
            mark = time.time()
            average_gradients(dp, params)
            stage("AR", mark, step)
        mark = time.time()
        optimizer.step()
        stage("STEP", mark, step)
        global_loss = loss.detach().clone()
        all_reduce(dp, global_loss)
        losses.append(global_loss.item() / dp.size)
        step_ms.append((time.time() - began) * 1e3)
        if device.type == "cuda":
            memory = torch.cuda.max_memory_allocated(device)
        else:  # parameters, gradients (+ AdamW's two moments) and the measured saved activations
            memory = (activation_bytes or 0) + parameter_bytes(module) * (4 if config.optimizer == "adamw" else 2)
        emit("step", step=step, loss=losses[-1], step_ms=step_ms[-1],
             samples_per_s=config.batch_size / (step_ms[-1] / 1e3), memory_bytes=memory)
    return {"losses": losses, "step_ms": step_ms, "param_bytes": parameter_bytes(module),
            "activation_bytes": activation_bytes, "comm": counter.snapshot(), "dp_comm": dp_counter.snapshot(),
            "steps": config.steps,
            "module": module, "shard_rules": shard_rules, "communicator": communicator}


def run_tensor2d(config: TensorParallelConfig, groups: Any, *, emit: Emit | None = None) -> dict[str, Any]:
    """:func:`run_tensor_parallel` for a 2D config (the entry module's name for the strategy)."""
    if config.mode != "2d":
        raise ValueError(f"run_tensor2d needs mode='2d', got {config.mode!r}; use run_tensor_parallel")
    return run_tensor_parallel(config, groups, emit=emit)
