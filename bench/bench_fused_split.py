"""The split backward with fused weight-gradient accumulation: what it costs, and ZB-H1 against 1F1B with it.

Problem. A zero-bubble schedule splits each backward into the input
gradient (I) and the weight gradients (W). Autograd's split walks the graph
and starts W from gradients recorded in I (``models/split_backward.py``);
on a CPU, I + W has cost more than one whole backward, which eats the
bubble ZB-H1 removes. With ``training.fused_weight_grads`` a linear layer's
I queues its weight product and W is that product alone, accumulated into
``.grad`` in place (``models/fused_grads.py``).

Approach. First, in one process on one thread, the last stage of the cut
alone: per micro-batch, one whole backward (B) against I then W, with
autograd's accumulation and fused, alternating (``stage_passes``; GPT-2's
``Conv1D`` projections too). Then two ranks (one core each), a model whose second stage is all
linear layers (vgg-tiny: ``fc1``-``fc3`` at AMPA's 2-stage cut; and its
4096-wide variant), global batch 64 in 4 micro-batches. 1F1B and ZB-H1,
each with autograd's accumulation and fused, run interleaved per repeat
(order reversed every other repeat) at the same cut. From the runs:

* samples/s over the steps after the warm-up, and the ratios within each
  repeat (medians reported): ZB-H1 / 1F1B fused and autograd, and each
  schedule fused / autograd;
* per stage that has an input gradient, ZB-H1's I + W over 1F1B's B (the
  split backward's cost), fused and autograd;
* the ideal ZB-H1 / 1F1B from those stage times (``bench_zero_bubble``'s
  formula).

    .venv/bin/python bench/bench_fused_split.py [--repeats 3] [--steps 12] [--models vgg-tiny,vgg-fc4096] [--passes-only]

Writes ``bench/results/fused_split.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_zero_bubble import STAGES, ideal_zb_over_1f1b, interleaved, ratio  # noqa: E402  (this folder's)

from workbench.core.config import RunConfig, merge_changes  # noqa: E402

RESULTS = HERE / "results" / "fused_split.json"
VGG = {"model": {"name": "vgg-tiny"}, "data": {"kind": "digits"},
       "training": {"global_batch": 64, "optimizer": {"name": "sgd", "lr": 0.01}}}
MODELS = {"vgg-tiny": VGG,
          "vgg-fc4096": merge_changes(VGG, {"model": {"overrides": {"fc_width": 4096}}})}


def ampa_cut(fields: dict, m: int) -> str:
    """AMPA's 2-stage cut for 1F1B at ``m`` micro-batches, from a one-thread profile at the micro-batch size."""
    import torch

    from workbench.runtime.batches import global_batches, run_model, split_rounds
    from workbench.runtime.entry import resolve_partition

    torch.set_num_threads(1)
    config = RunConfig.from_dict({**fields, "plan": f"pp{STAGES}-1f1b-m{m}@ampa"})
    model = run_model(config)
    example = split_rounds(next(global_batches(config, model, 0)), config, 0)[0].inputs[0]
    return str(resolve_partition(config, model, example, "cpu"))


GPT2 = {"model": {"name": "gpt2-tiny", "overrides": {"n_layer": 4, "n_embd": 256, "n_head": 4, "seq_len": 64}}}


