"""Evaluation during training: validation loss and accuracy (or perplexity) every ``eval_every`` steps.

Problem. Strategies compare on time to accuracy, not on loss alone, but no
rank of a pipelined or sharded run holds the whole model, and the training
modules are shared with the strategy (switching them to eval mode, or
running extra forwards through them, would disturb training).

Approach. Every rank takes part: each hands its parameters and buffers
under dense-model names (:meth:`Strategy.param_state`,
:meth:`Strategy.buffer_state`) to rank 0 with ``gather_object`` on a gloo
group of its own, created at start on every rank, so the gather cannot
interleave with the sends and receives a pipeline keeps in flight on the
default group. Rank 0 loads them into its own copy of the model (built once,
never trained) and runs the validation batches
(:func:`~workbench.runtime.batches.validation_batches`) in eval mode under
``no_grad``; a barrier on the same group then releases the other ranks, so
no rank's next step time includes the evaluation. Rank 0 writes an ``eval``
event: ``step``, ``val_loss``, ``accuracy`` (top-1 for a classifier's
``[B, C]`` output; token accuracy for a language model's ``[B, T, V]``,
targets ``-100`` ignored), ``perplexity`` (``exp`` of the mean token loss,
language models only), ``samples``, ``tokens``, ``eval_s``, ``train_s``
(the step times so far, evaluations excluded) and ``wall_s`` (since
training began). A resumed run carries both clocks over from the events its
earlier attempt wrote up to the checkpoint it resumed from.

The global RNG is left as it was (the evaluation copy is built, and the
validation loader iterated, inside ``fork_rng``), so a run that evaluates
trains exactly as one that does not.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..core.config import RunConfig
from .batches import run_model, validation_batches
from .events import EventWriter, read_events

__all__ = ["Evaluation", "evaluate_model", "load_dense_state", "prior_times"]


@torch.no_grad()
def evaluate_model(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                   device: torch.device | str = "cpu") -> dict[str, Any]:
    """Mean validation loss and accuracy (or perplexity and token accuracy) of ``model`` in eval mode.

    A classifier (output ``[B, C]``, integer targets ``[B]``) reports top-1
    ``accuracy``; a language model (``[B, T, V]``, targets ``[B, T]``)
    reports ``perplexity`` = exp(mean token loss) and token ``accuracy``;
    any other output reports the model's own ``loss_fn`` per sample only.
    """
    was_training = model.training
    model.eval()
    loss_sum, correct, samples, tokens, kind = 0.0, 0, 0, 0, "other"
    try:
        for x, y in batches:
            out = model(x.to(device)).float()  # [B, C] or [B, T, V]
            y = y.to(device)
            samples += x.shape[0]
            if out.dim() == 3 and y.dim() == 2 and not y.is_floating_point():
                kind = "lm"
                logits, target = out.reshape(-1, out.shape[-1]), y.reshape(-1)  # [B*T, V], [B*T]
                kept = target != -100
                loss_sum += float(F.cross_entropy(logits, target, ignore_index=-100, reduction="sum"))
                correct += int((logits.argmax(-1) == target)[kept].sum())
                tokens += int(kept.sum())
            elif out.dim() == 2 and y.dim() == 1 and not y.is_floating_point():
                kind = "classifier"
                loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
                correct += int((out.argmax(-1) == y).sum())
            else:
                loss_sum += float(model.loss_fn(out, y)) * x.shape[0]
    finally:
        model.train(was_training)
    if kind == "lm":
        mean = loss_sum / max(tokens, 1)
        return {"val_loss": mean, "accuracy": correct / max(tokens, 1), "perplexity": math.exp(min(mean, 700.0)),
                "samples": samples, "tokens": tokens}
    return {"val_loss": loss_sum / max(samples, 1), "accuracy": correct / samples if kind == "classifier" and samples
            else None, "perplexity": None, "samples": samples, "tokens": None}


def load_dense_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy parameters and buffers named as in ``model`` into it; a missing one is an error, not a default."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    missing = sorted(name for name, _ in named if name not in state)
    if missing:
        raise ValueError(f"evaluation: the ranks gave no value for {len(missing)} of the model's parameters and "
                         f"buffers, e.g. {missing[:4]}; the strategy's param_state/buffer_state must cover the "
                         f"dense model")
    with torch.no_grad():
        for name, tensor in named:
            tensor.copy_(state[name].to(tensor.dtype))


def prior_times(run_dir: str | Path, rank: int, resumed_from: int) -> tuple[float, float]:
    """Training and wall seconds an earlier attempt spent up to step ``resumed_from`` (from its events)."""
    events = read_events(run_dir, rank)
    step_ms: dict[int, float] = {}
    reached: dict[int, float] = {}
    for e in events:
        if e.get("kind") == "step" and isinstance(e.get("step"), int) and e["step"] <= resumed_from:
            step_ms[e["step"]] = float(e.get("step_ms") or 0.0)
            reached[e["step"]] = float(e["t"])
    starts = [float(e["t"]) for e in events if e.get("kind") == "start"]
    train_s = sum(step_ms.values()) / 1e3
    wall_s = reached[resumed_from] - starts[0] if resumed_from in reached and starts else train_s
    return train_s, max(wall_s, train_s)


class Evaluation:
    """Every rank builds one; :meth:`after_step` evaluates when ``step`` is due (a collective on its own group)."""

    def __init__(self, config: RunConfig, strategy, writer: EventWriter, device: torch.device, *,
                 board=None, run_dir: str | Path | None = None, resumed_from: int | None = None) -> None:
        self.config, self.strategy, self.writer, self.device, self.board = config, strategy, writer, device, board
        self.rank = dist.get_rank()
        self.group = dist.new_group(backend="gloo")  # every rank, same order: out of the pipeline's traffic
        self.train_s, self.wall_offset_s = 0.0, 0.0
        if resumed_from and run_dir is not None and self.rank == 0:
            self.train_s, self.wall_offset_s = prior_times(run_dir, self.rank, resumed_from)
        self.started = time.perf_counter()
        self.model: nn.Module | None = None
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        if self.rank == 0:
            with torch.random.fork_rng(devices=[]):
                self.model = run_model(config).to(device)
        self.results: list[dict[str, Any]] = []

    def due(self, step: int) -> bool:
        every = self.config.evaluation.every
        return every > 0 and (step % every == 0 or step == self.config.training.steps)

    def after_step(self, step: int, step_s: float) -> dict[str, Any] | None:
        """Count a finished step's time; evaluate if ``step`` (steps done) is due. Returns rank 0's result."""
        self.train_s += step_s
        return self.evaluate(step) if self.due(step) else None

    def evaluate(self, step: int) -> dict[str, Any] | None:
        state = {**self.strategy.param_state(), **self.strategy.buffer_state()}  # a collective for some strategies
        gathered: list[Any] | None = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(state, gathered, dst=0, group=self.group)
        result = None
        if self.rank == 0:
            result = self._evaluate_on_rank0(step, gathered)
        dist.barrier(group=self.group)  # no rank starts its next step (and its clock) before rank 0 is done
        return result

    def _evaluate_on_rank0(self, step: int, gathered: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
        began = time.perf_counter()
        merged: dict[str, torch.Tensor] = {}
        for state in gathered:
            merged.update(state)
        load_dense_state(self.model, merged)
        with torch.random.fork_rng(devices=[]):
            if self.batches is None:
                self.batches = list(validation_batches(self.config, self.model))
            metrics = evaluate_model(self.model, self.batches, self.device)
        eval_s = time.perf_counter() - began
        wall_s = self.wall_offset_s + (began - self.started)
        result = {"step": step, **metrics, "eval_s": eval_s, "train_s": self.train_s, "wall_s": wall_s}
        self.writer.write("eval", **result)
        if self.board is not None:
            self.board.evaluation(step, metrics)
        self.results.append(result)
        return result
