"""Per-layer measurement of time, FLOPs and memory into core.costs (torch, never torch.distributed).

``profile(model, batch)`` measures a layer chain on this machine (``profile_sizes(model, sizes)``: at
several batch sizes, fitted so its times follow the batch);
:mod:`~workbench.profiling.projection` projects the result to devices you do
not have (:mod:`~workbench.profiling.devices` holds their specs).
"""

__all__ = ["profile", "profile_sizes", "count_flops", "measure_step_ms"]


def __getattr__(name: str):
    """The measuring functions, imported with torch when first asked for: the cache, the projection and the
    zoo profiles' index (:mod:`.zoo_profiles`) import without it, so a planner with its profile cached starts
    in a fraction of a second."""
    if name in __all__:
        from .batch_profiles import profile_sizes
        from .profiler import count_flops, measure_step_ms, profile

        return {"profile": profile, "profile_sizes": profile_sizes, "count_flops": count_flops,
                "measure_step_ms": measure_step_ms}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
