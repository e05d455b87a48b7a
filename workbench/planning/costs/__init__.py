"""The cost model: what one strategy costs on one cluster, and the numbers it is built from.

Cluster presets and cluster files (``clusters``); one strategy's estimate, simulated or projected
(``estimate``); the tensor-parallel closed forms (``tensor_costs``); runtime calibration, measured from
runs (``run_calibration``) into the factors estimates scale compute by (``compute_scaling``). Above
``partitioning`` (an estimate partitions with AMPA and places stages), below the searches.
"""
