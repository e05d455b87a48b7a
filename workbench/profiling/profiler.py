"""Per-layer profiling of a layer chain: time, FLOPs and memory into ``ModelCosts``.

A pipeline planner needs, per layer, what a stage holding it will spend.
Each layer is therefore measured the way a stage runs it: its input arrives
detached and enters through the stage's boundary
(:func:`workbench.models.boundary.stage_input`, which in-place first ops may
modify), it runs forward, and backward starts from an incoming output
gradient (the last layer from the loss). Per layer and repeat, forward and backward are timed
separately: on a CPU by ``time.perf_counter`` around each, on a GPU by CUDA
events recorded on the stream before the forward, between forward and
backward and after the backward (``meta["timer"]``: ``perf-counter`` or
``cuda-events``); the median and the spread (max - min) over ``repeats``
after ``warmup`` runs are kept, and every sample in ``meta["samples_ms"]``.
Each run is followed by one of the backward split in two, as zero-bubble
schedules run it: the input gradient (I) and the weight gradient (W) timed
apart on the same clock, from one forward (:mod:`~.split_backward`), kept as
``input_grad_ms``/``weight_grad_ms`` beside the fused ``backward_ms``.
Interleaving the two kinds of run lets drift hit both alike.

Layers that are the same computation on the same shapes (the blocks of a
transformer) share one measurement by default, taken on the first few of
them and pooled (:mod:`workbench.profiling.identical`:
``meta["identical_layers"]`` says which layers share and which were timed;
``share_identical=False`` times every layer); what is counted is counted
for every layer.

One extra, untimed pass per layer counts FLOPs (torch's FlopCounterMode, 2 FLOPs per multiply-add, forward and backward separately)
and the bytes autograd saves for backward (a saved-tensors hook, deduplicated by storage,
parameters excluded). Parameter, gradient and optimizer-state bytes follow
from the parameters (Adam: 2 states, SGD with momentum: 1). The same pass
counts the FLOPs of the convolutions a GPU library runs by Winograd
(``meta["winograd_flops"]``: forward and backward per layer), which a
projection charges at the device's reduced rate. Peak memory is
the CUDA allocator's high-water mark on GPUs; on CPUs, which keep no such
statistic, it is the sum of what is live at the end of forward (inputs,
saved tensors, output, parameters, gradients), stated in ``meta``.

With ``microbatch_passes=True`` the profile also measures what splitting the
batch costs (``meta["microbatch_factors"]``,
:mod:`workbench.profiling.microbatch`): for micro-batches of 1, 2,
4, ... samples, the whole batch runs through the layers as a pipeline
rank runs them (each layer a stage: the forward of every micro-batch, then
their backwards), and the time is set against the per-layer profile's share
for those samples. Small micro-batches cost more per sample (fixed work per
operator call); a rank that time-shares its core with other ranks also
finds its weights and activations evicted by them between two passes, so
the same passes are timed again with the last-level cache flushed before
each (``"cold"``); and once more with every forward on detached copies of
the weights bound by ``torch.func.functional_call`` (``"bound"``), as an
asynchronous pipeline runs each micro-batch on its stashed version. On this
machine (``bench/bench_planner.py``, three rounds) the cold passes at
micro-batches of 1 took 1.74-2.21x the profile's share and the runtime's
ranks 1.69-2.14x, four ranks on two cores; the planner fits ``k + c / b``
to these points when no run calibrates it
(:func:`workbench.planning.costs.compute_scaling.profiled_compute_models`).

Results are cached on disk (see :mod:`workbench.profiling.cache`).
"""

from __future__ import annotations

import hashlib
import platform
import statistics
import time
import warnings
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..core.costs import LayerCost, ModelCosts
from ..core.fields import check_int, is_int
from ..models import LayerSequence, build_model, sample_batch
from ..models.boundary import stage_input
from .cache import CACHE_FORMAT, load as load_cached, store as store_cached
from .flops import flop_counter
from .identical import TimingGroups, layer_signature
from .microbatch import microbatch_factors
from .split_backward import SPLIT_FIELDS, fused_copy, time_split_run

__all__ = ["profile", "count_flops", "resolve_device", "as_sequence", "measure_step_ms", "OPTIMIZER_STATES"]

