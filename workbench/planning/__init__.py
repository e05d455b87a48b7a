"""Partitioning (AMPA and baselines), strategy space, estimates and search (pure Python)."""

from .ampa import PartitionResult, SearchCandidate, search
from .clusters import cluster_names, get_cluster
from .partitioners import partition
