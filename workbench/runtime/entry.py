"""The torchrun entry point: ``torchrun -m workbench.runtime.entry --config RUN_DIR/config.json``.

One process per rank. It reads the resolved run config, starts the process
group (with a finite collective timeout, so a dead peer becomes an error
rather than a hang), builds the unmodified model, resolves the partition,
hands both to the configured strategy and trains, writing the run-directory
contract as it goes: ``events/rank{r}.jsonl`` (start, one step line per
step with loss, samples per second and memory, the measured stage events,
heartbeats, checkpoints, end, or an error with its traceback) and
``checkpoints/step{N}/``. With ``resume`` it continues from the latest
complete checkpoint in the run directory, bit for bit: weights, optimizer,
strategy state, RNG and data position.

Several ``--config`` run one after another in the same processes (a
sweep): one process group, each run its own directory and its own model,
seed and strategy. The runs must agree on world size, device and
placement; a failed run stops the sweep, and the runs after it record
that they did not run.

A rank that raises writes its error event and exits non-zero; torchrun
then stops the other ranks, and any rank blocked in a collective with the
failed one times out after ``collective_timeout_s``.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import asdict
import os
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Sequence

if __name__ == "__main__":  # before torch: a warm rank server, when one is named, runs this rank forked from it
    from .warm_client import forward_to_warm_server
    forward_to_warm_server("workbench.runtime.entry")

import torch
import torch.distributed as dist

from ..core.config import RunConfig, check_shared_processes
from ..core.partition import Partition
from .batches import global_batches, run_model, split_rounds
from .board import ScalarBoard
from .checkpoint import latest_checkpoint, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .evaluation import Evaluation
from .events import EventWriter
from .progress import ProgressLog
from .groups import check_backend_for_plan, device_share, init_distributed, pick_device
from .strategies import strategy_class
from .strategies.base import PendingLoss, RunContext, Strategy, loss_value

__all__ = ["main", "resolve_partition", "autocast_dtype_for"]


# the torchrun rank of this process, which differs from its mesh rank under a placement
PROCESS_RANK_ENV = "WORKBENCH_PROCESS_RANK"
# set to 0 to leave CPU ranks unpinned (see pin_cpu_rank)
PIN_CORES_ENV = "WORKBENCH_PIN_CORES"


def pin_cpu_rank(device: torch.device) -> list[int] | None:
    """Give this CPU rank its own share of the node's cores; the cores it now runs on, or None where it does not.

    Only where every rank of the node can have at least one core of its own
    (``LOCAL_WORLD_SIZE`` at most the usable cores), and not when
    ``WORKBENCH_PIN_CORES=0``. Unpinned, the kernel may wake a rank whose
    receive completed on the core of the rank that sent to it, and the two
    then share one core while the other idles until the load balancer moves
    one of them: on two ranks of two cores, 1F1B over naive model parallelism
    measured 1.25 unpinned and 1.32 pinned (``bench/RESULTS.md``). Called
    before the process group starts, so the collective library's threads
    inherit the cores.
    """
    if device.type != "cpu" or os.environ.get(PIN_CORES_ENV, "1") == "0" or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    local_world, local = int(os.environ.get("LOCAL_WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    if local_world < 2 or local_world > len(cores) or not 0 <= local < local_world:
        return None
    share = len(cores) // local_world
    mine = cores[local * share:(local + 1) * share]
    os.sched_setaffinity(0, mine)
    return mine


def autocast_dtype_for(precision: str, device: torch.device) -> torch.dtype | None:
    """``auto``: bf16 autocast on CUDA, fp32 on CPU; ``bf16`` / ``fp32`` force it."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def resolve_partition(config: RunConfig, model, example_input: torch.Tensor, device: str | None = None
                      ) -> Partition:
    """The stage -> layers map for the config: uniform, explicit text, or AMPA on a fresh profile (on
    ``device``, default the example's)."""
    plan = config.plan
    num_layers = len(model)
    stages = plan.num_virtual_stages
    if stages == 1:
        return Partition.uniform(num_layers, 1)
    if plan.partition == "uniform":
        return Partition.uniform(num_layers, stages)
    if plan.partition == "ampa":
        return ampa_partition(config, model, example_input, device)
    return Partition.parse(plan.partition, num_layers)  # its stage count was checked with the plan


