"""The workbench on ONE GPU: GPT-2 small's MFU, the profile against the step, our 1F1B against torch's.

Problem: the GPU machines we are lent have one GPU and a few minutes, so the
multi-GPU comparisons cannot run there; what one GPU can tell us is how close
a training step comes to the peak, whether the per-layer profile the planner
relies on adds up to a real step, and what the shared-GPU (``staged``)
runtime does to a pipeline.

Approach, three parts in one run, sized to finish within five minutes on one H100:

a. GPT-2 small (zoo ``gpt2-small``, dropout off, synthetic tokens, AdamW, bf16
   autocast) on one rank in this process, eager and under ``torch.compile``
   (forward + loss): warm-up steps, then timed steps between CUDA events. MFU =
   model FLOPs per step / step time / the GPU's datasheet bf16 dense peak
   (:data:`PEAK_TFLOPS`). The FLOPs are the workbench profiler's per-layer
   counts for the same batch (FlopCounterMode, forward + backward, 2 per
   multiply-add, attention counted whole); ``6 * N * tokens + 12 * layers *
   width * seq_len * tokens`` (N without the embedding tables) is kept beside.
b. ``workbench.profiling.profile`` of that model and batch under the same
   autocast: the sum of per-layer forward + backward times over the eager
   step's forward + backward, and over its whole step.
c. ``pp2-1f1b-mM`` (ours at its best: fused weight-gradient accumulation)
   vs ``torchpp2-1f1b-mM`` (torch's ``Schedule1F1B``, at its best) with both
   ranks on ``cuda:0`` (so ``staged``): every micro-batch count of both sides
   ``--reps`` times, interleaved and mirrored (A B, B A, ...), as runs of ONE
   torchrun launch (``bench_runtime.sweep_throughputs``: the start-up, about
   half a minute on a lent GPU machine, is paid once). Each side is reported
   at the count whose median was highest; the backend of every run comes
   from its start event.

Without CUDA it says so and exits 0, writing nothing. ``--smoke`` runs every
part on the CPU at toy sizes (tiny GPT-2, 2 steps, the ``eager`` compile
backend, staged forced) into ``bench/results/gpu-smoke.json``. Otherwise it
prints a table and writes ``bench/results/gpu.json``; a part that raised is
recorded there and makes the exit status 1.

    .venv/bin/python bench/bench_gpu.py [--smoke] [--batch 16] [--seq-len 1024] [--steps 10] [--reps 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

import bench_runtime
from workbench.core.config import merge_changes
from workbench.core.hardware import DATASHEET_DEVICES
from workbench.profiling.profiler import DeviceClock

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "gpu.json"
SMOKE_RESULTS = HERE / "results" / "gpu-smoke.json"

# Peak dense TFLOP/s by a part of torch.cuda.get_device_name(), first match wins: the planner's datasheet devices
# (SXM parts), and the variants it has no preset for (datasheet figures, dense).
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200 NVL", {"float32": 60.0, "bfloat16": 835.0}),
    ("H200", DATASHEET_DEVICES["H200"].peak_tflops),  # the H100 SXM's compute with more, faster memory
    ("H100 PCIe", {"float32": 51.2, "bfloat16": 756.0}),
    ("H100 NVL", {"float32": 60.0, "bfloat16": 835.0}),
    ("H100", DATASHEET_DEVICES["H100"].peak_tflops),
    ("A100", DATASHEET_DEVICES["A100"].peak_tflops),
]
NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
SMOKE_GPT2 = {"model": "gpt2-tiny", "overrides": {"n_layer": 2, "seq_len": 32, **NO_DROPOUT}, "batch": 2}
SMOKE_PIPELINE = {"model": {"name": "resnet18", "overrides": {"image_size": 32, "num_classes": 10}},
                  "training": {"global_batch": 8}}


def peak_tflops(device_name: str, dtype: str = "bfloat16") -> float | None:
    """The table's dense peak for ``device_name`` at ``dtype``, None for a GPU not in it (or a CPU)."""
    for part, peaks in PEAK_TFLOPS:
        if part in device_name:
            return peaks.get(dtype)
    return None


