"""The automatic zero-bubble schedule against ZB-H1 and 1F1B, on a profile with unequal F, I and W, on two ranks.

Problem. ZB-H1 has one order for every profile: the last stage runs each
weight gradient (W) one micro-batch late, so two of them are left for the
drain. Where the first stage is the longer one and mostly forward, the last
stage idles between micro-batches anyway, and the deferred W only lengthens
the drain: ZB-H1 then runs behind 1F1B. ``zb-auto`` (``pipeline.kind =
"zb-auto"``) lists the schedule from the profile's F, I and W under 1F1B's
memory and keeps the fastest of it, ZB-H1 and ZB-H2 by simulation.

Approach. ``bench/zb_front_end.py``'s network (a fixed 40-pass blur in front
of a trainable stride-2 convolution, then four convolution blocks whose
weight gradients cost more than their input gradients here), 96x96
synthetic images, global batch 64, 4 micro-batches, two gloo ranks (one core
each). Each schedule runs at the 2-stage cut the simulator finds fastest for
it from a profile at the micro-batch (16 samples); the runs are interleaved
per repeat, the order reversed every other repeat, and ratios are taken
within a repeat (median reported). Beside each measured step: the
simulator's, from the run's own measured stage times.

    .venv/bin/python bench/bench_zb_auto.py [--repeats 5] [--steps 14]

Writes ``bench/results/zb_auto.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_zero_bubble import interleaved, ratio  # noqa: E402  (this folder's benchmark: its runs and ratios)
from zb_front_end import front_end_net  # noqa: E402

RESULTS = HERE / "results" / "zb_auto.json"
STAGES, PASSES, SIZE = 2, 40, 96
KINDS = ("1f1b", "zbh1", "zbauto")


def fields(batch: int) -> dict:
    return {"model": {"name": "zb_front_end:front_end_net", "args": {"passes": PASSES, "image_size": SIZE}},
            "data": {"kind": "synthetic"},
            "training": {"global_batch": batch, "optimizer": {"name": "sgd", "lr": 0.01}}}


def best_cuts(batch: int, m: int) -> tuple[dict[str, str], dict[str, dict[str, float]]]:
    """Per kind, the 2-stage cut with the shortest simulated iteration from a profile at the micro-batch; and
    every cut's simulated iteration per kind."""
    from workbench.core.partition import Partition
    from workbench.planning import load_cluster
    from workbench.profiling import profile
    from workbench.scheduling import generators
    from workbench.scheduling.simulate import simulate
    from workbench.scheduling.stagecosts import StageCosts
    from workbench.scheduling.zero_bubble import zb_auto, zb_h1

    mb = batch // m
    seq = front_end_net(PASSES, image_size=SIZE)
    x, y = torch.randn(mb, 3, SIZE, SIZE), torch.randint(0, 10, (mb,))
    costs = profile(seq, batch=(x, y), progress=False, cache=False)
    cluster, n = load_cluster("local-cpu"), costs.num_layers
    table: dict[str, dict[str, float]] = {}
    for cut in range(1, n):
        text = f"0-{cut - 1}|{cut}-{n - 1}"
        sc = StageCosts.from_model(costs, Partition.parse(text), mb)
        build = {"1f1b": generators.one_f_one_b(STAGES, m), "zbh1": zb_h1(STAGES, m), "zbauto": zb_auto(STAGES, m, sc)}
        table[text] = {kind: simulate(s, sc, cluster).metrics["iteration_ms"] for kind, s in build.items()}
        table[text]["stage_ms"] = {"F": list(sc.forward_ms), "I": list(sc.input_grad_ms), "W": list(sc.weight_grad_ms)}
    best = {kind: min(table, key=lambda t: table[t][kind]) for kind in KINDS}
    return best, table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=14)
    args = parser.parse_args()
    torch.set_num_threads(1)
    m = args.microbatches
    best, table = best_cuts(args.batch, m)
    print(f"front-end net {SIZE}x{SIZE}, batch {args.batch}, m={m}; simulated ms per cut:", flush=True)
    for cut, row in table.items():
        stages = {op: [round(v, 1) for v in values] for op, values in row["stage_ms"].items()}
        print(f"  {cut}: " + ", ".join(f"{k} {row[k]:.1f}" for k in KINDS) + f"; stage ms {stages}", flush=True)
    print(f"best cut per schedule: {best}", flush=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    plans = {kind: f"pp{STAGES}-{kind}-m{m}@{best[kind]}" for kind in KINDS}
    rows = interleaved(plans, fields(args.batch), args.steps, args.repeats, "bench-zbauto-")
    summary = {"zbauto_over_zbh1": ratio(rows, "zbauto", "zbh1"), "zbauto_over_1f1b": ratio(rows, "zbauto", "1f1b"),
               "zbh1_over_1f1b": ratio(rows, "zbh1", "1f1b"),
               "simulated_over_measured": {k: statistics.median(r[k]["simulated_step_ms"] / r[k]["step_ms"]
                                                                 for r in rows) for k in KINDS}}
    for key, value in summary.items():
        print(f"{key}: {json.dumps(value)}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"cuts": best, "simulated_per_cut": table, "repeats": rows, "summary": summary},
                                  indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
