"""Cost model of tensor-parallel transformer steps: 2D (SUMMA) against 1D (Megatron) and dense.

Problem: the planner and the timeline need, without running anything, what a
tensor-parallel training step costs per rank: FLOPs, elements moved by each
collective, parameter and activation bytes, and a step time on a given device
and link. The two schemes trade differently: 1D moves activations
(all-reduces of [B s, h]) and keeps block inputs and outputs whole on every
rank; 2D moves weight and activation blocks by broadcast (SUMMA) and keeps
1/q² of everything.

Approach: closed forms in the shape of one GPT-2-style model
(:class:`TransformerShape`), derived from the algorithms as the runtime
implements them, so that the runtime's counted volume can be checked against
them exactly:

- one 2D linear, forward: (q-1) broadcasts of the activation block
  [T/q, K/q] along the row and of the weight block [K/q, N/q] along the
  column (elements received per rank); backward twice that (the same two
  broadcasts again plus a reduce of each product);
- layer norm: two all-reduces of [T/q] along the row, forward and backward;
- a bias / gamma / table column of n values: all-gather of n/q² slices
  forward, reduce-scatter backward (or, when q² does not divide n, nothing
  forward and an all-reduce of n/q backward);
- 1D: two all-reduces of [T, h] per layer forward (after the row-parallel
  linears) and two backward (before the column-parallel ones).

Ring collectives: all-reduce moves 2 (n-1)/n of the tensor per rank,
all-gather (n-1) times the local piece, reduce-scatter (n-1)/n of the input.
Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.costs import DeviceSpec, LinkSpec
from ...core.fields import check_int
from ...core.timeline import Event, Timeline

__all__ = [
    "TransformerShape", "linear_volume_2d", "step_volume_2d", "step_volume_1d", "collective_calls", "step_flops",
    "param_bytes_per_rank", "activation_bytes_per_rank", "estimate_step", "max_batch_under_cap", "simulate_step",
]

MODES = ("2d", "1d", "dense")
# Activation elements autograd saves per layer, per token (coefficients of h and of the MLP width f), as the
# runtime's blocks save them (calibrated against the measured saved-tensor bytes, bench_tensor2d):
NORMS_AND_INPUTS_H = 4     # dense / 1D: two fused LayerNorms' inputs and the qkv / fc inputs (replicated in 1D)
NORMS_AND_INPUTS_H_2D = 7  # 2D: the grid LayerNorm is composed of autograd ops and keeps centred and normalised x
HEAD_SPLIT_H = 4           # q|k|v and the attention context (split by heads in 1D too)
GELU_F = 5                 # the tanh GELU's intermediates
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class TransformerShape:
    """A GPT-2-style decoder at one batch: ``batch`` sequences of ``seq`` tokens per data-parallel replica."""

    hidden: int
    heads: int
    layers: int
    vocab: int
    positions: int
    batch: int
    seq: int
    inner: int = 0          # MLP width; 0 means 4 x hidden
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("hidden", "heads", "layers", "vocab", "positions", "batch", "seq"):
            check_int(name, getattr(self, name), 1)
        if self.inner == 0:
            object.__setattr__(self, "inner", 4 * self.hidden)
        check_int("inner", self.inner, 1)
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be divisible by heads={self.heads}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def with_batch(self, batch: int) -> "TransformerShape":
        return TransformerShape(self.hidden, self.heads, self.layers, self.vocab, self.positions, batch, self.seq,
                                self.inner, self.dtype)

    def linears(self) -> list[tuple[int, int]]:
        """(in, out) of the four linears of one block: qkv, attention output, MLP up, MLP down."""
        h, f = self.hidden, self.inner
        return [(h, 3 * h), (h, h), (h, f), (f, h)]

    def num_params(self) -> int:
        h = self.hidden
        per_layer = sum(k * n + n for k, n in self.linears()) + 4 * h
        return self.vocab * h + self.positions * h + self.layers * per_layer + 2 * h


def _check_mode(mode: str, degree: int) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    check_int("q" if mode == "2d" else "degree", degree, 1)


def linear_volume_2d(q: int, tokens: int, in_features: int, out_features: int) -> dict[str, float]:
    """Elements one rank moves for one SUMMA linear over ``tokens`` tokens (forward / backward)."""
    forward = (q - 1) * (tokens / q * in_features / q + in_features / q * out_features / q)
    return {"forward_elements": forward, "backward_elements": 2 * forward}


def _vector_volume_2d(q: int, n: int) -> tuple[float, float]:
    """(forward, backward) elements for a length-n column vector (bias, gamma, table columns)."""
    if n % (q * q) == 0:
        return (q - 1) * n / (q * q), (q - 1) / q * n / q
    return 0.0, 2 * (q - 1) / q * n / q


def _all_reduce(n: int, elements: float) -> float:
    return 2 * (n - 1) / n * elements


def step_volume_2d(shape: TransformerShape, q: int) -> dict[str, float]:
    """Elements moved per rank in one training step (forward, backward, per kind) on a q x q grid."""
    _check_mode("2d", q)
    t, h, v = shape.tokens, shape.hidden, shape.vocab
    forward = backward = 0.0
    broadcast_fwd = 0.0

    def vector(n: int, times: int = 1) -> None:
        nonlocal forward, backward
        f, b = _vector_volume_2d(q, n)
        forward += times * f
        backward += times * b

    def layer_norm() -> None:
        nonlocal forward, backward
        forward += 2 * _all_reduce(q, t / q)
        backward += 2 * _all_reduce(q, t / q)
        vector(h, 2)

    vector(v * h, 2)            # token table: once for the embedding, once for the tied head
    vector(shape.positions * h)
    for _ in range(shape.layers):
        layer_norm()
        layer_norm()
        for k, n in shape.linears():
            lin = linear_volume_2d(q, t, k, n)
            forward += lin["forward_elements"]
            backward += lin["backward_elements"]
            broadcast_fwd += lin["forward_elements"]
            vector(n)
    layer_norm()
    forward += _all_reduce(q, t / q * v) + 2 * _all_reduce(q, 1)  # logits over the row; loss and token count
    return {"forward_elements": forward, "backward_elements": backward, "total_elements": forward + backward,
            "summa_forward_elements": broadcast_fwd, "total_bytes": (forward + backward) * shape.dtype_bytes}


def step_volume_1d(shape: TransformerShape, degree: int) -> dict[str, float]:
    """Elements moved per rank in one training step with Megatron 1D over ``degree`` ranks."""
    _check_mode("1d", degree)
    t, h = shape.tokens, shape.hidden
    activation = _all_reduce(degree, t * h)
    forward = activation * (2 * shape.layers + 1) + (degree - 1) * t * shape.vocab / degree  # + embedding, logits gather
    backward = activation * (2 * shape.layers + 1)                                          # + LM-head input
    return {"forward_elements": forward, "backward_elements": backward, "total_elements": forward + backward,
            "total_bytes": (forward + backward) * shape.dtype_bytes}


def collective_calls(shape: TransformerShape, mode: str, degree: int, summa: str = "broadcast") -> dict[str, int]:
    """Collective operations one rank issues per training step (forward / backward), as the runtime issues them.

    2D per linear: q broadcasts of each operand forward (``broadcast``) or one all-gather of each
    (``allgather``); backward twice the broadcasts plus one reduce per product (or two all-gathers and two
    reduce-scatters). Per layer norm: two all-reduces and two parameter gathers each way. Per bias: one
    gather forward, one reduce-scatter (or all-reduce) backward. 1D: two all-reduces per layer each way.
    The count, not the size, is what a latency-bound link pays for.
    """
    _check_mode(mode, degree)
    if summa not in ("broadcast", "allgather"):
        raise ValueError(f"summa must be 'broadcast' or 'allgather', got {summa!r}")
    if degree == 1 or mode == "dense":
        return {"forward": 0, "backward": 0, "total": 0}
    layers = shape.layers
    if mode == "1d":
        forward, backward = 2 * layers + 2, 2 * layers + 1  # + embedding all-reduce, logits gather; + head input
        return {"forward": forward, "backward": backward, "total": forward + backward}
    q = degree
    linear_fwd, linear_bwd = (2 * q, 4 * q) if summa == "broadcast" else (2, 4)
    vector_fwd = lambda n: 1 if n % (q * q) == 0 else 0  # noqa: E731  (gather only when sliced n/q²)
    norm_fwd = 2 + 2 * vector_fwd(shape.hidden)
    norm_bwd = 4
    biases = [n for _, n in shape.linears()]
    forward = 2 * vector_fwd(shape.vocab * shape.hidden) + vector_fwd(shape.positions * shape.hidden)
    forward += layers * (2 * norm_fwd + 4 * linear_fwd + sum(vector_fwd(n) for n in biases)) + norm_fwd + 3
    backward = 3 + layers * (2 * norm_bwd + 4 * linear_bwd + len(biases)) + norm_bwd
    return {"forward": forward, "backward": backward, "total": forward + backward}


def step_flops(shape: TransformerShape) -> int:
    """Dense FLOPs of one training step (forward + backward = 3 x forward) over the replica's batch."""
    t, h = shape.tokens, shape.hidden
    matmul = sum(2 * t * k * n for k, n in shape.linears())
    attention = 4 * shape.batch * shape.seq * shape.seq * h  # scores and context
    forward = shape.layers * (matmul + attention) + 2 * t * h * shape.vocab
    return 3 * forward


