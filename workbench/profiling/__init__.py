"""Per-layer measurement of time, FLOPs and memory into core.costs (torch, never torch.distributed).

``profile(model, batch)`` measures a layer chain on this machine (``profile_sizes(model, sizes)``: at
several batch sizes, fitted so its times follow the batch);
:mod:`~workbench.profiling.projection` projects the result to devices you do
not have (:mod:`~workbench.profiling.devices` holds their specs).
"""

from .batch_profiles import profile_sizes
from .profiler import count_flops, measure_step_ms, profile

__all__ = ["profile", "profile_sizes", "count_flops", "measure_step_ms"]
