"""Per-layer measurement of time, FLOPs and memory into core.costs (torch, never torch.distributed)."""
