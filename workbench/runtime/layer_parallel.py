"""Apply a per-layer parallel plan to the unmodified layers of one pipeline stage.

Problem. A :class:`~workbench.core.plan.ParallelPlan` may give every layer its
own data-parallel kind (replicate, zero2, fsdp), its own 1D tensor-parallel
degree and its own recomputation. Inside a stage of ``n`` ranks, a layer with
tensor-parallel degree ``t`` splits its weights over groups of ``t`` ranks
and its batch over the ``n / t`` groups, so two neighbouring layers may
disagree on which rows of the batch a rank holds.

Approach, torchtitan-style, from outside the model and only with torch's own
building blocks:

* one :class:`~torch.distributed.device_mesh.DeviceMesh` per layer layout
  (degree, consecutive or strided ranks), with named dims ``pp`` x ``dp`` x
  ``tp`` built from the plan's topology; a layer takes its stage's
  ``["dp", "tp"]`` submesh;
* 1D tensor parallelism: DTensor ``parallelize_module`` with
  ``ColwiseParallel`` / ``RowwiseParallel`` on the linears of HF GPT-2 blocks
  (``Conv1D``, weight [in, out]), HF BERT layers and plain ``nn.Linear``
  chains; GPT-2's fused q|k|v weight is re-laid out head-group-major so
  that a column shard holds complete heads of q, k and v;
* recomputation: ``torch.utils.checkpoint`` (non-reentrant) around exactly
  the marked layers, inside the data-parallel wrapper;
* data parallelism: FSDP2 ``fully_shard`` (``reshard_after_forward`` True for
  ``fsdp``, False for ``zero2``) or FSDP2's ``replicate`` (DDP semantics), on
  the layer's ``dp`` dim, gradients summed (see below);
* between layers of different layouts, :class:`Relayout` moves activations
  through the logical *stage batch*: every rank of the stage holds the whole
  stage micro-batch where it enters the stage (and where it leaves it for
  the next stage), a layer's data-parallel group ``d`` takes rows
  ``[d N / D, (d + 1) N / D)``.

The last stage is not gathered: each of its ranks computes the loss only of
the rows its last layer's data group holds, weighted so that the groups'
parts add up to the loss of the whole stage micro-batch (the ranks of one
tensor-parallel group compute the same part; one of them reports it). Each
rank's gradient is thus an exact *part* of the true gradient: the
data-parallel reduction sums (divide factor 1) instead of averaging.

What was applied is read back from the wrapped modules
(:func:`realized_options`) and compared with the plan; a mismatch is an
error, never a fallback.

Memory count. :class:`SavedActivations` counts the bytes of the tensors
autograd keeps for backward while it is active (live and peak, each storage
once, parameters excluded; a recomputed layer keeps its input), and
:func:`local_bytes` / :func:`held_unsharded_bytes` count what a rank holds
of parameters, gradients, optimizer state and all-gathered FSDP
parameters, so a rank's memory can be counted on any device.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..core.plan import LayerPlan
from ..core.topology import Topology

__all__ = ["Layout", "layout_of", "StageMeshes", "Relayout", "Recomputed", "ParallelLayer", "parallelize_layer",
           "realized_options", "check_realized", "dense_parameters", "tensor_parallel_rules", "SavedActivations",
           "local_bytes", "held_unsharded_bytes"]


# -- layouts and meshes ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Which batch rows and weight shards a stage rank holds for one layer.

    ``size`` ranks in the stage; ``tp`` ranks per tensor-parallel group,
    neighbouring (``consecutive``) or strided. Stage rank ``r`` is in data
    group ``r // tp`` (consecutive) or ``r % (size / tp)`` (strided).
    """

    size: int
    tp: int = 1
    consecutive: bool = True

    @property
    def dp(self) -> int:
        return self.size // self.tp

    @property
    def full(self) -> bool:
        """Every rank holds the whole stage batch (one data group)."""
        return self.dp == 1

    def rank_grid(self) -> list[list[int]]:
        """Stage ranks as a [dp][tp] grid."""
        if self.consecutive:
            return [[d * self.tp + k for k in range(self.tp)] for d in range(self.dp)]
        return [[k * self.dp + d for k in range(self.tp)] for d in range(self.dp)]

    def coords(self, stage_rank: int) -> tuple[int, int]:
        """(data group, index inside the tensor-parallel group) of a stage rank."""
        if self.consecutive:
            return stage_rank // self.tp, stage_rank % self.tp
        return stage_rank % self.dp, stage_rank // self.dp

    def canonical(self) -> "Layout":
        """Layouts that place the same rows on the same ranks compare equal."""
        if self.full:
            return Layout(self.size, self.size, True)
        if self.tp == 1:
            return Layout(self.size, 1, True)
        return self


