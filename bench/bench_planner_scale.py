"""Planning at the scale of real clusters: the simulator on 64-device shapes, what a caller pays per call.

Targets (the issue "planning at the scale of real clusters"): simulating 1F1B at 64 stages x 256
micro-batches with memory accounting under 100 ms, generating the schedule included (a partition
editor or a planner asks for the same kind and shape again with new stage costs, so each repeat
draws new costs); GroPipe 8 groups x 8 stages at 64 micro-batches under 200 ms, its schedule from
the registry as the planner's estimate asks for it (one iteration without delay; three with a
delayed update, which the estimate reads its steady iteration from). The first call of a shape,
which also generates, lowers and compiles the schedule, is its own row, and so is making the
timeline (an ``Event`` per event) of the 64 x 256 result, which the metrics and memory do not need.
Today's 16 x 64 case of ``bench_scheduling.py`` is kept for comparison.

The planner's own rows run ``workbench plan`` as a user does, a whole process (its start, the
profile found in the cache without building the model, the search, the printout): GPT-2 with 48
layers on 64 devices with ``--fine-grained`` (target 3 s) and on 1,024 devices (target 10 s), each
run once untimed first so the profile is cached; and profiling that model on one thread with the
cache off (target 30 s). CPU time of these rows is the child process's.

Every row is a :class:`Measurement` in :data:`MEASUREMENTS` (planner rows go there too): its
``setup`` returns the callable that is timed (called once untimed where the row is about repeated
calls), the median of ``repeats`` calls is reported, wall and CPU, because the machine may be
shared. Writes ``bench/results/planner_scale.json`` (or the
path after ``--out``; ``--only a,b`` runs the rows whose names contain ``a`` or ``b`` and keeps the
file's other rows). The script only uses the public API, so pointing ``PYTHONPATH`` at an
older checkout times that one (the "before" numbers of bench/RESULTS.md).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from workbench.core.costs import ClusterSpec, LayerCost, ModelCosts
from workbench.core.plan import ParallelPlan
from workbench.planning.costs.clusters import get_cluster
from workbench.scheduling import generators as g
from workbench.scheduling.registry import schedule_for
from workbench.scheduling.simulate import simulate
from workbench.scheduling.stagecosts import StageCosts

RESULTS = Path(__file__).resolve().parent / "results" / "planner_scale.json"
NAN = float("nan")


@dataclass(frozen=True)
class Measurement:
    """One row: ``setup()`` builds what the row needs (untimed) and returns the call that is timed."""

    name: str
    setup: Callable[[], Callable[[], object]]
    target_ms: float = NAN
    repeats: int = 7
    note: str = ""


def cluster_64() -> ClusterSpec:
    """8 nodes of 8 H100s on InfiniBand: the 64 devices of the issue's shapes."""
    c16 = get_cluster("2x8xH100-IB")
    return ClusterSpec("8x8xH100-IB", 8, 8, c16.device, c16.intra_node, c16.inter_node)


def stage_costs(num_stages: int, seed: int) -> StageCosts:
    """Per-stage costs as a partition gives them: times, activations and messages differ from stage to stage."""
    rng = random.Random(seed)
    forward = tuple(rng.uniform(0.8, 1.2) for _ in range(num_stages))
    return StageCosts(forward_ms=forward, backward_ms=tuple(2 * f * rng.uniform(0.9, 1.1) for f in forward),
                      send_bytes=tuple(rng.randint(2, 6) * 10**6 for _ in range(num_stages - 1)) + (0,),
                      param_bytes=tuple(rng.randint(5, 15) * 10**7 for _ in range(num_stages)),
                      grad_bytes=tuple(rng.randint(5, 15) * 10**7 for _ in range(num_stages)),
                      optimizer_bytes=tuple(rng.randint(10, 30) * 10**7 for _ in range(num_stages)),
                      activation_bytes=tuple(rng.randint(5, 15) * 10**5 for _ in range(num_stages)))


def _cycling(num_stages: int) -> Callable[[], StageCosts]:
    """New costs on every call (as when a boundary moves), from a few prepared in advance."""
    prepared = [stage_costs(num_stages, seed) for seed in range(5)]
    calls = iter(range(10**9))
    return lambda: prepared[next(calls) % len(prepared)]


def forget_schedules() -> None:
    """Drop the generators' remembered schedules (and so their compiled forms): the next call is a first call."""
    for generator in (g.one_f_one_b, g.gropipe):
        getattr(generator, "cache_clear", lambda: None)()


def _warm(call: Callable[[], object]) -> Callable[[], object]:
    """``call`` once untimed (the shape's first call has its own row), then the call the row times."""
    call()
    return call


