"""One pipeline stage on one rank: forward and backward of its layer block.

A stage is a contiguous slice of the model's layer sequence (an ordinary
``nn.Sequential`` cut from the unmodified model). The interpreter calls
:meth:`Stage.forward` and :meth:`Stage.backward` per micro-batch, in the
order the schedule says; the stage keeps what backward needs (its input and
output, or only the input when recomputing) keyed by micro-batch, and frees
it after the backward.

The last stage also owns the loss: its forward turns the output into a
scaled loss (``loss_scale`` = 1 / micro-batches per optimizer step), so the
gradients accumulated over the schedule equal the gradient of the mean loss,
exactly as in a single-process run over the same micro-batches.

Activation recomputation: with ``recompute`` the forward runs under
``no_grad`` and keeps only the input and the RNG state; the backward replays
the forward with the same RNG state, then back-propagates.

Split backward (zero-bubble schedules): :meth:`Stage.backward_input` (I)
returns the input gradient and keeps the graph, :meth:`Stage.backward_weight`
(W) adds the weight gradients later and frees it
(:mod:`~workbench.models.split_backward`). With fused weight-gradient
accumulation (``weight_grads``), I queues the fused layers' weight products
and W runs them (:mod:`~workbench.models.fused_grads`); the split graph
walk then serves only the other parameters.

Stage inputs: a received activation enters the block through
:func:`workbench.models.boundary.stage_input`, a zero-copy non-leaf alias
whose backward hands over the input gradient, so blocks that start with an
in-place op (``ReLU(inplace=True)``, ``x += b``) run as in the dense model. Such
a block overwrites its input; a recomputing stage, which must replay the
forward on the original input, then runs its no-grad forward on a copy. It
learns whether the block modifies its input from the first micro-batch (the
input's version counter) and copies only if so.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from torch.autograd.graph import get_gradient_edge

from ..models.boundary import InputGrad, stage_input
from ..models.fused_grads import WeightGradBuffers, split_input_pass, split_weight_pass, unfused
from ..models.split_backward import SplitBackward

__all__ = ["Stage", "autocast_context", "output_shapes"]


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """bf16 autocast when asked for (CUDA), a no-op otherwise (fp32)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@dataclass
class _Saved:
    inputs: torch.Tensor  # as received; the original values when recomputing (the block may overwrite them)
    output: torch.Tensor | None = None  # None when recomputing
    input_grad: InputGrad | None = None  # where the backward leaves the input gradient (stages that need one)
    target: torch.Tensor | None = None  # kept for the replay of a last stage
    rng_state: torch.Tensor | None = None
    cuda_rng_state: torch.Tensor | None = None
    input_node: Any = None  # the input's gradient edge, where a split backward's I stops
    split: SplitBackward | None = None  # between a split backward's I and its W


