"""Run configs: one typed, validated value per training launch.

A run config is the model, the data, the parallel plan and the training
options, in tables. It is written by hand in TOML (``launch/*.toml``) or by a
notebook or the planner in JSON (``config.json`` in the run directory); both
load into the same :class:`RunConfig`, which checks every field at
construction so a bad value fails in the notebook or the CLI, before any
process starts, with a message naming the field by its place in the file
(``training.steps``), the value and what would be valid::

    name = "gropipe-vgg"

    [model]
    name = "vgg-tiny"

    [data]
    kind = "digits"

    [plan]                      # a workbench.core.plan.ParallelPlan
    mesh = { dp = 2, pp = 2 }   # 2 groups x 2 stages: world size 4
    microbatches = 4
    partition = "0-2|3-4"

    [plan.pipeline]
    kind = "gropipe"
    inner = "1f1b"
    delay = 1

    [training]
    global_batch = 64
    steps = 30

    [training.optimizer]
    name = "sgd"
    lr = 0.02

The tables: ``[model]``, ``[data]``, ``[plan]``, ``[training]``,
``[evaluation]``, ``[events]``, ``[faults]`` and ``[run]``
(:mod:`~workbench.core.config_tables`); ``name`` and ``plugins`` stand
alone. ``model`` may be a name (``model = "vgg-tiny"``), ``plan`` a plan name
(``plan = "pp2-1f1b-m4"``; see :mod:`workbench.core.plan`) and ``data`` a
factory. Files of the earlier flat format (``steps = 30`` beside ``model``)
keep loading: :mod:`~workbench.core.config_upgrade` moves each key into its
table.

The world size is the plan's mesh. Besides the plan's own checks, the config
refuses what the runtime cannot run before launch, naming the layer and its
option (per-layer options on a 2D grid, a tensor-parallel degree that does
not divide the heads, per-layer options under GroPipe or the asynchronous
pipeline); :func:`runs_layer_by_layer` says which plans the layer-by-layer
runtime takes.

Stdlib only (``tomllib``, ``dataclasses``): the planner and the job monitor
read configs without importing torch. The TOML reader and writer live in
:mod:`~workbench.core.toml_text`; the tables and the TOML functions are
re-exported here.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config_tables import (PRECISIONS, DataConfig, EvaluationConfig, EventsConfig, FaultsConfig, ModelConfig,
                            OptimizerConfig, RunOptions, TrainingConfig, _build, is_import_path)
from .config_upgrade import FLAT_KEYS, MOVED_TO_PLAN, moved_attribute, upgrade
from .fields import check_str, config_error, from_dict, merged, require, to_dict
from .plan import PIPELINE_KINDS, NoPipeline, ParallelPlan, plan_error
from .toml_text import read_toml, to_toml

__all__ = ["RunConfig", "runs_layer_by_layer", "is_import_path", "ModelConfig", "DataConfig", "TrainingConfig",
           "OptimizerConfig", "EvaluationConfig", "EventsConfig", "FaultsConfig", "RunOptions", "MOVED_TO_PLAN",
           "FLAT_KEYS", "PRECISIONS", "merge_changes", "read_toml", "to_toml", "check_shared_processes"]

TABLES = ("model", "data", "training", "evaluation", "events", "faults", "run")
# what replace() and the planner's overrides change as a whole rather than entry by entry (their entries
# depend on each other: a data kind and its factory, a mesh and its pipeline)
WHOLE = ("plan", "data")


def runs_layer_by_layer(plan: ParallelPlan) -> bool:
    """Whether ``plan`` needs the layer-by-layer runtime rather than a uniform strategy.

    It does when its layers differ, when they shard data parallelism (zero2,
    fsdp), or on a 1D tensor-parallel mesh unless every layer is the mesh's
    own consecutive tensor parallelism without recomputation and without a
    pipeline (what the uniform 1D strategy runs). Uniform 2D grids stay with
    the SUMMA strategy (per-layer options on a 2D mesh are refused).
    """
    if plan.tp_kind == "2d" or not plan.is_uniform:
        return not plan.is_uniform
    layer = plan.layer
    if layer.dp != "replicate":
        return True
    if plan.tp_kind == "1d":
        return not isinstance(plan.pipeline, NoPipeline) or layer.tp_degree != plan.tp or layer.recompute \
            or not layer.consecutive
    return False


def _import_plugins(plugins: Any) -> tuple[str, ...]:
    """Import the modules a config names in ``plugins`` (where its own pipeline kinds, say, register), in every
    process that reads the config, before its plan is read."""
    if isinstance(plugins, str) or not isinstance(plugins, (list, tuple)):
        raise config_error("plugins", plugins, "expected a list of module names, e.g. ['my_schedules']")
    for name in plugins:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
            raise config_error("plugins", name, "expected a dotted module name such as 'my_package.schedules'")
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise config_error("plugins", name,
                               f"cannot be imported ({exc}); put it on PYTHONPATH or install it") from None
    return tuple(plugins)


@dataclass(frozen=True)
class RunConfig:
    """Everything one training launch needs, in tables: model, data, plan, training, evaluation, events, faults
    and run options; validated at construction.

    ``training.global_batch`` is the batch of one optimizer step; it is split into ``training.grad_accum``
    rounds, each round across the plan's ``dp`` replicas and then into its ``microbatches`` micro-batches.
    ``plugins`` names modules imported before the plan is read, in the launcher and in every rank: a user's own
    pipeline kinds register there (``workbench.scheduling.registry.register``). The tables may be given as
    dicts (``training={"steps": 3}``), ``model`` as a zoo name or factory, ``data`` as a factory's import path.
    """

    model: ModelConfig
    plan: ParallelPlan
    name: str = "run"
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    run: RunOptions = field(default_factory=RunOptions)
    plugins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "plugins", _import_plugins(self.plugins))
        object.__setattr__(self, "plan", ParallelPlan.from_dict(self.plan))
        check_str("name", self.name, error=config_error)
        if not isinstance(self.model, (ModelConfig, dict)):
            object.__setattr__(self, "model", ModelConfig(name=self.model))
        if is_import_path(self.data):
            object.__setattr__(self, "data", DataConfig(kind="factory", factory=self.data))
        for name, cls in (("model", ModelConfig), ("data", DataConfig), ("training", TrainingConfig),
                          ("evaluation", EvaluationConfig), ("events", EventsConfig), ("faults", FaultsConfig),
                          ("run", RunOptions)):
            object.__setattr__(self, name, _build(cls, name, getattr(self, name)))
        self._check_runnable()
        self._check_sizes()

    def __getattr__(self, name: str) -> Any:
        moved = moved_attribute(name)  # only called for attributes a RunConfig does not have
        if moved is not None:
            raise AttributeError(f"RunConfig.{name} has moved into its table: use {moved}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def mesh_rank(self, process: int) -> int:
        """The rank of the plan's mesh that process ``process`` (torchrun's rank) runs under ``run.placement``."""
        placement = self.run.placement
        return placement.index(process) if placement else process

    def _check_runnable(self) -> None:
        """Refuse, before launch, what the runtime cannot run yet, and options that contradict the plan."""
        plan = self.plan
        if self.evaluation.every and not runs_layer_by_layer(plan) and plan.tp_kind != "none":
            raise config_error("evaluation.every", self.evaluation.every,
                               f"plan {plan.name!r} runs the uniform {plan.tp_kind.upper()} "
                               f"tensor-parallel strategy, whose ranks hold parameter shards the evaluation cannot put "
                               f"back into the dense model; set evaluation.every = 0" + (
                               ", or give the layers per-layer options ([[plan.layers]]): the layer-by-layer runtime "
                               "gathers dense parameters" if plan.tp_kind == "1d" else ""))
        if self.training.fused_weight_grads and (runs_layer_by_layer(plan) or not plan.gradient_buffer):
            raise config_error("training.fused_weight_grads", True, f"plan {plan.name!r} does not run on the "
                               "scheduled pipelines or GroPipe, whose stages alone fuse the weight-gradient "
                               "accumulation; set fused_weight_grads = false")
        if runs_layer_by_layer(plan):
            self._check_layerwise()
            return
        if not plan.is_uniform:
            raise plan_error("layers", plan.name, "per-layer options on a 2D tensor-parallel mesh are not run; "
                             "give one option for all layers ([[plan.layers]] layers = 'all')")
        layer = plan.layer
        if layer.dp != "replicate":
            raise plan_error("layers.dp", layer.dp, "the 2D tensor-parallel runtime replicates data-parallel layers "
                             "(DDP); sharded data parallelism ('zero2', 'fsdp') runs with 1D or no tensor parallelism")
        if plan.tp > 1 and not isinstance(plan.pipeline, NoPipeline):
            raise plan_error("mesh", str(plan.mesh), "the runtime does not combine 2D tensor parallelism with a "
                             "pipeline: use pp = 1 with tp_row x tp_col, or 1D tensor parallelism (tp)")
        one_batch = plan.tp > 1 or not plan.pipeline.accumulates
        if one_batch and self.training.grad_accum != 1:
            raise config_error("training.grad_accum", self.training.grad_accum, f"plan {plan.name!r} trains one "
                               "batch per step (tensor parallelism and torch's pipelining rescale nothing; the "
                               "asynchronous pipeline coalesces more micro-batches instead): set grad_accum = 1")
        if plan.tp > 1 and layer.recompute:
            raise plan_error("layers.recompute", True, "the 2D tensor-parallel runtime does not recompute "
                             "activations; set recompute = false")
        if plan.iterates_across_steps and self.training.resume:
            raise config_error("training.resume", self.training.resume,
                               "the asynchronous pipeline keeps micro-batches of the next iteration "
                               "in flight across steps, which a checkpoint does not hold; set resume = false")
        if plan.tp > 1:
            self._check_heads()

    def _check_layerwise(self) -> None:
        """What the layer-by-layer runtime runs: its pipeline kinds (``per_layer``) or none, 1D tensor parallelism."""
        plan = self.plan
        if not plan.pipeline.per_layer:
            kinds = ", ".join(k for k, cls in PIPELINE_KINDS.items() if cls.per_layer and k != "none")
            if plan.pipeline.uses_costs:
                raise plan_error("pipeline.kind", plan.pipeline.kind, f"kind {plan.pipeline.kind!r} builds its "
                                 f"schedule from stage costs profiled before the run on whole stages, which per-layer "
                                 f"options change; run them with one of {kinds} (plan {plan.name!r})")
            raise plan_error("pipeline.kind", plan.pipeline.kind, f"per-layer options, sharded data parallelism "
                             f"and tensor parallelism inside a pipeline run with the {kinds} schedules or without "
                             f"a pipeline; kind {plan.pipeline.kind!r} runs one option for all layers "
                             f"(plan {plan.name!r})")
        if plan.tp_kind == "2d":
            i = next((i for i, layer in enumerate(plan.layers) if layer != plan.layers[0]), 0)
            raise plan_error(f"layers[{i}]", plan.layers[i].text, "per-layer options on a 2D tensor-parallel mesh "
                             "are not run: the SUMMA grid runs one option for all layers")
        stage_rows = plan.dp * self.microbatch_size
        heads, batch = self.model.heads, self.training.global_batch
        for i, layer in enumerate(plan.layers):
            where = "layers" if len(plan.layers) == 1 else f"layers[{i}]"
            replicas = plan.dp * plan.tp // layer.tp_degree
            if stage_rows % replicas and not batch % (plan.dp * plan.microbatches * self.training.grad_accum):
                raise config_error("training.global_batch", batch,
                                   f"{where} option {layer.text!r} splits each stage "
                                   f"micro-batch of {stage_rows} samples over {replicas} data-parallel ranks: make "
                                   f"dp x microbatch size a multiple of {replicas}")
            if layer.tp == "1d" and heads and heads % layer.tp_degree:
                valid = [d for d in range(2, heads + 1) if heads % d == 0 and plan.tp % d == 0]
                raise plan_error(f"{where}.tp_degree", layer.tp_degree, f"{where} option {layer.text!r}: degree "
                                 f"{layer.tp_degree} does not divide the {heads} attention heads; valid degrees "
                                 f"are {valid or 'none on this mesh'}")

    def _check_heads(self) -> None:
        """The attention heads must split over the tensor-parallel degree (q for a 2D grid)."""
        plan = self.plan
        degree = plan.q if plan.tp_kind == "2d" else plan.tp
        heads = self.model.heads
        if heads and heads % degree:
            valid = [d for d in range(1, heads + 1) if heads % d == 0]
            nearest = min(valid, key=lambda d: (abs(d - degree), d))
            what, fix = ((f"q = {degree}", f"tp_row = tp_col = {nearest}") if plan.tp_kind == "2d"
                         else (f"tp = {degree}", f"tp = {nearest}"))
            raise plan_error("mesh", str(plan.mesh), f"{what} does not divide the {heads} attention heads; "
                             f"nearest valid is {fix}")

    def _check_sizes(self) -> None:
        """The batch against the plan's replicas, and the fault's rank and the placement against its world size."""
        plan, batch = self.plan, self.training.global_batch
        per_round = plan.dp * plan.microbatches * self.training.grad_accum
        if batch % per_round:
            raise config_error("training.global_batch", batch,
                               f"must be divisible by dp x microbatches x grad_accum = {per_round}")
        if plan.tp_kind == "2d" and batch % (plan.dp * plan.q):
            raise config_error("training.global_batch", batch,
                               f"must be divisible by dp x grid rows = {plan.dp * plan.q}")
        if self.faults.step >= 0 and self.faults.rank >= self.world_size:
            raise config_error("faults.rank", self.faults.rank, f"must be a rank below world size {self.world_size}")
        placement = self.run.placement
        if placement and sorted(placement) != list(range(self.world_size)):
            raise config_error("run.placement", list(placement), f"expected each of the {self.world_size} processes "
                               f"0-{self.world_size - 1} once: placement[r] is the process that runs rank r of the "
                               f"mesh")

    # -- derived ----------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Processes the plan needs: its mesh's size (replicas x stages x tensor-parallel ranks)."""
        return self.plan.world_size

    @property
    def microbatch_size(self) -> int:
        return self.training.global_batch // (self.plan.dp * self.plan.microbatches * self.training.grad_accum)

    # -- io ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The grouped form: ``name``, ``plugins`` and one dict per table (the plan as its ``[plan]`` table)."""
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        """A config from its dict: the grouped form, or the earlier flat one (each key moved into its table)."""
        if not isinstance(data, dict):
            raise ValueError(f"a run config must be a table/dict, got {type(data).__name__}")
        data = upgrade(data)
        require(data, ("model", "plan"))
        _import_plugins(data.get("plugins", ()))  # before the plan is read: they may register its pipeline kind
        return from_dict(cls, data, error=config_error)

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

    def to_toml(self, *, defaults: bool = True) -> str:
        """The config as TOML that :meth:`from_toml` reads back (the form ``launch/*.toml`` are written in);
        ``defaults=False`` leaves out the settings (and table entries) that equal a default config's."""
        return to_toml(self.to_dict() if defaults else self._without_defaults(), sections=TABLES + ("plan",))

    def _without_defaults(self) -> dict[str, Any]:
        data = self.to_dict()
        default = RunConfig(model=self.model.name, plan=self.plan).to_dict()
        out: dict[str, Any] = {"name": data["name"]}
        for key, value in data.items():
            if key == "plan":
                out[key] = value
            elif isinstance(value, dict):
                kept = _differences(value, default[key])
                if key == "model":
                    kept["name"] = value["name"]
                if key == "training":
                    kept["global_batch"] = value["global_batch"]
                if kept:
                    out[key] = {k: kept[k] for k in value if k in kept}  # in the table's own order
                if key == "model" and list(kept) == ["name"]:
                    out[key] = value["name"]  # model = "vgg-tiny"
            elif default.get(key) != value:
                out[key] = value
        return out

    def save_toml(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_toml())
        return path

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with ``changes`` (the file's keys): a dict for a table changes only the entries it names
        (``replace(training={"steps": 3})``); the plan and the data, whose entries depend on each other, and any
        value that is not a dict, replace the whole entry."""
        return RunConfig.from_dict(merge_changes(self.to_dict(), changes))


def check_shared_processes(configs: list["RunConfig"]) -> None:
    """Refuse runs that cannot train one after another in the same processes (a sweep): they must agree on
    what the processes are (world size, device, placement, collective timeout), and none may resume (a
    restart would train the whole sweep again)."""
    first = configs[0]
    for config in configs[1:]:
        for field, ours, theirs in (("world_size", config.world_size, first.world_size),
                                    ("run.device", config.run.device, first.run.device),
                                    ("run.placement", config.run.placement, first.run.placement),
                                    ("run.collective_timeout_s", config.run.collective_timeout_s,
                                     first.run.collective_timeout_s)):
            if ours != theirs:
                raise ValueError(f"runs in one sweep share their processes, so they must agree on {field}: "
                                 f"{first.plan.name!r} has {theirs!r}, {config.plan.name!r} {ours!r}; launch them "
                                 f"apart")
    for config in configs:
        if config.training.resume and len(configs) > 1:
            raise ValueError(f"config field 'training.resume' of {config.plan.name!r}: a run in a sweep cannot resume "
                             "(a restart would run the whole sweep again); launch it on its own")


def merge_changes(data: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A run config's dict with ``changes`` as :meth:`RunConfig.replace` makes them (flat keys of the earlier
    format moved into their tables first)."""
    data, changes = upgrade(data), upgrade(changes)
    if isinstance(data.get("model"), str) and isinstance(changes.get("model"), dict):
        data = {**data, "model": {"name": data["model"]}}  # model = "name", its entries changed
    return merged(RunConfig, data, changes, whole=WHOLE)


def _differences(value: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """The entries of a table that differ from the default's, nested tables by their own differing entries."""
    out = {}
    for key, entry in value.items():
        if isinstance(entry, dict) and isinstance(default.get(key), dict) and key != "overrides" and key != "args":
            entry = _differences(entry, default[key])
            if entry:
                out[key] = entry
        elif default.get(key) != entry:
            out[key] = entry
    return out
