"""Partitioning (AMPA and baselines), strategy space, estimates and search (pure Python)."""

from .ampa import PartitionResult, SearchCandidate, search
from .calibrate import calibrate_from_run
from .calibration import RuntimeCalibration
from .clusters import cluster_names, get_cluster, load_cluster
from .estimate import Estimate, estimate, project
from .partitioners import partition
from .search import Plan, PlanResult, plan, transformer_shape
from .space import check_plan, enumerate_strategies
from .tensor_costs import TransformerShape
