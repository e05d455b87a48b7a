"""This machine: ``torchrun -m ENTRY`` in a child process that cannot outlive the notebook.

torchrun is run as ``python -m torch.distributed.run`` (the interpreter of
the spec, so the notebook's environment is the job's), with c10d rendezvous
on ``localhost:0`` so the OS picks a free port and two jobs never collide;
c10d (rather than ``--standalone``) keeps ``--max-restarts`` meaningful and
gives the rendezvous the run id. Console lines carry a ``[rank<r>]:`` prefix
so logs can be split by global rank (a torchrun without
``--log-line-prefix-template`` writes its own ``[default<local rank>]:``,
the same rank on one node), and per-rank files go to ``--log-dir``.
Each torchrun runs under :mod:`workbench.jobs.guard`, started in a new
session (the kernel's *Interrupt* does not reach it) with a parent-death
signal (a dying kernel takes the run along); cancel kills the whole tree,
workers in their own sessions included.

:func:`torchrun_argv`, :func:`worker_env` and :func:`start_agents` are shared
with the multi-node backend, which starts one such agent per node.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...core.rundir import CONFIG_FILE, DIST_BACKEND_ENV, LOGS_DIR
from ..process import RUN_ID_ENV, create_time, kill_processes, pdeathsig_preexec, process_alive
from ..spec import LaunchSpec
from .base import ProcessState, Started

__all__ = ["LocalBackend", "torchrun_argv", "worker_env", "start_agents", "poll_agents", "cancel_agents",
           "RANK_PREFIX"]

RANK_PREFIX = "[rank${rank}]:"
# torchrun's own prefix where it has no --log-line-prefix-template (torch 2.11): the LOCAL rank
FALLBACK_PREFIX = "[default{rank}]:"
_INHERITED_DROP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                   "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE")


@functools.lru_cache(maxsize=None)
def prefix_template_supported(python: str) -> bool:
    """Whether the torchrun of ``python``'s torch takes ``--log-line-prefix-template`` (2.11's does not).

    Read from that torch's ``distributed/run.py`` source, located without
    importing torch: the launching process (a notebook kernel) stays torch-free,
    and the ranks' interpreter may have another torch than this one. An
    interpreter that is not on this machine (a Slurm script's, a remote node's)
    is assumed to have this process's torch, as the rest of the launch assumes.
    """
    locate = "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0] if s else '')"
    try:
        found = subprocess.run([python, "-c", locate], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        here = importlib.util.find_spec("torch")
        found = here.submodule_search_locations[0] if here and here.submodule_search_locations else ""
    try:
        return '"--log-line-prefix-template"' in (Path(found) / "distributed" / "run.py").read_text() if found else False
    except OSError:
        return False


def node_log_dir(run_dir: Path, node: int) -> Path:
    return Path(run_dir) / LOGS_DIR / f"node{node}"


def torchrun_argv(spec: LaunchSpec, run_dir: Path, run_id: str, *, endpoint: str, log_dir: Path | str,
                  local_addr: str | None = None, python: str | None = None) -> list[str]:
    """The torchrun command line for one node of ``spec``."""
    argv = [python or spec.python, "-m", "torch.distributed.run",
            "--nnodes", str(spec.nnodes), "--nproc-per-node", str(spec.nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
            "--max-restarts", str(spec.max_restarts), "--monitor-interval", "0.5"]
    if local_addr:
        argv += ["--local-addr", local_addr]
    argv += ["--log-dir", str(log_dir), "--tee", "3"]
    if prefix_template_supported(python or spec.python):
        argv += ["--log-line-prefix-template", RANK_PREFIX]
    argv += ["-m", spec.entry, "--config", str(Path(run_dir) / CONFIG_FILE)]
    return argv


def worker_env(spec: LaunchSpec, run_dir: Path, run_id: str) -> dict[str, str]:
    """The variables a run adds for its processes (on top of the inherited environment)."""
    return {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", RUN_ID_ENV: run_id,
            "WORKBENCH_RUN_DIR": str(run_dir), DIST_BACKEND_ENV: spec.dist_backend, **spec.env}


def _child_environ(spec: LaunchSpec, run_dir: Path, run_id: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _INHERITED_DROP and not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.update(worker_env(spec, run_dir, run_id))
    return env


def guard_argv(run_dir: Path, run_id: str, node: int, argv: list[str]) -> list[str]:
    """``argv`` run under :mod:`workbench.jobs.guard` (tree kill on parent death, final status)."""
    return [sys.executable, "-m", "workbench.jobs.guard", "--run-id", run_id, "--run-dir", str(run_dir),
            "--node", str(node), "--parent", str(os.getpid()), "--", *argv]


def start_agents(spec: LaunchSpec, run_dir: Path, run_id: str, argvs: list[list[str]]) -> Started:
    """Start one guarded torchrun agent per argv; console output goes to ``logs/node<i>/console.log``."""
    env = _child_environ(spec, run_dir, run_id)
    processes, agents = [], []
    try:
        for node, argv in enumerate(argvs):
            log_dir = node_log_dir(run_dir, node)
            log_dir.mkdir(parents=True, exist_ok=True)
            with open(log_dir / "console.log", "ab") as console:
                proc = subprocess.Popen(guard_argv(run_dir, run_id, node, argv), env=env,
                                        stdin=subprocess.DEVNULL, stdout=console,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=pdeathsig_preexec)
            processes.append(proc)
            agents.append({"node": node, "pid": proc.pid, "create_time": create_time(proc.pid)})
    except OSError:
        cancel_agents({"run_id": run_id, "agents": agents}, grace_s=1.0)
        raise
    launch = {"agents": agents, "launcher_pid": os.getpid(), "launcher_create_time": create_time(os.getpid())}
    return Started(launch=launch, commands=[shlex.join(a) for a in argvs], processes=processes)


def poll_agents(launch: dict[str, Any], processes: list[Any], run_dir: Path) -> ProcessState:
    """Running while any agent runs; exit codes from our own children or from the guards' records.

    An agent whose guard has recorded torchrun's exit code counts as finished
    even while the guard itself is still writing the final status.
    """
    agents = launch.get("agents", [])
    if processes:
        codes = [p.poll() for p in processes]
        if any(c is None for c in codes):
            return ProcessState(running=True)
        return ProcessState(running=False, exit_codes={f"node{i}": c for i, c in enumerate(codes)})
    codes: dict[str, int] = {}
    running = False
    for agent in agents:
        record = node_log_dir(run_dir, agent["node"]) / "exit_code"
        text = record.read_text().strip() if record.is_file() else ""
        if text.lstrip("-").isdigit():
            codes[f"node{agent['node']}"] = int(text)
        elif process_alive(agent["pid"], agent.get("create_time")):
            running = True
    if running:
        return ProcessState(running=True)
    return ProcessState(running=False, exit_codes=codes if len(codes) == len(agents) else None)


def cancel_agents(launch: dict[str, Any], grace_s: float) -> None:
    roots = [(a["pid"], a.get("create_time")) for a in launch.get("agents", [])]
    kill_processes(launch.get("process_run_id", launch["run_id"]), roots, grace_s=grace_s)


class LocalBackend:
    """Single-node torchrun on this machine."""

    name = "local"

    def check(self, spec: LaunchSpec) -> None:
        if spec.nnodes != 1:
            raise ValueError(f"LaunchSpec.nnodes is {spec.nnodes} but the local backend runs one node; use "
                             f"backend='multinode' (or 'slurm'), or set nnodes=1")
        if spec.slurm is not None:
            raise ValueError("LaunchSpec.slurm is set but the backend is 'local'; use backend='slurm' or drop slurm")

    def render(self, spec: LaunchSpec, run_dir: Path, run_id: str) -> list[str]:
        argv = torchrun_argv(spec, run_dir, run_id, endpoint="localhost:0", log_dir=node_log_dir(run_dir, 0))
        return [shlex.join(argv)]

    def start(self, spec: LaunchSpec, run_dir: Path, run_id: str) -> Started:
        argv = torchrun_argv(spec, run_dir, run_id, endpoint="localhost:0", log_dir=node_log_dir(run_dir, 0))
        return start_agents(spec, run_dir, run_id, [argv])

    def poll(self, launch: dict[str, Any], processes: list[Any], run_dir: Path) -> ProcessState:
        return poll_agents(launch, processes, run_dir)

    def cancel(self, launch: dict[str, Any], grace_s: float) -> None:
        cancel_agents(launch, grace_s)
