"""Partitioning: cut a profiled model into pipeline stages and put the stages on devices.

AMPA, the exact partitioner by performance projection, and its outer search over groups x stages
(``ampa``); the baseline partitioners and manual partitions behind one entry point (``partitioners``);
topology-aware placement of (replica, stage) pairs on a cluster's nodes (``placement``). The bottom of
the planning room: it imports only ``core`` and ``scheduling``.
"""
