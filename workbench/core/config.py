"""Run configs: one typed, validated value per training launch.

A run config is the model, the data, the parallel plan and the training
options. It is written by hand in TOML (``launch/*.toml``) or by a notebook
or the planner in JSON (``config.json`` in the run directory); both load into
the same :class:`RunConfig`, which checks every field at construction so a
bad value fails in the notebook or the CLI, before any process starts, with
a message naming the field, the value and what would be valid::

    name = "gropipe-vgg"
    model = "vgg-tiny"
    global_batch = 64
    steps = 30

    [plan]                      # a workbench.core.plan.ParallelPlan
    mesh = { dp = 2, pp = 2 }   # 2 groups x 2 stages: world size 4
    microbatches = 4
    partition = "0-2|3-4"

    [plan.pipeline]
    kind = "gropipe"
    inner = "1f1b"
    delay = 1

    [optimizer]
    name = "sgd"
    lr = 0.02

``plan`` may also be a plan name (``plan = "pp2-1f1b-m4"``; see :mod:`workbench.core.plan`).
The world size is the plan's mesh. Besides the plan's own checks, the config
refuses what the runtime cannot run before launch, naming the layer and its
option (per-layer options on a 2D grid, a tensor-parallel degree that does
not divide the heads, per-layer options under GroPipe or the asynchronous
pipeline); :func:`runs_layer_by_layer` says which plans the layer-by-layer
runtime takes.

Stdlib only (``tomllib``, ``dataclasses``): the planner and the job monitor
read configs without importing torch.

The ``[optimizer]``, ``[data]`` and ``[events]`` tables and the field checks
live in :mod:`~workbench.core.config_tables`, the TOML reader and writer in
:mod:`~workbench.core.toml_text`; both are re-exported here.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .config_tables import DataConfig, EventsConfig, OptimizerConfig, _build, is_import_path
from .fields import check_bool, check_choice, check_int, check_number, config_error, is_int, reject_unknown
from .plan import PIPELINE_KINDS, NoPipeline, ParallelPlan, plan_error
from .toml_text import read_toml, to_toml

__all__ = ["RunConfig", "runs_layer_by_layer", "is_import_path", "OptimizerConfig", "DataConfig", "EventsConfig", "MOVED_TO_PLAN",
           "read_toml", "to_toml"]

PRECISIONS = ("auto", "fp32", "bf16")
# flat keys of the earlier config format -> where each lives now
MOVED_TO_PLAN: dict[str, str] = {
    "strategy": "[plan] (plan = \"NAME\", or mesh + [plan.pipeline] kind)",
    "groups": "[plan] mesh.dp", "stages": "[plan] mesh.pp", "tp": "[plan] mesh.tp (1D) or mesh.tp_row/tp_col (2D)",
    "chunks": "[plan.pipeline] chunks (kind = \"interleaved\")", "inner": "[plan.pipeline] inner",
    "delay": "[plan.pipeline] delay", "stash": "[plan.pipeline] stash", "vertical_sync": "[plan.pipeline] vertical_sync",
    "mode": "[plan.pipeline] mode", "inflight": "[plan.pipeline] inflight",
    "memory_cap_mb": "[plan.pipeline] memory_cap_mb", "partition": "[plan] partition",
    "microbatches": "[plan] microbatches", "recompute": "[[plan.layers]] recompute (or a '-rc' plan name)",
}


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


def _factory_name(obj: Any) -> Any:
    """A model factory (function or class) passed as an object, as the import path the ranks can use.

    Processes started by torchrun cannot receive a model object from the
    notebook; they build the model themselves, so the config keeps a name
    they can import. A model *instance*, or a factory defined in the notebook
    itself, has no such name: that is refused with what to do instead.
    """
    import importlib

    what = type(obj).__name__
    if hasattr(obj, "named_parameters") and not isinstance(obj, type):
        raise config_error("model", f"<{what} object>", "a model object cannot be sent to the run's processes, which "
                           "build the model themselves: move the code that builds it into a function in a module "
                           "(a .py file next to the notebook) and pass model = 'module:function' (or the function)")
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not callable(obj) or not module or not qualname:
        return obj  # not a factory: the string check below names the field
    if module == "__main__" or "<" in qualname or "." in qualname:
        raise config_error("model", f"{module}.{qualname}",
                           "this factory is defined in the notebook (or nested), so the "
                           "run's processes cannot import it: move it into a module (a .py file next to the notebook) "
                           "and import it from there")
    try:
        found = getattr(importlib.import_module(module), qualname, None)
    except Exception:  # noqa: BLE001 - any import failure means it cannot be named
        found = None
    if found is not obj:
        raise config_error("model", f"{module}.{qualname}", "this factory cannot be imported by its name; pass "
                           "model = 'package.module:function'")
    return f"{module}:{qualname}"


@dataclass(frozen=True)
class RunConfig:
    """Everything one training launch needs: model + data + plan + training options; validated at construction.

    ``global_batch`` is the batch of one optimizer step; it is split into
    ``grad_accum`` rounds, each round across the plan's ``dp`` replicas and
    then into its ``microbatches`` micro-batches. ``plugins`` names modules
    imported before the plan is read, in the launcher and in every rank: a
    user's own pipeline kinds register there
    (``workbench.scheduling.registry.register``).
    """

    model: str
    plan: ParallelPlan
    name: str = "run"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    model_args: dict[str, Any] = field(default_factory=dict)
    split_points: tuple[str, ...] = ()
    global_batch: int = 32
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    steps: int = 10
    data: DataConfig = field(default_factory=DataConfig)
    seed: int = 0
    checkpoint_every: int = 0
    resume: bool = False
    run_dir: str = ""
    device: str = "auto"
    placement: tuple[int, ...] = ()
    precision: str = "auto"
    grad_accum: int = 1
    collective_timeout_s: float = 120.0
    events: EventsConfig = field(default_factory=EventsConfig)
    dump_params: bool = False
    fail_at_step: int = -1
    fail_rank: int = 0
    eval_every: int = 0
    eval_batches: int = 8
    target_accuracy: float = 0.0
    target_perplexity: float = 0.0
    tensorboard: bool = True
    plugins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "plugins", _import_plugins(self.plugins))
        object.__setattr__(self, "plan", ParallelPlan.from_dict(self.plan))
        object.__setattr__(self, "optimizer", _build(OptimizerConfig, "optimizer", self.optimizer))
        if is_import_path(self.data):
            object.__setattr__(self, "data", DataConfig(kind="factory", factory=self.data))
        object.__setattr__(self, "data", _build(DataConfig, "data", self.data))
        object.__setattr__(self, "events", _build(EventsConfig, "events", self.events))
        if not isinstance(self.model, str):
            object.__setattr__(self, "model", _factory_name(self.model))
        if not isinstance(self.model, str) or not self.model:
            raise config_error("model", self.model, "expected a zoo model name such as 'vgg-tiny', 'resnet18', 'mlp', "
                               "or a factory 'package.module:function'")
        if not isinstance(self.model_overrides, dict):
            raise config_error("model_overrides", self.model_overrides,
                               "expected a table of model constructor overrides")
        if not isinstance(self.model_args, dict):
            raise config_error("model_args", self.model_args,
                               "expected a table of keyword arguments for the model factory")
        if self.model_args and not self.model_from_factory:
            raise config_error("model_args", self.model_args, f"model {self.model!r} is a zoo name; zoo models take "
                               "model_overrides, and model_args go to a factory model = 'package.module:function'")
        if self.model_overrides and self.model_from_factory:
            raise config_error("model_overrides", self.model_overrides, "a factory model takes its arguments as "
                               "model_args")
        if isinstance(self.split_points, str) or not isinstance(self.split_points, (list, tuple)) \
                or not all(isinstance(p, str) and p for p in self.split_points):
            raise config_error("split_points", self.split_points, "expected a list of submodule names to cut the model "
                               "before, such as ['layer2', 'layer3']")
        object.__setattr__(self, "split_points", tuple(self.split_points))
        if self.split_points and not self.model_from_factory:
            raise config_error("split_points", list(self.split_points), "zoo models are already cut into layers; "
                               "split_points apply to a factory model")
        for name in ("global_batch", "steps", "grad_accum", "eval_batches"):
            check_int(name, getattr(self, name), 1, error=config_error)
        for name in ("seed", "checkpoint_every", "eval_every"):
            check_int(name, getattr(self, name), 0, error=config_error)
        check_number("target_accuracy", self.target_accuracy, 0, 1, error=config_error,
                     expected="a top-1 accuracy in [0, 1] (0: none)")
        check_number("target_perplexity", self.target_perplexity, 0.0, error=config_error)
        if (self.target_accuracy or self.target_perplexity) and not self.eval_every:
            raise config_error("eval_every", self.eval_every, "a target is reached only by evaluating: set eval_every "
                               "to evaluate every N steps")
        check_bool("tensorboard", self.tensorboard, error=config_error)
        check_int("fail_at_step", self.fail_at_step, -1, error=config_error)
        check_int("fail_rank", self.fail_rank, 0, error=config_error)
        check_choice("precision", self.precision, PRECISIONS, error=config_error)
        check_number("collective_timeout_s", self.collective_timeout_s, 0.0, strict=True, error=config_error)
        for name in ("resume", "dump_params"):
            check_bool(name, getattr(self, name), error=config_error)
        if not isinstance(self.run_dir, str):
            raise config_error("run_dir", self.run_dir, "expected a directory path string")
        if self.device != "auto" and self.device not in ("cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise config_error("device", self.device, "valid options are auto, cpu, cuda, cuda:N")
        self._check_placement()
        self._check_runnable()
        self._check_batch()

    def _check_placement(self) -> None:
        """``placement[r]``: the process (torchrun rank, node-major) that runs rank ``r`` of the plan's mesh."""
        value = self.placement
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) \
                or not all(is_int(d) for d in value):
            raise config_error("placement", value, "expected a list of process ranks, one per rank of the plan's mesh")
        object.__setattr__(self, "placement", tuple(value))
        if value and sorted(value) != list(range(self.world_size)):
            raise config_error("placement", list(value), f"expected each of the {self.world_size} processes 0-"
                               f"{self.world_size - 1} once: placement[r] is the process that runs rank r of the mesh")

    def mesh_rank(self, process: int) -> int:
        """The rank of the plan's mesh that process ``process`` (torchrun's rank) runs under ``placement``."""
        return self.placement.index(process) if self.placement else process

    def _check_runnable(self) -> None:
        """Refuse, before launch, what the runtime cannot run yet, and options that contradict the plan."""
        plan = self.plan
        if self.eval_every and not runs_layer_by_layer(plan) and plan.tp_kind != "none":
            raise config_error("eval_every", self.eval_every,
                               f"plan {plan.name!r} runs the uniform {plan.tp_kind.upper()} "
                               f"tensor-parallel strategy, whose ranks hold parameter shards the evaluation cannot put "
                               f"back into the dense model; set eval_every = 0" + (
                               ", or give the layers per-layer options ([[plan.layers]]): the layer-by-layer runtime "
                               "gathers dense parameters" if plan.tp_kind == "1d" else ""))
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
        if one_batch and self.grad_accum != 1:
            raise config_error("grad_accum", self.grad_accum, f"plan {plan.name!r} trains one batch per step (tensor "
                               "parallelism and torch's pipelining rescale nothing; the asynchronous pipeline "
                               "coalesces more micro-batches instead): set grad_accum = 1")
        if plan.tp > 1 and layer.recompute:
            raise plan_error("layers.recompute", True, "the 2D tensor-parallel runtime does not recompute "
                             "activations; set recompute = false")
        if plan.iterates_across_steps and self.resume:
            raise config_error("resume", self.resume,
                               "the asynchronous pipeline keeps micro-batches of the next iteration "
                               "in flight across steps, which a checkpoint does not hold; set resume = false")
        if plan.tp > 1:
            self._check_heads()

    def _check_layerwise(self) -> None:
        """What the layer-by-layer runtime runs: GPipe / 1F1B / interleaved or no pipeline, 1D tensor parallelism."""
        plan = self.plan
        if not plan.pipeline.per_layer:
            kinds = ", ".join(k for k, cls in PIPELINE_KINDS.items() if cls.per_layer and k != "none")
            raise plan_error("pipeline.kind", plan.pipeline.kind, f"per-layer options, sharded data parallelism "
                             f"and tensor parallelism inside a pipeline run with the {kinds} schedules or without "
                             f"a pipeline; kind {plan.pipeline.kind!r} runs one option for all layers "
                             f"(plan {plan.name!r})")
        if plan.tp_kind == "2d":
            i = next((i for i, layer in enumerate(plan.layers) if layer != plan.layers[0]), 0)
            raise plan_error(f"layers[{i}]", plan.layers[i].text, "per-layer options on a 2D tensor-parallel mesh "
                             "are not run: the SUMMA grid runs one option for all layers")
        stage_rows = plan.dp * self.microbatch_size
        heads = self.model_overrides.get("n_head", self.model_overrides.get("num_attention_heads"))
        for i, layer in enumerate(plan.layers):
            where = "layers" if len(plan.layers) == 1 else f"layers[{i}]"
            replicas = plan.dp * plan.tp // layer.tp_degree
            if stage_rows % replicas and not self.global_batch % (plan.dp * plan.microbatches * self.grad_accum):
                raise config_error("global_batch", self.global_batch,
                                   f"{where} option {layer.text!r} splits each stage "
                                   f"micro-batch of {stage_rows} samples over {replicas} data-parallel ranks: make "
                                   f"dp x microbatch size a multiple of {replicas}")
            if layer.tp == "1d" and isinstance(heads, int) and heads >= 1 and heads % layer.tp_degree:
                valid = [d for d in range(2, heads + 1) if heads % d == 0 and plan.tp % d == 0]
                raise plan_error(f"{where}.tp_degree", layer.tp_degree, f"{where} option {layer.text!r}: degree "
                                 f"{layer.tp_degree} does not divide the {heads} attention heads; valid degrees "
                                 f"are {valid or 'none on this mesh'}")

    def _check_heads(self) -> None:
        """The attention heads must split over the tensor-parallel degree (q for a 2D grid)."""
        plan = self.plan
        degree = plan.q if plan.tp_kind == "2d" else plan.tp
        heads = self.model_overrides.get("n_head", self.model_overrides.get("num_attention_heads"))
        if isinstance(heads, int) and heads >= 1 and heads % degree:
            valid = [d for d in range(1, heads + 1) if heads % d == 0]
            nearest = min(valid, key=lambda d: (abs(d - degree), d))
            what, fix = ((f"q = {degree}", f"tp_row = tp_col = {nearest}") if plan.tp_kind == "2d"
                         else (f"tp = {degree}", f"tp = {nearest}"))
            raise plan_error("mesh", str(plan.mesh), f"{what} does not divide the {heads} attention heads; "
                             f"nearest valid is {fix}")

    def _check_batch(self) -> None:
        plan = self.plan
        per_round = plan.dp * plan.microbatches * self.grad_accum
        if self.global_batch % per_round:
            raise config_error("global_batch", self.global_batch,
                               f"must be divisible by dp x microbatches x grad_accum = {per_round}")
        if plan.tp_kind == "2d" and self.global_batch % (plan.dp * plan.q):
            raise config_error("global_batch", self.global_batch,
                               f"must be divisible by dp x grid rows = {plan.dp * plan.q}")
        if self.fail_at_step >= 0 and self.fail_rank >= self.world_size:
            raise config_error("fail_rank", self.fail_rank, f"must be a rank below world size {self.world_size}")

    # -- derived ----------------------------------------------------------------------
    @property
    def model_from_factory(self) -> bool:
        """Whether ``model`` is a ``package.module:function`` factory rather than a zoo name."""
        return is_import_path(self.model)

    @property
    def world_size(self) -> int:
        """Processes the plan needs: its mesh's size (replicas x stages x tensor-parallel ranks)."""
        return self.plan.world_size

    @property
    def microbatch_size(self) -> int:
        return self.global_batch // (self.plan.dp * self.plan.microbatches * self.grad_accum)

    # -- io ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(plan=self.plan.to_dict(), optimizer=asdict(self.optimizer), data=asdict(self.data),
                    events=asdict(self.events), model_overrides=dict(self.model_overrides),
                    model_args=dict(self.model_args), split_points=list(self.split_points),
                    placement=list(self.placement), plugins=list(self.plugins))
        data["data"]["columns"] = list(self.data.columns)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        if not isinstance(data, dict):
            raise ValueError(f"a run config must be a table/dict, got {type(data).__name__}")
        moved = [k for k in data if k in MOVED_TO_PLAN]
        if moved:
            key = moved[0]
            raise ValueError(f"config field {key!r} has moved into the parallel plan: use {MOVED_TO_PLAN[key]}. "
                             f"For example: plan = \"pp2-1f1b-m4\", or a [plan] table with "
                             f"mesh = {{dp = 1, pp = 2}}, microbatches = 4 and [plan.pipeline] kind = \"1f1b\"")
        reject_unknown(data, {f.name for f in fields(cls)}, error=config_error)
        for required in ("model", "plan"):
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

    def to_toml(self, *, defaults: bool = True) -> str:
        """The config as TOML that :meth:`from_toml` reads back (the form ``launch/*.toml`` are written in);
        ``defaults=False`` leaves out the settings (and table entries) that equal a default config's."""
        return to_toml(self.to_dict() if defaults else self._without_defaults())

    def _without_defaults(self) -> dict[str, Any]:
        data = self.to_dict()
        default = RunConfig.from_dict({"model": self.model, "plan": data["plan"]}).to_dict()
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("model", "name", "global_batch", "plan"):
                out[key] = value
            elif isinstance(value, dict) and isinstance(default.get(key), dict):
                table = {k: v for k, v in value.items() if default[key].get(k) != v}
                if table:
                    out[key] = table
            elif default.get(key) != value:
                out[key] = value
        return out

    def save_toml(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_toml())
        return path

    def replace(self, **changes: Any) -> "RunConfig":
        data = self.to_dict()
        data.update(changes)
        return RunConfig.from_dict(data)
