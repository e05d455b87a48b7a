"""Ranks that share a GPU: every collective and message staged through host memory.

NCCL refuses two ranks on one GPU, and gloo, the backend that remains,
sends and receives CPU tensors only (and covers few collectives for CUDA
tensors). So a pipeline, a tensor-parallel grid or a sharded layer cannot
run on fewer GPUs than ranks with either backend as it is.

The approach: a process-group backend of our own, ``staged``, registered
with ``torch.distributed``. It wraps a gloo backend; each operation copies
its tensors into host buffers (pinned when they come from a GPU), runs the
gloo operation on them, and copies the results back into the caller's
tensors when the work completes (``wait`` or ``get_future``). Everything
above it (DDP's reducer, FSDP2, DTensor's functional collectives, torch's
pipelining, our interpreter's ``isend``/``irecv``) sees an ordinary process
group, so every strategy runs unchanged. CPU tensors take exactly the same
path (host copies of host tensors), which is how ``dist_backend = "staged"``
tests this code without a GPU.

The copies are synchronous on the caller's current stream: the device-to-
host copy waits for the kernels that produced the tensor, and the result is
on the device before ``wait`` returns, so no stream or event bookkeeping can
go wrong. Work that returns futures (DDP's communication hook) completes
when the future is asked for. CUDA IPC would skip the host, but it needs a
handshake per buffer; ``bench/bench_gpu.py`` measures the staged path.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllgatherOptions, AllToAllOptions, BarrierOptions, GatherOptions,
                                        ReduceScatterOptions, ScatterOptions)

__all__ = ["STAGED_BACKEND", "register_staged_backend", "StagedProcessGroup"]

STAGED_BACKEND = "staged"


class _Staging:
    """The host buffers of one operation, and which of them go back to the caller's tensors when it is done."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []
        self.results: list[tuple[torch.Tensor, torch.Tensor]] = []  # (caller's tensor, host buffer)

    def host(self, tensor: torch.Tensor, *, fill: bool = True, result: bool = False) -> torch.Tensor:
        buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=tensor.is_cuda)
        if fill:
            buffer.copy_(tensor.detach())  # waits for the current stream's kernels that wrote a CUDA tensor
        self.buffers.append(buffer)
        if result:
            self.results.append((tensor, buffer))
        return buffer

    def hosts(self, tensors: Sequence[torch.Tensor], **kwargs: bool) -> list[torch.Tensor]:
        return [self.host(t, **kwargs) for t in tensors]

    def copy_back(self) -> None:
        with torch.no_grad():
            for tensor, buffer in self.results:
                tensor.copy_(buffer)
        self.buffers.clear()
        self.results.clear()


class StagedWork(dist.Work):
    """gloo works on host buffers; completing them copies the results back to the caller's tensors."""

    def __init__(self, works: list[Any], staging: _Staging, result: Any) -> None:
        super().__init__()
        self._works, self._staging, self._result = works, staging, result
        self._done = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        if not self._done:
            for work in self._works:
                work.wait() if not timeout else work.wait(timeout)
            self._staging.copy_back()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done

    def result(self) -> Any:
        return self._result

    def get_future(self) -> torch.futures.Future:
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._result)
        return future

    def source_rank(self) -> int:
        return self._works[0].source_rank()


class _BackendFacts:
    """What torch asks of a group's backend object: the staged group coalesces, allocates and splits nothing."""

    supports_coalescing = False
    supports_splitting = False
    supports_time_estimate = False

    def supports_tensor_alloc(self, device: Any) -> bool:
        return False

    def name(self) -> str:
        return STAGED_BACKEND