def build_gpt2(spec: dict, device: torch.device) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """The zoo model of ``spec`` on ``device`` (seeded random weights) and a synthetic token batch."""
    from workbench.models import build_model, sample_batch

    seq = build_model(spec["model"], seed=0, **spec["overrides"]).to(device).train()
    inputs, targets = sample_batch(seq, spec["batch"])
    return seq, inputs.to(device), targets.to(device)


def analytic_flops(seq: Any, tokens: int) -> float:
    """``6 * N * tokens + 12 * layers * width * seq_len * tokens``; N leaves out the embedding tables."""
    config = seq.config
    embedding = sum(p.numel() for m in seq.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters())
    weights = sum(p.numel() for p in seq.parameters()) - embedding
    return 6.0 * weights * tokens + 12.0 * config["n_layer"] * config["n_embd"] * config["seq_len"] * tokens


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def time_steps(seq: Any, loss_of: Callable, batch: tuple, device: torch.device, dtype: torch.dtype | None,
               warmup: int, steps: int) -> dict[str, Any]:
    """Warm-up steps (wall time kept: it holds compilation), then ``steps`` timed training steps."""
    optimizer = torch.optim.AdamW(seq.parameters(), lr=1e-4, fused=device.type == "cuda")
    clock = DeviceClock(device)
    marks, warmup_s = [], 0.0
    started = time.perf_counter()
    for step in range(warmup + steps):
        if step == warmup:
            _sync(device)
            warmup_s = time.perf_counter() - started
        start = clock.mark()
        with autocast(device, dtype):
            loss = loss_of(*batch)
        loss.backward()
        middle = clock.mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append((start, middle, clock.mark()))
    timed = marks[warmup:]
    span_ms = clock.ms(timed[0][0], timed[-1][2])
    loss_value = float(loss.detach().float())
    del optimizer
    return {"warmup_steps": warmup, "steps": steps, "warmup_s": round(warmup_s, 3),
            "step_ms": span_ms / steps, "step_ms_median": statistics.median(clock.ms(a, c) for a, _, c in timed),
            "fwd_bwd_ms_median": statistics.median(clock.ms(a, b) for a, b, _ in timed),
            "final_loss": loss_value, "loss_finite": math.isfinite(loss_value)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_loss(seq: Any, compiled: bool, compile_backend: str) -> Callable:
    """``(inputs, targets) -> loss`` of the sequence, under ``torch.compile`` when asked."""
    def forward_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return seq.loss_fn(seq(inputs), targets)

    return torch.compile(forward_loss, backend=compile_backend) if compiled else forward_loss


def profile_part(seq: Any, batch: tuple, device: torch.device, dtype: torch.dtype | None) -> dict[str, Any]:
    """Per-layer profile of the sequence on the batch, under the step's autocast: times and FLOP counts."""
    from workbench.profiling import profile

    with autocast(device, dtype):
        costs = profile(seq, batch, device=str(device), warmup=1, repeats=3, cache=False, progress=False,
                        optimizer="adamw")
    layers = [{"name": layer.name, "forward_ms": layer.forward_ms, "backward_ms": layer.backward_ms,
               "flops": layer.flops, "backward_flops": back}
              for layer, back in zip(costs.layers, costs.meta["backward_flops"], strict=True)]
    forward = sum(layer["forward_ms"] for layer in layers)
    backward = sum(layer["backward_ms"] for layer in layers)
    return {"timer": costs.meta["timer"], "forward_ms": forward, "backward_ms": backward,
            "sum_ms": forward + backward, "flops_per_step": float(sum(layer["flops"] + layer["backward_flops"]
                                                                      for layer in layers)),
            "layers": layers}


def attempt(errors: dict[str, str], part: str, action: Callable[[], Any]) -> Any:
    """``action()``, or None with the error recorded under ``part`` (the other parts still run)."""
    started = time.perf_counter()
    try:
        return action()
    except Exception as exc:  # noqa: BLE001 - a failed part is reported, not fatal to the others
        errors[part] = f"{type(exc).__name__}: {exc}"[:2000]
        print(f"  {part} failed: {errors[part].splitlines()[0][:200]}", flush=True)
        traceback.print_exc()
        return None
    finally:
        print(f"  {part}: {time.perf_counter() - started:.1f} s", flush=True)


def gpt2_parts(spec: dict, device: torch.device, args: argparse.Namespace, errors: dict[str, str]) -> dict:
    """Parts a and b on one model: the eager step, the profile, the compiled step; MFU from the profile's FLOPs.

    The model and its batch live only in this call, so their memory is free when it returns.
    """
    dtype = torch.bfloat16 if args.precision == "bf16" else None
    seq, inputs, targets = build_gpt2(spec, device)
    batch, tokens = (inputs, targets), inputs.numel()

    def timed(compiled: bool) -> dict:
        loss_of = step_loss(seq, compiled, args.compile_backend)
        return time_steps(seq, loss_of, batch, device, dtype, args.warmup, args.steps)

    eager = attempt(errors, "gpt2 eager step", lambda: timed(False))
    profiled = attempt(errors, "gpt2 profile", lambda: profile_part(seq, batch, device, dtype))
    compiled = attempt(errors, "gpt2 compiled step", lambda: timed(True))
    analytic = analytic_flops(seq, tokens)
    part = {"model": spec["model"], "overrides": spec["overrides"], "batch": spec["batch"],
            "seq_len": int(inputs.shape[1]), "tokens_per_step": tokens,
            "params": sum(p.numel() for p in seq.parameters()), "autocast": args.precision, "optimizer": "AdamW",
            "compile_backend": args.compile_backend, "flops_per_step_analytic": analytic}
    if profiled is not None:
        part.update(flops_per_step=profiled["flops_per_step"], flops_source="profiler (FlopCounterMode)",
                    profiler_over_analytic=profiled["flops_per_step"] / analytic)
    else:
        part.update(flops_per_step=analytic, flops_source="analytic (6N tokens + attention)")
    part["runs"] = {name: with_mfu(run, part["flops_per_step"], tokens, args.peak)
                    for name, run in (("eager", eager), ("compiled", compiled)) if run is not None}
    return {"mfu": part, "profile": profile_ratios(profiled, eager)}


def release(device: torch.device) -> None:
    """Forget compiled graphs and hand cached GPU memory back before the launches of part c."""
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def with_mfu(run: dict, flops: float, tokens: int, peak: float | None) -> dict:
    seconds = run["step_ms"] / 1e3
    achieved = flops / seconds / 1e12
    return {**run, "tokens_per_s": tokens / seconds, "tflops": achieved,
            "mfu": None if peak is None else achieved / peak}


def profile_ratios(profiled: dict | None, eager: dict | None) -> dict | None:
    """The profile's sum against the eager step: over its forward + backward, and over the whole step."""
    if profiled is None:
        return None
    out = {k: v for k, v in profiled.items() if k != "flops_per_step"}
    if eager is not None:
        out.update(step_ms=eager["step_ms"], fwd_bwd_ms=eager["fwd_bwd_ms_median"],
                   sum_over_fwd_bwd=profiled["sum_ms"] / eager["fwd_bwd_ms_median"],
                   sum_over_step=profiled["sum_ms"] / eager["step_ms"])
    return out


@contextlib.contextmanager
def forced_backend(name: str | None):
    """``WORKBENCH_DIST_BACKEND=name`` for the launches made inside (None: leave the environment alone)."""
    from workbench.core.rundir import DIST_BACKEND_ENV

    before = os.environ.get(DIST_BACKEND_ENV)
    if name is not None:
        os.environ[DIST_BACKEND_ENV] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DIST_BACKEND_ENV, None)
        else:
            os.environ[DIST_BACKEND_ENV] = before


