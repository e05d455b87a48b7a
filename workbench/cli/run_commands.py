"""``workbench run CONFIG.toml [--nproc N] [--run-root DIR]``: train under torchrun, in the foreground.

The config is loaded and checked completely before any process starts: the
fields themselves (by :class:`~workbench.core.config.RunConfig`), the
process count against what the strategy needs, the model name against the
zoo and an explicit partition against the model's layer count. Then a fresh
run directory is made under the run root (``--run-root``, else
``$WORKBENCH_RUN_ROOT``, else ``./runs``) holding ``config.json`` (with the
run directory filled in), ``command.txt`` and ``launch.json``, and
``python -m torch.distributed.run --standalone`` (a free port, never a fixed
one) runs ``workbench.runtime.entry`` with one thread per rank. torchrun's
output streams to the terminal; ``status.json`` records the outcome, and the
run directory is printed as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..core.config import RunConfig
from ..core.rundir import COMMAND_FILE, CONFIG_FILE, LAUNCH_FILE, LOGS_DIR, status_path
from .result import Result

__all__ = ["prepare_run", "torchrun_command", "register"]


def check_against_model(config: RunConfig) -> None:
    """Refuse a model, partition or data the run could not use (imports torch; see ``runtime.preflight``)."""
    from ..runtime.preflight import check_run

    check_run(config)


def torchrun_command(config_path: Path, nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "workbench.runtime.entry", "--config", str(config_path)]


def prepare_run(config: RunConfig, run_root: str | Path, nproc: int | None = None) -> tuple[Path, list[str]]:
    """Validate, make a fresh run directory with config.json and command.txt; return it and the command."""
    nproc = config.world_size if nproc is None else nproc
    if nproc != config.world_size:
        raise ValueError(f"--nproc {nproc} does not match plan {config.plan.name!r}, whose mesh {config.plan.mesh} "
                         f"has {config.world_size} processes; use --nproc {config.world_size} or change the "
                         f"plan's mesh in the config")
    check_against_model(config)
    root = Path(run_root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        run_dir = root / (f"{stamp}-{config.name}-{config.plan.family}" + (f"-{attempt}" if attempt else ""))
        try:
            run_dir.mkdir()
            break
        except FileExistsError:
            continue
    run_dir = run_dir.resolve()
    (run_dir / LOGS_DIR).mkdir()
    resolved = config.replace(run={"dir": str(run_dir)})
    resolved.save_json(run_dir / CONFIG_FILE)
    command = torchrun_command(run_dir / CONFIG_FILE, nproc)
    (run_dir / COMMAND_FILE).write_text("OMP_NUM_THREADS=1 " + shlex.join(command) + "\n")
    return run_dir, command


def launch_foreground(run_dir: Path, command: list[str]) -> int:
    """Run torchrun to completion, record launch.json and status.json; return its exit code."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    started = time.time()
    proc = subprocess.Popen(command, env=env)
    # the local backend's record, so ``workbench status`` and ``attach`` read a foreground run like any other
    from ..jobs.process import create_time

    agent = {"node": 0, "pid": proc.pid, "create_time": create_time(proc.pid)}
    (run_dir / LAUNCH_FILE).write_text(json.dumps({
        "backend": "local", "run_id": run_dir.name, "host": socket.gethostname(), "start_time": started,
        "foreground": True, "agents": [agent], "launcher_pid": os.getpid(),
        "launcher_create_time": create_time(os.getpid()), "commands": [shlex.join(command)]}) + "\n")
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        code = proc.wait()
        state = "CANCELLED"
    else:
        state = "SUCCEEDED" if code == 0 else "FAILED"
    node_dir = run_dir / LOGS_DIR / "node0"
    node_dir.mkdir(parents=True, exist_ok=True)
    (node_dir / "exit_code").write_text(f"{code}\n")
    status_path(run_dir).write_text(json.dumps({"state": state, "returncode": code, "start": started,
                                                "end": time.time()}) + "\n")
    return code


def _run(args: argparse.Namespace) -> Result:
    config = RunConfig.from_toml(args.config)
    root = args.run_root or os.environ.get("WORKBENCH_RUN_ROOT") or "runs"
    run_dir, command = prepare_run(config, root, args.nproc)
    code = launch_foreground(run_dir, command)
    return Result(str(run_dir), {"run_dir": str(run_dir), "returncode": code}, exit_code=code)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", parents=[common], help="train a run config under torchrun in the foreground")
    p.add_argument("config", help="run config (TOML), e.g. launch/gropipe_vgg.toml")
    p.add_argument("--nproc", type=int, default=None, help="processes (default: what the strategy needs)")
    p.add_argument("--run-root", default=None, help="where run directories go (default $WORKBENCH_RUN_ROOT or ./runs)")
    p.set_defaults(handler=_run)
