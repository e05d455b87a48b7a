"""Launching, monitoring and reattaching to runs (no torch).

``launch(LaunchSpec(...), backend="local" | "multinode" | "slurm" | "dryrun")``
returns a :class:`Job`; ``launch_sweep([spec, ...])`` trains several runs one
after another in one set of processes and returns one job per run;
``attach(run_dir)`` rebuilds one from its run directory; ``list_runs()`` and
``reap()`` find and clean up leftovers.
"""

from .job import Job, attach, launch, list_runs, reap
from .spec import LaunchSpec, SlurmOptions
from .status import JobStatus, RankStatus
from .sweep import launch_sweep

__all__ = ["LaunchSpec", "SlurmOptions", "launch", "launch_sweep", "Job", "JobStatus", "RankStatus", "attach",
           "list_runs", "reap"]
