"""Partitioning (AMPA and baselines), strategy space, estimates and search (pure Python)."""

from .ampa import PartitionResult, SearchCandidate, search
from .clusters import cluster_names, get_cluster, load_cluster
from .compute_scaling import RuntimeCalibration
from .estimate import Estimate, estimate, project
from .partitioners import partition
from .run_calibration import calibrate_from_run
from .search import PlanResult, RankedPlan, plan, transformer_shape
from .space import check_plan, enumerate_strategies
from .tensor_costs import TransformerShape
