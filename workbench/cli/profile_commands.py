"""Commands over models and measurements: ``models``, ``profile`` and ``commbench``.

``profile`` measures a zoo model layer by layer (forward, backward and the
backward's input- and weight-gradient parts; optionally projecting the
result to another device) and writes the ``ModelCosts`` JSON; ``commbench``
launches the link benchmark under torchrun in a subprocess and prints the
fitted links. torch is imported inside the handlers so ``workbench --help``
stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .model_args import add_model_arg, parse_model_args
from .result import Result

MB = 1024 ** 2


def _models(args: argparse.Namespace) -> Result:
    from ..models import describe_models

    rows = describe_models()
    lines = [f"{'model':<16}{'params':>14}  description"]
    lines += [f"{r['name']:<16}{r['num_params']:>14,}  {r['description']}" for r in rows]
    return Result("\n".join(lines), {"models": rows})


def _split_cells(values: list[float | None]) -> str:
    """The I and W columns: measured times, '-' where the layer has no measured split."""
    return "".join(f"{v:>10.2f}" if v is not None else f"{'-':>10}" for v in values)


def _costs_table(costs) -> str:
    """Per-layer table: forward, fused backward and its input-gradient (I) and weight-gradient (W) parts."""
    lines = [f"{costs.model} batch {costs.batch_size} on {costs.device} ({costs.dtype})",
             f"{'layer':<14}{'fwd ms':>10}{'bwd ms':>10}{'I ms':>10}{'W ms':>10}{'GFLOP':>10}{'params MB':>11}"
             f"{'act MB':>9}{'saved MB':>10}"]
    for layer in costs.layers:
        lines.append(f"{layer.name:<14}{layer.forward_ms:>10.2f}{layer.backward_ms:>10.2f}"
                     f"{_split_cells([layer.input_grad_ms, layer.weight_grad_ms])}{layer.flops / 1e9:>10.3f}"
                     f"{layer.param_bytes / MB:>11.2f}{layer.activation_bytes / MB:>9.2f}{layer.saved_bytes / MB:>10.2f}")
    measured = [l for l in costs.layers if l.has_split_backward]
    split_totals = [sum(l.split_backward_ms[part] for l in measured) if measured else None for part in (0, 1)]
    lines.append(f"{'total':<14}{costs.total('forward_ms'):>10.2f}{costs.total('backward_ms'):>10.2f}"
                 f"{_split_cells(split_totals)}{costs.total('flops') / 1e9:>10.3f}{costs.total('param_bytes') / MB:>11.2f}")
    if measured and len(measured) < len(costs.layers):
        lines.append(f"(I and W totals over the {len(measured)} of {len(costs.layers)} layers with a measured split)")
    return "\n".join(lines)


def _shared_lines(costs) -> str:
    """Which layers share one timing (``meta["identical_layers"]``), and the layers it was taken on."""
    names = costs.names
    return "".join(f"\n{len(group['layers'])} identical layers share one timing ({names[group['layers'][0]]} .. "
                   f"{names[group['layers'][-1]]}), taken on {', '.join(names[i] for i in group['timed'])}"
                   for group in costs.meta.get("identical_layers", []))


def _profile(args: argparse.Namespace) -> Result:
    from ..profiling import profile
    from ..profiling.projection import project

    if args.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    model = args.model
    if args.model_arg:
        from ..models.zoo import build_model, list_models

        if model not in list_models():
            raise ValueError(f"--model-arg applies to a zoo model; {model!r} is not one (zoo models: "
                             f"{', '.join(list_models())})")
        model = build_model(model, **parse_model_args(args.model_arg))
    costs = profile(model, args.batch, device=args.device, warmup=args.warmup, repeats=args.repeats,
                    cache=not args.no_cache, progress=not args.json, optimizer=args.optimizer,
                    microbatch_passes=args.microbatch_passes, share_identical=not args.every_layer,
                    fused_weight_grads=args.fused_weight_grads)
    if args.project:
        costs = project(costs, args.project, dtype=args.dtype)
    text = _costs_table(costs) + _shared_lines(costs)
    if costs.meta.get("fused_weight_grads"):
        text += "\nlinear layers timed fused: weight gradients accumulated inside their products (I queues, W runs)"
    factors = costs.meta.get("microbatch_factors")
    if factors:
        text += "\nmicro-batch passes against the profile's share: " + "; ".join(
            f"{b}: " + " / ".join(f"{factors[mode][i]:.2f}" for mode in ("hot", "cold", "bound"))
            for i, b in enumerate(factors["sizes"])) + " (hot / cache flushed / bound weights)"
    if args.out:
        path = costs.save(args.out)
        text += f"\nwrote {path}"
    return Result(text, costs.to_dict())


def _commbench(args: argparse.Namespace) -> Result:
    if args.nproc < 2:
        raise ValueError(f"--nproc must be >= 2, got {args.nproc}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="commbench-")) / "link.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               "-m", "workbench.runtime.commbench", "--out", str(out), "--iters", str(args.iters)]
    if args.sizes:
        command += ["--sizes", args.sizes]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
    if done.returncode != 0 or not out.is_file():
        output = (done.stderr or done.stdout).strip().splitlines()
        causes = [line for line in output if line.startswith("[rank") and "Error" in line]
        tail = causes[-1] if causes else "\n".join(output[-15:])
        return Result(f"commbench failed (exit {done.returncode}): {' '.join(command)}\n{tail}",
                      {"error": tail, "command": command}, exit_code=1)
    data = json.loads(out.read_text())
    lines = [f"{data['world_size']} ranks, {data['backend']} on {data['device']}  -> {out}",
             f"{'bytes':>10}{'p2p ms':>10}{'allreduce ms':>14}"]
    for p2p, allreduce in zip(data["measurements"]["p2p"], data["measurements"]["allreduce"]):
        lines.append(f"{p2p['bytes']:>10}{p2p['ms']:>10.3f}{allreduce['ms']:>14.3f}")
    for kind in ("p2p", "allreduce"):
        link = data[kind]
        if link is None:
            lines.append(f"fitted {kind}: no fit ({data[f'{kind}_error']})")
        else:
            lines.append(f"fitted {kind}: latency {link['latency_us']:.1f} us, bandwidth {link['bandwidth_gbs']:.3f} GB/s")
    return Result("\n".join(lines), {**data, "path": str(out)})


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("models", parents=[common], help="the model zoo with parameter counts")
    p.set_defaults(handler=_models)
    p = sub.add_parser("profile", parents=[common], help="measure a zoo model layer by layer")
    p.add_argument("model", help="zoo model name (see `workbench models`)")
    p.add_argument("--batch", type=int, default=8, help="batch size of the synthetic batch")
    add_model_arg(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per layer")
    p.add_argument("--warmup", type=int, default=1, help="untimed repetitions per layer")
    p.add_argument("--optimizer", default="adam", help="optimizer whose state is counted: adam, adamw, sgd, none")
    p.add_argument("--no-cache", action="store_true", help="measure even if a cached profile exists")
    p.add_argument("--every-layer", action="store_true",
                   help="time every layer; by default layers that are the same computation on the same shapes (the "
                        "blocks of a transformer) share one timing, taken on the first few (meta.identical_layers)")
    p.add_argument("--microbatch-passes", action="store_true",
                   help="(CPU) also time the batch in micro-batches of 1, 2, 4, ... samples, with the cache hot, "
                        "flushed, and with bound weight copies (meta.microbatch_factors), which the planner "
                        "models the runtime's compute from")
    p.add_argument("--fused-weight-grads", action="store_true",
                   help="time the linear layers as stages with training.fused_weight_grads run them: weight "
                        "gradients accumulated inside their products (I queues them, W runs them)")
    p.add_argument("--project", default=None, help="project the profile onto a device: V100, A100, H100, local-cpu")
    p.add_argument("--dtype", default="float32", help="dtype for --project (float32, bfloat16, float16, ...)")
    p.add_argument("--out", default=None, help="write the ModelCosts JSON here")
    p.set_defaults(handler=_profile)
    p = sub.add_parser("commbench", parents=[common], help="measure p2p and all-reduce links under torchrun")
    p.add_argument("--nproc", type=int, default=2, help="ranks on this machine")
    p.add_argument("--out", default=None, help="write the fitted links (JSON) here")
    p.add_argument("--sizes", default=None, help="comma-separated message sizes in bytes")
    p.add_argument("--iters", type=int, default=10, help="timed repetitions per size")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the benchmark is abandoned")
    p.set_defaults(handler=_commbench)
