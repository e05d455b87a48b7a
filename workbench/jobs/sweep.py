"""Several runs in one set of processes: ``launch_sweep([spec, ...])`` returns one :class:`Job` per run.

Problem: a lesson or a comparison often trains three or four plans of the
same size one after another, and each launch pays again for torchrun, the
ranks' imports and the process group: about 15 s of CPU for two ranks on a
laptop-class machine, often more than the training itself.

Approach: the runtime's entry already trains several run configs one after
another in the same processes (``--config`` repeated). ``launch_sweep``
checks every spec as :func:`~workbench.jobs.launch` does, makes one run
directory per spec, starts one torchrun whose ranks train the runs in
order, and records in each run's ``launch.json`` the shared processes and
the sweep's first run, whose directory holds their console logs and exit
codes. A run's job ends when its ranks report their end, while the
processes go on to the next run; a run whose predecessor failed records
that it did not run. Cancelling any of the jobs stops the processes, and
so every run of the sweep not yet finished. The runs must agree on what the
processes are (world size, device, placement, interpreter, environment),
and none may restart or resume: a restart would train the whole sweep again.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterable

from ..core.rundir import CONFIG_FILE
from .backends.local import node_log_dir, start_agents, torchrun_argv
from .job import Job, new_run_dir, record_launch
from .spec import (DEFAULT_ENTRY, LaunchSpec, check_entry_importable, check_launchable, check_run_configs,
                   config_dict)

__all__ = ["launch_sweep"]

# what the runs of a sweep share, because they share the processes
_SHARED = ("nnodes", "nproc_per_node", "entry", "dist_backend", "python")


def launch_sweep(specs: Iterable[LaunchSpec], backend: str = "local", *, check_entry: bool = True) -> list[Job]:
    """Start the runs of ``specs`` one after another in one torchrun on this machine; one job per run.

    Each spec is checked as ``launch`` checks it before anything starts (a
    bad one raises ``ValueError`` naming the field and the run), and the
    specs must agree on what their processes are.
    """
    specs = list(specs)
    if not specs or not all(isinstance(spec, LaunchSpec) for spec in specs):
        raise ValueError("launch_sweep takes a non-empty list of LaunchSpec")
    if backend != "local":
        raise ValueError(f"a sweep runs on the 'local' backend (got {backend!r}); launch the runs apart on another")
    _check_sweep(specs, check_entry)
    first = specs[0]
    runs = [new_run_dir(spec) for spec in specs]
    host_id, host_dir = runs[0]
    argv = torchrun_argv(first, host_dir, host_id, endpoint="localhost:0", log_dir=node_log_dir(host_dir, 0))
    for _, run_dir in runs[1:]:
        argv += ["--config", str(run_dir / CONFIG_FILE)]
    try:
        started = start_agents(first, host_dir, host_id, [argv])
    except BaseException:
        for _, run_dir in runs:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    run_dirs = [str(run_dir) for _, run_dir in runs]
    return [record_launch(spec, "local", run_id, run_dir, started, process_run_id=host_id,
                          sweep={"index": index, "host": str(host_dir), "run_dirs": run_dirs})
            for index, (spec, (run_id, run_dir)) in enumerate(zip(specs, runs))]


def _check_sweep(specs: list[LaunchSpec], check_entry: bool) -> None:
    from .backends import get_backend

    runner = get_backend("local")
    first = specs[0]
    for index, spec in enumerate(specs):
        try:
            runner.check(spec)
            check_launchable(spec, check_entry=False)
        except ValueError as error:
            raise ValueError(f"run {index} of the sweep ({spec.name!r}): {error}") from None
        for name in _SHARED:
            if getattr(spec, name) != getattr(first, name):
                raise ValueError(f"runs in one sweep share their processes, so they must agree on LaunchSpec.{name}: "
                                 f"run 0 has {getattr(first, name)!r}, run {index} {getattr(spec, name)!r}; launch "
                                 f"them apart")
        if dict(spec.env) != dict(first.env):
            raise ValueError(f"runs in one sweep share their processes, so they must agree on LaunchSpec.env: run 0 "
                             f"has {dict(first.env)!r}, run {index} {dict(spec.env)!r}; launch them apart")
        if spec.max_restarts:
            raise ValueError(f"LaunchSpec.max_restarts of run {index} of the sweep is {spec.max_restarts}: a restart "
                             f"would train the whole sweep again; launch a run that restarts on its own")
    if first.entry == DEFAULT_ENTRY:
        from ..core.config import RunConfig, check_shared_processes

        check_shared_processes([RunConfig.from_dict(config_dict(spec.config)) for spec in specs])
    if check_entry:  # the runs share interpreter and environment: one probe, one preflight for all of them
        check_entry_importable(first)
        try:
            check_run_configs(specs)
        except ValueError as error:
            where, _, reason = str(error).partition(": ")
            raise ValueError(f"{where} of the sweep: {reason}" if where.startswith("run ") else str(error)) from None
