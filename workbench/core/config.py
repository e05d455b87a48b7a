"""Run configs: one typed, validated value per training launch.

A launch is described by hand in TOML (``launch/*.toml``) or by a notebook
in JSON (``config.json`` in the run directory). Both load into the same
:class:`RunConfig`, which checks every field at construction so a bad value
fails in the notebook or the CLI, before any process starts, with a message
naming the field, the value and what would be valid.

The layout of the processes follows from the strategy: ``world_size`` is
``groups * stages * tp`` (data-parallel groups times pipeline stages times
tensor-parallel ranks); pipeline strategies need one group, data-parallel
ones one stage, and only "tensor" layouts use ``tp > 1``.
``STRATEGY_LAYOUTS`` is the table that says which; a new strategy is one line there and one in
``workbench.runtime.strategies``.

Stdlib only (``tomllib``, ``dataclasses``): the planner and the job monitor
read configs without importing torch.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["RunConfig", "OptimizerConfig", "DataConfig", "EventsConfig", "STRATEGY_LAYOUTS", "read_toml"]

# strategy -> layout: "pipeline" (groups == 1), "grouped" (groups x stages), "data" (stages == 1),
# "tensor" (stages == 1, tp ranks per group)
STRATEGY_LAYOUTS: dict[str, str] = {
    "gpipe": "pipeline",
    "1f1b": "pipeline",
    "interleaved": "pipeline",
    "torch-pipelining": "pipeline",
    "gropipe": "grouped",
    "async": "grouped",
    "ddp": "data",
    "tensor2d": "tensor",
    "tensor1d": "tensor",
}
OPTIMIZERS = ("sgd", "adam")
DATA_KINDS = ("synthetic", "digits", "bytes-lm")
PRECISIONS = ("auto", "fp32", "bf16")
INNER_SCHEDULES = ("gpipe", "1f1b")
ASYNC_MODES = ("stash", "2bw")  # weight versions of strategy "async" (PipeDream stashing, PipeDream-2BW)


def _fail(field_name: str, value: Any, valid: str) -> ValueError:
    return ValueError(f"config field {field_name!r} = {value!r} is invalid: {valid}")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(name, value, f"expected an int >= {minimum}")


def _check_number(name: str, value: Any, minimum: float, *, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum or (strict and value == minimum):
        raise _fail(name, value, f"expected a number {'>' if strict else '>='} {minimum}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...] | list[str]) -> None:
    if value not in choices:
        raise _fail(name, value, f"valid options are {', '.join(map(str, choices))}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _fail(name, value, "expected true or false")


def _build(cls: type, name: str, data: Any) -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise _fail(name, data, f"expected a table with fields {[f.name for f in fields(cls)]}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise _fail(f"{name}.{unknown[0]}", data[unknown[0]], f"unknown field; valid fields are {sorted(known)}")
    return cls(**data)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check_choice("optimizer.name", self.name, OPTIMIZERS)
        _check_number("optimizer.lr", self.lr, 0.0, strict=True)
        _check_number("optimizer.momentum", self.momentum, 0.0)
        _check_number("optimizer.weight_decay", self.weight_decay, 0.0)


@dataclass(frozen=True)
class DataConfig:
    kind: str = "synthetic"
    seq_len: int = 64

    def __post_init__(self) -> None:
        _check_choice("data.kind", self.kind, DATA_KINDS)
        _check_int("data.seq_len", self.seq_len, 1)


@dataclass(frozen=True)
class EventsConfig:
    stage_events: bool = True
    heartbeat_s: float = 5.0

    def __post_init__(self) -> None:
        _check_bool("events.stage_events", self.stage_events)
        _check_number("events.heartbeat_s", self.heartbeat_s, 0.0, strict=True)


@dataclass(frozen=True)
class RunConfig:
    """Everything one training launch needs; validated at construction.

    ``partition`` is ``"uniform"``, ``"ampa"`` (profile, then balance) or
    explicit text such as ``"0-3|4-9"`` with one range per (virtual) stage.
    ``global_batch`` is the batch of one optimizer step; it is split into
    ``grad_accum`` rounds, each round across ``groups`` and then into
    ``microbatches`` micro-batches per group.
    """

    model: str
    strategy: str
    name: str = "run"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    groups: int = 1
    stages: int = 1
    tp: int = 1
    chunks: int = 1
    inner: str = "1f1b"
    delay: int = 0
    stash: bool = True
    vertical_sync: bool = False
    mode: str = "stash"
    inflight: str | int = "auto"
    memory_cap_mb: float = 0.0
    partition: str = "uniform"
    microbatches: int = 4
    global_batch: int = 32
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    steps: int = 10
    data: DataConfig = field(default_factory=DataConfig)
    seed: int = 0
    checkpoint_every: int = 0
    resume: bool = False
    run_dir: str = ""
    device: str = "auto"
    precision: str = "auto"
    recompute: bool = False
    grad_accum: int = 1
    collective_timeout_s: float = 120.0
    events: EventsConfig = field(default_factory=EventsConfig)
    dump_params: bool = False
    fail_at_step: int = -1
    fail_rank: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "optimizer", _build(OptimizerConfig, "optimizer", self.optimizer))
        object.__setattr__(self, "data", _build(DataConfig, "data", self.data))
        object.__setattr__(self, "events", _build(EventsConfig, "events", self.events))
        if not isinstance(self.model, str) or not self.model:
            raise _fail("model", self.model, "expected a model name such as 'vgg-tiny', 'resnet18', 'mlp'")
        if not isinstance(self.model_overrides, dict):
            raise _fail("model_overrides", self.model_overrides, "expected a table of model constructor overrides")
        _check_choice("strategy", self.strategy, list(STRATEGY_LAYOUTS))
        for name in ("groups", "stages", "tp", "chunks", "microbatches", "global_batch", "steps", "grad_accum"):
            _check_int(name, getattr(self, name), 1)
        for name in ("seed", "checkpoint_every"):
            _check_int(name, getattr(self, name), 0)
        _check_int("fail_at_step", self.fail_at_step, -1)
        _check_int("fail_rank", self.fail_rank, 0)
        _check_choice("delay", self.delay, (0, 1))
        _check_choice("inner", self.inner, INNER_SCHEDULES)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_number("collective_timeout_s", self.collective_timeout_s, 0.0, strict=True)
        for name in ("resume", "recompute", "dump_params", "stash", "vertical_sync"):
            _check_bool(name, getattr(self, name))
        if not isinstance(self.run_dir, str):
            raise _fail("run_dir", self.run_dir, "expected a directory path string")
        if self.device != "auto" and self.device not in ("cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise _fail("device", self.device, "valid options are auto, cpu, cuda, cuda:N")
        if not isinstance(self.partition, str) or not self.partition.strip():
            raise _fail("partition", self.partition, "expected 'uniform', 'ampa' or text like '0-3|4-9'")
        self._check_layout()

    def _check_layout(self) -> None:
        layout = STRATEGY_LAYOUTS[self.strategy]
        if layout == "pipeline" and self.groups != 1:
            raise _fail("groups", self.groups, f"strategy {self.strategy!r} runs one pipeline: set groups = 1 "
                        f"(use strategy 'gropipe' for several groups)")
        if layout != "tensor" and self.tp != 1:
            raise _fail("tp", self.tp, f"strategy {self.strategy!r} has no tensor parallelism: set tp = 1")
        if layout in ("data", "tensor") and self.stages != 1:
            raise _fail("stages", self.stages, f"strategy {self.strategy!r} does not cut the model into pipeline "
                        f"stages: set stages = 1 (use 'gropipe' for groups x stages)")
        if self.strategy == "interleaved":
            if self.chunks < 2:
                raise _fail("chunks", self.chunks, "strategy 'interleaved' needs chunks >= 2 per rank")
            if self.microbatches % self.stages:
                raise _fail("microbatches", self.microbatches,
                            f"interleaved needs a multiple of stages ({self.stages})")
        elif self.chunks != 1:
            raise _fail("chunks", self.chunks, f"only strategy 'interleaved' uses chunks; set chunks = 1 "
                        f"for {self.strategy!r}")
        if self.delay and self.strategy != "gropipe":
            raise _fail("delay", self.delay, f"only strategy 'gropipe' has a delayed update; set delay = 0")
        self._check_async()
        if self.strategy == "torch-pipelining" and (self.grad_accum != 1 or self.stages < 2):
            bad, value = ("grad_accum", self.grad_accum) if self.grad_accum != 1 else ("stages", self.stages)
            raise _fail(bad, value, "strategy 'torch-pipelining' needs grad_accum = 1 (torch rescales gradients "
                        "every step) and stages >= 2")
        if layout == "tensor":
            self._check_tensor_layout()
        per_round = self.groups * self.microbatches * self.grad_accum
        if self.global_batch % per_round:
            raise _fail("global_batch", self.global_batch,
                        f"must be divisible by groups x microbatches x grad_accum = {per_round}")
        if self.fail_at_step >= 0 and self.fail_rank >= self.world_size:
            raise _fail("fail_rank", self.fail_rank, f"must be a rank below world size {self.world_size}")

    def _check_async(self) -> None:
        """Options of strategy 'async': weight versions, micro-batches in flight, memory cap."""
        _check_choice("mode", self.mode, ASYNC_MODES)
        if self.inflight != "auto" and (isinstance(self.inflight, bool) or not isinstance(self.inflight, int)
                                        or self.inflight < 1):
            raise _fail("inflight", self.inflight, "expected 'auto' or an int >= 1 (micro-batches in flight per stage)")
        _check_number("memory_cap_mb", self.memory_cap_mb, 0.0)
        defaults = {"stash": True, "vertical_sync": False, "mode": "stash", "inflight": "auto", "memory_cap_mb": 0.0}
        if self.strategy != "async":
            for name, default in defaults.items():
                if getattr(self, name) != default:
                    raise _fail(name, getattr(self, name), f"only strategy 'async' uses {name!r}; remove it or set "
                                f"strategy = 'async'")
            return
        if self.mode == "2bw" and not self.stash:
            raise _fail("stash", self.stash, "mode '2bw' keeps two weight versions; set stash = true (stash = false "
                        "is the unstashed mode 'stash' shown for comparison)")
        if self.vertical_sync and not self.stash:
            raise _fail("vertical_sync", self.vertical_sync, "vertical sync runs later stages on older stashed "
                        "versions; it needs stash = true")
        if self.mode == "2bw" and self.vertical_sync:
            raise _fail("vertical_sync", self.vertical_sync, "mode '2bw' already uses one version per iteration on "
                        "every stage; vertical_sync applies to mode 'stash'")
        if self.mode == "2bw" and self.microbatches < self.stages:
            raise _fail("microbatches", self.microbatches, f"mode '2bw' coalesces gradients over at least the "
                        f"pipeline depth: use microbatches >= stages ({self.stages})")
        if self.stages < 2:
            raise _fail("stages", self.stages, "strategy 'async' pipelines the model: use stages >= 2")
        if self.grad_accum != 1:
            raise _fail("grad_accum", self.grad_accum, "strategy 'async' updates after each mini-batch's "
                        "micro-batches: set grad_accum = 1 (more micro-batches coalesce more)")
        if self.resume:
            raise _fail("resume", self.resume, "strategy 'async' keeps micro-batches of the next iteration in flight "
                        "across steps, which a checkpoint does not hold; set resume = false")

    def _check_tensor_layout(self) -> None:
        """tensor2d: tp a square q x q grid, heads divisible by q; both: one step is one batch (no accumulation)."""
        if self.grad_accum != 1:
            raise _fail("grad_accum", self.grad_accum, f"strategy {self.strategy!r} trains one batch per step: "
                        f"set grad_accum = 1")
        if self.recompute:
            raise _fail("recompute", self.recompute, f"strategy {self.strategy!r} does not recompute activations; "
                        f"set recompute = false")
        degree = self.tp
        if self.strategy == "tensor2d":
            side = math.isqrt(self.tp)
            if side * side != self.tp:
                low, high = side * side, (side + 1) ** 2
                nearest = low if self.tp - low <= high - self.tp else high
                raise _fail("tp", self.tp, f"strategy 'tensor2d' runs on a q x q grid, so tp must be a square; "
                            f"nearest valid tp is {nearest} (q = {math.isqrt(nearest)})")
            degree = side
        heads = self.model_overrides.get("n_head", self.model_overrides.get("num_attention_heads"))
        if isinstance(heads, int) and heads >= 1 and heads % degree:
            valid = [d for d in range(1, heads + 1) if heads % d == 0]
            nearest = min(valid, key=lambda d: (abs(d - degree), d))
            what = f"q = {degree}" if self.strategy == "tensor2d" else f"tp = {degree}"
            fix = f"q = {nearest} (tp = {nearest * nearest})" if self.strategy == "tensor2d" else f"tp = {nearest}"
            raise _fail("tp", self.tp, f"{what} does not divide the {heads} attention heads; nearest valid is {fix}")
        rows = degree if self.strategy == "tensor2d" else 1
        if self.global_batch % (self.groups * rows):
            raise _fail("global_batch", self.global_batch,
                        f"must be divisible by groups x grid rows = {self.groups * rows}")

    # -- derived ----------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Processes the strategy needs: data-parallel groups x pipeline stages x tensor-parallel ranks."""
        return self.groups * self.stages * self.tp

    @property
    def num_virtual_stages(self) -> int:
        return self.stages * self.chunks

    @property
    def microbatch_size(self) -> int:
        return self.global_batch // (self.groups * self.microbatches * self.grad_accum)

    # -- io ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        if not isinstance(data, dict):
            raise ValueError(f"a run config must be a table/dict, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise _fail(unknown[0], data[unknown[0]], f"unknown field; valid fields are {sorted(known)}")
        for required in ("model", "strategy"):
            if required not in data:
                raise ValueError(f"config field {required!r} is missing; it is required")
        return cls(**data)

    @classmethod
    def from_toml(cls, path: str | Path) -> "RunConfig":
        return cls.from_dict(read_toml(path))

    @classmethod
    def from_json(cls, path: str | Path) -> "RunConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def save_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def replace(self, **changes: Any) -> "RunConfig":
        data = self.to_dict()
        data.update(changes)
        return RunConfig.from_dict(data)


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file as a dict; a missing file or bad TOML is a ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
