"""Planning (pure Python), in four sub-packages, each importing only those listed after it:
``strategy`` (the strategy space and the search that ranks it), ``layerwise`` (per-layer plans of a
stage), ``costs`` (cluster presets, estimates, calibration) and ``partitioning`` (AMPA, baselines,
placement). The names below are the room's public ones."""

from .costs.clusters import cluster_names, get_cluster, load_cluster
from .costs.compute_scaling import RuntimeCalibration
from .costs.estimate import Estimate, estimate, project
from .costs.run_calibration import calibrate_from_run
from .costs.tensor_costs import TransformerShape
from .partitioning.ampa import PartitionResult, SearchCandidate, search
from .partitioning.partitioners import partition
from .strategy.request import Budget, SearchOptions, Workload
from .strategy.search import PlanResult, RankedPlan, plan, transformer_shape
from .strategy.space import check_plan, enumerate_strategies
