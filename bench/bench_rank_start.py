"""What a short run costs before it trains: ranks started cold, without and with bytecode, and warm.

One 2-rank ``pp2-1f1b-m4`` run of the MLP on the digits (5 steps) under real
torchrun (``torchrun -m workbench.runtime.entry``), launched three ways,
interleaved round by round:

* ``cold, no bytecode``: every process compiles the modules it imports
  (``PYTHONDONTWRITEBYTECODE=1`` with an empty ``PYTHONPYCACHEPREFIX``: what a
  venv installed without bytecode on a machine that sets the variable did);
* ``cold``: torchrun and each rank import torch from bytecode (the peer);
* ``warm``: the ranks are forked from a warm rank server
  (:mod:`workbench.runtime.warm`); torchrun itself starts cold.

Per launch: the wall time until torchrun exits, until rank 0's start event,
and the CPU of every process of the launch (torchrun and the ranks, the
server's share included for warm ranks). Medians over the rounds; ratios
against ``cold``.

Run: ``.venv/bin/python bench/bench_rank_start.py [--rounds 3]``; writes bench/results/rank_start.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

from runtime_launch import make_config  # noqa: E402
from workbench.core.rundir import WARM_RANKS_ENV, read_events  # noqa: E402
from workbench.runtime.warm import server_command, server_env, wait_ready  # noqa: E402

MODES = ("cold, no bytecode", "cold", "warm")


def _cpu_of(pid: int) -> float:
    """User + system CPU of ``pid`` and of its waited-for children (seconds), from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def launch_once(run_dir: Path, mode: str, sock: Path, server_pid: int, empty_cache: Path) -> dict[str, float]:
    make_config(run_dir, plan="pp2-1f1b-m4")
    env = {k: v for k, v in os.environ.items() if k != WARM_RANKS_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if mode == "cold, no bytecode":
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(empty_cache))
    else:
        env["PYTHONDONTWRITEBYTECODE"] = ""
    if mode == "warm":
        env[WARM_RANKS_ENV] = str(sock)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "workbench.runtime.entry", "--config", str(run_dir / "config.json")]
    server_before = _cpu_of(server_pid)
    before = os.times()
    began = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.time() - began
    after = os.times()
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} launch failed:\n{proc.stderr[-2000:]}")
    start = next(e for e in read_events(run_dir, 0) if e["kind"] == "start")
    cpu = (after.children_user - before.children_user + after.children_system - before.children_system
           + _cpu_of(server_pid) - server_before)
    return {"wall_s": wall, "to_start_s": start["t"] - began, "cpu_s": cpu}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "rank_start.json"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-rank-start-"))
    sock = work / "warm.sock"
    server = subprocess.Popen(server_command(str(sock)), env=server_env(dict(os.environ, OMP_NUM_THREADS="1")),
                              stdout=subprocess.DEVNULL)
    try:
        if not wait_ready(str(sock), 120):
            raise RuntimeError("the warm rank server did not start")
        samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for r in range(args.rounds):
            for mode in MODES:
                empty = work / f"empty-cache-{r}"
                empty.mkdir(exist_ok=True)
                samples[mode].append(launch_once(work / f"{mode.replace(', ', '-').replace(' ', '-')}-{r}", mode,
                                                 sock, server.pid, empty))
                print(mode, {k: round(v, 2) for k, v in samples[mode][-1].items()}, flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    result: dict = {"rounds": args.rounds, "load_average": os.getloadavg(), "modes": {}}
    for mode in MODES:
        medians = {key: statistics.median(s[key] for s in samples[mode]) for key in ("wall_s", "to_start_s", "cpu_s")}
        result["modes"][mode] = {**medians, "samples": samples[mode]}
    peer = result["modes"]["cold"]
    for mode in MODES:
        row = result["modes"][mode]
        row["vs_cold"] = {key: row[key] / peer[key] for key in ("wall_s", "to_start_s", "cpu_s")}
        print(f"{mode:18s} wall {row['wall_s']:.2f} s ({row['vs_cold']['wall_s']:.2f}x cold)  to start "
              f"{row['to_start_s']:.2f} s  CPU {row['cpu_s']:.2f} s ({row['vs_cold']['cpu_s']:.2f}x cold)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
