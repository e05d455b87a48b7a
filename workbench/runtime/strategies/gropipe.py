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

Gradients travel as one flat buffer per stage (sum, then divided by G).
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

    def _on_all_reduce(self, action: Action) -> int:
        """Start this stage's gradient all-reduce; returns the bytes reduced (recorded on the event)."""
        # flat: [sum of this stage's parameter sizes]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self._params])
        work = None
        if self._num_groups > 1:
            work = dist.all_reduce(flat, group=self._dp_group, async_op=True)
        self._pending[self._iteration_of(action)] = (work, flat)
        for p in self._params:
            p.grad = None
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
        offset = 0
        for p in self._params:
            n = p.numel()
            p.grad = (flat[offset:offset + n] / self._num_groups).view_as(p).to(p.dtype)
            offset += n
        self.optimizer().step()
        self.optimizer().zero_grad(set_to_none=True)

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