def pipeline_part(args: argparse.Namespace) -> dict:
    """Part c: ours vs torch's 1F1B on 2 ranks sharing one device, both at their best micro-batch count."""
    if args.smoke:
        fields = merge_changes(SMOKE_PIPELINE, {"run": {"device": "cpu"}, "training": {"precision": "fp32"}})
    else:  # cuda:0 for both ranks: they share the GPU even on a machine with more
        fields = {"model": args.pp_model, "run": {"device": "cuda:0"},
                  "training": {"global_batch": args.pp_batch, "precision": args.precision}}
    fields = {**fields, "data": {"kind": "synthetic"}, "events": {"tensorboard": False}}
    counts = [int(m) for m in args.microbatches.split(",")]
    sides = {"a": "pp2-1f1b-m{m}", "b": "torchpp2-1f1b-m{m}"}
    order = sweep_order(counts, args.reps)
    ours = bench_runtime.fused(fields)  # torch's side runs with scale_grads off, its best (strategy's docstring)
    runs = [{**(ours if side == "a" else fields), "plan": sides[side].format(m=m)} for side, m in order]
    with forced_backend("staged" if args.smoke else None):
        rates, starts = bench_runtime.sweep_throughputs(runs, args.pp_steps, args.pp_warmup)
    measured: dict[tuple[str, int], list[float]] = {}
    for key, rate in zip(order, rates):
        measured.setdefault(key, []).append(rate)
    medians = {key: statistics.median(values) for key, values in measured.items()}
    best = {side: max(counts, key=lambda m: medians[(side, m)]) for side in sides}
    facts: dict[str, dict[str, list]] = {}
    for run, start in zip(runs, starts):
        plan = facts.setdefault(run["plan"], {"backend": [], "device": [], "shared_by": []})
        for key in plan:
            if start.get(key) not in plan[key]:
                plan[key].append(start.get(key))
    row = {"comparison": "1f1b ours vs torch Schedule1F1B, 2 ranks on 1 device"}
    for side, template in sides.items():
        plan = template.format(m=best[side])
        row.update({f"{side}_plan": plan, f"{side}_samples_per_s": medians[(side, best[side])],
                    f"{side}_runs": measured[(side, best[side])],
                    f"{side}_sweep": {m: medians[(side, m)] for m in counts},
                    f"{side}_backends": facts.get(plan, {}).get("backend", [])})
    row["ratio"] = row["a_samples_per_s"] / row["b_samples_per_s"]
    print("  " + "; ".join(f"{'ours' if side == 'a' else 'torch'} " + ", ".join(
        f"m{m} {medians[(side, m)]:.1f}" for m in counts) for side in sides) + " samples/s", flush=True)
    return {"fields": fields, "microbatches": counts, "steps": args.pp_steps, "warmup": args.pp_warmup,
            "reps": args.reps, "order": [f"{side}{m}" for side, m in order], "rows": [row], "start_events": facts}