def param_bytes_per_rank(shape: TransformerShape, mode: str, degree: int) -> int:
    """Parameter bytes on one rank (2D: q x q grid with side ``degree``; 1D: ``degree`` ranks)."""
    _check_mode(mode, degree)
    h, size = shape.hidden, shape.dtype_bytes
    if mode == "dense" or degree == 1:
        return shape.num_params() * size
    if mode == "2d":
        q2 = degree * degree
        vectors = [shape.vocab * h, shape.positions * h, 2 * h] + shape.layers * ([n for _, n in shape.linears()] + [h] * 4)
        stored = sum(n // q2 if n % q2 == 0 else n // degree for n in vectors)
        matrices = shape.layers * sum(k * n for k, n in shape.linears()) // q2
        return (stored + matrices) * size
    split = shape.vocab * h + shape.layers * (sum(k * n for k, n in shape.linears()) + 3 * h + shape.inner)
    replicated = shape.positions * h + 2 * h + shape.layers * (4 * h + 2 * h)
    return (split // degree + replicated) * size


def activation_bytes_per_rank(shape: TransformerShape, mode: str, degree: int) -> int:
    """Bytes autograd keeps for backward on one rank after the forward pass (see the module notes)."""
    _check_mode(mode, degree)
    t, h, f = shape.tokens, shape.hidden, shape.inner
    scores = shape.batch * shape.heads * shape.seq * shape.seq
    if mode == "2d":
        per_layer = (t * h * (NORMS_AND_INPUTS_H_2D + HEAD_SPLIT_H) + t * f * GELU_F + scores) / (degree * degree)
        head = t * shape.vocab / degree + t * h / (degree * degree)
    else:
        degree = 1 if mode == "dense" else degree
        per_layer = t * h * NORMS_AND_INPUTS_H + (t * h * HEAD_SPLIT_H + t * f * GELU_F + scores) / degree
        head = t * shape.vocab + t * h
    return int((shape.layers * per_layer + head) * shape.dtype_bytes)


def estimate_step(shape: TransformerShape, mode: str, degree: int, device: DeviceSpec, link: LinkSpec, *,
                  overlap: float = 0.0, optimizer_factor: int = 4, summa: str = "broadcast",
                  call_ms: float = 0.0) -> dict[str, Any]:
    """Per-rank compute, communication and memory of one step, and its time on ``device`` / ``link``.

    ``overlap``: fraction of the communication hidden behind compute (SUMMA's double-buffered
    broadcasts can hide some; 1D's all-reduces sit on the critical path). ``optimizer_factor``: bytes of
    parameters + gradients + optimizer state per parameter byte (4 for Adam in fp32). ``call_ms``: what
    each step of a collective costs beyond its link time (``ClusterSpec.collective_call_ms``): a call
    of 2D's (a broadcast or reduce within a row or column) has q - 1 steps, an all-reduce of 1D's 2(P - 1).
    """
    _check_mode(mode, degree)
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1], got {overlap!r}")
    ranks = degree * degree if mode == "2d" else (degree if mode == "1d" else 1)
    flops = step_flops(shape) / ranks
    compute_ms = flops / (device.tflops(shape.dtype) * 1e12 * device.efficiency) * 1e3
    if mode == "2d":
        volume, hops = step_volume_2d(shape, degree), degree - 1  # a q-rank broadcast / gather: q-1 messages deep
    elif mode == "1d":
        volume, hops = step_volume_1d(shape, degree), 2 * (degree - 1)  # ring all-reduce: 2(P-1) steps
    else:
        volume, hops = {"forward_elements": 0.0, "total_elements": 0.0, "total_bytes": 0.0}, 0
    calls = collective_calls(shape, mode, degree, summa)["total"]
    comm_ms = (calls * hops * (link.latency_us * 1e-3 + call_ms)
               + volume["total_bytes"] / (link.bandwidth_gbs * 1e9) * 1e3)
    params = param_bytes_per_rank(shape, mode, degree)
    activations = activation_bytes_per_rank(shape, mode, degree)
    return {
        "mode": mode, "degree": degree, "ranks": ranks, "flops_per_rank": flops, "compute_ms": compute_ms,
        "comm_forward_fraction": volume["forward_elements"] / volume["total_elements"] if volume["total_elements"] else 0.0,
        "comm_elements": volume["total_elements"], "comm_bytes": volume["total_bytes"], "comm_ms": comm_ms,
        "collective_calls": calls,
        "step_ms": compute_ms + (1.0 - overlap) * comm_ms,
        "param_bytes": params, "activation_bytes": activations,
        "memory_bytes": params * optimizer_factor + activations,
    }


def max_batch_under_cap(shape: TransformerShape, mode: str, degree: int, cap_bytes: int, *,
                        optimizer_factor: int = 4, limit: int = 1 << 16) -> int:
    """Largest batch (a multiple of the grid rows for 2D) whose per-rank memory fits ``cap_bytes``; 0 if none."""
    _check_mode(mode, degree)
    step = degree if mode == "2d" else 1
    static = param_bytes_per_rank(shape, mode, degree) * optimizer_factor

    def fits(batch: int) -> bool:
        return static + activation_bytes_per_rank(shape.with_batch(batch), mode, degree) <= cap_bytes

    if not fits(step):
        return 0
    low, high = 1, 2
    while high * step <= limit and fits(high * step):
        low, high = high, high * 2
    high = min(high, limit // step + 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * step) else (low, mid)
    return low * step


def simulate_step(shape: TransformerShape, mode: str, degree: int, device: DeviceSpec, link: LinkSpec, *,
                  overlap: float = 0.0, iteration: int = 0, call_ms: float = 0.0) -> Timeline:
    """A simulated timeline of one step on every rank of one grid (ranks are symmetric).

    Per layer (``chunk`` = layer index): forward compute ``F``, then its communication ``AR`` (the
    exposed part, ``1 - overlap``), and in reverse order backward compute ``B`` and its communication;
    the optimizer ``STEP`` closes the step. Compute splits 1 : 2 between forward and backward.
    """
    est = estimate_step(shape, mode, degree, device, link, overlap=overlap, call_ms=call_ms)
    layers = shape.layers
    fwd_ms, bwd_ms = est["compute_ms"] / 3 / layers, est["compute_ms"] * 2 / 3 / layers
    exposed = (1.0 - overlap) * est["comm_ms"]
    comm_fwd = exposed * est["comm_forward_fraction"] / layers
    comm_bwd = exposed * (1.0 - est["comm_forward_fraction"]) / layers
    bytes_fwd = int(est["comm_bytes"] * est["comm_forward_fraction"] / layers)
    bytes_bwd = int(est["comm_bytes"] * (1.0 - est["comm_forward_fraction"]) / layers)
    plan = [(layer, "F", fwd_ms, comm_fwd, bytes_fwd) for layer in range(layers)]
    plan += [(layer, "B", bwd_ms, comm_bwd, bytes_bwd) for layer in reversed(range(layers))]
    events: list[Event] = []
    for rank in range(est["ranks"]):
        clock = 0.0
        for layer, op, compute, comm, nbytes in plan:
            events.append(Event(rank, 0, op, clock, clock + compute, iteration=iteration, chunk=layer))
            clock += compute
            if comm > 0:
                events.append(Event(rank, 0, "AR", clock, clock + comm, iteration=iteration, chunk=layer, nbytes=nbytes))
                clock += comm
        events.append(Event(rank, 0, "STEP", clock, clock, iteration=iteration))
    return Timeline(events, meta={"mode": mode, "degree": degree, "step_ms": est["step_ms"], "estimate": est})
