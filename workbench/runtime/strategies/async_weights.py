"""Weight versions of one asynchronous pipeline stage: which version each micro-batch binds, which are kept.

A forward binds the version it is told to use as fresh leaf tensors over
that version's storage (``torch.func.functional_call``); a step keeps the
current version's storage while a later forward or backward still uses it;
a version is freed after its last use. See :mod:`.async_pipeline`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn
from torch.func import functional_call

from ...core.ir import Action, Op

__all__ = ["StageWeights", "VersionedBlock"]


class VersionedBlock(nn.Module):
    """A stage's layers; runs with the weight version bound for the current micro-batch, if any."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.bound: dict[str, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bound is None:
            return self.inner(x)
        return functional_call(self.inner, self.bound, (x,))


@dataclass
class StageWeights:
    """The weight versions one stage keeps, and which micro-batch is bound to which.

    ``uses[v]`` counts the forwards and backwards of the stream that still
    name version ``v``; a version's storage is kept past a step while that
    count is positive (when stashing) and dropped after its last use.
    """

    block: VersionedBlock
    stash: bool
    uses: dict[int, int]
    current: int = 0
    kept: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    bound: dict[int, tuple[int, list[torch.Tensor]]] = field(default_factory=dict)  # micro-batch -> (version, leaves)
    activation_bytes: dict[int, int] = field(default_factory=dict)  # micro-batch -> saved bytes
    peaks: dict[str, int] = field(default_factory=lambda: {"activations": 0, "stashed_weights": 0, "total": 0,
                                                           "versions": 1, "microbatch_activations": 0})

    def __post_init__(self) -> None:
        self.names = [n for n, p in self.block.inner.named_parameters() if p.requires_grad]
        self.params = [p for p in self.block.inner.parameters() if p.requires_grad]

    def add_uses(self, actions: list[Action]) -> None:
        """Count the forwards and backwards of more of the stream (a later segment of the run); a split
        backward's use ends with its weight gradients (W), which read the version as its I did."""
        for a in actions:
            if a.op in (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_WEIGHT):
                self.uses[a.version] = self.uses.get(a.version, 0) + 1

    def storage(self, version: int) -> list[torch.Tensor]:
        if version == self.current or not self.stash:
            return [p.data for p in self.params]
        if version not in self.kept:
            raise RuntimeError(f"weight version {version} is not kept (kept: {sorted(self.kept)}, newest "
                               f"{self.current}): the schedule uses a version after its last planned use")
        return self.kept[version]

    @contextmanager
    def bind(self, microbatch: int, version: int) -> Iterator[int]:
        """Run the enclosed forward on ``version``; yields the version actually bound."""
        used = version if self.stash else self.current
        leaves = [t.detach().requires_grad_(True) for t in self.storage(used)]
        weight_ptrs = {t.untyped_storage().data_ptr() for t in leaves}
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in weight_ptrs:
                saved[ptr] = t.untyped_storage().nbytes()
            return t

        self.block.bound = dict(zip(self.names, leaves))
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield used
        finally:
            self.block.bound = None
        self.bound[microbatch] = (used, leaves)
        self.activation_bytes[microbatch] = sum(saved.values())
        self.peaks["microbatch_activations"] = max(self.peaks["microbatch_activations"],
                                                   self.activation_bytes[microbatch])
        self._use(version)
        self._note_peak()

    @contextmanager
    def rebound(self, microbatch: int) -> Iterator[None]:
        """Bind the micro-batch's version again for its backward: a recomputing stage replays the forward there,
        and the replay must read (and differentiate) the tensors the forward read, not the newest weights."""
        self.block.bound = dict(zip(self.names, self.leaves(microbatch)))
        try:
            yield
        finally:
            self.block.bound = None

    def leaves(self, microbatch: int) -> list[torch.Tensor]:
        """The tensors the micro-batch's forward bound: what its graph differentiates."""
        return self.bound[microbatch][1]

    def read_version(self, microbatch: int) -> int:
        """The version whose weights the micro-batch's graph reads now."""
        version, leaves = self.bound[microbatch]
        if leaves and leaves[0].data_ptr() == self.params[0].data_ptr():
            return self.current  # the graph holds the live storage, overwritten by every step since
        return version

    def before_backward(self, microbatch: int) -> None:
        """Let the micro-batch's backward accumulate straight into the live gradients: each bound leaf takes its
        parameter's gradient buffer, which autograd then adds to in place (a fresh gradient buffer per
        micro-batch and layer, and a second pass to add it, cost a third of a heavy stage's backward on CPU)."""
        _, leaves = self.bound[microbatch]
        for p, leaf in zip(self.params, leaves):
            if p.grad is not None and leaf.grad is None:
                leaf.grad = p.grad

    def finish_backward(self, microbatch: int, planned: int) -> None:
        """Add the bound leaves' gradients to the live parameters (already there where the backward accumulated
        into them); release the micro-batch's version."""
        _, leaves = self.bound.pop(microbatch)
        self.activation_bytes.pop(microbatch, None)
        for p, leaf in zip(self.params, leaves):
            grad = leaf.grad
            if grad is None or grad is p.grad:
                continue
            p.grad = grad if p.grad is None else p.grad.add_(grad)
        self._use(planned)

    def before_step(self) -> None:
        """Keep the current version's storage when a later forward or backward still uses it."""
        if self.stash and self.uses.get(self.current, 0) > 0 and self.params:
            self.kept[self.current] = [p.data for p in self.params]
            for p in self.params:
                p.data = p.data.clone()
        self.current += 1
        self._note_peak()

    def _use(self, version: int) -> None:
        self.uses[version] -= 1
        if self.uses[version] == 0:
            self.kept.pop(version, None)

    def _note_peak(self) -> None:
        stashed = sum(t.untyped_storage().nbytes() for ts in self.kept.values() for t in ts)
        acts = sum(self.activation_bytes.values())
        for key, value in (("activations", acts), ("stashed_weights", stashed), ("total", acts + stashed),
                           ("versions", 1 + len(self.kept))):
            self.peaks[key] = max(self.peaks[key], value)
