"""Per-layer plans as planned: each layer's data parallelism, tensor parallelism and recomputation.

Problem. The uniform strategies apply one option to the whole model; a plan
that fully shards some layers, splits others over two tensor-parallel ranks
and recomputes a few needs every layer treated on its own, inside each
pipeline stage, with the pipeline between the stages unchanged.

Approach. :mod:`workbench.runtime.layer_parallel` applies the plan to the
unmodified layers of this rank's stage(s) with torch's FSDP2, DTensor and
checkpoint; the stage is then an ordinary :class:`~workbench.runtime.stage.Stage`
whose module moves activations between layer layouts and hands the whole
stage micro-batch to the next stage, so the scheduled pipeline interpreter
(GPipe, 1F1B, interleaved, zero-bubble) runs it as it runs any stage, each rank talking to
the rank of the next stage in its own position. Without a pipeline, the one
stage runs forward and backward per micro-batch.

The loss. The stage micro-batch is the replicas' micro-batches side by side
(when the mesh has ``dp > 1``) and its loss is the sum of theirs, as in the
single-process reference. The last stage does not gather its output: each
rank computes the loss of the rows its last layer's data group holds only
(:class:`RowsLoss`), weighted so that the parts add up to the stage loss and
their gradients, summed by the data-parallel reductions, to its gradient;
the step loss adds the parts over the ranks (one per tensor-parallel group)
in the one scalar all-reduce the step loss needs anyway.

What each layer realised is read back from its modules, checked against the
plan (a mismatch raises) and reported by :meth:`Layerwise.layers_report`,
which the entry module writes into the start event.

Memory. Every step the strategy counts what the rank holds and
:meth:`Layerwise.memory_report` returns it as ``{"memory": {...}}``, for the
step event of that step. Fields, all in bytes of this rank:

* ``params_bytes``: parameters as stored (the local shard of an FSDP, zero2
  or tensor-parallel parameter, the whole of a replicated one);
* ``unsharded_params_bytes``: all-gathered FSDP parameters held from a
  forward to its backward, the most seen at the end of a stage forward (a
  zero2 layer keeps its gathered parameters, and so does a replicated one:
  FSDP2's ``replicate`` computes with a gathered copy of its own; an fsdp
  layer frees them);
* ``grads_bytes``: gradients as the optimizer sees them (local shards);
* ``optimizer_bytes``: optimizer state after the step;
* ``activations_peak_bytes``: the peak of the tensors autograd saved for
  backward over the step (all in-flight micro-batches, the loss over the
  rank's own rows included, each storage once, see
  :class:`~workbench.runtime.layer_parallel.SavedActivations`);
* ``counted_bytes``: the sum of the five, states and activations together
  as a memory model adds them;
* ``peak_bytes``: on CUDA ``torch.cuda.max_memory_allocated`` over the step,
  elsewhere ``counted_bytes``; ``source`` says which (``"cuda"`` or ``"count"``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ...core.ir import Op
from ...core.plan import NoPipeline
from ...core.timeline import Event
from ..batches import split_rounds
from ..interpreter import Interpreter, MicrobatchData
from ..layer_parallel import (Layout, ParallelLayer, Relayout, SavedActivations, StageMeshes, check_realized,
                              dense_parameters, held_unsharded_bytes, layout_of, local_bytes, parallelize_layer,
                              realized_options)
from ..layer_parallel.split import DataParallelModules
from ..stage import Stage, output_shapes
from .base import RunContext, Strategy, global_mean_loss, make_optimizer

__all__ = ["Layerwise", "StageModule", "RowsLoss"]


class StageModule(nn.Module):
    """A stage's parallelised layers with the relayouts between them: whole stage batch in, and out.

    With ``gather_output=False`` (the last stage) the output stays in the last
    layer's layout: each rank returns only the rows of the stage batch its
    last layer's data group holds (:attr:`output_layout`).
    """

    def __init__(self, layers: list[ParallelLayer], meshes: StageMeshes, gather_output: bool = True) -> None:
        super().__init__()
        self.parallel_layers = layers
        self.layers = nn.ModuleDict({layer.name: layer.module for layer in layers})
        full = Layout(meshes.size, meshes.size)  # every rank holds the whole stage batch
        self.output_layout = full if gather_output else layers[-1].layout
        sources = [full] + [layer.layout for layer in layers]
        targets = [layer.layout for layer in layers] + [self.output_layout]
        self.relayouts = [Relayout(src, dst, meshes.stage_rank, meshes.group) for src, dst in zip(sources, targets)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for relayout, layer in zip(self.relayouts, self.parallel_layers):
            x = layer.module(relayout(x))
        return self.relayouts[-1](x)


class _CountedStage(Stage):
    """A stage whose forward (layers and loss) runs under the strategy's saved-activation count.

    Its replicated layers reduce their gradients once a step, as DDP does under
    ``no_sync``: only the step's last backward of this stage (``last_backward``,
    in the last accumulation round, ``sync_round``) lets them all-reduce; the
    backwards before it accumulate locally. Fully sharded and zero2 layers
    reduce-scatter every micro-batch (their gradients stay sharded).

    Where the schedule splits this stage's backward into I and W (zero-bubble
    kinds), :attr:`split` drives the layers' FSDP2 modules by hand, with the
    same reductions: sharded layers after every W (or whole backward),
    replicated ones after the stage's last (:mod:`~workbench.runtime.layer_parallel.split`).
    """

    replicated: tuple[nn.Module, ...] | list[nn.Module] = ()
    last_backward: int | None = None  # None: a split backward schedule (``split`` reduces)
    sync_round: bool = True
    split: DataParallelModules | None = None
    last_gradient: tuple[Op, int] | None = None  # the stage's last W (or whole backward B) in an iteration

    def _run(self, inputs: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        memory: _MemoryCount = self.memory  # type: ignore[attr-defined]
        with memory.activations:
            out = super()._run(inputs, target)
        memory.note_unsharded()
        return out

    def backward(self, microbatch: int, grad_output: torch.Tensor | None = None) -> torch.Tensor | None:
        if self.replicated and self.last_backward is not None:
            sync = self.sync_round and microbatch == self.last_backward
            for module in self.replicated:
                module.set_requires_gradient_sync(sync)  # type: ignore[operator]
        grad_input = super().backward(microbatch, grad_output)
        if self.split is not None:  # a whole backward in a split schedule (DualPipeV runs both)
            self.split.reduce(last=(Op.BACKWARD, microbatch) == self.last_gradient)
        return grad_input

    def backward_input(self, microbatch: int, grad_output: torch.Tensor | None = None,
                       params: list[torch.Tensor] | None = None) -> torch.Tensor | None:
        if params is None and self.split is not None:
            params = self.split.parameters()
        return super().backward_input(microbatch, grad_output, params)

    def backward_weight(self, microbatch: int) -> None:
        if self.split is not None:
            self.split.unshard()
        super().backward_weight(microbatch)
        if self.split is not None:
            self.split.reduce(last=(Op.BACKWARD_WEIGHT, microbatch) == self.last_gradient)


class _MemoryCount:
    """One rank's per-step memory count (see the module docstring for the fields)."""

    def __init__(self, layers: list[ParallelLayer], device: torch.device) -> None:
        self.layers, self.device = layers, device
        self.activations = SavedActivations()
        self.unsharded = 0
        self.grads = 0
        self.report: dict[str, Any] = {}

    def start_step(self) -> None:
        self.activations.reset_peak()
        self.unsharded = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def note_unsharded(self) -> None:
        self.unsharded = max(self.unsharded, held_unsharded_bytes(self.layers))

    def note_grads(self, optimizer: torch.optim.Optimizer) -> None:
        self.grads = local_bytes(p.grad for g in optimizer.param_groups for p in g["params"])

    def end_step(self, optimizer: torch.optim.Optimizer) -> None:
        params = local_bytes(p for g in optimizer.param_groups for p in g["params"])
        states = local_bytes(v for state in optimizer.state.values() for v in state.values()
                             if isinstance(v, torch.Tensor))
        counted = params + self.unsharded + self.grads + states + self.activations.peak
        cuda = self.device.type == "cuda"
        self.report = {"params_bytes": params, "unsharded_params_bytes": self.unsharded, "grads_bytes": self.grads,
                       "optimizer_bytes": states, "activations_peak_bytes": self.activations.peak,
                       "counted_bytes": counted,
                       "peak_bytes": int(torch.cuda.max_memory_allocated(self.device)) if cuda else counted,
                       "source": "cuda" if cuda else "count"}


