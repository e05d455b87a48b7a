"""The planner lesson's per-layer section: a budget sweep of the per-layer search and the story of its best mix.

The lesson searches one model at budgets from all of what pure data parallelism needs down to a tenth
of it, and tells, with the numbers of the budget where the mix gains most, which option each run of
layers took and what that cost. Every sentence here is built from a :class:`HybridResult`.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from ..planning.strategy.hybrid import search_hybrid
from ..viz.plan import layer_option_text
from ..viz.style import apply_layout

__all__ = ["SweepRow", "budget_sweep", "gain_figure", "option_runs", "mix_story"]

GIB = 2 ** 30


@dataclass(frozen=True)
class SweepRow:
    """One budget of the sweep: its share of pure DP's memory, in GiB, the best per-layer and uniform plans."""

    fraction: float
    budget_gib: float
    mix: object  # HybridEstimate
    uniform: object  # HybridEstimate
    gain: float


def budget_sweep(costs, cluster, batch: int, fractions) -> tuple[dict, list[SweepRow]]:
    """The per-layer search at each ``fraction`` of what pure data parallelism needs; budgets where both a
    per-layer and a uniform plan fit become rows. Returns ({fraction: HybridResult}, rows)."""
    roomy = search_hybrid(costs, cluster, batch)
    dp_need = roomy.best["dp"].memory_bytes
    sweep = {}
    for fraction in fractions:
        found = search_hybrid(costs, cluster, batch, budget_bytes=fraction * dp_need)
        if "per-layer" in found.best and "uniform" in found.best:
            sweep[fraction] = found
    rows = [SweepRow(f, r.budget_bytes / GIB, r.best["per-layer"], r.best["uniform"], r.gain("uniform"))
            for f, r in sweep.items()]
    return sweep, rows


def gain_figure(rows: list[SweepRow]) -> go.Figure:
    fig = go.Figure(go.Scatter(x=[r.budget_gib for r in rows], y=[100 * r.gain for r in rows], mode="lines+markers"))
    return apply_layout(fig, title="Per-layer plan's gain over the best uniform plan",
                        xaxis_title="budget per device (GiB)", yaxis_title="throughput gain (%)", height=320)


def option_runs(layers) -> list[tuple[int, int, str]]:
    """Consecutive layers with equal options: (first, last, option text)."""
    out, start = [], 0
    texts = [layer_option_text(layer) for layer in layers]
    for i in range(1, len(layers) + 1):
        if i == len(layers) or texts[i] != texts[start]:
            out.append((start, i - 1, texts[start]))
            start = i
    return out


def _comm(parts: dict) -> float:
    return parts["tp_comm_ms"] + parts["dp_comm_ms"] + parts["transition_ms"]


def mix_story(row: SweepRow, roomy_gain: float, costs) -> tuple[str, int]:
    """Markdown on the budget ``row``: the two plans, the gain, each run of layers' option, and where the time
    went; with the number of layers whose option differs from the uniform plan's."""
    mix_layers, uniform_layers = row.mix.layers(), row.uniform.layers()
    lines = []
    for first, last, option in option_runs(mix_layers):
        span = costs.layers[first:last + 1]
        params = sum(layer.param_bytes for layer in span) / 2**20
        saved = sum((layer.saved_bytes or layer.activation_bytes) for layer in span) / costs.batch_size / 2**20
        names = span[0].name if first == last else f"{span[0].name} ... {span[-1].name}"
        lines.append(f"- **{names}**: {option} ({params:.0f} MiB of parameters, {saved:.1f} MiB saved per sample)")
    changed = sum(layer_option_text(a) != layer_option_text(b) for a, b in zip(mix_layers, uniform_layers))
    mine, theirs = row.mix.breakdown(), row.uniform.breakdown()
    text = (
        f"At **{row.budget_gib:.2f} GiB** per device the per-layer plan `{row.mix.name}` takes "
        f"**{row.mix.iteration_ms:.1f} ms** an iteration against **{row.uniform.iteration_ms:.1f} ms** for the best "
        f"uniform plan `{row.uniform.name}`: **{row.gain:+.1%}** throughput. With all of pure DP's memory the gain is "
        f"{roomy_gain:+.1%}: when everything fits, one option is enough. The mix:\n\n" + "\n".join(lines) +
        f"\n\nThe uniform plan gives every block *{layer_option_text(uniform_layers[1])}*; the mix changes the option "
        f"of {changed} of {len(mix_layers)} layers. On its slowest stage the mix computes for "
        f"{mine['compute_ms']:.1f} ms ({mine['compute_ms'] - theirs['compute_ms']:+.1f} ms against the uniform plan: "
        f"recomputation) and communicates for {_comm(mine):.1f} ms ({_comm(mine) - _comm(theirs):+.1f} ms: sharding "
        f"and tensor parallelism), using {row.mix.memory_bytes / GIB:.2f} of the {row.budget_gib:.2f} GiB. Each layer "
        f"takes the option that buys the memory it must give up most cheaply; a uniform plan must give every layer "
        f"the option its hungriest layer needs.")
    return text, changed
