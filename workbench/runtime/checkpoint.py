"""Per-rank checkpoints in the run directory, and finding the one to resume.

Each rank saves what only it holds: its stages' weights, its optimizer
state, its strategy's extra state (e.g. GroPipe's delayed gradient), its RNG
state, the step and the data position, as
``checkpoints/step{N}/rank{r}.pt``. After every rank has saved, rank 0 writes
``COMPLETE`` into the folder; only complete folders are resumed from, so a
crash during saving never leaves a half checkpoint that looks valid.

Files hold tensors, numbers and strings only and are read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..core.rundir import CHECKPOINTS_DIR

__all__ = ["save_checkpoint", "latest_checkpoint", "load_checkpoint", "checkpoint_dir", "rng_state", "set_rng_state"]

COMPLETE_MARKER = "COMPLETE"


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR / f"step{step}"


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def save_checkpoint(run_dir: str | Path, step: int, rank: int, state: dict[str, Any]) -> Path:
    """Save this rank's state for ``step`` (collective: every rank calls it)."""
    folder = checkpoint_dir(run_dir, step)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save({**state, "step": step}, tmp)
    tmp.replace(path)
    dist.barrier()
    if rank == 0:
        (folder / COMPLETE_MARKER).write_text(f"{dist.get_world_size()}\n")
    return folder


def latest_checkpoint(run_dir: str | Path, world_size: int) -> int | None:
    """The highest step with a complete checkpoint for ``world_size`` ranks, or None."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    steps = []
    for folder in root.glob("step*") if root.is_dir() else []:
        marker = folder / COMPLETE_MARKER
        if not folder.name[4:].isdigit() or not marker.is_file():
            continue
        if all((folder / f"rank{r}.pt").is_file() for r in range(world_size)):
            steps.append(int(folder.name[4:]))
    return max(steps, default=None)


def load_checkpoint(run_dir: str | Path, step: int, rank: int, device: torch.device) -> dict[str, Any]:
    path = checkpoint_dir(run_dir, step) / f"rank{rank}.pt"
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist; resume needs one file per rank")
    return torch.load(path, map_location=device, weights_only=True)
