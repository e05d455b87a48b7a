"""Memory count: saved activations while autograd keeps them, and what a rank holds of its layers.

:class:`SavedActivations` counts the bytes of the tensors autograd keeps for
backward while it is active (live and peak, each storage once, parameters
excluded; a recomputed layer keeps its input), and :func:`local_bytes` /
:func:`held_unsharded_bytes` count what a rank holds of parameters,
gradients, optimizer state and all-gathered FSDP parameters, so a rank's
memory can be counted on any device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .parallelize import ParallelLayer

__all__ = ["SavedActivations", "local_bytes", "held_unsharded_bytes"]


def _local_tensor(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def local_bytes(tensors) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor's local shard; None entries count 0)."""
    return sum(_local_tensor(t).numel() * t.element_size() for t in tensors if t is not None)


class _Held:
    """A tensor saved for backward while counted; its bytes are released when autograd drops it."""

    __slots__ = ("count", "key", "tensor")

    def __init__(self, count: "SavedActivations", key: int, tensor: torch.Tensor) -> None:
        self.count, self.key, self.tensor = count, key, tensor

    def __del__(self) -> None:
        self.count._release(self.key)


class SavedActivations:
    """Bytes of the tensors autograd saves for backward while this counter is active (``with count:``).

    Each storage counts once (a tensor saved by several operations, views of
    one buffer), parameters and views of parameters not at all (they are
    counted as parameters); a DTensor counts its local shard. A saved tensor
    is live from its forward operation until autograd frees it after that
    operation's backward (or when the graph is dropped). ``peak`` is the
    largest live total since :meth:`reset_peak`.
    """

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self._storages: dict[int, list[int]] = {}  # data pointer -> [bytes, tensors held]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    def reset_peak(self) -> None:
        self.peak = self.live

    def _pack(self, t: torch.Tensor) -> Any:
        base = t._base if t._base is not None else t
        if isinstance(base, nn.Parameter):
            return t  # a parameter (or a view of one)
        storage = _local_tensor(t).untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0:
            return t
        entry = self._storages.get(key)
        if entry is None:
            self._storages[key] = [nbytes, 1]
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        else:
            entry[1] += 1
        return _Held(self, key, t)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed

    def _release(self, key: int) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._storages[key]
            self.live -= entry[0]


def held_unsharded_bytes(layers: list[ParallelLayer]) -> int:
    """Bytes of all-gathered FSDP parameters these layers hold right now (their local TP part)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

    total = 0
    for layer in layers:
        if not isinstance(layer.module, FSDPModule):
            continue
        group = layer.module._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        for param in group.fsdp_params:
            if param.sharded_state is ShardedState.UNSHARDED and hasattr(param, "_unsharded_param"):
                local = _local_tensor(param._unsharded_param)
                if local.untyped_storage().nbytes() > 0:
                    total += local.numel() * local.element_size()
    return total
