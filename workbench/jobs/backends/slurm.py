"""Slurm: an sbatch script that runs ``srun torchrun`` with c10d rendezvous on the first node.

:func:`render_sbatch` is a pure function of the spec (golden-file tested): one
Slurm task per node, each running torchrun with ``--nproc-per-node`` workers;
the head node is the first host of the allocation (``scontrol show
hostnames``) and the rendezvous id is the Slurm job id; a one-node job
rendezvouses on a free local port, so jobs that share a node do not collide.
Submission uses ``sbatch --parsable``; status asks ``squeue --json`` while
the controller knows the job (also for a while after it ended), ``scontrol
show job`` where ``squeue`` has no JSON output, and ``sacct`` (accounting)
once the controller has forgotten it; cancel is ``scancel``. Slurm states
are mapped onto the workbench's job states; a job stopped by its time limit
ends ``FAILED`` with the reason ``TIMEOUT``. The run directory must
be on a filesystem the nodes and the notebook share, which is also how the
notebook sees the events.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from ...core.fields import is_int
from ...core.rundir import LOGS_DIR, WARM_RANKS_ENV
from ..spec import LaunchSpec
from .base import ProcessState, Started
from .local import torchrun_argv, worker_env

__all__ = ["SlurmBackend", "render_sbatch", "map_slurm_state", "SBATCH_FILE"]

SBATCH_FILE = "submit.sbatch"
_NODE_LOCAL_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
_STATE_MAP = {
    "PENDING": "PENDING", "CONFIGURING": "PENDING", "REQUEUED": "PENDING", "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING", "RESIZING": "PENDING", "SUSPENDED": "PENDING",
    "RUNNING": "RUNNING", "COMPLETING": "RUNNING", "STAGE_OUT": "RUNNING", "SIGNALING": "RUNNING",
    "COMPLETED": "SUCCEEDED",
    "CANCELLED": "CANCELLED",
    "FAILED": "FAILED", "NODE_FAIL": "FAILED", "OUT_OF_MEMORY": "FAILED", "TIMEOUT": "FAILED",
    "PREEMPTED": "FAILED", "DEADLINE": "FAILED", "BOOT_FAIL": "FAILED", "REVOKED": "FAILED",
}


def _state_word(state: str) -> str:
    """``CANCELLED by 123`` -> ``CANCELLED``, ``RUNNING+`` -> ``RUNNING``."""
    return state.strip().split(" ")[0].rstrip("+").upper() if state else ""


def map_slurm_state(state: str) -> str:
    """A Slurm job state (``CANCELLED by 123`` included) as a workbench job state."""
    return _STATE_MAP.get(_state_word(state), "UNKNOWN")


def render_sbatch(spec: LaunchSpec, run_dir: Path, run_id: str) -> str:
    """The sbatch script for ``spec`` (its run directory must be visible on every node)."""
    options = spec.slurm
    logs = Path(run_dir) / LOGS_DIR
    lines = ["#!/bin/bash", f"#SBATCH --job-name={spec.name}", f"#SBATCH --nodes={spec.nnodes}",
             "#SBATCH --ntasks-per-node=1"]
    if options.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={options.gpus_per_node}")
    if options.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={options.cpus_per_task}")
    lines.append(f"#SBATCH --time={options.time}")
    for key in ("partition", "account", "mem"):
        if getattr(options, key):
            lines.append(f"#SBATCH --{key}={getattr(options, key)}")
    lines.append(f"#SBATCH --output={logs}/slurm-%j.out")
    if options.requeue:  # a requeued job runs the script again: keep the first attempt's output
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    lines += [f"#SBATCH {extra}" for extra in options.extra_sbatch]
    lines += ["", "set -euo pipefail", "export SLURM_UNBUFFEREDIO=1"]
    for key, value in worker_env(spec, run_dir, run_id).items():
        lines.append(f"export {key}={shlex.quote(value)}")
    lines += list(options.setup)
    if spec.nnodes > 1:
        lines.append('HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
    lines.append("")
    # one node: a free port of its own (jobs may share the node); several: the agreed port on the first node
    endpoint = "localhost:0" if spec.nnodes == 1 else "HEAD_PLACEHOLDER"
    argv = torchrun_argv(spec, run_dir, "SLURM_JOB_ID_PLACEHOLDER", endpoint=endpoint, log_dir=logs / "torchrun")
    command = shlex.join(argv)
    command = command.replace("HEAD_PLACEHOLDER", f'"$HEAD_NODE:{options.rdzv_port}"')
    command = command.replace("SLURM_JOB_ID_PLACEHOLDER", '"$SLURM_JOB_ID"')
    lines.append(f"srun --kill-on-bad-exit=1 {command}")
    return "\n".join(lines) + "\n"


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    # a job's ranks run inside Slurm's job step, never forked from a warm rank server of the submitting session
    env = {k: v for k, v in os.environ.items() if k != WARM_RANKS_ENV}
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
    except FileNotFoundError:
        raise ValueError(f"{argv[0]!r} is not on PATH; the Slurm backend needs the Slurm client commands") from None


class SlurmBackend:
    """Submit to Slurm with sbatch; poll squeue then sacct; cancel with scancel.

    Answers are reused for ``min_poll_s`` seconds so a live monitor does not
    hammer the Slurm controller with several queries a second.
    """

    name = "slurm"
    min_poll_s = 5.0

    def __init__(self) -> None:
        self._last: tuple[float, ProcessState] | None = None

    def check(self, spec: LaunchSpec) -> None:
        options = spec.slurm
        if options is None:
            raise ValueError("LaunchSpec.slurm is None; the slurm backend needs SlurmOptions (partition, time, "
                             "gpus_per_node, ...)")
        if spec.hosts:
            raise ValueError(f"LaunchSpec.hosts is {list(spec.hosts)} but Slurm chooses the nodes; leave hosts empty")
        if spec.dist_backend == "nccl" and options.gpus_per_node < spec.nproc_per_node:
            raise ValueError(f"SlurmOptions.gpus_per_node is {options.gpus_per_node} but NCCL needs one GPU per "
                             f"process ({spec.nproc_per_node} per node); set gpus_per_node={spec.nproc_per_node}")
        if options.gpus_per_node and options.gpus_per_node < spec.nproc_per_node:
            raise ValueError(f"SlurmOptions.gpus_per_node is {options.gpus_per_node}, fewer than the "
                             f"{spec.nproc_per_node} processes per node; set gpus_per_node >= nproc_per_node")
        if options.cpus_per_task is not None and options.cpus_per_task < spec.nproc_per_node:
            raise ValueError(f"SlurmOptions.cpus_per_task is {options.cpus_per_task}, fewer than the "
                             f"{spec.nproc_per_node} processes each node's task runs; set cpus_per_task >= "
                             f"{spec.nproc_per_node}")
        root = str(Path(spec.run_root).expanduser().resolve())
        if spec.nnodes > 1 and root.startswith(_NODE_LOCAL_ROOTS):
            raise ValueError(f"LaunchSpec.run_root {root!r} is node-local storage, invisible to the other nodes; "
                             f"use a shared filesystem (home or scratch)")

    def render(self, spec: LaunchSpec, run_dir: Path, run_id: str) -> list[str]:
        return [render_sbatch(spec, run_dir, run_id)]

    def start(self, spec: LaunchSpec, run_dir: Path, run_id: str) -> Started:
        script = Path(run_dir) / SBATCH_FILE
        script.write_text(render_sbatch(spec, run_dir, run_id))
        (Path(run_dir) / LOGS_DIR).mkdir(parents=True, exist_ok=True)
        out = _run(["sbatch", "--parsable", str(script)])
        if out.returncode != 0:
            raise ValueError(f"sbatch refused the job (exit {out.returncode}): {out.stderr.strip() or out.stdout}")
        job_id = out.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise ValueError(f"sbatch --parsable printed {out.stdout.strip()!r}, not a job id")
        return Started(launch={"slurm_job_id": job_id, "script": str(script)}, commands=[f"sbatch {script}"])

    def poll(self, launch: dict[str, Any], processes: list[Any], run_dir: Path) -> ProcessState:
        if self._last is not None and time.monotonic() - self._last[0] < self.min_poll_s:
            return self._last[1]
        answer = self._query(launch["slurm_job_id"])
        self._last = (time.monotonic(), answer)
        return answer

    def _query(self, job_id: str) -> ProcessState:
        state = self._squeue(job_id) or self._scontrol(job_id) or self._sacct(job_id)
        if state is None:
            return ProcessState(running=None, detail=f"Slurm job {job_id} is unknown to squeue, scontrol and sacct")
        raw, exit_code = state
        mapped = map_slurm_state(raw)
        running = mapped in ("PENDING", "RUNNING")
        codes = {"slurm": exit_code} if exit_code is not None and not running else None
        timeout = _state_word(raw) == "TIMEOUT"
        detail = "TIMEOUT: the job reached its Slurm time limit" if timeout else f"Slurm state {raw}"
        return ProcessState(running=running, exit_codes=codes, scheduler_state=mapped, detail=detail)

    def _squeue(self, job_id: str) -> tuple[str, int | None] | None:
        out = _run(["squeue", "--json", "-j", job_id])
        if out.returncode != 0:
            return None
        try:
            jobs = json.loads(out.stdout).get("jobs", [])
        except json.JSONDecodeError:
            return None
        for job in jobs:
            if str(job.get("job_id")) == job_id:
                state = job.get("job_state")
                state = state[0] if isinstance(state, list) and state else state
                return (str(state), _json_exit_code(job.get("exit_code"))) if state else None
        return None

    def _scontrol(self, job_id: str) -> tuple[str, int | None] | None:
        """``scontrol show job -o``: one line of ``Key=Value`` words (any Slurm version, JSON or not)."""
        out = _run(["scontrol", "show", "job", "-o", job_id])
        if out.returncode != 0:
            return None
        fields = dict(word.split("=", 1) for word in out.stdout.split() if "=" in word)
        if fields.get("JobId") != job_id or not fields.get("JobState"):
            return None
        code = fields.get("ExitCode", "").split(":")[0]
        return fields["JobState"], int(code) if code.isdigit() else None

    def _sacct(self, job_id: str) -> tuple[str, int | None] | None:
        out = _run(["sacct", "-j", job_id, "--parsable2", "--noheader", "--format=JobID,State,ExitCode"])
        if out.returncode != 0:
            return None
        for line in out.stdout.splitlines():
            parts = line.split("|")
            if len(parts) >= 3 and parts[0] == job_id:
                code = parts[2].split(":")[0]
                return parts[1], int(code) if code.isdigit() else None
        return None

    def cancel(self, launch: dict[str, Any], grace_s: float) -> None:
        """``scancel``, then wait (``grace_s`` + 10 s at most) until Slurm no longer runs the job: scancel only
        asks, and the steps get SIGTERM, then SIGKILL after the cluster's KillWait."""
        self._last = None
        out = _run(["scancel", launch["slurm_job_id"]])
        if out.returncode != 0:
            raise ValueError(f"scancel {launch['slurm_job_id']} failed: {out.stderr.strip()}")
        deadline = time.monotonic() + grace_s + 10.0
        while self._query(launch["slurm_job_id"]).running and time.monotonic() < deadline:
            time.sleep(0.25)


def _json_exit_code(value: Any) -> int | None:
    """``exit_code`` of ``squeue --json``: a wait status (22.05: 256 is exit 1; a signal n gives 128 + n, as
    a shell says), or ``{"return_code": ...}`` (23.02 and later)."""
    if isinstance(value, dict):
        value = value.get("return_code")
        value = value.get("number") if isinstance(value, dict) else value
        return value if is_int(value) else None
    if not is_int(value) or value < 0:
        return None
    return (value >> 8) & 0xFF if value & 0x7F == 0 else 128 + (value & 0x7F)
