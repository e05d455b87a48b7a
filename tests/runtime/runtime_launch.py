"""Launch the runtime entry module under real torchrun for the multi-process tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from workbench.core.config import RunConfig
from workbench.runtime.events import read_events

BASE = {"model": "mlp", "steps": 5, "global_batch": 16, "seed": 3, "dump_params": True,
        "collective_timeout_s": 60.0, "events": {"stage_events": True, "heartbeat_s": 1.0}}


def make_config(run_dir: Path, **fields) -> RunConfig:
    """``fields`` over :data:`BASE`; ``plan`` a plan name (``"pp2-1f1b-m4"``), a [plan] dict or a ParallelPlan."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = RunConfig.from_dict({**BASE, **fields, "run_dir": str(run_dir)})
    config.save_json(run_dir / "config.json")
    return config


def torchrun(run_dir: Path, nproc: int, timeout: float = 150.0) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "workbench.runtime.entry", "--config", str(run_dir / "config.json")]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def run_ok(run_dir: Path, nproc: int, **fields) -> RunConfig:
    config = make_config(run_dir, **fields)
    proc = torchrun(run_dir, nproc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return config


def step_losses(run_dir: Path, rank: int = 0) -> list[float]:
    return [e["loss"] for e in read_events(run_dir, rank) if e["kind"] == "step"]


def dumped_params(run_dir: Path, ranks: list[int]) -> dict[str, torch.Tensor]:
    params: dict[str, torch.Tensor] = {}
    for r in ranks:
        params.update(torch.load(run_dir / "params" / f"rank{r}.pt", weights_only=True))
    return params


def processes_mentioning(text: str) -> list[int]:
    """Live pids whose command line contains ``text`` (to prove nothing is left behind)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(proc.name))
    return pids