def _1f1b_64x256() -> Callable[[], object]:
    cluster, costs = cluster_64(), _cycling(64)
    return lambda: simulate(g.one_f_one_b(64, 256), costs(), cluster).metrics["peak_memory_bytes"]


def simulate_1f1b_64x256() -> Callable[[], object]:
    return _warm(_1f1b_64x256())


def simulate_1f1b_64x256_first_call() -> Callable[[], object]:
    call = _1f1b_64x256()

    def first() -> object:
        forget_schedules()
        return call()
    return first


def timeline_1f1b_64x256() -> Callable[[], object]:
    results = iter([simulate(g.one_f_one_b(64, 256), stage_costs(64, 0), cluster_64()) for _ in range(3)])
    return lambda: len(next(results).timeline)


def simulate_gropipe_8x8_m64(delay: int) -> Callable[[], Callable[[], object]]:
    def setup() -> Callable[[], object]:
        plan = ParallelPlan.parse(f"gropipe-8x8-1f1b-m64-d{delay}")
        cluster, costs, iterations = cluster_64(), _cycling(8), 3 if delay else 1
        return _warm(lambda: simulate(schedule_for(plan, num_iterations=iterations), costs(), cluster).metrics)
    return setup


def simulate_1f1b_16x64_comm() -> Callable[[], object]:
    """bench_scheduling.py's row: uniform costs on two nodes, one schedule simulated again and again."""
    costs = StageCosts.uniform(16, forward_ms=1.0, backward_ms=2.0, send_bytes=4 * 10**6, param_bytes=10**8,
                               activation_bytes=10**6)
    schedule, cluster = g.one_f_one_b(16, 64), get_cluster("2x8xH100-IB")
    simulate(schedule, costs, cluster)
    return lambda: simulate(schedule, costs, cluster).metrics


GPT2_48 = ["gpt2-small", "--model-arg", "n_layer=48"]


def workbench_command(*args: str, warm: bool = True) -> Callable[[], Callable[[], object]]:
    """A row timing ``workbench ARGS`` as a whole process on one thread (run once untimed first when ``warm``)."""
    def setup() -> Callable[[], object]:
        command = [sys.executable, "-m", "workbench.cli", *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}

        def call() -> object:
            return subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout

        if warm:
            call()
        return call
    return setup


def gpt2_48_costs() -> ModelCosts:
    """GPT-2 small with 48 blocks as ``workbench plan gpt2-small --model-arg n_layer=48 --profile-batch 2`` profiles
    it and projects it onto an H100 (the embeddings, 48 equal blocks, the head), written out so that the row needs
    neither torch nor a profile."""
    embeddings = LayerCost("embeddings", 0.05726080955223881, 0.10452192477611941, param_bytes=157535232,
                           activation_bytes=786432, saved_bytes=789504, grad_bytes=157535232,
                           optimizer_bytes=315070464, peak_bytes=316648448, num_params=39383808, input_grad_ms=0.0,
                           weight_grad_ms=0.14827687933999195)
    blocks = [LayerCost(f"block_{i}", 0.1213465456502242, 0.2326930913004484, flops=3724541952,
                        param_bytes=28351488, activation_bytes=786432, saved_bytes=28315648, grad_bytes=28351488,
                        optimizer_bytes=56702976, peak_bytes=86591488, num_params=7087872,
                        input_grad_ms=0.1640734110533154, weight_grad_ms=0.11087830356529742) for i in range(48)]
    head = LayerCost("head", 0.6007879375784754, 1.1915758751569507, flops=19761856512, param_bytes=154395648,
                     activation_bytes=51463168, saved_bytes=53040132, grad_bytes=154395648, optimizer_bytes=308791296,
                     peak_bytes=414081028, num_params=38598912, input_grad_ms=0.40516444324764184,
                     weight_grad_ms=0.5024943779936194)
    return ModelCosts("gpt2-small", 2, "H100", (embeddings, *blocks, head), input_bytes=2048)


def forget_per_layer_search() -> None:
    """Drop what the per-layer search remembers between calls (1F1B's in-flight counts among the schedules, the
    fetch counts of layout changes): the next call is a first call, as the command line's."""
    forget_schedules()
    from workbench.planning.layerwise import layer_costs
    from workbench.scheduling import registry
    for cached in (getattr(registry, "_memory", None), getattr(layer_costs, "_fetches", None),
                   getattr(layer_costs, "_fetch_units", None)):
        getattr(cached, "cache_clear", lambda: None)()


def per_layer_search_gpt2_48_64() -> Callable[[], object]:
    """``search_hybrid`` as ``workbench plan gpt2-small --model-arg n_layer=48 --profile-batch 2 --cluster
    8x8xH100-IB --batch 512 --fine-grained`` runs it: every pipeline degree, micro-batch count, split and template."""
    from workbench.planning.strategy.hybrid import search_hybrid

    costs, cluster = gpt2_48_costs(), get_cluster("8x8xH100-IB")

    def first() -> object:
        forget_per_layer_search()
        return search_hybrid(costs, cluster, 512, budget_bytes=cluster.device.memory_bytes).searched
    return first