def _counted(target: torch.Tensor) -> torch.Tensor | float:
    """What a mean loss over ``target`` divides by: its non-ignored (-100) entries for class targets, else its rows."""
    if target.is_floating_point():
        return float(target.shape[0])
    return target.ne(-100).sum()


class RowsLoss:
    """This rank's part of the stage micro-batch loss, from the rows its output holds.

    The stage micro-batch is the replicas' micro-batches of ``replica_rows``
    rows side by side, and its loss is the sum of each replica's own loss,
    as in the single-process reference. A rank of the last stage holds the
    rows ``[g B, (g + 1) B)`` of its last layer's data group ``g`` (``B`` =
    stage rows / data groups); for every replica those rows meet, it takes
    the model's loss over the common rows, weighted by their share of what
    the replica's mean divides by (its non-ignored targets for class
    targets, its rows otherwise). The parts of the data groups add up to the
    stage loss and their gradients to its gradient; the ranks of one
    tensor-parallel group hold the same rows and compute the same part
    (each needs the whole gradient of its rows), so the part is counted once
    per group (:meth:`counts`).
    """

    def __init__(self, loss_fn, replica_rows: int, layout: Layout, stage_rank: int) -> None:
        self.loss_fn, self.replica_rows, self.layout, self.stage_rank = loss_fn, replica_rows, layout, stage_rank

    def counts(self) -> bool:
        """Whether this rank's part enters the reported loss (the first rank of its tensor-parallel group)."""
        return self.layout.coords(self.stage_rank)[1] == 0

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        rows = target.shape[0]
        block = rows // self.layout.dp
        start = self.layout.coords(self.stage_rank)[0] * block
        if output.shape[0] != block:
            raise RuntimeError(f"stage rank {self.stage_rank}: the last layer's output has {output.shape[0]} rows, "
                               f"its data group holds {block} of the {rows} rows of the stage micro-batch")
        parts = []
        for first in range(0, rows, self.replica_rows):
            lo, hi = max(first, start), min(first + self.replica_rows, start + block)
            if lo >= hi:
                continue
            piece = target[lo:hi]
            loss = self.loss_fn(output[lo - start:hi - start], piece)
            if hi - lo == self.replica_rows:
                parts.append(loss)  # the whole replica
                continue
            share, whole = _counted(piece), _counted(target[first:first + self.replica_rows])
            if isinstance(share, torch.Tensor):  # no targets counted in these rows: no part (and no 0/0)
                parts.append(torch.where(share > 0, loss * share / whole, loss.new_zeros(())))
            else:
                parts.append(loss * (share / whole))
        return sum(parts[1:], parts[0])


