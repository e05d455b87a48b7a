"""A small real torchrun worker for the job tests, speaking the run-directory contract.

Each rank trains a tiny linear regression with gloo all-reduce and writes
``start``/``step``/``stage``/``heartbeat``/``end``/``error``
events to ``events/rank{r}.jsonl``. The config's ``worker`` table tells it to
run N steps, raise on a rank at a step, go silent (stall) on a rank at a step,
or sleep per step. Fault tolerance with checkpoints is tested with the real
training entry instead.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

if __name__ == "__main__":  # before torch: the suite's ranks start warm (workbench.runtime.warm)
    from workbench.runtime.warm_client import forward_to_warm_server
    forward_to_warm_server("wb_jobs_worker")

import torch
import torch.distributed as dist

from workbench.core.rundir import events_path, make_event


class EventWriter:
    """Line-buffered JSONL writer for one rank; safe to call from two threads."""

    def __init__(self, run_dir: Path, rank: int):
        path = events_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self.rank = rank

    def write(self, kind: str, **fields) -> None:
        line = json.dumps(make_event(kind, self.rank, **fields)) + "\n"
        with self._lock:
            self._file.write(line)


def heartbeat(writer: EventWriter, state: dict, period_s: float, stop: threading.Event) -> None:
    while not stop.wait(period_s):
        if not state["stalled"]:
            writer.write("heartbeat", step=state["step"])


def batch(step: int, rank: int, world: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step * world + rank)
    x = torch.randn(16, dim, generator=gen)  # [16, dim]
    y = x.sum(dim=1, keepdim=True) * 0.5 + 1.0  # [16, 1]
    return x, y


def train(cfg: dict, writer: EventWriter, state: dict) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    dim, lr = int(cfg.get("dim", 4)), float(cfg.get("lr", 0.05))
    weight = torch.zeros(dim, 1)  # [dim, 1]
    bias = torch.zeros(1)  # [1]
    for step in range(int(cfg.get("steps", 10))):
        state["step"] = step
        if step == cfg.get("fail_step") and rank == cfg.get("fail_rank"):
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        if step == cfg.get("stall_step") and rank == cfg.get("stall_rank"):
            state["stalled"] = True
            time.sleep(3600)
        t0 = time.time()
        x, y = batch(step, rank, world, dim)
        w, b = weight.clone().requires_grad_(), bias.clone().requires_grad_()
        loss = ((x @ w + b - y) ** 2).mean()
        t_fwd = time.time()
        loss.backward()
        t_bwd = time.time()
        grads = torch.cat([w.grad.flatten(), b.grad])  # [dim + 1]
        dist.all_reduce(grads)
        grads /= world
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        t_ar = time.time()
        weight = weight - lr * grads[:dim].reshape(dim, 1)
        bias = bias - lr * grads[dim:]
        time.sleep(float(cfg.get("step_s", 0.0)))
        t_end = time.time()
        ms = lambda t: (t - t0) * 1000.0  # noqa: E731
        for op, start, end in (("F", t0, t_fwd), ("B", t_fwd, t_bwd), ("AR", t_bwd, t_ar)):
            writer.write("stage", stage=0, op=op, microbatch=0 if op != "AR" else None, iteration=step,
                         start=ms(start), end=ms(end), t0=t0)
        writer.write("step", step=step, loss=float(mean_loss) / world, samples_per_s=16 / max(t_end - t0, 1e-9),
                     step_ms=ms(t_end), memory_bytes=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    run_dir = Path(args.config).resolve().parent
    cfg = json.loads(Path(args.config).read_text()).get("worker", {})
    rank = int(os.environ["RANK"])
    writer = EventWriter(run_dir, rank)
    state = {"step": 0, "stalled": False}
    stop = threading.Event()
    threading.Thread(target=heartbeat, args=(writer, state, float(cfg.get("heartbeat_s", 0.5)), stop),
                     daemon=True).start()
    # like the real entry, the start event names the plan that ran (here: data parallel over every rank)
    world_size = int(os.environ["WORLD_SIZE"])
    writer.write("start", world_size=world_size, strategy=f"dp{world_size}", config=cfg,
                 pid=os.getpid(), host=socket.gethostname(),
                 restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
        train(cfg, writer, state)
        writer.write("end", step=state["step"], status="SUCCEEDED")
    except BaseException as exc:
        writer.write("error", message=str(exc), traceback=traceback.format_exc(), exc_type=type(exc).__name__)
        raise
    finally:
        stop.set()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