MEASUREMENTS: list[Measurement] = [
    Measurement("plan_cli_gpt2_48_64_devices_fine_grained_ms",
                workbench_command("plan", *GPT2_48, "--profile-batch", "2", "--cluster", "8x8xH100-IB", "--batch",
                                  "512", "--fine-grained"), 3000.0, repeats=3,
                note="workbench plan, 8x8xH100-IB, batch 512, --fine-grained, profile cached: the whole process"),
    Measurement("plan_cli_gpt2_48_1024_devices_ms",
                workbench_command("plan", *GPT2_48, "--profile-batch", "2", "--cluster", "128x8xH100-IB", "--batch",
                                  "1024"), 10000.0, repeats=3,
                note="workbench plan, 128x8xH100-IB, batch 1024, profile cached: the whole process"),
    Measurement("plan_cli_gpt2_48_1024_devices_fine_grained_ms",
                workbench_command("plan", *GPT2_48, "--profile-batch", "2", "--cluster", "128x8xH100-IB", "--batch",
                                  "1024", "--fine-grained"), repeats=1,
                note="the same with the per-layer search (no target)"),
    Measurement("profile_gpt2_48_one_thread_ms",
                workbench_command("profile", *GPT2_48, "--batch", "2", "--no-cache", warm=False), 30000.0, repeats=1,
                note="workbench profile on one thread, cache off (identical blocks timed once)"),
    Measurement("simulate_1f1b_64x256_memory_ms", simulate_1f1b_64x256, 100.0,
                note="generation + simulation with memory, new stage costs each call"),
    Measurement("simulate_1f1b_64x256_first_call_ms", simulate_1f1b_64x256_first_call, repeats=3,
                note="the shape's first call: generates, lowers and compiles the schedule"),
    Measurement("timeline_1f1b_64x256_ms", timeline_1f1b_64x256, repeats=3,
                note="making the 64 x 256 result's timeline (82k events) when it is read"),
    Measurement("simulate_gropipe_8x8_m64_d0_ms", simulate_gropipe_8x8_m64(0), 200.0,
                note="schedule_for(gropipe-8x8-1f1b-m64-d0) + simulation, new stage costs each call"),
    Measurement("simulate_gropipe_8x8_m64_d1_3_iterations_ms", simulate_gropipe_8x8_m64(1), 200.0,
                note="the delayed update as the estimate simulates it: three iterations"),
    Measurement("simulate_1f1b_16x64_comm_ms", simulate_1f1b_16x64_comm, 50.0, repeats=9,
                note="bench_scheduling.py's case, for comparison"),
    Measurement("per_layer_search_gpt2_48_layers_64_devices_ms", per_layer_search_gpt2_48_64, 700.0, repeats=3,
                note="per-layer search, GPT-2 48 layers, 64 devices (1F1B, ZB-H1 and ZB-H2 pipelines): each call "
                     "a first call"),
]


def timed(call: Callable[[], object], repeats: int) -> tuple[float, float, list[float]]:
    """Median wall ms, median CPU ms, and every wall time."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), _cpu_s()
        call()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((_cpu_s() - c0) * 1e3)
    return statistics.median(wall), statistics.median(cpu), wall


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the rows that run ``workbench``)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _verdict(value: float, target: float) -> str:
    return "-" if target != target else "ok" if value < target else "OVER"


def main(argv: list[str]) -> int:
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else RESULTS
    load_before = os.getloadavg()[0]
    rows = json.loads(out.read_text()).get("rows", {}) if out.is_file() else {}
    only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else None
    print(f"{'measurement':<46} {'wall ms':>9} {'cpu ms':>9} {'target ms':>10}")
    for m in MEASUREMENTS:
        if only is not None and not any(part in m.name for part in only):
            continue
        wall, cpu, every = timed(m.setup(), m.repeats)
        rows[m.name] = {"wall_ms": round(wall, 2), "cpu_ms": round(cpu, 2),
                        "every_wall_ms": [round(t, 2) for t in every],
                        "target_ms": None if m.target_ms != m.target_ms else m.target_ms, "repeats": m.repeats,
                        "note": m.note}
        print(f"{m.name:<46} {wall:>9.1f} {cpu:>9.1f} {m.target_ms:>10.0f}  {_verdict(wall, m.target_ms)} wall, "
              f"{_verdict(cpu, m.target_ms)} cpu")
    data = {"rows": rows, "load_average_1min": [load_before, os.getloadavg()[0]], "python": sys.version.split()[0]}
    print(f"load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
