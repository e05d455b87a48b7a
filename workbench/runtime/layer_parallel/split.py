"""Data-parallel layers under a split backward: FSDP2 modules whose gradients come from I and W passes.

Problem. A zero-bubble schedule runs a stage's backward as two passes: the
input gradient (I) when the previous stage waits for it, the weight
gradients (W) later, in a bubble (:class:`~workbench.models.split_backward.SplitBackward`).
Both passes are ``torch.autograd.grad`` calls from the middle of the graph.
FSDP2 (``fully_shard`` and its ``replicate``) reduces gradients from hooks
that a whole ``.backward()`` fires: its post-backward hook runs when the
gradient reaches the layer's *input*, which in a split backward is during I,
before W has produced the weight gradients; and the graph's leaves are
FSDP's *unsharded* parameters, not the module's (sharded) ones.

Approach (what torch's own pipelining does around its split backward, per
micro-batch here so that sharded gradients never accumulate unsharded):

* during the step every data-parallel module of a split stage runs with
  gradient sync, resharding after backward and "last backward" off, so the
  hooks that I (and the first stage's whole-backward W) fire only
  accumulate, into the unsharded parameters' ``.grad``;
* I and W differentiate the unsharded parameters (:meth:`DataParallelModules.parameters`);
* before W, every module is unsharded again (:meth:`DataParallelModules.unshard`): a forward of
  a later micro-batch may have freed an ``fsdp`` layer's gathered weights
  since I ran, and W reads tensors that share their storage;
* after W the module's gradients are reduced by calling FSDP's
  post-backward by hand (:meth:`DataParallelModules.reduce`), then its final callback: sharded
  layers (``fsdp``, ``zero2``) after every W, as they reduce-scatter every
  micro-batch under a whole backward; replicated layers after the stage's
  last W of the iteration, as DDP all-reduces once. FSDP takes the
  unsharded gradient, reduces it into the sharded one and clears it, so
  reducing after some W's and not others never counts a gradient twice.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DataParallelModules"]


def _state(module: nn.Module):
    return module._get_fsdp_state()  # type: ignore[operator]


class DataParallelModules:
    """One split stage's FSDP2 modules (``(module, dp kind)``), driven through its I and W passes."""

    def __init__(self, modules: list[tuple[nn.Module, str]]) -> None:
        self.modules = modules
        for module, _ in modules:
            self._set(module, False, False)

    @staticmethod
    def _set(module: nn.Module, sync: bool, reshard: bool) -> None:
        module.set_requires_gradient_sync(sync)  # type: ignore[operator]
        module.set_reshard_after_backward(reshard)  # type: ignore[operator]
        module.set_is_last_backward(sync)  # type: ignore[operator]

    def parameters(self) -> list[torch.Tensor]:
        """What I and W differentiate: FSDP's unsharded parameters, the leaves of the graph a forward built."""
        out: list[torch.Tensor] = []
        for module, _ in self.modules:
            for group in _state(module)._fsdp_param_groups:
                out += [p.unsharded_param for p in group.fsdp_params if hasattr(p, "_unsharded_param")]
        return out

    def unshard(self) -> None:
        """Gather every module's parameters (a no-op where they are gathered)."""
        for module, _ in self.modules:
            module.unshard()  # type: ignore[operator]

    def reduce(self, last: bool) -> None:
        """After a W: reduce the sharded modules' gradients, and the replicated ones' on the stage's ``last`` W."""
        for module, kind in self.modules:
            if kind != "replicate" or last:
                self._reduce(module, reshard=kind == "fsdp" or last)

    def _reduce(self, module: nn.Module, reshard: bool) -> None:
        self._set(module, True, reshard)
        state = _state(module)
        for inner in state._state_ctx.all_states:
            for group in inner._fsdp_param_groups:
                group.post_backward()
        state._root_post_backward_final_callback()
        self._set(module, False, False)