class StagedProcessGroup(dist.ProcessGroup):
    """A process group whose every operation runs on gloo over host copies of its tensors."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout: timedelta) -> None:
        super().__init__(rank, world_size)
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore(STAGED_BACKEND, store), rank, world_size, timeout)
        self._rank, self._world_size = rank, world_size
        self._group_name = ""

    # -- identity -------------------------------------------------------------------------------------------------

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._world_size

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return STAGED_BACKEND

    def _set_group_name(self, name: str) -> None:
        self._group_name = name
        super()._set_group_name(name)

    @property
    def group_name(self) -> str:
        return self._group_name

    def _get_backend(self, device: Any) -> _BackendFacts:
        return _BackendFacts()

    def __repr__(self) -> str:
        return f"StagedProcessGroup(rank={self._rank}, size={self._world_size}, over gloo)"

    # -- one pattern for every operation ---------------------------------------------------------------------------

    def _in_place(self, name: str, tensors: list[torch.Tensor], opts: Any, *, reads: bool = True,
                  writes: bool = True) -> StagedWork:
        """Operations that read and write the same tensors (all-reduce, broadcast, reduce); ``reads`` and
        ``writes`` say whether this rank's tensors go in and come back (a broadcast's root only sends)."""
        staging = _Staging()
        buffers = staging.hosts(tensors, fill=reads, result=writes)
        return StagedWork([getattr(self._gloo, name)(buffers, *_opts(opts))], staging, tensors)

    def _lists_out(self, name: str, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                   opts: Any) -> StagedWork:
        """Operations that write lists of tensors from tensors (all-gather, gather)."""
        staging = _Staging()
        host_out = [staging.hosts(row, fill=False, result=True) for row in outputs]
        return StagedWork([getattr(self._gloo, name)(host_out, staging.hosts(inputs), opts)], staging, outputs)

    def _lists_in(self, name: str, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                  opts: Any) -> StagedWork:
        """Operations that write tensors from lists of tensors (scatter, reduce-scatter)."""
        staging = _Staging()
        host_in = [staging.hosts(row) for row in inputs]
        host_out = staging.hosts(outputs, fill=False, result=True)
        return StagedWork([getattr(self._gloo, name)(host_out, host_in, opts)], staging, outputs)

    def _flat(self, name: str, outputs: list[torch.Tensor], inputs: list[torch.Tensor], *rest: Any) -> StagedWork:
        """Operations from one input tensor into one output tensor, pair by pair (coalesced ones: a list)."""
        staging = _Staging()
        works = [getattr(self._gloo, name)(staging.host(out, fill=False, result=True), staging.host(inp), *rest)
                 for out, inp in zip(outputs, inputs, strict=True)]
        return StagedWork(works, staging, outputs if len(outputs) > 1 else outputs[0])

    # -- the operations (torch calls each by one of two names: its Python one and its C++ one) ----------------------

    def allreduce(self, tensors, opts=None):
        return self._in_place("allreduce", tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._in_place("allreduce_coalesced", tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = self._rank == (opts.rootRank if opts is not None else 0)
        return self._in_place("broadcast", tensors, opts, reads=root, writes=not root)

    def reduce(self, tensors, opts=None):
        root = self._rank == (opts.rootRank if opts is not None else 0)
        return self._in_place("reduce", tensors, opts, writes=root)  # the other ranks' tensors are undefined after

    def allgather(self, output_lists, inputs, opts=None):
        return self._lists_out("allgather", output_lists, inputs, _opt(opts, AllgatherOptions))

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self._lists_out("allgather_coalesced", output_lists, inputs, _opt(opts, AllgatherOptions))

    def gather(self, output_lists, inputs, opts=None):
        return self._lists_out("gather", output_lists, inputs, _opt(opts, GatherOptions))

    def scatter(self, outputs, input_lists, opts=None):
        return self._lists_in("scatter", outputs, input_lists, _opt(opts, ScatterOptions))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        return self._lists_in("reduce_scatter", outputs, input_lists, _opt(opts, ReduceScatterOptions))

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's name
        return self._flat("_allgather_base", [output], [input], _opt(opts, AllgatherOptions))

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._flat("_allgather_base", outputs, inputs, _opt(opts, AllgatherOptions))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002 - torch's name
        return self._flat("_reduce_scatter_base", [output], [input], _opt(opts, ReduceScatterOptions))

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._flat("_reduce_scatter_base", outputs, inputs, _opt(opts, ReduceScatterOptions))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def alltoall(self, outputs, inputs, opts=None):
        staging = _Staging()
        host_out = staging.hosts(outputs, fill=False, result=True)
        return StagedWork([self._gloo.alltoall(host_out, staging.hosts(inputs), _opt(opts, AllToAllOptions))],
                          staging, outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        return self._flat("alltoall_base", [output], [input], output_split_sizes, input_split_sizes,
                          _opt(opts, AllToAllOptions))

    all_to_all_single = alltoall_base

    def send(self, tensors, dst, tag=0):
        staging = _Staging()
        return StagedWork([self._gloo.send(staging.hosts(tensors), dst, tag)], staging, tensors)

    def recv(self, tensors, src, tag=0):
        staging = _Staging()
        return StagedWork([self._gloo.recv(staging.hosts(tensors, fill=False, result=True), src, tag)], staging,
                          tensors)

    def recv_anysource(self, tensors, tag=0):
        staging = _Staging()
        return StagedWork([self._gloo.recv_anysource(staging.hosts(tensors, fill=False, result=True), tag)], staging,
                          tensors)

    def barrier(self, opts=None):
        return StagedWork([self._gloo.barrier(_opt(opts, BarrierOptions))], _Staging(), None)


def _opt(opts: Any, kind: type) -> Any:
    return kind() if opts is None else opts


def _opts(opts: Any) -> tuple:
    return () if opts is None else (opts,)


def _create(store: Any, rank: int, world_size: int, timeout: timedelta) -> StagedProcessGroup:
    return StagedProcessGroup(store, rank, world_size, timeout)


def register_staged_backend() -> None:
    """Make ``init_process_group("staged")`` and ``new_group`` under it build a :class:`StagedProcessGroup`."""
    if STAGED_BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(STAGED_BACKEND, _create, devices=["cpu", "cuda"])
