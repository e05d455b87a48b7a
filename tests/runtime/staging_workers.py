"""Worker for test_staging.py: every process-group operation, staged and plain gloo, on the same inputs."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist


def operations(rank: int, world: int, group) -> dict[str, list]:
    """Run each operation on ``group`` (inputs depend on the rank only); name -> the resulting values."""
    out: dict[str, list] = {}

    def seeded(*shape: int) -> torch.Tensor:
        return torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape) * (rank + 1) + rank

    t = seeded(3, 4)
    dist.all_reduce(t, group=group)
    out["all_reduce"] = t.tolist()
    t = seeded(4, 3)
    column = t[:, 1]  # a non-contiguous view: the result must land in it
    dist.all_reduce(column, op=dist.ReduceOp.MAX, group=group)
    out["all_reduce_view"] = t.tolist()
    t = seeded(5)
    work = dist.all_reduce(t, group=group, async_op=True)
    work.wait()
    out["all_reduce_async"] = t.tolist()
    t = seeded(2, 2)
    dist.broadcast(t, src=world - 1, group=group)
    out["broadcast"] = t.tolist()
    t = seeded(3)
    dist.reduce(t, dst=0, group=group)
    out["reduce"] = t.tolist() if rank == 0 else None  # only the destination's tensor is defined after a reduce
    parts = [torch.zeros(2, 3) for _ in range(world)]
    dist.all_gather(parts, seeded(2, 3), group=group)
    out["all_gather"] = [p.tolist() for p in parts]
    flat = torch.zeros(world * 4)
    dist.all_gather_into_tensor(flat, seeded(4), group=group)
    out["all_gather_into_tensor"] = flat.tolist()
    shard = torch.zeros(3)
    dist.reduce_scatter_tensor(shard, seeded(3 * world), group=group)
    out["reduce_scatter_tensor"] = shard.tolist()
    shard = torch.zeros(2)
    dist.reduce_scatter(shard, [seeded(2) + i for i in range(world)], group=group)
    out["reduce_scatter"] = shard.tolist()
    mine = torch.zeros(3)
    dist.scatter(mine, [seeded(3) * (i + 1) for i in range(world)] if rank == 0 else None, src=0, group=group)
    out["scatter"] = mine.tolist()
    gathered = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    dist.gather(seeded(2), gathered, dst=0, group=group)
    out["gather"] = [g.tolist() for g in gathered] if gathered else []
    received = torch.zeros(2 * world)
    dist.all_to_all_single(received, seeded(2 * world), group=group)
    out["all_to_all_single"] = received.tolist()
    objects: list = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank}, group=group)
    out["all_gather_object"] = objects
    box = [f"from {rank}"]
    dist.broadcast_object_list(box, src=0, group=group)
    out["broadcast_object_list"] = box
    # a ring exchange: every rank sends before it receives, so sends must not wait for their receiver
    right, left = (rank + 1) % world, (rank - 1) % world
    outgoing, incoming = seeded(6), torch.zeros(6)
    send = dist.isend(outgoing, dst=right, group=group)
    dist.irecv(incoming, src=left, group=group).wait()
    send.wait()
    out["ring_exchange"] = incoming.tolist()
    dist.barrier(group=group)
    return out


def worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    from workbench.runtime.staging import StagedProcessGroup, register_staged_backend

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    register_staged_backend()
    dist.init_process_group("staged", init_method=f"file://{init_file}", rank=rank, world_size=world)
    staged_group = dist.group.WORLD
    plain = dist.new_group(backend="gloo")
    sub = dist.new_group(ranks=list(range(0, world, 2)))  # a staged subgroup, as build_groups makes them
    result = {
        "staged_type": type(staged_group).__name__,
        "is_staged": isinstance(staged_group, StagedProcessGroup),
        "backend": dist.get_backend(),
        "subgroup_backend": dist.get_backend(sub) if rank % 2 == 0 else None,
        "staged": operations(rank, world, staged_group),
        "gloo": operations(rank, world, plain),
    }
    if rank % 2 == 0:
        t = torch.full((3,), float(rank))
        dist.all_reduce(t, group=sub)
        result["sub_all_reduce"] = t.tolist()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
