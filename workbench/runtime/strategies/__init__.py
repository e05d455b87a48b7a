"""Parallel strategies run by the runtime: pipelines and GroPipe, async pipeline, 2D tensor parallel, DDP."""