def sweep_order(counts: list[int], reps: int) -> list[tuple[str, int]]:
    """Every (side, micro-batch count) ``reps`` times, interleaved and mirrored (A B, then B A, ...), so the
    drift of the shared processes and the first run's warm-up fall on both sides alike."""
    order: list[tuple[str, int]] = []
    for rep in range(reps):
        for m in counts:
            pair = [("a", m), ("b", m)]
            order += pair if rep % 2 == 0 else pair[::-1]
    return order


def _cell(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def print_table(results: dict) -> None:
    """The measurements as one table per part."""
    mfu = results.get("mfu")
    if mfu:
        print(f"\n{mfu['model']} step ({mfu['autocast']} autocast, AdamW), batch {mfu['batch']} x {mfu['seq_len']} "
              f"tokens; {mfu['flops_per_step'] / 1e9:.3g} GFLOP/step ({mfu['flops_source']}); "
              f"peak {_cell(results['peak_tflops'], '.1f')} TFLOP/s")
        print(f"{'run':<10} {'step ms':>10} {'tokens/s':>11} {'TFLOP/s':>9} {'MFU':>7} {'warm-up s':>10}")
        for name, run in mfu["runs"].items():
            print(f"{name:<10} {run['step_ms']:>10.3f} {run['tokens_per_s']:>11.0f} {run['tflops']:>9.3f} "
                  f"{_cell(run['mfu'], '.3f'):>7} {run['warmup_s']:>10.1f}")
    profiled = results.get("profile")
    if profiled:
        print(f"\nprofile sum of per-layer forward + backward: {profiled['sum_ms']:.3f} ms "
              f"(forward {profiled['forward_ms']:.3f}, backward {profiled['backward_ms']:.3f}, {profiled['timer']})")
        if "sum_over_step" in profiled:
            print(f"  / eager forward + backward {profiled['fwd_bwd_ms']:.3f} ms = {profiled['sum_over_fwd_bwd']:.3f}; "
                  f"/ eager step {profiled['step_ms']:.3f} ms = {profiled['sum_over_step']:.3f}")
    pipeline = results.get("pipeline")
    if pipeline:
        print(f"\n{'1F1B, 2 ranks on 1 device':<28} {'A plan':>16} {'A smp/s':>9} {'B plan':>20} {'B smp/s':>9} "
              f"{'A/B':>6}  backends")
        for row in pipeline["rows"]:
            backends = ",".join(sorted(set(row["a_backends"]) | set(row["b_backends"]))) or "?"
            print(f"{'ours vs torch Schedule1F1B':<28} {row['a_plan']:>16} {row['a_samples_per_s']:>9.1f} "
                  f"{row['b_plan']:>20} {row['b_samples_per_s']:>9.1f} {row['ratio']:>6.3f}  {backends}")
    for part, message in results["errors"].items():
        print(f"FAILED {part}: {message.splitlines()[0][:300]}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="every part on the CPU at toy sizes (exercise the code)")
    parser.add_argument("--batch", type=int, default=16, help="GPT-2 small sequences per step")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10, help="timed GPT-2 steps")
    parser.add_argument("--warmup", type=int, default=3, help="GPT-2 steps before the timed ones (compilation)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="autocast dtype (fp32: none)")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (--smoke: eager)")
    parser.add_argument("--pp-model", default="resnet18", help="zoo model of the 1F1B comparison")
    parser.add_argument("--pp-batch", type=int, default=64, help="global batch of the 1F1B comparison")
    parser.add_argument("--pp-steps", type=int, default=8)
    parser.add_argument("--pp-warmup", type=int, default=3, help="steps left out of a launch's throughput")
    parser.add_argument("--microbatches", default="2,4", help="micro-batch counts each 1F1B is swept over")
    parser.add_argument("--reps", type=int, default=2, help="paired launches of the 1F1B comparison (median)")
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out: gpt2, pipeline")
    parser.add_argument("--out", type=Path, default=None, help="results file (default bench/results/gpu.json)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.warmup, args.compile_backend = 2, 1, "eager"
        args.microbatches, args.reps, args.pp_steps, args.pp_warmup = "2", 1, 3, 1
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    args.out = args.out or (SMOKE_RESULTS if args.smoke else RESULTS)
    return args


def gpt2_spec(args: argparse.Namespace) -> dict:
    if args.smoke:
        return SMOKE_GPT2
    overrides = {"seq_len": args.seq_len, "n_positions": max(1024, args.seq_len), **NO_DROPOUT}
    return {"model": "gpt2-small", "overrides": overrides, "batch": args.batch}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("bench_gpu.py needs CUDA (torch.cuda.is_available() is False): nothing measured, nothing written; "
              "--smoke runs it on the CPU at toy sizes")
        return 0
    device = torch.device("cpu") if args.smoke else torch.device("cuda", 0)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    args.peak = peak_tflops(name, "bfloat16" if args.precision == "bf16" else "float32")
    skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    started = time.perf_counter()
    results: dict[str, Any] = {
        "topic": "gpu", "time": time.time(), "smoke": args.smoke, "device": name,
        "gpus": torch.cuda.device_count() if device.type == "cuda" else 0, "torch": torch.__version__,
        "cuda": torch.version.cuda, "precision": args.precision, "peak_tflops": args.peak, "errors": {}}
    print(f"{name}; torch {torch.__version__}; {args.precision} peak {_cell(args.peak, '.1f')} TFLOP/s"
          + (" (smoke: CPU, toy sizes)" if args.smoke else ""), flush=True)
    try:
        if "gpt2" not in skip:
            print("part a/b: GPT-2 steps and profile", flush=True)
            parts = attempt(results["errors"], "gpt2",
                            lambda: gpt2_parts(gpt2_spec(args), device, args, results["errors"]))
            results.update(parts or {})
            release(device)
        if "pipeline" not in skip:
            print("part c: our 1F1B vs torch's Schedule1F1B, 2 ranks sharing the device", flush=True)
            results["pipeline"] = attempt(results["errors"], "pipeline", lambda: pipeline_part(args))
    except KeyboardInterrupt:  # a time limit (gpu_check.sh sends SIGINT): keep what finished
        results["errors"]["interrupted"] = "stopped by SIGINT (a time limit) before every part finished"
    results["wall_s"] = round(time.perf_counter() - started, 1)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.out} after {results['wall_s']} s", flush=True)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
