"""Pipeline kinds: one spec class each, registered by its kind.

Problem. Every room needs to know things about a pipeline schedule: the
parser its name, the config its fields, the planner which variants to try,
the runtime which strategy runs it, the memory model how many weight copies
it keeps. Written as ``isinstance`` ladders in each room, a new schedule
touched a dozen files and nothing listed them.

Approach. A pipeline kind is a frozen dataclass deriving from
:class:`PipelineSpec`. The class carries its fields (validated at
construction), its name token and parse rule, the checks it makes on a
whole plan, and a few class attributes the rooms read (``family``,
``runtime``, ``replicated``, ``split_backward``, ...). :func:`register_kind`
adds it to :data:`PIPELINE_KINDS`, the one table rooms consult; the kind's
generator is bound to it in ``workbench.scheduling.registry`` (one line),
which is also where a plan becomes its schedule. Adding a kind is that
spec, that generator and that line; the built-in kinds are defined here in
the same way as a user's own (``workbench.scheduling.registry.register``).

The kinds live in modules by family: :mod:`.flushed` (no pipeline,
GPipe, 1F1B, interleaved), :mod:`.zero_bubble` (ZB-H1, ZB-H2, ZB-V,
DualPipeV, zb-auto), :mod:`.replicated` (GroPipe, the asynchronous
pipeline) and :mod:`.torch_pipelining`; :mod:`.base` holds the spec class
and the table. They are imported below in the order they register, which
is the order of :data:`PIPELINE_KINDS`.

Standard library only.
"""

from .base import (PIPELINE_KINDS, OnePipeline, PipelineSpec, inner_kinds, pipeline_from_dict, pipeline_to_dict,
                   plan_error, register_kind)
from .flushed import GPipe, Interleaved, NoPipeline, OneFOneB
from .zero_bubble import DualPipeV, ZBAuto, ZBH1, ZBH2, ZBV
from .replicated import AsyncPipeline, GroPipe
from .torch_pipelining import TORCH_SCHEDULES, TorchPipelining

__all__ = [
    "PipelineSpec", "OnePipeline", "PIPELINE_KINDS", "register_kind", "plan_error", "pipeline_from_dict",
    "pipeline_to_dict", "NoPipeline", "GPipe", "OneFOneB", "Interleaved", "ZBH1", "ZBH2", "ZBV", "DualPipeV", "ZBAuto",
    "GroPipe", "AsyncPipeline", "TorchPipelining", "inner_kinds",
]
