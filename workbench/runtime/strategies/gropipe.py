"""GroPipe: G groups of S-stage pipelines with per-stage delayed gradient all-reduce.

Rank ``g * S + s`` runs stage ``s`` of pipeline ``g`` (``Topology(dp=G,
pp=S)``); each group takes 1/G of the global batch. Instead of one
all-reduce over the whole replica, stage ``s`` all-reduces only its own
gradients, across the ``G`` ranks holding stage ``s`` (the ``dp`` process
group of that stage), and it starts that all-reduce asynchronously as soon
as its last backward ends, which the schedule says with an ``sAR`` action
right there. Later stages finish backward first, so their communication
overlaps the earlier stages' remaining backward work.

The ``STEP`` action of iteration ``t`` names the iteration whose gradients it
applies (``Action.iteration``):

* ``delay = 0``: ``t`` itself. The step waits for this iteration's
  all-reduce: exact synchronous data parallelism.
* ``delay = 1``: ``t - 1``. The all-reduce of iteration ``t`` stays in flight
  through iteration ``t + 1``'s pipeline and is applied at its end, so
  ``w_{t+1} = w_t - lr * g_{t-1}``: the communication is hidden behind a
  whole iteration of compute at the price of one step of staleness.

Gradients travel as one flat buffer per stage (sum, then divided by G in
place). The backward accumulates straight into such a buffer: each
parameter's ``.grad`` is a view of it (as DDP's ``gradient_as_bucket_view``),
so the all-reduce starts without gathering the gradients into a new tensor,
and the step reads its views without copying them out again. Buffers are
reused: the one an applied step has read is zeroed and becomes the next
iteration's. Parameters of mixed dtypes or devices gather a fresh buffer at
each all-reduce instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ...core.ir import Action
from ...scheduling.passes import LoweredIterations
from .base import RunContext
from .pipeline import ScheduledPipeline, build_schedule

__all__ = ["GroPipe"]


class GroPipe(ScheduledPipeline):
    """Scheduled pipeline plus per-stage gradient all-reduce across groups, exact or one step late."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.step_after_schedule = False
        self._params = [p for s in self.stages.values() for p in s.parameters()]
        self._sizes = [p.numel() for p in self._params]
        same = len({(p.dtype, p.device) for p in self._params}) == 1
        self._free: list[torch.Tensor] | None = [] if same else None  # zeroed buffers ready for an iteration
        self._accum: torch.Tensor | None = None  # the buffer this iteration's backward accumulates into
        self._accumulate_into_buffer()
        self._dp_group = self.groups.group("dp")
        self._num_groups = self.groups.size("dp")
        # iteration -> (all-reduce handle or None once waited, flat gradient buffer)
        self._pending: dict[int, tuple[dist.Work | None, torch.Tensor]] = {}
        self._current_step = 0
        # lowered once: a delayed update's first iteration differs (no step yet), then each is the last renumbered
        warmup = self.config.plan.pipeline.delay
        self._iterations = LoweredIterations(lambda i: build_schedule(self.config, i, ctx.stage_costs), warmup=warmup)

    def actions_for(self, step: int) -> list[Action]:
        self._current_step = step
        return self._iterations.actions(self.ctx.rank, step)

    def _iteration_of(self, action: Action) -> int:
        return self._current_step if action.iteration is None else action.iteration

    # -- gradient buffers -------------------------------------------------------------
    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [v.view_as(p) for v, p in zip(flat.split(self._sizes), self._params)]

    def _accumulate_into_buffer(self) -> None:
        """Point every ``.grad`` at a zeroed flat buffer, where the next backward accumulates in place."""
        if self._free is None or not self._params:
            return
        if self._free:
            self._accum = self._free.pop()
        else:
            p = self._params[0]
            self._accum = torch.zeros(sum(self._sizes), dtype=p.dtype, device=p.device)
        for p, view in zip(self._params, self._views(self._accum)):
            p.grad = view

    def _gathered(self) -> torch.Tensor:
        """This iteration's gradients as one flat tensor: the buffer itself where every ``.grad`` is still its
        view (the backward accumulated in place), else gathered into a new tensor."""
        flat, self._accum = self._accum, None
        if flat is not None and all(p.grad is not None and p.grad.data_ptr() == v.data_ptr()
                                    for p, v in zip(self._params, self._views(flat))):
            return flat
        # flat: [sum of this stage's parameter sizes]
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self._params])

    def _on_all_reduce(self, action: Action) -> int:
        """Start this stage's gradient all-reduce; returns the bytes reduced (recorded on the event)."""
        flat = self._gathered()
        work = None
        if self._num_groups > 1:
            work = dist.all_reduce(flat, group=self._dp_group, async_op=True)
        self._pending[self._iteration_of(action)] = (work, flat)
        for p in self._params:
            p.grad = None
        self._accumulate_into_buffer()
        return flat.numel() * flat.element_size()

    def _reduced(self, iteration: int) -> torch.Tensor | None:
        entry = self._pending.pop(iteration, None)
        if entry is None:
            return None
        work, flat = entry
        if work is not None:
            work.wait()
        return flat

    def _on_step(self, action: Action) -> None:
        flat = self._reduced(self._iteration_of(action))
        self.interpreter.compute_started()  # the STEP event times the update, not the wait for the all-reduce
        if flat is None:
            raise RuntimeError(f"rank {self.ctx.rank}: {action} applies iteration {action.iteration}'s gradients, "
                               f"but no all-reduce of that iteration was started")
        if self._num_groups > 1:
            flat.div_(self._num_groups)
        accumulating = [p.grad for p in self._params]  # the next iteration's views (None: no buffer)
        for p, view in zip(self._params, self._views(flat)):
            p.grad = view.to(p.dtype)
        self.optimizer().step()
        for p, grad in zip(self._params, accumulating):
            p.grad = grad
        if self._free is not None:  # one dtype and device: the buffer (or the gathered tensor) serves again
            self._free.append(flat.zero_())

    # -- state ------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """The delayed gradients still to apply (waited, so the checkpoint is complete)."""
        pending = {}
        for iteration in list(self._pending):
            pending[str(iteration)] = self._reduced(iteration)
            self._pending[iteration] = (None, pending[str(iteration)])
        return {"pending_grads": pending}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        for iteration, flat in state.get("pending_grads", {}).items():
            self._pending[int(iteration)] = (None, flat.to(self.ctx.device))

    def close(self) -> None:
        for work, _ in self._pending.values():
            if work is not None:
                work.wait()