class Layerwise(Strategy):
    """Runs any plan whose layers differ, or that shards data parallelism, layer by layer."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        config, plan = ctx.config, ctx.config.plan
        names = ctx.model.layer_names
        layer_plans = plan.layers_for(len(names))
        stage_size = plan.dp * plan.tp
        layouts = [layout_of(lp, stage_size) for lp in layer_plans]
        self.meshes = StageMeshes(plan.mesh, ctx.rank, ctx.device.type, layouts)
        self.pipelined = not isinstance(plan.pipeline, NoPipeline)
        num_virtual = plan.num_virtual_stages
        bounds = [ctx.partition.bounds[v] for v in range(num_virtual)]
        blocks = [ctx.model.stage(*b) for b in bounds]
        shapes = output_shapes(blocks, ctx.example_input, ctx.device, ctx.autocast_dtype)
        if self.pipelined:
            from .pipeline import lowered_schedule

            schedule = lowered_schedule(config)
            self.actions = [a if a.peer is None else replace(a, peer=self.meshes.twin(a.peer))
                            for a in schedule.actions(self.meshes.stage)]
            mine = schedule.stages_of(self.meshes.stage)
        else:
            self.actions, mine = [], [0]
        loss_scale = 1.0 / (plan.dp * plan.microbatches * config.training.grad_accum)
        self.stages: dict[int, Stage] = {}
        self.layers: list[ParallelLayer] = []
        self.loss: RowsLoss | None = None  # on the last stage's ranks
        for v in mine:
            first, last = bounds[v]
            stage_layers = []
            for i in range(first, last + 1):
                module = ctx.model[i].to(ctx.device)
                stage_layers.append(parallelize_layer(i, names[i], module, layer_plans[i], layouts[i],
                                                      self.meshes.mesh(layouts[i])))
            self.layers += stage_layers
            is_last = v == num_virtual - 1
            loss_fn = None
            if is_last:
                loss_fn = self.loss = RowsLoss(ctx.model.loss_fn, config.microbatch_size, stage_layers[-1].layout,
                                               self.meshes.stage_rank)
            module = StageModule(stage_layers, self.meshes, gather_output=not is_last)
            self.stages[v] = _CountedStage(index=v, module=module, device=ctx.device, is_first=v == 0,
                                           is_last=is_last, loss_fn=loss_fn, loss_scale=loss_scale,
                                           autocast_dtype=ctx.autocast_dtype)
        last_backward, last_gradient = self._last_backwards(plan.microbatches), self._last_gradients()
        for v, stage in self.stages.items():
            wrapped = [(layer.module, layer.plan.dp) for layer in stage.module.parallel_layers  # type: ignore[union-attr]
                       if hasattr(layer.module, "set_requires_gradient_sync")]
            stage.replicated = [module for module, kind in wrapped if kind == "replicate"]
            stage.last_backward = last_backward.get(v)
            if v in last_gradient:
                stage.split, stage.last_gradient = DataParallelModules(wrapped), last_gradient[v]
        self._report = []
        for layer in self.layers:
            realized = realized_options(layer)
            check_realized(layer, realized)
            self._report.append(realized)
        self._optimizer = make_optimizer([p for s in self.stages.values() for p in s.parameters()], config)
        self.memory = _MemoryCount(self.layers, ctx.device)
        for stage in self.stages.values():
            stage.memory = self.memory  # type: ignore[attr-defined]
        self.interpreter = None
        if self.pipelined:
            self.interpreter = Interpreter(
                rank=ctx.rank, actions=self.actions, stages=self.stages, num_microbatches=plan.microbatches,
                boundary_shapes={v: shapes[v] for v in range(num_virtual)}, device=ctx.device,
                handlers={Op.STEP: self._on_step, Op.ALL_REDUCE: self._on_all_reduce}, record=ctx.record_events)
        self.step_after_schedule = not any(a.op is Op.STEP for a in self.actions)

    def _last_backwards(self, microbatches: int) -> dict[int, int]:
        """Per stage of this rank, the micro-batch of its last backward in an iteration (none where the schedule
        splits backward into input and weight gradients: those stages synchronise every backward)."""
        if not self.pipelined:
            return {0: microbatches - 1}
        out: dict[int, int] = {}
        split = {a.stage for a in self.actions if a.op in (Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)}
        for a in self.actions:
            if a.op is Op.BACKWARD and a.stage not in split and a.microbatch is not None:
                out[a.stage] = a.microbatch
        return out

    def _last_gradients(self) -> dict[int, tuple[Op, int]]:
        """Per stage of this rank whose backward the schedule splits, the last action that adds gradients (a W,
        or a whole backward where the schedule mixes both) and its micro-batch."""
        split = {a.stage for a in self.actions if a.op is Op.BACKWARD_WEIGHT}
        return {a.stage: (a.op, a.microbatch) for a in self.actions
                if a.stage in split and a.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT) and a.microbatch is not None}

    # -- what ran --------------------------------------------------------------------------------
    def layers_report(self) -> list[dict[str, Any]]:
        """Each of this rank's layers as realised: name, dp kind, tp degree, recompute, ..."""
        return [dict(r, stage=self.meshes.stage) for r in self._report]

    def memory_report(self) -> dict[str, Any]:
        """This rank's memory in the last step: ``{"memory": {...}}`` (fields in the module docstring)."""
        return {"memory": dict(self.memory.report)} if self.memory.report else {}

    # -- training --------------------------------------------------------------------------------
    def _on_step(self, action) -> None:
        self.memory.note_grads(self._optimizer)
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)

    def _on_all_reduce(self, action) -> None:
        raise ValueError(f"plan {self.config.plan.name!r} runs one pipeline per stage group; action {action} "
                         f"belongs to a grouped schedule")

    def _stage_batches(self, batch) -> list[MicrobatchData]:
        """Per accumulation round, the stage micro-batches: every replica's micro-batch ``m`` side by side."""
        per_replica = [split_rounds(batch, self.config, g) for g in range(self.config.plan.dp)]
        rounds = []
        for r in range(self.config.training.grad_accum):
            data = [replicas[r] for replicas in per_replica]
            rounds.append(MicrobatchData(
                inputs=[torch.cat([d.inputs[m] for d in data]) for m in range(self.config.plan.microbatches)],
                targets=[torch.cat([d.targets[m] for d in data]) for m in range(self.config.plan.microbatches)]))
        return rounds

    def train_step(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        config = self.config
        self.memory.start_step()
        rounds = self._stage_batches(batch)
        for r, data in enumerate(rounds):
            iteration = step * config.training.grad_accum + r
            for stage in self.stages.values():
                stage.sync_round = r == len(rounds) - 1  # type: ignore[attr-defined]
            if self.interpreter is not None:
                last = r == len(rounds) - 1
                self.interpreter.run(iteration, data, skip=frozenset() if last else frozenset({Op.STEP}))
            else:
                self._run_unpipelined(iteration, data)
        if self.step_after_schedule:
            start = time.perf_counter()
            self._on_step(None)
            self.record_since("STEP", start, step * config.training.grad_accum + len(rounds) - 1)
        self.memory.end_step(self._optimizer)
        local = sum(sum(s.take_losses()) for s in self.stages.values())
        if self.loss is not None and not self.loss.counts():
            local = 0.0  # the first rank of this tensor-parallel group reports the group's part
        total_mb = config.plan.dp * config.plan.microbatches * config.training.grad_accum
        return global_mean_loss(local, total_mb, self.ctx.device)

    def _run_unpipelined(self, iteration: int, data: MicrobatchData) -> None:
        stage, device = self.stages[0], self.ctx.device
        for m, (x, y) in enumerate(zip(data.inputs, data.targets)):
            start = time.perf_counter()
            stage.forward(m, x.to(device), y.to(device))
            self.record_since("F", start, iteration, m)
            start = time.perf_counter()
            stage.backward(m)
            self.record_since("B", start, iteration, m)

    # -- state -----------------------------------------------------------------------------------
    def modules(self) -> dict[str, nn.Module]:
        return {f"stage{v}": s.module for v, s in self.stages.items()}

    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def param_state(self) -> dict[str, torch.Tensor]:
        """Dense parameters under their model names (collective over each layer's mesh)."""
        return {f"{layer.name}.{name}": value for layer in self.layers
                for name, value in dense_parameters(layer).items()}

    def buffer_state(self) -> dict[str, torch.Tensor]:
        """Buffers under their model names (a replicated DTensor buffer as its full tensor)."""
        from torch.distributed.tensor import DTensor

        return {f"{layer.name}.{name}": (b.full_tensor() if isinstance(b, DTensor) else b).detach().cpu().clone()
                for layer in self.layers for name, b in layer.layer.named_buffers()}

    def take_events(self) -> tuple[list[Event], float]:
        if self.interpreter is None:
            return super().take_events()
        return self.interpreter.take_events(), self.interpreter.t0_unix