def stage_passes(fields: dict, cut: str, microbatch: int, iters: int = 40) -> dict:
    """The last stage of ``cut`` in one process (one thread): median ms per micro-batch of B, and of I and W,
    autograd's and fused; each a step of two micro-batches (gradients released after it, as the optimizer
    does), the four variants in alternating order."""
    import copy
    import time

    import torch

    from workbench.core.partition import Partition
    from workbench.models import build_model, sample_batch
    from workbench.models.fused_grads import WeightGradBuffers, fuse_weight_grads
    from workbench.runtime.stage import Stage

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(fields["model"]["name"], **fields["model"].get("overrides", {}))
    (a0, b0), (a1, b1) = Partition.parse(cut).bounds
    x, y = sample_batch(model, microbatch)
    with torch.no_grad():
        h = model.stage(a0, b0)(x)
    stages = {}
    for fused in (False, True):
        module = copy.deepcopy(model.stage(a1, b1))
        buffers = WeightGradBuffers() if fused else None
        if fused:
            fuse_weight_grads(module, buffers)
        stages[fused] = Stage(index=1, module=module, device=torch.device("cpu"), is_first=False, is_last=True,
                              loss_fn=model.loss_fn, loss_scale=0.5, weight_grads=buffers)
    times: dict[str, list[float]] = {k: [] for k in ("B", "I", "W", "B-fused", "I-fused", "W-fused")}
    variants = [(fused, split) for fused in (False, True) for split in (False, True)]
    for it in range(iters):
        for fused, split in (variants if it % 2 == 0 else variants[::-1]):  # a step of 2 micro-batches each
            stage, tag = stages[fused], "-fused" if fused else ""
            for mb in range(2):
                stage.forward(mb, h.clone(), y)
            spent = {"B": 0.0, "I": 0.0, "W": 0.0}
            for mb in range(2):
                t0 = time.perf_counter()
                if split:
                    stage.backward_input(mb)
                    t1 = time.perf_counter()
                    stage.backward_weight(mb)
                    spent["I"] += t1 - t0
                    spent["W"] += time.perf_counter() - t1
                else:
                    stage.backward(mb)
                    spent["B"] += time.perf_counter() - t0
            for key in (("I", "W") if split else ("B",)):
                times[key + tag].append(spent[key] / 2 * 1e3)  # per micro-batch
            stage.module.zero_grad(set_to_none=True)
    ms = {k: statistics.median(v[iters // 4:]) for k, v in times.items()}
    return {**ms, "split_over_whole": (ms["I"] + ms["W"]) / ms["B"],
            "split_over_whole_fused": (ms["I-fused"] + ms["W-fused"]) / ms["B-fused"],
            "w_autograd_over_fused": ms["W"] / ms["W-fused"]}


def split_cost(rows: list[dict], zb: str, whole: str) -> dict:
    """Per repeat and stage with an input gradient (not the first), ZB-H1's I + W over 1F1B's B."""
    values = []
    for row in rows:
        for stage, times in row[zb]["stage_ms"].items():
            b = row[whole]["stage_ms"].get(stage, {}).get("B")
            if stage != "0" and b:
                values.append((times["I"] + times["W"]) / b)
    return {"median": statistics.median(values), "runs": values}


def stage_times(rows: list[dict], case: str) -> dict:
    """Per stage and op, the median over repeats of the mean pass times (ms)."""
    stages = rows[0][case]["stage_ms"]
    return {s: {op: statistics.median(r[case]["stage_ms"][s][op] for r in rows) for op in ops}
            for s, ops in stages.items()}


def bench_model(name: str, fields: dict, m: int, steps: int, repeats: int, passes_only: bool) -> dict:
    cut = ampa_cut(fields, m)
    print(f"{name}: global batch {fields['training']['global_batch']}, m={m}, AMPA's cut {cut}", flush=True)
    passes = stage_passes(fields, cut, fields["training"]["global_batch"] // m)
    print("  last stage in one process: " + json.dumps({k: round(v, 3) for k, v in passes.items()}), flush=True)
    if passes_only:
        return {"partition": cut, "stage_passes": passes}
    fused = merge_changes(fields, {"training": {"fused_weight_grads": True}})
    plans = {f"{kind}{suffix}": f"pp{STAGES}-{kind}-m{m}@{cut}" for kind in ("1f1b", "zbh1")
             for suffix in ("", "-fused")}
    rows = []
    for rep in range(repeats):  # one repeat at a time so fused and autograd runs alternate too
        row: dict = {}
        for case in (list(plans) if rep % 2 == 0 else list(plans)[::-1]):
            row.update(interleaved({case: plans[case]}, fused if case.endswith("-fused") else fields, steps, 1,
                                   f"bench-fused-split-{case}-")[0])
        rows.append(row)
    summary = {
        "zbh1_over_1f1b_fused": ratio(rows, "zbh1-fused", "1f1b-fused"),
        "zbh1_over_1f1b_autograd": ratio(rows, "zbh1", "1f1b"),
        "zbh1_fused_over_autograd": ratio(rows, "zbh1-fused", "zbh1"),
        "1f1b_fused_over_autograd": ratio(rows, "1f1b-fused", "1f1b"),
        "split_over_whole_fused": split_cost(rows, "zbh1-fused", "1f1b-fused"),
        "split_over_whole_autograd": split_cost(rows, "zbh1", "1f1b"),
        "ideal_zbh1_over_1f1b_fused": statistics.median(
            ideal_zb_over_1f1b(r["zbh1-fused"]["stage_ms"], r["1f1b-fused"]["stage_ms"], m) for r in rows),
        "ideal_zbh1_over_1f1b_autograd": statistics.median(
            ideal_zb_over_1f1b(r["zbh1"]["stage_ms"], r["1f1b"]["stage_ms"], m) for r in rows),
        "stage_ms": {case: stage_times(rows, case) for case in plans},
    }
    return {"partition": cut, "stage_passes": passes, "repeats": rows, "summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--passes-only", action="store_true", help="only the one-process stage passes")
    args = parser.parse_args()
    out = {}
    for name in args.models.split(","):
        out[name] = bench_model(name, MODELS[name], args.microbatches, args.steps, args.repeats, args.passes_only)
        for key, value in out[name].get("summary", {}).items():
            print(f"  {key}: {json.dumps(value)}", flush=True)
    gpt2_cut = "0-2|3-5"  # embeddings and 2 blocks | 2 blocks and the head (micro-batches of 8 sequences)
    out["gpt2-4x256"] = {"partition": gpt2_cut, "stage_passes": stage_passes(GPT2, gpt2_cut, 8)}
    print("gpt2-4x256 last stage in one process: " + json.dumps(
        {k: round(v, 3) for k, v in out["gpt2-4x256"]["stage_passes"].items()}), flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"microbatches": args.microbatches, "steps": args.steps, "models": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