def ampa_partition(config: RunConfig, model, example_input: torch.Tensor, device: str | None = None) -> Partition:
    """Profile a copy of the model at the micro-batch size on ``device`` (default the example's), then balance
    with AMPA."""
    from ..planning.partitioning.ampa import ampa
    from ..scheduling.registry import stage_memory

    microbatch = example_input.shape[0]
    costs = _profile_copy(config, model, example_input, device)
    plan = config.plan
    result = ampa(costs, plan.num_virtual_stages, num_microbatches=plan.microbatches, schedule=stage_memory(plan),
                  batch_size=microbatch * plan.microbatches, optimizer=config.training.optimizer.name)
    return result.partition


def _profile_copy(config: RunConfig, model, example_input: torch.Tensor, device: str | None):
    """A profile of a copy of the model at the example's micro-batch size, on ``device`` (default the example's);
    with ``training.fused_weight_grads``, of the linear layers fused as the stages run them."""
    from ..profiling import profile

    return profile(copy.deepcopy(model), example_input.shape[0], device=device or str(example_input.device),
                   progress=False, fused_weight_grads=config.training.fused_weight_grads)


def _shared_partition(config: RunConfig, model, example_input: torch.Tensor, device: str) -> Partition:
    """Resolve on rank 0 and broadcast, so a measured (AMPA) partition is the same on every rank."""
    box = [str(resolve_partition(config, model, example_input, device))] if dist.get_rank() == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    return Partition.parse(box[0], len(model))


def measured_stage_costs(config: RunConfig, model, example_input: torch.Tensor, partition: Partition,
                         device: str | None = None):
    """The stages' costs at the micro-batch size, from a profile of a copy of the model on ``device`` (the
    rank's; default the example's)."""
    from ..scheduling.stagecosts import StageCosts

    microbatch = example_input.shape[0]
    costs = _profile_copy(config, model, example_input, device)
    return StageCosts.from_model(costs, partition, microbatch, optimizer=_optimizer_kind(config))


def _optimizer_kind(config: RunConfig) -> str:
    opt = config.training.optimizer
    return "adam" if opt.name == "adam" else ("sgd-momentum" if opt.momentum else "sgd")


def _shared_stage_costs(config: RunConfig, model, example_input: torch.Tensor, partition: Partition, device: str):
    """For kinds whose schedule is built from the stages' costs: measured on rank 0, the same on every rank."""
    if not config.plan.pipeline.uses_costs:
        return None
    box = [measured_stage_costs(config, model, example_input, partition, device)] if dist.get_rank() == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _save(run_dir: Path, step: int, rank: int, strategy: Strategy, device: torch.device) -> Path:
    state = {
        "modules": {k: m.state_dict() for k, m in strategy.modules().items()},
        "optimizer": strategy.optimizer().state_dict(),
        "extra": strategy.extra_state(),
        "rng": rng_state(device),
        "data_position": step,
    }
    return save_checkpoint(run_dir, step, rank, state)


def _restore(run_dir: Path, step: int, rank: int, strategy: Strategy, device: torch.device) -> int:
    state = load_checkpoint(run_dir, step, rank, device)
    modules = strategy.modules()
    if set(state["modules"]) != set(modules):
        raise ValueError(f"checkpoint step {step} rank {rank} holds modules {sorted(state['modules'])}, this run "
                         f"has {sorted(modules)}: the strategy or partition changed since it was saved")
    for key, module in modules.items():
        module.load_state_dict(state["modules"][key])
    strategy.optimizer().load_state_dict(state["optimizer"])
    strategy.load_extra_state(state["extra"])
    set_rng_state(state["rng"], device)
    return int(state["data_position"])


def _attempt(writer: EventWriter) -> int:
    """Which attempt this is: torchrun's restart count, or later when the run directory holds earlier starts
    (a requeued Slurm job runs a fresh torchrun, whose count starts at 0 again)."""
    return max(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), writer.previous_starts)


