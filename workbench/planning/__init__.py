"""Partitioning (AMPA and baselines), strategy space, estimates and search (pure Python)."""
