"""Launch the runtime entry module under real torchrun for the multi-process tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import torch

from workbench.core.config import RunConfig, merge_changes
from workbench.core.rundir import DIST_BACKEND_ENV
from workbench.runtime.events import read_events

BASE = {"model": "mlp", "training": {"steps": 5, "global_batch": 16, "seed": 3},
        "run": {"dump_params": True, "collective_timeout_s": 60.0},
        "events": {"stage_events": True, "heartbeat_s": 1.0}}


def make_config(run_dir: Path, base: dict | None = None, **fields) -> RunConfig:
    """``fields`` over ``base`` (default :data:`BASE`) as ``RunConfig.replace`` takes them (a table's dict changes
    the entries it names: ``training={"steps": 3}``); ``plan`` a plan name (``"pp2-1f1b-m4"``), a [plan] dict or
    a ParallelPlan."""
    run_dir.mkdir(parents=True, exist_ok=True)
    data = merge_changes(BASE if base is None else base, fields)
    config = RunConfig.from_dict(merge_changes(data, {"run": {"dir": str(run_dir)}}))
    config.save_json(run_dir / "config.json")
    return config


def torchrun(run_dir: Path | Sequence[Path], nproc: int, timeout: float = 150.0, dist_backend: str | None = None
             ) -> subprocess.CompletedProcess:
    """The entry under torchrun; several run directories make one sweep (the runs one after another in the same
    processes); ``dist_backend`` forces the ranks' collective backend (e.g. ``staged``)."""
    dirs = [run_dir] if isinstance(run_dir, (str, Path)) else list(run_dir)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "workbench.runtime.entry"]
    for folder in dirs:
        cmd += ["--config", str(Path(folder) / "config.json")]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if dist_backend is not None:
        env[DIST_BACKEND_ENV] = dist_backend
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 60.0 * (len(dirs) - 1))


def run_ok(run_dir: Path, nproc: int, dist_backend: str | None = None, **fields) -> RunConfig:
    config = make_config(run_dir, **fields)
    proc = torchrun(run_dir, nproc, dist_backend=dist_backend)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return config


class Sweep:
    """The runs a test module checks, trained in as few torchrun launches as their process counts allow.

    ``runs`` maps a key to ``(nproc, fields)`` (``fields`` over ``base`` as :func:`make_config` takes them; a
    whole config's ``to_dict()`` with ``base={}``). The first test
    that asks for a key launches every run of that process count in one torchrun, a sweep (the entry trains
    them one after another in the same processes, each in its own run directory); later tests reuse the
    result. Each run is exactly the run its test would have launched alone.
    """

    def __init__(self, root: Path, runs: dict[str, tuple[int, dict]], dist_backend: str | None = None,
                 base: dict | None = None) -> None:
        self.root, self.runs, self.dist_backend, self.base = Path(root), dict(runs), dist_backend, base
        self._launched: dict[int, subprocess.CompletedProcess] = {}
        self._configs: dict[str, RunConfig] = {}

    def dir(self, key: str) -> Path:
        return self.root / key

    def run(self, key: str) -> RunConfig:
        """``key``'s config once its run has succeeded (its sweep launched if it was not yet)."""
        nproc = self.runs[key][0]
        if nproc not in self._launched:
            keys = [k for k, (n, _) in self.runs.items() if n == nproc]
            for k in keys:
                self._configs[k] = make_config(self.dir(k), self.base, **self.runs[k][1])
            self._launched[nproc] = torchrun([self.dir(k) for k in keys], nproc, dist_backend=self.dist_backend)
        proc = self._launched[nproc]
        assert proc.returncode == 0, f"the sweep of {nproc}-rank runs failed:\n{proc.stderr[-3000:]}"
        return self._configs[key]


def forked_ranks(fn, args: tuple, nprocs: int, preload: list[str]) -> None:
    """``nprocs`` real processes running ``fn(rank, *args)``, forked from a server that imported ``preload`` once
    (torch, transformers, the worker module): on 2 cores, 4 to 9 ranks would otherwise each spend seconds
    importing the same modules. The server starts at the first call and serves the session's later launches
    (with what that first call preloaded; the heavy libraries are always among it)."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "transformers", *preload])
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")


def plan_id(name: str) -> str:
    """A short test id for a plan name: its per-layer options become ``-layers``."""
    head, _, rest = name.partition("-L[")
    return head + ("-layers" if rest else "")


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


def stashing_reference(config: RunConfig, versions: dict[tuple[int, int, int], int] | None = None
                       ) -> dict[str, torch.Tensor]:
    """One process applying the asynchronous rule by hand, for the run's own model and partition.

    Each micro-batch runs every stage on the weight version the schedule
    names for it; stage ``s``'s step of iteration ``t`` applies the gradients
    of iteration ``t``'s micro-batches. The versions are the stage's weights
    after each step, kept here as a history. ``versions`` ((stage, iteration,
    micro-batch) -> version) replaces the plan's own (e.g. the versions a run
    that changed its schedule recorded).
    """
    from torch.func import functional_call

    from workbench.core.partition import Partition
    from workbench.runtime.batches import global_batches, run_model, split_rounds
    from workbench.runtime.strategies.base import make_optimizer
    from workbench.scheduling.generators import async_1f1b

    S, m = config.plan.pp, config.plan.microbatches
    model = run_model(config)
    torch.manual_seed(config.training.seed + 1)
    text = config.plan.partition
    partition = Partition.uniform(len(model), S) if text == "uniform" else Partition.parse(text, len(model))
    blocks = [model.stage(*partition.bounds[s]) for s in range(S)]
    optimizers = [make_optimizer(list(b.parameters()), config) for b in blocks]
    history = [[{n: p.detach().clone() for n, p in b.named_parameters()}] for b in blocks]
    spec = config.plan.pipeline
    inflight = spec.inflight if isinstance(spec.inflight, int) else None
    plan = async_1f1b(S, m, config.training.steps, inflight=inflight, mode=spec.mode, vertical_sync=spec.vertical_sync)
    version = versions if versions is not None else {
        (s, a.iteration, a.microbatch): a.version for s in range(S) for a in plan.actions(s) if a.op.value == "F"}
    batches = global_batches(config, model, 0)
    for t in range(config.training.steps):
        data = split_rounds(next(batches), config, 0)[0]
        for mb, (x, y) in enumerate(zip(data.inputs, data.targets)):
            h, leaves = x, []
            for s, block in enumerate(blocks):
                leaves.append({n: w.clone().requires_grad_(True) for n, w in history[s][version[(s, t, mb)]].items()})
                h = functional_call(block, leaves[-1], (h,))
            (model.loss_fn(h, y) / m).backward()
            for block, bound in zip(blocks, leaves):
                for n, p in block.named_parameters():
                    p.grad = bound[n].grad.clone() if p.grad is None else p.grad + bound[n].grad
        for s, (block, optimizer) in enumerate(zip(blocks, optimizers)):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            history[s].append({n: p.detach().clone() for n, p in block.named_parameters()})
    return {n: p.detach() for b in blocks for n, p in b.named_parameters()}