def _build(config: RunConfig, run_dir: Path, writer: EventWriter, cores: list[int] | None):
    """The run's strategy, resumed where a checkpoint says, with its start event written; (strategy, model,
    device, first step, checkpoint resumed from)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = pick_device(config.run.device)
    model = run_model(config)
    torch.manual_seed(config.training.seed + 1)
    batches_from_start = global_batches(config, model, 0)
    example = split_rounds(next(batches_from_start), config, 0)[0].inputs[0]
    partition = _shared_partition(config, model, example, str(device))
    stage_costs = _shared_stage_costs(config, model, example, partition, str(device))
    ctx = RunContext(config=config, rank=rank, world_size=world_size, device=device,
                     autocast_dtype=autocast_dtype_for(config.training.precision, device), model=model,
                     partition=partition, example_input=example, record_events=config.events.stage_events,
                     stage_costs=stage_costs)
    strategy = strategy_class(config.plan)(ctx)
    start_step = 0
    resumed_from = latest_checkpoint(run_dir, world_size) if config.training.resume else None
    if resumed_from is not None:
        start_step = _restore(run_dir, resumed_from, rank, strategy, device)
    writer.step = start_step
    writer.write("start", world_size=world_size, strategy=config.plan.name, config=config.to_dict(), pid=os.getpid(),
                 host=socket.gethostname(), restart=_attempt(writer),
                 resumed_from=resumed_from, partition=str(partition), device=str(device), backend=dist.get_backend(),
                 process=int(os.environ.get(PROCESS_RANK_ENV, rank)), cores=cores,
                 **device_share(device, config.run.device),
                 **({"stage_costs": asdict(stage_costs)} if stage_costs is not None else {}),
                 **({"layers": strategy.layers_report()} if hasattr(strategy, "layers_report") else {}),
                 **({"fused_layers": strategy.fused_layers} if getattr(strategy, "fused_layers", 0) else {}))
    return strategy, model, device, start_step, resumed_from


class _StepLog:
    """Step events, progress lines and TensorBoard scalars, written once each step's loss is known (a step's
    loss may still be reducing when the next step starts)."""

    def __init__(self, config: RunConfig, writer: EventWriter, strategy: Strategy, device: torch.device,
                 board: ScalarBoard | None) -> None:
        self.config, self.writer, self.strategy, self.device, self.board = config, writer, strategy, device, board
        self.unwritten: list[tuple[int, float | PendingLoss, float]] = []
        self.progress = ProgressLog(dist.get_rank(), config.training.steps)

    def add(self, done: int, loss: float | PendingLoss, elapsed: float) -> None:
        self.unwritten.append((done, loss, elapsed))

    def flush(self) -> None:
        for done, loss, elapsed in self.unwritten:
            self.writer.step = done
            value, rate = loss_value(loss), self.config.training.global_batch / elapsed
            self.writer.write("step", step=done, loss=value, samples_per_s=rate, step_ms=elapsed * 1e3,
                              memory_bytes=_memory_bytes(self.device),
                              **(self.strategy.memory_report() if hasattr(self.strategy, "memory_report") else {}))
            self.progress.step(done, value, rate, elapsed * 1e3)
            if self.board is not None:
                self.board.step(done, value, rate, elapsed * 1e3)
        self.unwritten.clear()


def train(config: RunConfig, run_dir: Path, writer: EventWriter, *, cores: list[int] | None = None) -> None:
    rank = dist.get_rank()
    strategy, model, device, start_step, resumed_from = _build(config, run_dir, writer, cores)
    writer.start_heartbeat(config.events.heartbeat_s)
    board = ScalarBoard(run_dir) if config.events.tensorboard and rank == 0 else None
    evaluation = (Evaluation(config, strategy, writer, device, board=board, run_dir=run_dir, resumed_from=resumed_from)
                  if config.evaluation.every else None)  # every rank: evaluating is a collective
    batches = global_batches(config, model, start_step, group=strategy.data_group)
    log = _StepLog(config, writer, strategy, device, board)
    for step in range(start_step, config.training.steps):
        if step == config.faults.step and rank == config.faults.rank:
            log.flush()
            raise RuntimeError(f"fault injected by config (faults.step={step}, faults.rank={rank})")
        batch = next(batches)
        started = time.perf_counter()
        loss = strategy.train_step(step, batch)
        elapsed = time.perf_counter() - started
        log.flush()  # the previous step's loss: every rank has issued its all-reduce by now
        log.add(step + 1, loss, elapsed)
        if not isinstance(loss, PendingLoss):
            log.flush()
        writer.step = step + 1
        events, t0 = strategy.take_events()
        writer.stage_events(events, t0)
        for kind, fields in strategy.take_records():
            if rank == 0:  # every rank decided the same
                writer.write(kind, **fields)
        if config.training.checkpoint_every and (step + 1) % config.training.checkpoint_every == 0:
            log.flush()
            folder = _save(run_dir, step + 1, rank, strategy, device)
            writer.write("checkpoint", step=step + 1, path=str(folder))
        if evaluation is not None:
            evaluation.after_step(step + 1, elapsed)  # outside the step's clock
    log.flush()
    _finish(config, run_dir, writer, strategy, board, rank)


def _finish(config: RunConfig, run_dir: Path, writer: EventWriter, strategy: Strategy, board, rank: int) -> None:
    strategy.close()
    if board is not None:
        board.close()
    if config.run.dump_params:
        folder = run_dir / "params"
        folder.mkdir(exist_ok=True)
        torch.save(strategy.param_state(), folder / f"rank{rank}.pt")
    dist.barrier()
    writer.write("end", step=config.training.steps, status="SUCCEEDED")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbench.runtime.entry", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, action="append",
                        help="path to the run's config.json; repeat it to train several runs one after another "
                             "in the same processes (a sweep: each run its own directory, no restart in between)")
    args = parser.parse_args(argv)
    paths = list(args.config)
    configs = [RunConfig.from_json(path) for path in paths]
    run_dirs = [Path(config.run.dir or Path(path).parent) for config, path in zip(configs, paths)]
    # under a placement, this process runs the mesh rank the planner put on its device: every later use of
    # RANK (process group, events, strategies) sees the mesh rank; LOCAL_RANK still picks the device
    process = int(os.environ.get("RANK", 0))
    rank = configs[0].mesh_rank(process)
    os.environ["RANK"], os.environ[PROCESS_RANK_ENV] = str(rank), str(process)
    for index, (config, run_dir) in enumerate(zip(configs, run_dirs)):
        writer = EventWriter(run_dir, rank)
        os.environ["WORKBENCH_RUN_DIR"] = str(run_dir)  # this run's directory, for the strategies that read it
        try:
            if index == 0:
                check_shared_processes(configs)
                _start_process_group(config)
            check_backend_for_plan(_PROCESS["backend"], pick_device(config.run.device), config.plan)
            train(config, run_dir, writer, cores=_PROCESS["cores"])
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the run directory
            writer.error(exc)
            writer.close()
            for later in run_dirs[index + 1:]:  # the sweep stops here: its later runs say why they did not run
                skipped = EventWriter(later, rank)
                skipped.error(RuntimeError(f"not run: the run before it in the same processes ({run_dir}) failed"))
                skipped.close()
            print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            os._exit(1)  # skip process-group teardown that could block on a dead peer
        writer.close()
    dist.destroy_process_group()
    return 0


_PROCESS: dict = {}  # what the first run of the process set up: "cores" (pinned, or None) and "backend"


def _start_process_group(config: RunConfig) -> None:
    """Once per process: threads, core pinning and the default process group, for the first run's settings."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size != config.world_size:
        raise ValueError(f"plan {config.plan.name!r} on mesh {config.plan.mesh} needs {config.world_size} "
                         f"processes, torchrun started {world_size}; launch with --nproc-per-node "
                         f"{config.world_size}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    device = pick_device(config.run.device)
    _PROCESS["cores"] = pin_cpu_rank(device)
    _PROCESS["backend"] = init_distributed(device, timeout_s=config.run.collective_timeout_s,
                                           requested_device=config.run.device)


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: the run is complete and recorded, and a native thread of the
    # collective library still being torn down at exit has aborted a finished rank ("terminate called
    # without an active exception", exit -6), which turned a successful run into a failed job.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
