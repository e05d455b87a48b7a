"""What training a model holds in memory, counted from its configuration: the tour's opening.

Problem. Whether a model needs more than one device is first a question of
bytes: its weights, their gradients, the optimizer's state and the
activations a forward pass keeps for the backward pass. The first three are
arithmetic on the parameter count; the activations depend on the model's code,
the batch and the sequence length, and formulas for them hold only for the
layer they were derived for. A 7B-class model cannot be built in a laptop's
memory to count them.

Approach. Build the model on torch's meta device (shapes and dtypes, no
storage) and run one forward pass and the loss under
``torch.autograd.graph.saved_tensors_hooks``, adding up every distinct tensor
autograd saves (views count once, through their base; parameters not at all).
The same count on real tensors of a small model shows that the meta count is
what a real pass saves. Weights, gradients and optimizer state follow from the
parameter count and the bytes per parameter of a precision (:data:`PRECISIONS`).
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from ..models.data import sample_batch
from ..models.sequence import LayerSequence
from ..models.zoo import get_entry
from ..viz.style import apply_layout, palette_color

__all__ = ["PRECISIONS", "TrainingMemory", "build_on", "saved_activation_bytes", "training_memory",
           "memory_table", "memory_figure", "memory_story", "GIB"]

GIB = 2 ** 30
# bytes per parameter: (weights, gradients, optimizer state) with Adam's two moments
PRECISIONS = {
    "fp32": (4, 4, 8),  # fp32 weights and gradients, Adam's m and v in fp32
    "bf16-mixed": (2, 2, 12),  # bf16 weights and gradients; fp32 master weights, m and v
}


@dataclass(frozen=True)
class TrainingMemory:
    """One model's training memory on one device, in bytes, at ``batch`` samples."""

    model: str
    params: int
    batch: int
    precision: str
    weights: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def state(self) -> int:
        """What the parameters cost whatever the batch: weights, gradients and optimizer state."""
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        return self.state + self.activations

    def parts(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer state": self.optimizer,
                "activations": self.activations}


def build_on(device: str, model: str, **overrides) -> LayerSequence:
    """Zoo ``model`` (with config ``overrides``) as a :class:`LayerSequence` on ``device`` ("meta": no storage)."""
    entry = get_entry(model)
    config = entry.config(overrides)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        return entry.to_sequence(entry.build(config), model, config)


def saved_activation_bytes(seq: LayerSequence, batch: int) -> int:
    """Bytes autograd keeps for the backward pass of one training forward (loss included) at ``batch``:
    every distinct saved tensor once (a view through its base), parameters excluded. Works on meta models."""
    device = next(seq.parameters()).device.type
    params = {id(p) for p in seq.parameters()}
    kept: dict[int, torch.Tensor] = {}  # holding the tensors keeps their ids unique

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor
        if id(base) not in params:
            kept[id(base)] = base
        return tensor

    inputs, targets = (t.to(device) for t in sample_batch(seq, batch))  # made on the host, moved (meta: shapes)
    seq.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        seq.loss_fn(seq(inputs), targets)
    return sum(base.numel() * base.element_size() for base in kept.values())


def training_memory(model: str, batch: int, *, precision: str = "fp32", device: str = "meta",
                    label: str | None = None, **overrides) -> TrainingMemory:
    """Zoo ``model``'s training memory at ``batch`` samples, counted on ``device`` (meta: without storage).
    Activations are counted in fp32; ``precision`` sets the bytes per parameter of the rest; ``label`` names the
    row (default: the model and its overrides)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    seq = build_on(device, model, **overrides)
    params = sum(p.numel() for p in {id(p): p for p in seq.parameters()}.values())
    weights, gradients, optimizer = (params * size for size in PRECISIONS[precision])
    activations = saved_activation_bytes(seq, batch)
    name = label or (f"{model} ({', '.join(f'{k}={v}' for k, v in overrides.items())})" if overrides else model)
    return TrainingMemory(name, params, batch, precision, weights, gradients, optimizer, activations)


def _gib(value: int) -> str:
    return f"{value / GIB:,.2f}" if value < 10 * GIB else f"{value / GIB:,.0f}"


def memory_table(rows: list[TrainingMemory]) -> str:
    """A Markdown table: parameters, each part and the total, in GiB."""
    lines = ["| model | parameters | batch | weights | gradients | optimizer state | activations | total (GiB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row.model} | {row.params / 1e6:,.1f} M | {row.batch} | {_gib(row.weights)} | "
                     f"{_gib(row.gradients)} | {_gib(row.optimizer)} | {_gib(row.activations)} | {_gib(row.total)} |")
    return "\n".join(lines)


def memory_figure(rows: list[TrainingMemory], device_gib: float | None = None) -> go.Figure:
    """Stacked bars, one per model, of its memory parts in GiB (log scale: the models differ by 1000x);
    ``device_gib`` draws one device's memory as a line."""
    fig = go.Figure()
    for index, part in enumerate(rows[0].parts()):
        fig.add_bar(name=part, x=[row.model for row in rows], y=[row.parts()[part] / GIB for row in rows],
                    marker_color=palette_color(index))
    if device_gib is not None:
        fig.add_hline(y=device_gib, line_dash="dash", line_color="red",
                      annotation_text=f"one {device_gib:g} GiB device", annotation_position="top left")
    return apply_layout(fig, barmode="stack", title="What training holds on one device",
                        yaxis_title="GiB (log scale)", yaxis_type="log", height=380)


def memory_story(small: TrainingMemory, large: TrainingMemory, device_gib: float) -> str:
    """Sentences on two rows of :func:`training_memory`, every number from them: what the small one holds, and
    whether the large one's weights, gradients and optimizer state alone fit one ``device_gib`` device."""
    share = small.activations / small.total
    state = large.state / GIB
    verdict = (f"more than one {device_gib:g} GiB device holds, before a single activation"
               if state > device_gib else f"which one {device_gib:g} GiB device holds")
    devices = -(-large.total // int(device_gib * GIB))
    return (f"**{small.model}** at batch {small.batch} holds {small.total / GIB:.2f} GiB, "
            f"{share:.0%} of it activations. **{large.model}** has {large.params / 1e9:.1f} billion parameters: "
            f"their weights, gradients and optimizer state take {state:,.0f} GiB ({large.precision}), {verdict}. "
            f"Its activations for a batch of {large.batch} add {large.activations / GIB:,.0f} GiB, "
            f"{large.total / GIB:,.0f} GiB in all: at least {devices} such devices, if the bytes could be split "
            f"evenly. Splitting them is what the rest of this workbench is about.")
