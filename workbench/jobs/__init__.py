"""Launching, monitoring and reattaching to runs (no torch)."""