@dataclass
class Stage:
    """Layers ``module`` of (virtual) stage ``index``; ``is_last`` adds the loss."""

    index: int
    module: nn.Module
    device: torch.device
    is_first: bool
    is_last: bool
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    loss_scale: float = 1.0
    autocast_dtype: torch.dtype | None = None
    recompute: bool = False
    weight_grads: WeightGradBuffers | None = None  # where the block's fused linear layers accumulate, if they do
    _saved: dict[int, _Saved] = field(default_factory=dict, repr=False)
    losses: list[torch.Tensor] = field(default_factory=list, repr=False)
    # Recompute only: does the block modify its input in place? None until the first micro-batch shows it.
    _modifies_input: bool | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.is_last and self.loss_fn is None:
            raise ValueError(f"stage {self.index} is the last stage and needs a loss_fn")

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def _run(self, inputs: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        with autocast_context(self.device, self.autocast_dtype):
            out = self.module(inputs)
            if self.is_last:
                loss = self.loss_fn(out, target)
                return loss.float()
        return out

    def forward(self, microbatch: int, inputs: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor | None:
        """Run the block; return the activation to send (``None`` on the last stage)."""
        if microbatch in self._saved:
            raise RuntimeError(f"stage {self.index}: forward of micro-batch {microbatch} ran twice before its backward")
        saved = _Saved(inputs=inputs, target=target if self.recompute else None)
        if self.recompute:
            saved.rng_state = torch.get_rng_state()
            if self.device.type == "cuda":
                saved.cuda_rng_state = torch.cuda.get_rng_state(self.device)
            with torch.no_grad():
                out = self._run_keeping_input(inputs, target)
        else:
            if self._needs_input_grad(inputs):
                inputs, saved.input_grad = stage_input(inputs)  # zero-copy, in-place safe (module docstring)
                saved.input_node = get_gradient_edge(inputs)
            out = self._run(inputs, target)
            saved.output = out
        self._saved[microbatch] = saved
        if self.is_last:
            self.losses.append(out.detach())  # read at the end of the step: no device sync here
            return None
        return out.detach()

    def backward(self, microbatch: int, grad_output: torch.Tensor | None = None) -> torch.Tensor | None:
        """Back-propagate one micro-batch; return the gradient of the stage input (``None`` on stage 0)."""
        saved = self._saved.pop(microbatch, None)
        if saved is None:
            raise RuntimeError(f"stage {self.index}: backward of micro-batch {microbatch} before its forward")
        output = self._replay(saved) if self.recompute else saved.output
        if self.is_last:
            (output * self.loss_scale).backward()
        else:
            if grad_output is None:
                raise RuntimeError(f"stage {self.index}: backward of micro-batch {microbatch} needs an output gradient")
            output.backward(grad_output.to(output.dtype))
        if saved.input_grad is None:
            return None
        return saved.input_grad.grad

    def backward_input(self, microbatch: int, grad_output: torch.Tensor | None = None,
                       params: list[torch.Tensor] | None = None) -> torch.Tensor | None:
        """I of a split backward: the gradient of the stage input (``None`` on stage 0); W comes later.

        ``params``: the tensors the micro-batch's graph differentiates, where they are not the module's own
        parameters (a weight version bound for this micro-batch, as the asynchronous pipeline binds them)."""
        saved = self._saved.get(microbatch)
        if saved is None or saved.split is not None:
            raise RuntimeError(f"stage {self.index}: input gradient of micro-batch {microbatch} "
                               f"{'twice' if saved else 'before its forward'}")
        output = self._replay(saved) if self.recompute else saved.output
        if not self.is_last and grad_output is None:
            raise RuntimeError(f"stage {self.index}: backward of micro-batch {microbatch} needs an output gradient")
        scaled = output * self.loss_scale if self.is_last else output
        saved.split = SplitBackward(scaled, saved.input_node,
                                    unfused(self.weight_grads, self.parameters() if params is None else params))
        saved.output = None
        return split_input_pass(self.weight_grads, (self.index, microbatch), saved.split,
                                None if self.is_last else grad_output)

    def backward_weight(self, microbatch: int) -> None:
        """W of a split backward: add the weight gradients of micro-batch ``microbatch``, then free what it kept."""
        saved = self._saved.get(microbatch)
        if saved is None or saved.split is None:
            raise RuntimeError(f"stage {self.index}: weight gradient of micro-batch {microbatch} before its input "
                               f"gradient")
        split_weight_pass(self.weight_grads, (self.index, microbatch), saved.split)
        del self._saved[microbatch]

    def _replay(self, saved: _Saved) -> torch.Tensor:
        """A recomputing stage's forward again, with the RNG state of the first run; the output with its graph."""
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.set_rng_state(saved.rng_state)
            if saved.cuda_rng_state is not None:
                torch.cuda.set_rng_state(saved.cuda_rng_state, self.device)
            inputs = saved.inputs
            if self._needs_input_grad(inputs):
                inputs, saved.input_grad = stage_input(inputs)
                saved.input_node = get_gradient_edge(inputs)
            return self._run(inputs, saved.target)

    def _needs_input_grad(self, inputs: torch.Tensor) -> bool:
        return not self.is_first and inputs.is_floating_point()

    def _run_keeping_input(self, inputs: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """The no-grad forward of a recomputing stage, leaving ``inputs`` as they were for the replay.

        A block that modifies its input in place (its first op is in-place)
        runs on a copy; whether it does is read from the copy's version
        counter at the first micro-batch, so blocks that do not pay nothing.
        """
        if self._modifies_input is False:
            version = inputs._version
            out = self._run(inputs, target)
            if inputs._version != version:
                raise RuntimeError(f"stage {self.index}: the block modified its input in place, which it did not do "
                                   f"at the first micro-batch; the recompute replay would read the modified input")
            return out
        copy = inputs.clone()
        version = copy._version
        out = self._run(copy, target)
        if self._modifies_input is None:
            self._modifies_input = copy._version != version
        return out

    @property
    def in_flight(self) -> int:
        """Micro-batches whose activations are held (forward done, backward not yet)."""
        return len(self._saved)

    def take_losses(self) -> list[float]:
        """Unscaled micro-batch losses since the last call."""
        losses, self.losses = self.losses, []
        return [float(loss) for loss in losses]


def output_shapes(modules: list[nn.Module], example: torch.Tensor, device: torch.device,
                  autocast_dtype: torch.dtype | None) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of each block's output for one micro-batch.

    Runs once on ``device`` (under its autocast, so the dtypes are the run's),
    without grad and in eval mode so normalisation statistics and the RNG
    stream stay untouched. A block held elsewhere (the whole model is built on
    the host; each rank keeps only its own stages on the device) visits the
    device for its pass and goes back, so one block at a time takes device
    memory.
    """
    shapes: list[tuple[tuple[int, ...], torch.dtype]] = []
    modes = [m.training for m in modules]
    device = torch.device(device)
    x: Any = example.to(device)
    try:
        with torch.no_grad(), autocast_context(device, autocast_dtype):
            for module in modules:
                home = _home_device(module)
                visiting = home is not None and not _same_device(home, device)
                if visiting:
                    module.to(device)
                try:
                    module.eval()
                    x = module(x)
                finally:
                    if visiting:
                        module.to(home)
                shapes.append((tuple(x.shape), x.dtype))
    finally:
        for module, mode in zip(modules, modes):
            module.train(mode)
    return shapes


def _home_device(module: nn.Module) -> torch.device | None:
    """Where a module's parameters (else buffers) are; None for a module that holds no tensor."""
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return None


def _same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:<current>`` name one device."""
    if a.type != b.type:
        return False
    if a.type == "cuda":
        current = torch.cuda.current_device()
        return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
    return True