def layout_of(layer: LayerPlan, stage_size: int) -> Layout:
    return Layout(stage_size, layer.tp_degree, layer.consecutive).canonical()


class StageMeshes:
    """This rank's place in its stage and one ``["dp", "tp"]`` device mesh per layout.

    ``topology`` is the plan's mesh (axes dp, pp, tp); a stage is every rank
    with one ``pp`` coordinate, numbered ``dp * tp_size + tp``. Meshes are
    DeviceMeshes over all stages at once (dims ``pp``, ``dp``, ``tp``), so
    every rank creates the same groups in the same order.
    """

    def __init__(self, topology: Topology, rank: int, device_type: str, layouts: list[Layout]) -> None:
        from torch.distributed.device_mesh import DeviceMesh

        self.topology, self.rank, self.device_type = topology, rank, device_type
        coords = topology.coords(rank)
        self.stage = coords.get("pp", 0)
        tp_size = topology.size("tp")
        self.stage_rank = coords["dp"] * tp_size + coords.get("tp", 0)
        self.stages = [self._stage_ranks(s) for s in range(topology.size("pp"))]
        self.size = len(self.stages[0])
        stage_ids = torch.tensor(self.stages)  # [pp, n] global ranks
        self.stage_mesh = DeviceMesh(device_type, stage_ids, mesh_dim_names=("pp", "stage"))
        self.group = self.stage_mesh.get_group("stage") if self.size > 1 else None
        self._meshes: dict[Layout, Any] = {}
        for layout in dict.fromkeys(layouts):
            grid = torch.tensor([[[self.stages[s][r] for r in row] for row in layout.rank_grid()]
                                 for s in range(len(self.stages))])  # [pp, dp, tp] global ranks
            mesh = DeviceMesh(device_type, grid, mesh_dim_names=("pp", "dp", "tp"))
            self._meshes[layout] = mesh["dp", "tp"]

    def _stage_ranks(self, stage: int) -> list[int]:
        """Global ranks of ``stage`` in stage-rank order (dp-major, tp-minor)."""
        names = self.topology.names

        def rank(d: int, k: int) -> int:
            coords = {"dp": d, "pp": stage, "tp": k}
            return self.topology.rank(**{axis: coords[axis] for axis in names})

        return [rank(d, k) for d in range(self.topology.size("dp")) for k in range(self.topology.size("tp"))]

    def mesh(self, layout: Layout):
        """The ``["dp", "tp"]`` submesh of this rank's stage for ``layout``."""
        return self._meshes[layout]

    def twin(self, stage: int) -> int:
        """The global rank of stage ``stage`` with this rank's stage-rank (its pipeline peer)."""
        return self.stages[stage][self.stage_rank]


# -- activations between layouts ------------------------------------------------------------------------------------

