"""Partitioning (AMPA and baselines), strategy space, estimates and search (pure Python)."""

from .ampa import PartitionResult, SearchCandidate, search
from .calibrate import RuntimeCalibration, calibrate_from_run
from .clusters import cluster_names, get_cluster, load_cluster
from .estimate import Estimate, estimate, project
from .partitioners import partition
from .search import Plan, PlanResult, plan, transformer_shape
from .space import Strategy, enumerate_strategies
from .tensor_costs import TransformerShape
