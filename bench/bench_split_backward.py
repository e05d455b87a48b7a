"""The split backward's passes, ours against torch's, on the stages of the zero-bubble benchmark.

For each stage of ResNet-18 at 96x96 (16 samples, the zero-bubble
benchmark's micro-batch; the stages of AMPA's 4-stage cut there), one
process, one thread: the fused backward (``out.backward``), our split
(:class:`~workbench.models.split_backward.SplitBackward`: I, then W) and
torch's (``torch.distributed.pipelining._backward.stage_backward_input``,
then ``stage_backward_weight``), each after its own forward, interleaved,
median of ``REPEATS`` after 2 warm-ups. The first stage is left out: its
input needs no gradient, so both run its W as one whole backward.

    .venv/bin/python bench/bench_split_backward.py [--stages 2-3,4-6,7-9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.autograd.graph import get_gradient_edge

from workbench.models.split_backward import SplitBackward
from workbench.models.zoo import build_model

REPEATS, BATCH, SIZE = 7, 16, 96


def measure(first: int, last: int) -> dict[str, float]:
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    seq = build_model("resnet18", image_size=SIZE, num_classes=10)
    x = torch.randn(BATCH, 3, SIZE, SIZE)
    with torch.no_grad():
        for i in range(first):
            x = seq.call_layer(i, x)
    params = [p for i in range(first, last + 1) for p in seq[i].parameters()]

    def forward():
        inp = x.detach().requires_grad_(True)
        out = inp
        for i in range(first, last + 1):
            out = seq.call_layer(i, out)
        return inp, out

    def fused():
        _, out = forward()
        start = time.perf_counter()
        out.backward(torch.ones_like(out))
        return time.perf_counter() - start, 0.0

    def ours():
        inp, out = forward()
        edge = get_gradient_edge(inp)
        start = time.perf_counter()
        split = SplitBackward(out, edge, params)
        split.backward_input(torch.ones_like(out))
        middle = time.perf_counter()
        split.backward_weight()
        return time.perf_counter() - start, middle - start

    def theirs():
        inp, out = forward()
        start = time.perf_counter()
        _, groups = stage_backward_input([out], [torch.ones_like(out)], [inp], iter(params))
        middle = time.perf_counter()
        stage_backward_weight(iter(params), groups)
        return time.perf_counter() - start, middle - start

    times: dict[str, list[tuple[float, float]]] = {"fused": [], "ours": [], "torch": []}
    for _ in range(REPEATS + 2):
        for name, call in (("fused", fused), ("ours", ours), ("torch", theirs)):
            for p in params:
                p.grad = None
            times[name].append(call())
    out = {}
    for name, runs in times.items():
        out[name] = 1e3 * statistics.median(t for t, _ in runs[2:])
        if name != "fused":
            out[name + " I"] = 1e3 * statistics.median(i for _, i in runs[2:])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="2-3,4-6,7-9")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'stage':<7} {'fused':>7} {'ours I+W':>9} {'(I)':>6} {'torch I+W':>10} {'(I)':>6} {'ours/torch':>11} "
          f"{'ours/fused':>11}")
    for text in args.stages.split(","):
        first, last = (int(v) for v in text.split("-"))
        m = measure(first, last)
        print(f"{text:<7} {m['fused']:7.1f} {m['ours']:9.1f} {m['ours I']:6.1f} {m['torch']:10.1f} "
              f"{m['torch I']:6.1f} {m['ours'] / m['torch']:11.3f} {m['ours'] / m['fused']:11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
