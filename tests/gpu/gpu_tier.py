"""What the GPU tier's tests share: where its runs go, how they launch, and the one-GPU facts they check.

The tier runs on whatever GPU is at hand, one included: ranks that outnumber
the GPUs share them round-robin, on the ``staged`` backend (host copies over
gloo), each capped at its share of the GPU's memory. Every run is a real
``workbench.jobs.launch`` of the training entry under torchrun.

``WORKBENCH_GPU_TIER_REHEARSAL=1`` rehearses the tier on a machine without
CUDA: the same runs on CPU ranks with the ``staged`` backend forced (the
code path of ranks sharing a GPU, without the device), skipping only what
needs CUDA itself (events, the allocator, bf16 autocast on a GPU). It
checks the tier's own logic before a GPU is lent; it proves nothing about
CUDA.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from workbench.core.config import RunConfig, merge_changes
from workbench.jobs import LaunchSpec, launch
from workbench.runtime.events import read_events

REHEARSAL = os.environ.get("WORKBENCH_GPU_TIER_REHEARSAL") == "1"
DEVICE = "cpu" if REHEARSAL else "cuda"
ON_GPU = not REHEARSAL

MLP = {"model": "mlp", "training": {"global_batch": 16}}
# a task that learns in a few steps
DIGITS = {"model": "mlp", "training": {"global_batch": 64}, "data": {"kind": "digits"}}
GPT2 = {"model": {"name": "gpt2-tiny", "overrides": {"n_layer": 2, "seq_len": 16, "n_head": 4, "resid_pdrop": 0.0,
                                                    "embd_pdrop": 0.0, "attn_pdrop": 0.0}},
        "data": {"kind": "bytes-lm", "seq_len": 16}, "training": {"global_batch": 8}}
COMMON = {"training": {"steps": 4, "seed": 3, "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}},
          "run": {"dump_params": True, "collective_timeout_s": 120.0}, "events": {"tensorboard": False}}


def expected_backend(world_size: int) -> str:
    """The backend the ranks of a one-node run must pick on this machine (``choose_backend``'s rule)."""
    if REHEARSAL:
        return "staged"
    return "staged" if world_size > torch.cuda.device_count() else "nccl"


def launch_run(root: Path, fields: dict, *, device: str = DEVICE, timeout: float = 240.0) -> RunConfig:
    """One launched run of ``fields`` on ``device``; returns its config with ``run_dir`` set, after it succeeded."""
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in fields["plan"])[:48]
    backend = "staged" if REHEARSAL and device == "cpu" and fields.get("_staged", True) else "auto"
    fields = {k: v for k, v in fields.items() if not k.startswith("_")}
    config = merge_changes(COMMON, merge_changes(fields, {"run": {"device": device}, "name": name}))
    job = launch(LaunchSpec(config=config, name=name, run_root=str(root), dist_backend=backend))
    status = job.wait(timeout=timeout)
    if not status.finished:
        job.cancel()
    assert status.state == "SUCCEEDED", (f"{fields['plan']}: {status.state} {status.reason}\n"
                                         + "\n".join(job.logs(tail=60)))
    config = RunConfig.from_json(job.run_dir / "config.json")
    return config.replace(run={"dir": str(job.run_dir)})


def start_event(run_dir: Path, rank: int) -> dict:
    return next(e for e in read_events(run_dir, rank) if e["kind"] == "start")


def assert_ran_where_expected(config: RunConfig) -> None:
    """Each rank's start event names the device, the backend and the GPU sharing the rules give this machine."""
    run_dir = Path(config.run.dir)
    backend = expected_backend(config.world_size)
    gpus = torch.cuda.device_count() if ON_GPU else 0
    for rank in range(config.world_size):
        start = start_event(run_dir, rank)
        assert start["backend"] == backend, (rank, start["backend"])
        if not ON_GPU:
            assert start["device"] == "cpu" and start["shared_by"] is None
            continue
        assert start["device"] == f"cuda:{rank % gpus}", (rank, start["device"])
        shared = len(range(rank % gpus, config.world_size, gpus))
        assert (start["shared_by"], start["memory_fraction"]) == (shared, 1.0 / shared), start