# Optimizer -> state tensors per parameter.
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1, "sgd-plain": 0, "none": 0}
DEFAULT_BATCH = 8


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` -> CUDA when present, else CPU; a CUDA request without CUDA is a ValueError."""
    if isinstance(device, torch.device):
        device = str(device)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device != "cpu" and not str(device).startswith("cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available here; use 'auto' or 'cpu'")
    return torch.device(device)


def as_sequence(model: LayerSequence | nn.Module | str) -> LayerSequence:
    """A zoo name, a LayerSequence, an nn.Sequential or a chain-shaped module, as a LayerSequence."""
    if isinstance(model, str):
        return build_model(model)
    if isinstance(model, LayerSequence):
        return model
    if isinstance(model, nn.Module):
        return LayerSequence.from_module(model)
    raise ValueError(f"model must be a zoo name, a LayerSequence or an nn.Module, got {type(model).__name__}")


def _as_batch(seq: LayerSequence, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if batch is None:
        return sample_batch(seq, DEFAULT_BATCH)
    if is_int(batch):
        return sample_batch(seq, batch)
    if (isinstance(batch, (tuple, list)) and len(batch) == 2
            and all(isinstance(t, torch.Tensor) for t in batch)):
        return batch[0], batch[1]
    raise ValueError(f"batch must be None, an int batch size or an (inputs, targets) pair of tensors, "
                     f"got {type(batch).__name__}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def _device_key(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{platform.machine()}:{platform.processor()}:threads={torch.get_num_threads()}"


def _fingerprint(seq: LayerSequence) -> str:
    shapes = [(n, tuple(p.shape), str(p.dtype)) for n, p in seq.named_parameters()]
    return hashlib.sha256(repr((repr(seq), shapes, seq.layer_names)).encode()).hexdigest()[:24]


def _zero_grads(module: nn.Module) -> None:
    for param in module.parameters():
        param.grad = None


class _LayerRunner:
    """Runs one layer forward and backward like a pipeline stage does.

    Every run gets a fresh stage input (:meth:`prepare`, untimed): the data for
    the first layer, else :func:`stage_input` over the previous layer's output,
    exactly what a stage builds from a received activation. A layer that
    modifies its input in place (it starts with an in-place op) would change
    the input of the next run, so it runs on a copy of the original; whether
    it does is read from the input's version counter after the first run, and
    layers that do not are never copied.
    """

    def __init__(self, seq: LayerSequence, index: int, x: torch.Tensor, targets: torch.Tensor, buffers=None) -> None:
        self.seq, self.index, self.targets, self.buffers = seq, index, targets, buffers  # buffers: fused layers
        self.layer = seq[index]
        self.is_last = index == len(seq) - 1
        self.source = x.detach()
        self.needs_grad = index > 0 and x.is_floating_point()
        self.modifies_input: bool | None = None  # None until the first run shows it
        self._last: tuple[torch.Tensor, int] | None = None  # the buffer the last run read, and its version then
        self.x: torch.Tensor = self.source
        self.grad_out: torch.Tensor | None = None
        self.layer_output: torch.Tensor | None = None

    def prepare(self) -> None:
        """A fresh stage input for the next run (outside the timed region)."""
        if self.modifies_input is None and self._last is not None:
            buffer, version = self._last
            self.modifies_input = buffer._version != version
        buffer = self.source if self.modifies_input is False else self.source.clone()
        self._last = (buffer, buffer._version)
        self.x = stage_input(buffer)[0] if self.needs_grad else buffer

    def forward(self) -> torch.Tensor:
        out = self.seq.call_layer(self.index, self.x)
        self.layer_output = out.detach()
        if self.is_last:
            return self.seq.loss_fn(out, self.targets)
        return out

    def output_grad(self, out: torch.Tensor) -> torch.Tensor | None:
        """The incoming gradient of ``out``: None for the loss (a scalar), else a fixed random tensor."""
        if self.is_last:
            return None
        if self.grad_out is None or self.grad_out.shape != out.shape:
            generator = torch.Generator().manual_seed(self.index)
            self.grad_out = torch.randn(out.shape, generator=generator, dtype=out.dtype).to(out.device)
        return self.grad_out

    def backward(self, out: torch.Tensor) -> None:
        if out.requires_grad:
            out.backward(self.output_grad(out))


def _timer_name(device: torch.device) -> str:
    return "cuda-events" if device.type == "cuda" else "perf-counter"


class DeviceClock:
    """Time marks on the device's own clock: CUDA events recorded on the device's current stream on a GPU,
    ``perf_counter`` after a device synchronisation elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        _sync(self.device)

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        _sync(self.device)
        return time.perf_counter()

    def ms(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end)
        return (end - start) * 1e3


def _time_layer(runner: _LayerRunner, device: torch.device, warmup: int, repeats: int) -> dict[str, list[float]]:
    """Samples (ms) of forward, fused backward, and the backward's input (I) and weight (W) parts, per run."""
    clock = DeviceClock(device)
    times: dict[str, list[float]] = {name: [] for name in ("forward_ms", "backward_ms", *SPLIT_FIELDS)}
    for run in range(warmup + repeats):
        _zero_grads(runner.layer)
        runner.prepare()
        _sync(device)
        start = clock.mark()
        out = runner.forward()
        middle = clock.mark()
        runner.backward(out)
        end = clock.mark()
        del out
        split = time_split_run(runner, clock, runner.buffers)
        if run >= warmup:
            times["forward_ms"].append(clock.ms(start, middle))
            times["backward_ms"].append(clock.ms(middle, end))
            for name, value in zip(SPLIT_FIELDS, split):
                times[name].append(value)
    return times


def _count_layer(runner: _LayerRunner, device: torch.device) -> dict[str, int]:
    """FLOPs (forward, backward), saved bytes and peak bytes from one untimed pass."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in runner.layer.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_ptrs and storage.nbytes() > 0:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    _zero_grads(runner.layer)
    runner.prepare()
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    winograd_forward: dict[str, int] = {}
    winograd_backward: dict[str, int] = {}
    with flop_counter(winograd_forward) as forward_counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = runner.forward()
    with flop_counter(winograd_backward) as backward_counter:
        runner.backward(out)
    counts = {"forward_flops": forward_counter.get_total_flops(), "backward_flops": backward_counter.get_total_flops(),
              "winograd_flops": [winograd_forward.get("flops", 0), winograd_backward.get("flops", 0)],
              "saved_bytes": sum(saved.values())}
    if device.type == "cuda":
        _sync(device)
        counts["transient_peak"] = torch.cuda.max_memory_allocated(device) - base
    return counts


def _known_counts(runner: _LayerRunner, known: tuple[tuple, dict[str, Any]] | None) -> dict[str, Any] | None:
    """The counts of a layer whose signature's timed layers are all taken and were all counted alike (``known``:
    their :func:`_counted_key` and counts), from a forward without autograd that only passes its output on;
    None (count it) when there are no such counts or the output's shape or dtype differs from theirs."""
    if known is None:
        return None
    runner.prepare()
    with torch.no_grad():
        runner.forward()
    out = runner.layer_output
    key, counts = known
    return dict(counts) if (tuple(out.shape), str(out.dtype)) == key[-2:] else None


def _median_spread(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), (max(values) - min(values)) if len(values) > 1 else 0.0


def _time_fields(times: dict[str, list[float]]) -> dict[str, float]:
    """``{name: median, name_spread: spread}`` for every timed quantity."""
    fields: dict[str, float] = {}
    for name, values in times.items():
        fields[name], fields[f"{name}_spread"] = _median_spread(values)
    return fields


def _layer_fields(runner: _LayerRunner, counts: dict[str, Any], x: torch.Tensor, states: int,
                  device: torch.device) -> dict[str, Any]:
    """A layer's counted fields of its ``LayerCost``: FLOPs and bytes, which every layer gets on its own."""
    params = [p for p in runner.layer.parameters() if p.requires_grad]
    param_bytes = sum(_nbytes(p) for p in runner.layer.parameters())
    grad_bytes = sum(_nbytes(p) for p in params)
    activation_bytes = _nbytes(runner.layer_output)
    live_after_forward = (param_bytes + grad_bytes + _nbytes(x) + counts["saved_bytes"] + activation_bytes)
    peak = counts.get("transient_peak", 0) + param_bytes + _nbytes(x) if device.type == "cuda" else live_after_forward
    return dict(flops=int(counts["forward_flops"]), param_bytes=param_bytes, activation_bytes=activation_bytes,
                saved_bytes=counts["saved_bytes"], grad_bytes=grad_bytes, optimizer_bytes=states * grad_bytes,
                peak_bytes=int(peak), num_params=sum(p.numel() for p in runner.layer.parameters()))


def _counted_key(runner: _LayerRunner, counts: dict[str, Any]) -> tuple:
    """What counting a layer found that two layers of one measurement must share besides their signature
    (:mod:`workbench.profiling.identical`): FLOPs, saved bytes, the output's shape and dtype."""
    out = runner.layer_output
    return (int(counts["forward_flops"]), int(counts["backward_flops"]), tuple(counts["winograd_flops"]),
            counts["saved_bytes"], tuple(out.shape), str(out.dtype))


def _measure(seq: LayerSequence, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device,
             warmup: int, repeats: int, optimizer: str, progress: bool,
             share_identical: bool = True, buffers: Any = None) -> tuple[list[LayerCost], dict[str, Any]]:
    from tqdm.auto import tqdm

    fields, backward_flops, winograd_flops = [], [], []
    groups = TimingGroups(share_identical)
    counted: dict[str, tuple | None] = {}  # per signature: the counted key and counts its layers all had, or None
    borrowed: list[int] = []  # the layers that took their counts from the identical layers before them
    x = inputs
    bar = tqdm(total=len(seq), desc=f"profile {seq.model_name}", disable=not progress, leave=False)
    try:
        for index, name in enumerate(seq.layer_names):
            bar.set_postfix_str(name)
            runner = _LayerRunner(seq, index, x, targets, buffers)
            signature = layer_signature(runner.layer, x, needs_grad=runner.needs_grad, is_last=runner.is_last)
            # timed, then counted, unless an identical layer's timing is taken: then counted (or its counts taken
            # from the layers before it, see _known_counts), and timed only if the counts set it apart
            full = groups.full(signature)
            times = None if full else _time_layer(runner, device, warmup, repeats)
            counts = _known_counts(runner, counted.get(signature)) if full else None
            if counts is not None:
                borrowed.append(index)
            counts = counts if counts is not None else _count_layer(runner, device)
            key = _counted_key(runner, counts)
            before = counted.get(signature, (key, counts))
            counted[signature] = (key, counts) if before is not None and before[0] == key else None
            fields.append(_layer_fields(runner, counts, x, OPTIMIZER_STATES[optimizer], device))
            backward_flops.append(int(counts["backward_flops"]))
            winograd_flops.append([int(f) for f in counts["winograd_flops"]])
            next_x = runner.layer_output
            if groups.join(index, signature, key):
                groups.add(index, times if times is not None else _time_layer(runner, device, warmup, repeats))
            x = next_x
            bar.update(1)
    finally:
        bar.close()
    _zero_grads(seq)
    layers, samples = [], {name: [] for name in ("forward_ms", "backward_ms", *SPLIT_FIELDS)}
    for index, name in enumerate(seq.layer_names):
        times = groups.samples(index)
        layers.append(LayerCost(name=name, **_time_fields(times), **fields[index]))
        for kind, values in times.items():
            samples[kind].append([round(t, 4) for t in values])
    return layers, {"backward_flops": backward_flops, "winograd_flops": winograd_flops, "samples_ms": samples,
                    "share_identical": share_identical, "identical_layers": groups.shared(), "counts_borrowed": borrowed}


def _check_settings(warmup: Any, repeats: Any, optimizer: Any) -> None:
    check_int("warmup", warmup, 0)
    check_int("repeats", repeats, 1)
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATES)}, got {optimizer!r}")


def profile(model_or_sequence: LayerSequence | nn.Module | str, batch: Any = None, device: str = "auto",
            warmup: int = 1, repeats: int = 3, cache: bool = True, progress: bool = True, *,
            optimizer: str = "adam", cache_dir: str | None = None, microbatch_passes: bool = False,
            share_identical: bool = True, fused_weight_grads: bool = False) -> ModelCosts:
    """Measure every layer of a model; returns :class:`~workbench.core.costs.ModelCosts`.

    ``batch``: None (8 synthetic samples), a batch size (synthetic) or an
    ``(inputs, targets)`` pair. The model is moved to ``device`` and left in
    train mode; measured gradients are cleared afterwards. ``microbatch_passes``:
    also measure the cost of splitting the batch (``meta["microbatch_factors"]``,
    CPU only; see the module docstring). ``share_identical``: layers that are
    the same computation on the same input shapes share one timing
    (:mod:`workbench.profiling.identical`; ``meta["identical_layers"]`` lists
    them); False times every layer. ``fused_weight_grads``: time a copy of the model whose linear layers
    accumulate their weight gradients inside their products, as a pipeline stage with
    ``training.fused_weight_grads`` runs them (the caller's model stays as it was).
    """
    for name, value in (("microbatch_passes", microbatch_passes), ("share_identical", share_identical),
                        ("fused_weight_grads", fused_weight_grads)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
    _check_settings(warmup, repeats, optimizer)
    seq = as_sequence(model_or_sequence)
    inputs, targets = _as_batch(seq, batch)
    target_device = resolve_device(device)
    dtype = next((p.dtype for p in seq.parameters()), torch.float32)
    key = {"model": seq.model_name, "fingerprint": _fingerprint(seq), "layers": seq.layer_names,
           "inputs": [list(inputs.shape), str(inputs.dtype)], "targets": [list(targets.shape), str(targets.dtype)],
           "dtype": str(dtype).replace("torch.", ""), "device": _device_key(target_device), "warmup": warmup,
           "repeats": repeats, "optimizer": optimizer, "share_identical": share_identical, "torch": torch.__version__,
           "format": CACHE_FORMAT}
    key.update({name: True for name, on in (("microbatch_passes", microbatch_passes),
                                            ("fused_weight_grads", fused_weight_grads)) if on})
    if target_device.type == "cuda":
        key["timer"] = _timer_name(target_device)  # how a GPU profile was timed is part of its identity
    if cache:
        cached, reason = load_cached(key, cache_dir)
        if cached is not None:  # entries without a timer were timed by perf_counter
            return replace(cached, meta={"timer": "perf-counter", **cached.meta, "cache": "hit"})
        if reason != "miss":
            warnings.warn(f"profile cache: {reason}; measuring again", stacklevel=2)
    seq, buffers = fused_copy(seq) if fused_weight_grads else (seq, None)
    seq.to(target_device).train()
    inputs, targets = inputs.to(target_device), targets.to(target_device)
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[]):  # dropout in the measured passes leaves the caller's CPU RNG as it was
        layers, measured = _measure(seq, inputs, targets, target_device, warmup, repeats, optimizer, progress,
                                    share_identical, buffers)
        if microbatch_passes and target_device.type == "cpu":
            measured["microbatch_factors"] = microbatch_factors(seq, inputs, targets, layers, repeats)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "warmup": warmup, "repeats": repeats,
            "optimizer": optimizer, **measured, "input_shape": list(inputs.shape),
            "input_dtype": str(inputs.dtype).replace("torch.", ""), "task": seq.task,
            "timer": _timer_name(target_device),
            "peak_bytes_method": "cuda-allocator" if target_device.type == "cuda" else "live-bytes-estimate",
            "flop_convention": "2 FLOPs per multiply-add (torch FlopCounterMode)",
            "profile_wall_s": round(time.perf_counter() - started, 3), "cache": "miss",
            **({"fused_weight_grads": True} if fused_weight_grads else {})}
    costs = ModelCosts(model=seq.model_name, batch_size=int(inputs.shape[0]), device=_device_label(target_device),
                       layers=tuple(layers), dtype=key["dtype"], input_bytes=_nbytes(inputs), meta=meta)
    if cache:
        store_cached(key, costs, cache_dir)
    return costs


def measure_step_ms(model_or_sequence: LayerSequence | nn.Module | str, batch: Any = None, device: str = "auto",
                    warmup: int = 1, repeats: int = 3) -> list[float]:
    """Whole-model forward + loss + backward times (ms): the reference for a profile.

    Timed as :func:`profile` times layers: CUDA events on a GPU, ``perf_counter`` on a CPU.
    """
    _check_settings(warmup, repeats, "none")
    seq = as_sequence(model_or_sequence)
    inputs, targets = _as_batch(seq, batch)
    target_device = resolve_device(device)
    seq.to(target_device).train()
    inputs, targets = inputs.to(target_device), targets.to(target_device)
    clock = DeviceClock(target_device)
    times = []
    for run in range(warmup + repeats):
        _zero_grads(seq)
        start = clock.mark()
        seq.loss_fn(seq(inputs), targets).backward()
        end = clock.mark()
        if run >= warmup:
            times.append(clock.ms(start, end))
    _zero_grads(seq)
    return times


def count_flops(model_or_sequence: LayerSequence | nn.Module | str, batch: Any = None) -> list[int]:
    """Forward FLOPs per layer (2 per multiply-add) without timing anything: cheap enough for big models."""
    seq = as_sequence(model_or_sequence)
    x, _ = _as_batch(seq, batch)
    flops = []
    with torch.no_grad():
        for index in range(len(seq)):
            with flop_counter() as counter:
                x = seq.call_layer(index, x)
            flops.append(int(counter.get_total_flops()))
    return flops