class _RelayoutFn(torch.autograd.Function):
    """Rows of ``src``'s group -> rows of ``dst``'s group, through the whole stage batch.

    Forward: all-gather every rank's rows over the stage (skipped when the
    source is full), keep the destination's rows. Backward: the destination
    gradient of each distinct row block is contributed once (by the first
    rank of its tensor-parallel group, copies being equal), summed over the
    stage, and the source's rows are returned.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, src: Layout, dst: Layout, stage_rank: int, group: Any) -> torch.Tensor:
        ctx.src, ctx.dst, ctx.stage_rank, ctx.group = src, dst, stage_rank, group
        if src.full:
            full = x
        else:
            parts = [torch.empty_like(x) for _ in range(src.size)]
            dist.all_gather(parts, x.contiguous(), group=group)
            full = torch.cat([parts[row[0]] for row in src.rank_grid()])  # [N, ...] in data-group order
        ctx.rows = full.shape[0]
        if dst.full:
            return full
        block = ctx.rows // dst.dp
        return full.narrow(0, dst.coords(stage_rank)[0] * block, block).clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        src, dst = ctx.src, ctx.dst
        if dst.full:
            full = grad  # every rank holds the same gradient of the whole batch
        else:
            group_index, tp_index = dst.coords(ctx.stage_rank)
            block = ctx.rows // dst.dp
            full = grad.new_zeros((ctx.rows, *grad.shape[1:]))
            if tp_index == 0:
                full.narrow(0, group_index * block, block).copy_(grad)
            dist.all_reduce(full, group=ctx.group)
        if src.full:
            return full, None, None, None, None
        block = ctx.rows // src.dp
        return full.narrow(0, src.coords(ctx.stage_rank)[0] * block, block).contiguous(), None, None, None, None


class Relayout(nn.Module):
    """Moves a stage activation from one layer layout to the next (identity when they agree)."""

    def __init__(self, src: Layout, dst: Layout, stage_rank: int, group: Any) -> None:
        super().__init__()
        self.src, self.dst, self.stage_rank, self.group = src, dst, stage_rank, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.src == self.dst:
            return x
        return _RelayoutFn.apply(x, self.src, self.dst, self.stage_rank, self.group)


# -- tensor parallelism ---------------------------------------------------------------------------------------------

def _conv1d_class() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency of the zoo
        return None
    return Conv1D


def _is_conv1d(module: nn.Module) -> bool:
    cls = _conv1d_class()
    return cls is not None and isinstance(module, cls)


def _qkv_order(width: int, degree: int) -> torch.Tensor:
    """Column order putting q, k, v of head group p side by side: [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]."""
    hidden = width // 3
    block = hidden // degree
    return torch.tensor([part * hidden + p * block + i for p in range(degree) for part in range(3)
                         for i in range(block)])


@lru_cache(maxsize=None)
def _styles():
    """ParallelStyles for HF ``Conv1D`` (weight [in, out]), subclasses of torch's Colwise/Rowwise."""
    from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def distribute_conv1d(style, module: nn.Module, mesh, placements: dict[str, Any],
                          order: torch.Tensor | None = None) -> nn.Module:
        """Shard a Conv1D's parameters (columns re-laid out by ``order`` first) with the style's input/output hooks."""
        def partition(_name: str, mod: nn.Module, mesh_) -> None:
            for name, param in list(mod.named_parameters(recurse=False)):
                data = param.detach() if order is None else param.detach().index_select(-1, order.to(param.device))
                mod.register_parameter(name, nn.Parameter(distribute_tensor(data, mesh_, [placements[name]])))

        return distribute_module(
            module, mesh, partition,
            input_fn=lambda m, i, mesh_: style._prepare_input_fn(style.input_layouts, style.desired_input_layouts,
                                                                 m, i, mesh_),
            output_fn=lambda m, o, mesh_: style._prepare_output_fn(style.output_layouts, style.use_local_output,
                                                                   m, o, mesh_))

    class Colwise(ColwiseParallel):
        """Column-parallel ``nn.Linear`` (torch's own) or ``Conv1D`` (weight Shard(1), bias Shard(0));
        ``fused_qkv`` re-lays the columns out so each shard holds whole heads of q, k and v."""

        def __init__(self, *, fused_qkv: bool = False, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.fused_qkv = fused_qkv

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            if not _is_conv1d(module):
                return super()._apply(module, device_mesh)
            order = _qkv_order(module.nf, device_mesh.size()) if self.fused_qkv else None
            return distribute_conv1d(self, module, device_mesh, {"weight": Shard(1), "bias": Shard(0)}, order)

    class Rowwise(RowwiseParallel):
        """Row-parallel ``nn.Linear`` (torch's own) or ``Conv1D`` (weight Shard(0), bias Replicate)."""

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            if not _is_conv1d(module):
                return super()._apply(module, device_mesh)
            self.desired_input_layouts = (Shard(-1),)
            return distribute_conv1d(self, module, device_mesh, {"weight": Shard(0), "bias": Replicate()})

    return Colwise, Rowwise, Replicate


_ACTIVATIONS = (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Dropout, nn.Identity)


@dataclass
class _TensorRules:
    """A layer's parallelize_module plan, the attribute changes it needs and its re-laid-out parameters."""

    plan: dict[str, Any]
    heads: list[tuple[nn.Module, dict[str, int]]]  # (module, attribute -> local value)
    fused: dict[str, torch.Tensor]  # parameter name (relative to the layer) -> its column order


def tensor_parallel_rules(layer: nn.Module, degree: int) -> _TensorRules:
    """The 1D tensor-parallel plan of one workbench layer; ValueError for layers it does not know.

    Known: an HF GPT-2 block or BERT layer (wrapped or not), the zoo's GPT-2
    and BERT embeddings (vocab-parallel token embedding) and GPT-2 head
    (vocab-parallel logits, gathered), a plain ``nn.Linear`` and an
    ``nn.Sequential`` of linears with activations between them (column, row,
    column, ... with a gathered last column).
    """
    Colwise, Rowwise, Replicate = _styles()
    prefix, block = "", layer
    if hasattr(layer, "block") and isinstance(layer.block, nn.Module):
        prefix, block = "block.", layer.block
    kind = type(block).__name__
    if kind == "GPT2Block":
        attn, heads = block.attn, block.attn.num_heads
        _check_heads(heads, degree, kind)
        width = attn.c_attn.nf
        return _TensorRules(
            plan={f"{prefix}attn.c_attn": Colwise(fused_qkv=True), f"{prefix}attn.c_proj": Rowwise(),
                  f"{prefix}mlp.c_fc": Colwise(), f"{prefix}mlp.c_proj": Rowwise()},
            heads=[(attn, {"num_heads": heads // degree, "split_size": attn.split_size // degree})],
            fused={f"{prefix}attn.c_attn.weight": _qkv_order(width, degree),
                   f"{prefix}attn.c_attn.bias": _qkv_order(width, degree)})
    if kind == "BertLayer":
        attn = block.attention.self
        heads = attn.num_attention_heads
        _check_heads(heads, degree, kind)
        base = f"{prefix}attention."
        return _TensorRules(
            plan={f"{base}self.query": Colwise(), f"{base}self.key": Colwise(), f"{base}self.value": Colwise(),
                  f"{base}output.dense": Rowwise(), f"{prefix}intermediate.dense": Colwise(),
                  f"{prefix}output.dense": Rowwise()},
            heads=[(attn, {"num_attention_heads": heads // degree, "all_head_size": attn.all_head_size // degree})],
            fused={})
    if kind == "GPT2EmbeddingUnit":  # vocab-parallel token embedding, partial rows summed
        return _TensorRules(plan={"wte": Rowwise(input_layouts=Replicate())}, heads=[], fused={})
    if kind == "BertEmbeddingUnit":
        return _TensorRules(plan={"embeddings.word_embeddings": Rowwise(input_layouts=Replicate())}, heads=[],
                            fused={})
    if kind == "GPT2HeadUnit":  # vocab-parallel logits, gathered for the loss
        return _TensorRules(plan={"lm_head": Colwise(output_layouts=Replicate())}, heads=[], fused={})
    if isinstance(layer, nn.Linear):
        return _TensorRules(plan={"": Colwise(output_layouts=Replicate())}, heads=[], fused={})
    if isinstance(layer, nn.Sequential) and _is_linear_chain(layer):
        linears = [name for name, m in layer.named_children() if isinstance(m, nn.Linear)]
        plan: dict[str, Any] = {}
        for i, name in enumerate(linears):  # column, row, column, ...; a last column is gathered
            if i % 2:
                plan[name] = Rowwise()
            else:
                plan[name] = Colwise() if i + 1 < len(linears) else Colwise(output_layouts=Replicate())
        return _TensorRules(plan=plan, heads=[], fused={})
    raise ValueError(f"1D tensor parallelism applies to GPT-2 blocks, embeddings and head, BERT layers and "
                     f"embeddings, linear layers and chains of linears with activations; this layer is a {kind}")


def _is_linear_chain(layer: nn.Sequential) -> bool:
    """Linears with element-wise activations between them, optionally after a leading Flatten."""
    children = list(layer.children())
    first = next((i for i, m in enumerate(children) if isinstance(m, nn.Linear)), None)
    if first is None:
        return False
    return all(isinstance(m, nn.Flatten) for m in children[:first]) and \
        all(isinstance(m, (nn.Linear, *_ACTIVATIONS)) for m in children[first:])


def _check_heads(heads: int, degree: int, kind: str) -> None:
    if heads % degree:
        raise ValueError(f"tensor-parallel degree {degree} does not divide the {heads} attention heads of this "
                         f"{kind}")


# -- one layer ------------------------------------------------------------------------------------------------------

class _Keep(torch.autograd.Function):
    """Identity that saves its input for backward, so that the input a recomputed layer keeps (which the
    checkpoint holds outside autograd's saved tensors) is seen, and released, like any saved tensor."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


class Recomputed(nn.Module):
    """A layer that keeps only its input for backward and re-runs its forward there (torch.utils.checkpoint).

    The replay reads the kept input, so a layer that modifies its input in
    place (starts with ``ReLU(inplace=True)`` or ``x += b``) runs on a copy made
    inside the checkpointed region (freed with the layer's other
    intermediates). Whether it does is read from the copy's version counter
    at the first call; layers that do not are never copied.
    """

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self.modifies_input: bool | None = None

    def _call(self, x: torch.Tensor) -> torch.Tensor:
        if self.modifies_input is False:
            return self.layer(x)
        copy = x.clone()
        version = copy._version
        out = self.layer(copy)
        if self.modifies_input is None:
            self.modifies_input = copy._version != version
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            x = _Keep.apply(x)
        return checkpoint(self._call, x, use_reentrant=False)


@dataclass
class ParallelLayer:
    """One layer of a stage as applied: the module to call, the original layer and what was applied."""

    index: int
    name: str
    module: nn.Module  # what the stage calls (data-parallel wrapper around the recompute wrapper, if any)
    layer: nn.Module  # the original layer object, for dense parameter names
    plan: LayerPlan
    layout: Layout
    fused: dict[str, torch.Tensor]  # parameter -> column order it was re-laid out in


def parallelize_layer(index: int, name: str, layer: nn.Module, plan: LayerPlan, layout: Layout, mesh) -> ParallelLayer:
    """Apply ``plan`` to ``layer`` in place: tensor parallelism, then recomputation, then data parallelism."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    fused: dict[str, torch.Tensor] = {}
    if plan.tp == "2d":
        raise ValueError(f"layer {index} {name!r}: option 'tp2d' is not run per layer (only the uniform SUMMA "
                         f"grid runs 2D tensor parallelism)")
    if plan.tp == "1d":
        try:
            rules = tensor_parallel_rules(layer, plan.tp_degree)
        except ValueError as exc:
            raise ValueError(f"layer {index} {name!r}: option 'tp1d{plan.tp_degree}': {exc}") from None
        parallelize_module(layer, mesh["tp"], rules.plan)
        for module, values in rules.heads:
            for attribute, value in values.items():
                setattr(module, attribute, value)
        fused = rules.fused
    module = Recomputed(layer) if plan.recompute else layer
    if any(p.requires_grad for p in module.parameters()):
        dp_mesh = mesh["dp"]
        if plan.dp == "replicate":
            from torch.distributed._composable.replicate_with_fsdp import replicate

            replicate(module, mesh=dp_mesh)
        else:
            fully_shard(module, mesh=dp_mesh, reshard_after_forward=plan.dp == "fsdp")
        # every data group back-propagates its part of the one stage loss: sum the parts (plain SUM
        # collectives, which every backend has, rather than a pre-multiplied sum)
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return ParallelLayer(index, name, module, layer, plan, layout, fused)


def realized_options(layer: ParallelLayer) -> dict[str, Any]:
    """What was applied to ``layer``, read back from its modules (not from the plan)."""
    from torch.distributed._composable.replicate_with_fsdp import ReplicateModule
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    module = layer.module
    if isinstance(module, ReplicateModule):
        dp = "replicate"
    elif isinstance(module, FSDPModule):
        group = module._get_fsdp_state()._fsdp_param_group
        dp = "fsdp" if group is not None and group.post_forward_mesh_info is not None else "zero2"
    else:
        dp = "none"
    degree = 1
    for param in layer.layer.parameters():
        if isinstance(param, DTensor):
            names = param.device_mesh.mesh_dim_names or ()
            for dim, placement in enumerate(param.placements):
                if names[dim:dim + 1] == ("tp",) and isinstance(placement, Shard):
                    degree = max(degree, param.device_mesh.size(dim))
    return {"index": layer.index, "name": layer.name, "dp": dp, "tp_degree": degree,
            "recompute": isinstance(module, Recomputed), "consecutive": layer.layout.consecutive,
            "dp_size": layer.layout.dp, "param_bytes": sum(_local(p).numel() * p.element_size()
                                                            for p in layer.layer.parameters())}


def _local(param: torch.Tensor) -> torch.Tensor:
    """The part of a parameter this rank holds (its shard, for a DTensor)."""
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param


def check_realized(layer: ParallelLayer, realized: dict[str, Any]) -> None:
    """Raise unless what ran is what the plan asked for (a layer without parameters has no data parallelism)."""
    plan = layer.plan
    has_params = any(p.requires_grad for p in layer.layer.parameters())
    want = {"dp": plan.dp if has_params else "none", "tp_degree": plan.tp_degree, "recompute": plan.recompute}
    got = {k: realized[k] for k in want}
    if got != want:
        wrong = [k for k in want if got[k] != want[k]]
        raise RuntimeError(f"layer {layer.index} {layer.name!r} ran {', '.join(f'{k}={got[k]!r}' for k in wrong)} "
                           f"but the plan asks for {', '.join(f'{k}={want[k]!r}' for k in wrong)}")


def dense_parameters(layer: ParallelLayer) -> dict[str, torch.Tensor]:
    """Collective over the layer's mesh: its parameters as dense tensors under the layer's own names."""
    from torch.distributed.tensor import DTensor

    out: dict[str, torch.Tensor] = {}
    for name, param in layer.layer.named_parameters():
        value = param.full_tensor() if isinstance(param, DTensor) else param
        value = value.detach().float().cpu()
        if name in layer.fused:
            order = layer.fused[name]
            value = value.index_select(-1, torch.argsort(order))
        out[name] = value.clone()
    return out


# -- memory count ---------------------------------------------------------------------------------------------------

def _local_tensor(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def local_bytes(tensors) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor's local shard; None entries count 0)."""
    return sum(_local_tensor(t).numel() * t.element_size() for t in tensors if t is not None)


class _Held:
    """A tensor saved for backward while counted; its bytes are released when autograd drops it."""

    __slots__ = ("count", "key", "tensor")

    def __init__(self, count: "SavedActivations", key: int, tensor: torch.Tensor) -> None:
        self.count, self.key, self.tensor = count, key, tensor

    def __del__(self) -> None:
        self.count._release(self.key)


class SavedActivations:
    """Bytes of the tensors autograd saves for backward while this counter is active (``with count:``).

    Each storage counts once (a tensor saved by several operations, views of
    one buffer), parameters and views of parameters not at all (they are
    counted as parameters); a DTensor counts its local shard. A saved tensor
    is live from its forward operation until autograd frees it after that
    operation's backward (or when the graph is dropped). ``peak`` is the
    largest live total since :meth:`reset_peak`.
    """

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self._storages: dict[int, list[int]] = {}  # data pointer -> [bytes, tensors held]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    def reset_peak(self) -> None:
        self.peak = self.live

    def _pack(self, t: torch.Tensor) -> Any:
        base = t._base if t._base is not None else t
        if isinstance(base, nn.Parameter):
            return t  # a parameter (or a view of one)
        storage = _local_tensor(t).untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0:
            return t
        entry = self._storages.get(key)
        if entry is None:
            self._storages[key] = [nbytes, 1]
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        else:
            entry[1] += 1
        return _Held(self, key, t)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed

    def _release(self, key: int) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._storages[key]
            self.live -= entry[0]


def held_unsharded_bytes(layers: list[ParallelLayer]) -> int:
    """Bytes of all-gathered FSDP parameters these layers hold right now (their local TP part)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

    total = 0
    for layer in layers:
        if not isinstance(layer.module, FSDPModule):
            continue
        group = layer.module._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        for param in group.fsdp_params:
            if param.sharded_state is ShardedState.UNSHARDED and hasattr(param, "_unsharded_param"):
                local = _local_tensor(param._unsharded_param)
                if local.untyped_storage().nbytes() > 0:
                    total += local.numel() * local.element_size()
    return total
