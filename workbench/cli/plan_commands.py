"""``workbench plan``: rank hybrid strategies (data, pipeline, GroPipe, async, 2D/1D tensor) for a model on a cluster.

MODEL is a ModelCosts JSON file or a zoo model name; a name is profiled on
this machine first (cached) and, for a cluster of other devices, projected
onto them from its FLOPs and bytes. GPT-2 models from the zoo also get their
shape, so the uniform tensor-parallel strategies are considered (the runtime
shards no other model whole: :mod:`workbench.core.tensor_support`); with
``--fine-grained`` every zoo model's layers carry the degrees the runtime
splits them by. A zoo model is built
with ``--model-arg KEY=VALUE`` overrides, or else with those of the first
``--calibrate`` run of the same model, so that the profile describes the
model the runs trained.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .model_args import add_model_arg, parse_model_args
from .result import Result


def _run_configs(run_dirs: list[str] | None):
    """(run directory, RunConfig) of each ``--calibrate`` run that has a config (the others fail later, clearly)."""
    from ..core.config import RunConfig

    for run_dir in run_dirs or []:
        path = Path(run_dir) / "config.json"
        if path.is_file():
            yield run_dir, RunConfig.from_json(path)


def _run_model(run_dirs: list[str] | None, model: str):
    """(overrides, sequence length, run directory) of the first ``--calibrate`` run of zoo ``model``, or None."""
    return next(((dict(config.model.overrides), config.data.seq_len, run_dir)
                 for run_dir, config in _run_configs(run_dirs) if config.model.name == model), None)


def _model_costs(model: str, cluster, profile_batch: int | None, model_args: list[str] | None = None,
                 run_dirs: list[str] | None = None, microbatch_passes: bool = False, per_layer: bool = False, *,
                 global_batch: int | None = None, world_size: int | None = None):
    """(ModelCosts, TransformerShape or None, notes, the zoo model's overrides, its layers' tensor-parallel limits
    or None, whether the uniform tensor-parallel strategies shard it) for a costs file or a zoo model name; the
    limits (``Workload.tp_limits``) with ``per_layer``. A zoo model is profiled at ``profile_batch`` samples or,
    None, over the micro-batch sizes the plans of ``global_batch`` on ``world_size`` (or fewer) ranks run: on
    ranks that share this machine's cores measured at each size and fitted, for other devices measured at the
    default batch and projected onto the cluster's device at each size by the roofline; found again in the index
    of zoo profiles without building the model (:mod:`workbench.profiling.zoo_profiles`)."""
    from ..core.costs import ModelCosts

    if Path(model).is_file():
        if model_args:
            raise ValueError("--model-arg applies to a zoo model; MODEL is a costs file, whose model is fixed")
        return ModelCosts.load(model), None, [], {}, None, False
    from ..core.tensor_support import uniform_tp_missing
    from ..profiling.projection import project
    from ..profiling.zoo_profiles import indexed_profile, profile_zoo

    overrides, seq_len, notes = parse_model_args(model_args), None, []
    run = _run_model(run_dirs, model)
    if run is not None:
        run_overrides, seq_len, run_dir = run
        if not model_args:
            overrides = run_overrides
            if overrides:
                notes.append(f"{model} built as run {run_dir} built it: {overrides}")
        elif run_overrides != overrides:
            notes.append(f"note: run {run_dir} trained {model} with {run_overrides}, planned with {overrides}")
    sizes = None
    if profile_batch is None:
        from ..core.batch_fit import fit_sizes
        from ..planning.strategy.world_sizes import microbatch_range

        sizes = fit_sizes(*microbatch_range(global_batch or DEFAULT_PROFILE_BATCH, world_size or cluster.world_size))
    batch = profile_batch or DEFAULT_PROFILE_BATCH
    settings = {"microbatch_passes": microbatch_passes and cluster.shared_compute, "extras": _EXTRAS,
                "sizes": sizes if cluster.shared_compute and sizes else None}
    found = indexed_profile(model, overrides, batch, **settings)
    if found is None:  # not profiled yet with these settings here, or only torch knows the device: build the model
        from ..models.zoo import list_models

        if model not in list_models():
            raise ValueError(f"MODEL {model!r} is neither a ModelCosts JSON file nor a zoo model; zoo models: "
                             f"{', '.join(list_models())}")
        found = profile_zoo(model, overrides, batch, progress=False, **settings)
    costs = found.costs if cluster.shared_compute else project(found.costs, cluster.device, sizes=sizes)
    if costs.batch_fit is not None:
        notes.append(f"profiled at micro-batches of {', '.join(map(str, costs.profiled_sizes))} samples: "
                     f"{costs.batch_fit.describe()}")
    # what the layer-by-layer runtime splits each layer by, read off the model by its own rules
    limits = tuple(found.extras["tp_limits"]) if per_layer else None
    whole = not uniform_tp_missing(found.config)  # the runtime's rule, which its preflight refuses by
    return costs, _shape_of(found.family, found.config, costs.batch_size, seq_len), notes, overrides, limits, whole


DEFAULT_PROFILE_BATCH = 8
# read off a zoo model when it is profiled, and kept in the index of zoo profiles with it
_EXTRAS = {"tp_limits": "workbench.runtime.layer_parallel:tensor_parallel_limits"}


def _shape_of(family: str, config: dict, batch: int, seq_len: int | None = None):
    """The TransformerShape of a zoo model of ``family`` with resolved ``config`` (None unless GPT-2 / BERT)."""
    from ..planning.strategy.search import transformer_shape

    if family not in ("gpt2", "bert"):
        return None
    return transformer_shape({**config, "seq_len": seq_len} if seq_len else config, batch)


def _zoo_shape(model: str, overrides: dict, batch: int, seq_len: int | None = None):
    """The TransformerShape of zoo ``model`` with ``overrides`` (None unless it is a GPT-2 / BERT)."""
    from ..models.zoo import get_entry

    entry = get_entry(model)
    return _shape_of(entry.family, entry.config(overrides), batch, seq_len)


def _shards_whole(model: str, overrides: dict) -> bool:
    """Whether the uniform tensor-parallel strategies shard zoo ``model`` built with ``overrides``: the runtime's
    rule (:func:`workbench.core.tensor_support.uniform_tp_missing`), which its preflight refuses by."""
    from ..core.tensor_support import uniform_tp_missing
    from ..models.zoo import get_entry

    return not uniform_tp_missing(get_entry(model).config(overrides))


def _shape_of_runs(run_dirs: list[str] | None, batch: int):
    """(transformer shape, whether the uniform tensor-parallel strategies shard its model) of the first
    tensor-parallel run among ``run_dirs`` (its zoo model, overrides and sequence length), for planning a costs
    file that carries no shape; (None, False) if there is none."""
    for _, config in _run_configs(run_dirs):
        from ..models.zoo import list_models

        if config.plan.tp > 1 and config.model.name in list_models():
            overrides = dict(config.model.overrides)
            shape = _zoo_shape(config.model.name, overrides, batch, config.data.seq_len)
            if shape is not None:
                return shape, _shards_whole(config.model.name, overrides)
    return None, False


def _plan(args: argparse.Namespace) -> Result:
    from ..planning import Budget, SearchOptions, Workload, plan
    from ..planning.costs.clusters import load_cluster, share_gpus
    from ..planning.strategy.progress import terminal_bar

    if args.batch < 1:
        raise ValueError(f"--batch must be an int >= 1, got {args.batch}")
    if args.memory_cap is not None and args.memory_cap <= 0:
        raise ValueError(f"--memory-cap must be > 0 GiB, got {args.memory_cap}")
    if args.top is not None and args.top < 1:
        raise ValueError(f"--top must be >= 1, got {args.top}")
    options = SearchOptions(strategies=args.strategies.split(",") if args.strategies else None,
                            fine_grained=args.fine_grained, top=args.top, calibration=args.calibrate,
                            pipeline_degrees=_pipeline_degrees(args.pp), fewer_ranks=not args.exact_world_size)
    cluster = load_cluster(args.cluster)
    cluster = share_gpus(cluster, args.ranks_per_gpu)
    costs, shape, model_notes, overrides, limits, whole = _model_costs(
        args.model, cluster, args.profile_batch, args.model_arg, args.calibrate, args.microbatch_passes,
        args.fine_grained, global_batch=args.batch, world_size=args.world_size)
    if shape is None and args.calibrate:  # a tensor-parallel calibration run says what the transformer is
        shape, whole = _shape_of_runs(args.calibrate, costs.batch_size)
    workload = Workload(costs, args.batch, shape=shape if whole else None, tp_limits=limits, optimizer=args.optimizer)
    bar = terminal_bar() if not args.json and sys.stderr.isatty() else None  # Ctrl-C: the best plans so far
    result = plan(workload, cluster if args.ranks_per_gpu > 1 else args.cluster,
                  Budget(memory_cap_gib=args.memory_cap, world_size=args.world_size), options, progress=bar)
    lines = [f"{costs.model} on {cluster.name} ({args.world_size or cluster.world_size} devices), global batch "
             f"{args.batch}: {result.searched} strategies in {result.elapsed_s:.2f} s",
             f"{'#':>3} {'strategy':<28} {'iter ms':>10} {'samples/s':>10} {'GiB/dev':>8} {'compute':>9} "
             f"{'bubble':>9} {'exp.comm':>9}  method"]
    for p in result.plans:
        e = p.estimate
        lines.append(f"{p.rank:>3} {p.name:<28} {e.iteration_ms:>10.2f} {e.throughput:>10.1f} {e.memory_gib:>8.3f} "
                     f"{e.compute_ms:>9.2f} {e.bubble_ms:>9.2f} {e.exposed_comm_ms:>9.2f}  {e.method}")
    if result.infeasible:
        lines.append(f"{len(result.infeasible)} infeasible, e.g. {result.infeasible[0]['name']}: "
                     f"{result.infeasible[0]['reason']}")
    lines += model_notes + result.notes
    if args.emit_config:
        lines.append(_emit_config(result.best, args, overrides, shape))
    data = result.to_dict()
    data["notes"] = model_notes + list(data.get("notes", []))
    return Result("\n".join(lines), data)


def _pipeline_degrees(text: str | None) -> list[int] | None:
    """``"1,2"`` -> ``[1, 2]``; None for no restriction."""
    if text is None:
        return None
    try:
        degrees = [int(part) for part in text.split(",")]
    except ValueError:
        degrees = []
    if not degrees or min(degrees) < 1:
        raise ValueError(f"--pp takes comma-separated pipeline degrees >= 1 (e.g. 2 or 1,2), got {text!r}")
    return degrees


# what a plan decides in a run config (the name, the model, the plan, and training.global_batch and run.placement,
# set below); an existing config's other settings (steps, data, optimizer, ...) are kept
_PLANNED_KEYS = ("name", "model", "plan")


def _emit_config(best, args: argparse.Namespace, overrides: dict, shape) -> str:
    """Write ``best``'s run config to ``--emit-config`` (over an existing config of the same model, keeping its run
    settings), headed by the command that planned it and the plan's per-layer options, without the settings that
    are at their defaults; the line to print."""
    import shlex

    from ..core.config import RunConfig, merge_changes

    path = Path(args.emit_config)
    planned = {"name": best.name.replace("@", "-at-"), "model": {"name": best.model, "overrides": overrides},
               "training": {"global_batch": args.batch}}
    kept: dict = {}
    if path.is_file():
        previous = RunConfig.from_toml(path)
        if previous.model.name == best.model:
            kept = {k: v for k, v in previous.to_dict().items() if k not in _PLANNED_KEYS}
            kept["run"] = {k: v for k, v in kept["run"].items() if k != "placement"}  # the plan's, if it has one
            planned["name"] = previous.name  # the file keeps its own run name
    notes = []
    if shape is not None:  # the run's sequences are the ones the profile timed
        data = dict(kept.get("data", {}))
        if data.get("seq_len", shape.seq) != shape.seq:
            notes.append(f"Sequence length {shape.seq}, as profiled (the config this file held had {data['seq_len']}).")
        kept["data"] = {**data, "seq_len": shape.seq}
    config = best.to_config(**merge_changes(kept, planned))
    _check_shards(config)
    e = best.estimate
    header = [f"Written by: workbench {shlex.join(getattr(args, 'argv', ['plan', '...']))}",
              f"Plan {best.name}: predicted {e.iteration_ms:.1f} ms per iteration, {e.memory_gib * 1024:.1f} MiB "
              f"per device ({e.method}).", "Layers:"]
    header += [f"  {l['name']}: {l['dp_kind']}" + (f", {l.get('tp_kind', '1d')} TP x{l['tp']}" if l["tp"] > 1 else "")
               + (", recompute" if l["recompute"] else "") for l in best.layers()]
    if kept:
        header.append("Run settings (steps, data, optimizer, ...) kept from the config this file held.")
    header += notes
    path.write_text("".join(f"# {line}".rstrip() + "\n" for line in header) + config.to_toml(defaults=False))
    return f"wrote the run config of {best.name} to {path}"


def _check_shards(config) -> None:
    """Refuse, as the runtime's preflight would, a uniform tensor-parallel plan of a zoo model it cannot shard."""
    from ..models.zoo import get_entry, list_models
    from ..runtime.uniform_tp import check_tensor_parallel_model

    if config.model.name in list_models():
        check_tensor_parallel_model(config, get_entry(config.model.name).config(dict(config.model.overrides)))


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("plan", parents=[common], help="rank hybrid-parallel strategies for a model on a cluster")
    p.add_argument("model", help="ModelCosts JSON file or zoo model name (profiled here, projected to the cluster)")
    p.add_argument("--cluster", required=True, help="preset (local, local-cpu, 8xV100-PCIe, 8xA100-NVLink, "
                   "4xV100-NVLink, 2x8xH100-IB to 128x8xH100-IB, 32x8xA100-IB, 4pod-32x8xH100, 1xH100, 1xH200) "
                   "or a cluster file (ClusterSpec JSON, or TOML if it ends in .toml)")
    p.add_argument("--batch", type=int, required=True, help="global batch (samples per optimizer step)")
    p.add_argument("--memory-cap", type=float, help="per-device memory budget in GiB (default: the device's memory)")
    p.add_argument("--optimizer", default="adam", choices=("adam", "sgd-momentum", "sgd"),
                   help="the optimizer the run trains with: its state counts in the memory and its step's traffic in "
                        "the time (default adam; sgd is without momentum, a config's default)")
    p.add_argument("--top", type=int, help="show the K fastest feasible strategies")
    p.add_argument("--world-size", type=int, help="devices to use (default: the whole cluster); on a cluster whose "
                   "ranks share cores (local) an upper bound: plans on fewer ranks (1, 2, 4, ...) are ranked too, and "
                   "a note says when one of them trains faster")
    p.add_argument("--exact-world-size", action="store_true",
                   help="plan exactly --world-size ranks, also where the ranks share cores (no plans on fewer)")
    p.add_argument("--ranks-per-gpu", type=int, default=1, metavar="K",
                   help="run K ranks on each GPU, as the runtime does with more ranks than GPUs: each rank gets 1/K "
                        "of a GPU's memory and throughput and talks to the others through host memory (default 1)")
    p.add_argument("--strategies", help="evaluate only these comma-separated names, e.g. dp4,gropipe-2x2-1f1b-m4-d1")
    p.add_argument("--profile-batch", type=int, default=None,
                   help="profile a zoo model at this one batch and scale its times linearly to every micro-batch "
                        "(the behaviour before per-size profiles). Default: on a cluster of CPU ranks (local), "
                        "profile at the smallest and largest micro-batch the plans run and sizes 4x apart between "
                        "them (at most 64; e.g. 1, 4, 16, 64), and charge every plan each layer's time at its own "
                        "micro-batch, piecewise-linear between the sizes; on other devices, profile at 8 and "
                        "project each of those sizes onto the device by the roofline")
    add_model_arg(p, "the overrides of the first --calibrate run of the same model")
    p.add_argument("--pp", metavar="DEGREES",
                   help="consider only these comma-separated pipeline degrees, e.g. 2 (1 is no pipeline; default: "
                        "every degree that divides the devices)")
    p.add_argument("--fine-grained", action="store_true",
                   help="also search per-layer plans: every layer its own data-parallel kind (DDP, ZeRO-2, FSDP), "
                        "tensor-parallel degree and recomputation, by dynamic programming under the memory cap, "
                        "with the pipeline degree, schedule (1F1B, ZB-H1 or ZB-H2), micro-batches and partition "
                        "around it; the JSON gives every plan its 'layers' and compares the best with pure DP, "
                        "pure FSDP, 3D and the best uniform plan")
    p.add_argument("--emit-config", metavar="PATH.toml",
                   help="write the best plan's run config (model with its --model-arg overrides, plan with its "
                        "partition, batch) as TOML, ready for `workbench run`, headed by this command and the plan's "
                        "per-layer options; over an existing config of the same model, its run settings (steps, "
                        "data, optimizer, ...) are kept. A plan the runtime cannot run yet is refused with the reason")
    p.add_argument("--microbatch-passes", action="store_true",
                   help="on a cluster of CPU ranks (local), also profile what splitting the batch costs (micro-batch "
                        "passes with the cache hot, flushed and with bound weight copies, about 20 s): the planner "
                        "then models the runtime's compute from the profile alone, where --calibrate is not given. "
                        "With the default per-size profile the passes run on its size nearest 8 and scale what "
                        "the fit charges at each micro-batch by what a pipeline rank adds beyond it (the cache "
                        "left cold, fresh buffers), not by what small micro-batches cost, which the fit holds")
    p.add_argument("--calibrate", metavar="RUN_DIR", action="append",
                   help="scale the profile's compute to what this finished run of the model measured (a pipeline "
                        "run is best). Repeat it: scheduled-pipeline runs at two micro-batch sizes fit a "
                        "per-micro-batch cost, an async pipeline's run calibrates the async runtime, and a "
                        "tensor-parallel run (tp2d, tp1d; of a GPT-2/BERT model) its own runtime "
                        "(workbench.planning.costs.run_calibration). A run is set against the profile at its own "
                        "micro-batch (the per-size fit by default), so the fitted k + c / b is what the runtime "
                        "adds beyond that; it replaces --microbatch-passes")
    p.set_defaults(handler=_plan)
