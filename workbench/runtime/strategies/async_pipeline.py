"""Asynchronous multi-iteration pipeline: 1F1B with no flush, weight versions per micro-batch.

Problem: a synchronous pipeline drains between optimizer steps, so every
iteration pays the fill-and-drain bubble. Letting the next iteration's
micro-batches enter before the current one has finished removes the bubble,
but then a stage updates its weights while micro-batches that ran their
forward on the old weights are still in flight; back-propagating them
through the new weights gives gradients of no function at all.

Approach (PipeDream / PipeDream-2BW): the whole run is one stream of
micro-batches, ``async_1f1b`` orders it (the same value the simulator times)
and ``Action.version`` says which weight version each forward uses. Each
stage keeps the versions still needed (:class:`StageWeights`):

* the live parameters are the newest version; a forward binds the version it
  is told to use as fresh leaf tensors over that version's storage
  (``torch.func.functional_call``), so its autograd graph holds exactly
  those weights;
* at a step, if any in-flight or future micro-batch still uses the current
  version, its storage is kept (the parameters move to a copy and the
  optimizer updates the copy in place), so the backward of every micro-batch
  reads the weights its forward read. A version is freed after its last use;
* with ``stash = false`` (the demonstration of what goes wrong) nothing is
  kept: forwards bind the live storage and steps overwrite it, so a backward
  reads newer weights than its forward did.

The backward's gradients, taken w.r.t. the bound leaves, are added to the
live parameters' gradients; the step applies them to the newest weights.
The backward binds the micro-batch's leaves again, so a recomputing stage
replays its forward on the version that forward used. With ``split`` the
backward runs as its input gradient (I), sent upstream at once, then its
weight gradients (W), both on those leaves.
Every recorded event carries the version of the weights it actually used:
a forward the version it bound, a backward the version its graph reads at
that moment (the bound one while it is kept, the newest if the live storage
was overwritten), so "backward used its forward's version" is checked from
what the runtime did, not from the plan. Sends and receives carry the plan's
version of their micro-batch, a ``STEP`` the version it creates.

The stream is cut into one segment per training step: segment ``t`` ends
with the stage's ``STEP`` of iteration ``t``, and holds the forwards of
iteration ``t + 1`` that 1F1B starts before it (the strategy reads that
batch ahead from the same deterministic data source). Every receive in
segment ``t`` is fed by a send in the neighbour's segments ``<= t``, so the
per-step loss all-reduce never waits on a blocked peer. Micro-batches are
numbered across the stream (``iteration * m + microbatch``) so activations,
messages and stashed versions of different iterations never collide.

With ``groups > 1`` the pipelines run side by side on their share of the
batch and each stage all-reduces its gradients across them (``AR``, started
without blocking) before its step. ``inflight = "auto"`` profiles the model
and lets :func:`workbench.scheduling.adaptive.choose_inflight` pick how many
micro-batches each stage keeps in flight under ``memory_cap_mb``.

Measured memory: each forward counts the bytes autograd saves for the
micro-batch (weights excluded); ``memory/rank{r}.json`` in the run directory
holds the peaks of saved activations, stashed versions and their sum.

The weight versions are :mod:`.async_weights`, the stream and its
interpreter :mod:`.async_stream`.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from ...core.ir import Action, Op
from ...core.timeline import Event
from ..batches import global_batches, split_rounds
from ..groups import build_groups
from ..interpreter import MicrobatchData
from ..stage import Stage, output_shapes
from .async_stream import StreamInterpreter, _shifted, _stream_index, async_schedule
from .async_weights import StageWeights, VersionedBlock
from .base import PendingLoss, RunContext, Strategy, global_mean_loss, make_optimizer

__all__ = ["AsyncPipeline", "async_schedule", "StageWeights", "VersionedBlock"]


class AsyncPipeline(Strategy):
    """Runs this rank's segment of the asynchronous stream per training step."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        config = ctx.config
        plan, spec = config.plan, config.plan.pipeline
        self.groups = build_groups(plan.mesh)
        self.group_index = self.groups.coord("dp")
        if ctx.partition.num_stages != plan.pp:
            raise ValueError(f"partition {ctx.partition} has {ctx.partition.num_stages} stages, plan {plan.name!r} "
                             f"needs {plan.pp}")
        blocks = [ctx.model.stage(*ctx.partition.bounds[s]) for s in range(plan.pp)]
        self.inflight = self._resolve_inflight(ctx, blocks)
        self.mode = spec.mode
        # an adapting run is a series of streams, each draining at its end, where the next is re-decided
        self.stream_end = min(spec.adapt_every, config.training.steps) if spec.adapt_every else config.training.steps
        self._interval = spec.adapt_every  # steps to the next decision: doubles while decisions change nothing
        self.adaptations: list[dict[str, Any]] = []
        m = plan.microbatches
        actions = self._stream(0, self.stream_end)
        shapes = output_shapes(blocks, ctx.example_input, ctx.device, ctx.autocast_dtype)
        self._send_bytes = [int(torch.Size(shape).numel()) * dtype.itemsize for shape, dtype in
                            (shapes[v] for v in range(plan.pp))] if spec.adapt_every else []
        s = self.groups.coord("pp")
        self.block = VersionedBlock(blocks[s].to(ctx.device))
        self.stage = Stage(index=s, module=self.block, device=ctx.device, is_first=s == 0,
                           is_last=s == plan.pp - 1, loss_fn=ctx.model.loss_fn, loss_scale=1.0 / m,
                           autocast_dtype=ctx.autocast_dtype, recompute=plan.recompute)
        self.weights = StageWeights(self.block, stash=spec.stash, uses={})
        self.weights.add_uses(actions)
        self._optimizer = make_optimizer(self.weights.params, config)
        self._pending: tuple[dist.Work | None, torch.Tensor] | None = None
        self._loss_group = dist.new_group()  # every rank: the loss all-reduce stays out of the stream's traffic
        self.segments = self._segments(actions)
        self.interpreter = StreamInterpreter(
            rank=ctx.rank, actions=actions, stages={s: self.stage}, num_microbatches=m * config.training.steps,
            boundary_shapes={v: shapes[v] for v in range(plan.pp)}, device=ctx.device,
            handlers={Op.STEP: self._on_step, Op.ALL_REDUCE: self._on_all_reduce}, record=ctx.record_events,
            weights={s: self.weights}, microbatches_per_iteration=m)
        self.interpreter.time_compute = bool(spec.adapt_every)
        self._records: list[dict[str, Any]] = []
        self._adapt_group = dist.new_group() if spec.adapt_every else None
        self._data = MicrobatchData(inputs={}, targets={})
        self._next_iteration: int | None = None  # the first iteration whose data is not loaded yet
        self._ahead: Iterator | None = None
        self._ahead_at = 0  # the iteration ``_ahead`` yields next

    # -- set-up -----------------------------------------------------------------------
    def _stream(self, start: int, end: int) -> list[Action]:
        """This rank's actions for iterations ``start .. end - 1`` at the current depths and mode, micro-batches
        numbered across the run."""
        schedule = async_schedule(self.config, self.inflight, iterations=end - start, mode=self.mode)
        return _stream_index(tuple(_shifted(schedule.actions(self.ctx.rank), start)), self.config.plan.microbatches)

    def _resolve_inflight(self, ctx: RunContext, blocks: list[nn.Module]) -> tuple[int, ...]:
        """Micro-batches in flight per stage: the config's number, or chosen on rank 0 and shared."""
        plan = ctx.config.plan
        if plan.pipeline.inflight != "auto":
            from ...scheduling.generators import async_inflight

            return async_inflight(plan.pp, plan.pipeline.inflight)
        box: list[Any] = [None]
        if dist.get_rank() == 0:
            box = [list(self._choose_inflight(ctx))]
        dist.broadcast_object_list(box, src=0)
        return tuple(box[0])

    @staticmethod
    def _choose_inflight(ctx: RunContext) -> tuple[int, ...]:
        from ...profiling import profile
        from ...scheduling.adaptive import choose_inflight
        from ...scheduling.stagecosts import StageCosts

        config = ctx.config
        microbatch = ctx.example_input.shape[0]
        costs = profile(copy.deepcopy(ctx.model), microbatch, device=str(ctx.example_input.device), progress=False)
        optimizer = "adam" if config.training.optimizer.name == "adam" else (
            "sgd-momentum" if config.training.optimizer.momentum else "sgd")
        stage_costs = StageCosts.from_model(costs, ctx.partition, microbatch, optimizer=optimizer)
        spec = config.plan.pipeline
        cap = int(spec.memory_cap_mb * 2**20) if spec.memory_cap_mb else None
        return choose_inflight(stage_costs, config.plan.microbatches, memory_cap_bytes=cap, mode=spec.mode).inflight

    @staticmethod
    def _segments(actions: list[Action]) -> list[list[Action]]:
        """The stream cut after each STEP: segment ``t`` ends with iteration ``t``'s step."""
        segments, current = [], []
        for a in actions:
            current.append(a)
            if a.op is Op.STEP:
                segments.append(current)
                current = []
        if current:
            segments[-1].extend(current)
        return segments

    # -- data -------------------------------------------------------------------------
    def _add_iteration(self, iteration: int, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        data = split_rounds(batch, self.config, self.group_index)[0]
        m = self.config.plan.microbatches
        for i, (x, y) in enumerate(zip(data.inputs, data.targets)):
            self._data.inputs[iteration * m + i] = x
            self._data.targets[iteration * m + i] = y

    def _drop_iteration(self, iteration: int) -> None:
        m = self.config.plan.microbatches
        for j in range(iteration * m, (iteration + 1) * m):
            self._data.inputs.pop(j, None)
            self._data.targets.pop(j, None)

    # -- handlers ---------------------------------------------------------------------
    def _on_all_reduce(self, action: Action) -> int:
        """Start the stage's gradient all-reduce across the pipelines; the step waits for it."""
        params = self.weights.params
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        self._pending = (dist.all_reduce(flat, group=self.groups.group("dp"), async_op=True), flat)
        return flat.numel() * flat.element_size()

    def _on_step(self, action: Action) -> None:
        if self._pending is not None:
            work, flat = self._pending
            work.wait()
            self.interpreter.compute_started()  # the STEP event times the update, not the wait
            flat /= self.config.plan.dp
            for p, g in zip(self.weights.params, flat.split([p.numel() for p in self.weights.params])):
                p.grad = g.view_as(p).to(p.dtype)
            self._pending = None
        self.weights.before_step()
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)

    # -- Strategy ---------------------------------------------------------------------
    @property
    def data_group(self) -> int:
        return self.group_index

    def train_step(self, step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> PendingLoss:
        config = self.config
        segment = self.segments[step]
        if self.stage.is_first or self.stage.is_last:
            if self._next_iteration in (None, step):
                self._add_iteration(step, batch)
                self._next_iteration = step + 1
            needed = max((a.iteration for a in segment if a.op is Op.FORWARD), default=step)
            while self._next_iteration <= needed:  # forwards of later iterations 1F1B starts in this segment
                if self._ahead is None or self._ahead_at != self._next_iteration:  # (a drained stream read none)
                    self._ahead = global_batches(config, self.ctx.model, self._next_iteration, self.group_index)
                    self._ahead_at = self._next_iteration
                self._add_iteration(self._next_iteration, next(self._ahead))
                self._next_iteration += 1
                self._ahead_at += 1
        self.interpreter.run_segment(segment, self._data)
        self._drop_iteration(step)
        if step + 1 == self.stream_end and step + 1 < config.training.steps:
            self._adapt(step + 1)
        local = sum(self.stage.take_losses())
        # not waited here: a blocking all-reduce would drain the stream at every step
        return global_mean_loss(local, config.plan.dp * config.plan.microbatches, self.ctx.device, group=self._loss_group,
                                wait=False)

    # -- run-time adaptation --------------------------------------------------------
    def _measured(self) -> dict[str, Any]:
        """What this rank measured since the last decision: median forward, backward (I + W when split) and step
        times, the largest
        micro-batch's saved activations, and its stage's weight and optimizer-state bytes."""
        times = {op: statistics.median(v) if v else 0.0 for op, v in self.interpreter.compute_ms.items()}
        state = [t for st in self._optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        for v in self.interpreter.compute_ms.values():
            v.clear()
        backward = times[Op.BACKWARD] or times[Op.BACKWARD_INPUT] + times[Op.BACKWARD_WEIGHT]  # fused, or split
        return {"stage": self.stage.index, "forward_ms": times[Op.FORWARD], "backward_ms": backward,
                "step_ms": times[Op.STEP],
                "activation_bytes": self.weights.peaks["microbatch_activations"],
                "param_bytes": sum(p.numel() * p.element_size() for p in self.weights.params),
                "optimizer_bytes": sum(t.numel() * t.element_size() for t in state if t.dim() > 0)}

    def _adapt(self, start: int) -> None:
        """At the end of a stream (drained): share the measurements, re-decide the depths and mode for the next
        steps (every rank decides the same from the same numbers), and queue that stream. A stream drains at its
        end, so while decisions change nothing the next one comes twice as late; a change brings the interval back
        to ``adapt_every``."""
        from ...scheduling.adaptive import adapt_inflight
        from ...scheduling.stagecosts import StageCosts

        self.interpreter.finish()
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self._measured(), group=self._adapt_group)
        plan, spec = self.config.plan, self.config.plan.pipeline
        per_stage = [[g for g in gathered if g["stage"] == s] for s in range(plan.pp)]
        mean = lambda rows, key: sum(r[key] for r in rows) / len(rows)  # noqa: E731  (over the pipelines)
        costs = StageCosts(
            forward_ms=tuple(mean(r, "forward_ms") for r in per_stage),
            backward_ms=tuple(mean(r, "backward_ms") for r in per_stage),
            send_bytes=tuple(self._send_bytes[:-1]) + (0,),
            param_bytes=tuple(max(g["param_bytes"] for g in r) for r in per_stage),
            grad_bytes=tuple(max(g["param_bytes"] for g in r) for r in per_stage),
            optimizer_bytes=tuple(max(g["optimizer_bytes"] for g in r) for r in per_stage),
            activation_bytes=tuple(max(g["activation_bytes"] for g in r) for r in per_stage),
            step_ms=tuple(mean(r, "step_ms") for r in per_stage))
        cap = int(spec.memory_cap_mb * 2**20) if spec.memory_cap_mb else None
        decision = adapt_inflight(costs, plan.microbatches, inflight=tuple(self.inflight), mode=self.mode,
                                  configured_mode=spec.mode, memory_cap_bytes=cap)
        record = {"step": start, "inflight_from": list(self.inflight), "inflight_to": list(decision.inflight),
                  "mode_from": self.mode, "mode_to": decision.mode, "changed": decision.changes(self.inflight,
                                                                                                self.mode),
                  "predicted_ms": decision.iteration_ms, "reason": decision.reason, "at": time.time(),
                  "measured": {"forward_ms": list(costs.forward_ms), "backward_ms": list(costs.backward_ms),
                               "activation_bytes": list(costs.activation_bytes)}}
        self.adaptations.append(record)
        self._records.append(record)
        self.inflight, self.mode = tuple(decision.inflight), decision.mode
        self._interval = spec.adapt_every if record["changed"] else 2 * self._interval
        end = min(start + self._interval, self.config.training.steps)
        actions = self._stream(start, end)
        self.weights.add_uses(actions)
        self.interpreter.extend(actions)
        self.segments += self._segments(actions)
        self.stream_end = end

    def take_records(self) -> list[tuple[str, dict[str, Any]]]:
        """Run events to write (``adapt``: each re-decision of the depths and mode), once each."""
        out, self._records = [("adapt", r) for r in self._records], []
        return out

    def modules(self) -> dict[str, nn.Module]:
        return {f"stage{self.stage.index}": self.block.inner}

    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def take_events(self) -> tuple[list[Event], float]:
        return self.interpreter.take_events(), self.interpreter.t0_unix

    def memory_report(self) -> dict[str, Any]:
        """Measured peaks of this rank's stage: saved activations, stashed versions, both, versions held."""
        return {"stage": self.stage.index, "inflight": list(self.inflight), "mode": self.mode,
                "adaptations": [{k: v for k, v in a.items() if k != "measured"} for a in self.adaptations],
                **self.weights.peaks}

    def close(self) -> None:
        self.interpreter.finish()
        run_dir = self.config.run.dir or os.environ.get("WORKBENCH_RUN_DIR", "")  # the launcher names it
        if run_dir:
            folder = Path(run_dir) / "memory"
            folder.mkdir(exist_ok=True)
            (folder / f"rank{self.ctx.rank}.json").write_text(json.dumps(self.memory_report()) + "\n")
