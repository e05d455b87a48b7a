"""1D (Megatron-style) tensor parallelism for GPT-2: the baseline 2D is compared against.

Problem: the classic way to split a transformer over P ranks keeps every
block's input and output replicated on all ranks and splits only the weights:
a column-parallel linear (weight [in, out/P]) followed by a row-parallel one
(weight [in/P, out]) needs one all-reduce in the forward pass (after the row
linear) and one in the backward pass (before the column linear), per
attention and per MLP.

Approach: shard rules applied from outside, as in the 2D form. A
:class:`GPT2LMHead1D` twin module built from the dense config; the
:class:`ShardRules1D` cut the dense tensors (q | k | v re-laid-out so rank p holds complete
heads, vocab-parallel token embedding [V/P, h] tied to the LM head, layer
norms and position embeddings replicated) and gather them back into a dense
state dict. The LM head's vocab-sharded logits are all-gathered before the
loss (simple, at the price of full [b, s, V] logits per rank). Collectives and
their volume counting are the 2D package's, along the ``tp`` axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from .tensor2d.comm import CommCounter, GroupAxis, all_gather
from .tensor2d.ops import all_reduce_backward_only, all_reduce_forward_only
from .tensor2d.sharding import ShardRule, check_grid_size, from_canonical, model_dims, to_canonical

__all__ = ["tp_axis", "ColumnLinear1D", "RowLinear1D", "GPT2LMHead1D", "ShardRules1D", "parallelize_1d"]


def tp_axis(groups: Any, counter: CommCounter | None = None) -> GroupAxis:
    """The tensor-parallel communicator (axis ``tp``) of ``runtime.groups.ParallelGroups``."""
    counter = counter or CommCounter()
    if "tp" not in groups.topology or groups.size("tp") == 1:
        return GroupAxis(None, [groups.rank], 0, counter)
    return GroupAxis(groups.group("tp"), groups.ranks("tp"), groups.coord("tp"), counter)


class _GatherLastDim(torch.autograd.Function):
    """All-gather shards along the last dim for a replicated consumer; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, axis: GroupAxis) -> torch.Tensor:
        ctx.axis, ctx.width = axis, x.shape[-1]
        return all_gather(axis, x, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.narrow(-1, ctx.axis.index * ctx.width, ctx.width).contiguous(), None


class ColumnLinear1D(nn.Module):
    """x [.., in] replicated -> [.., out/P]; weight [in, out/P]."""

    def __init__(self, axis: GroupAxis, in_features: int, out_features: int) -> None:
        super().__init__()
        self.axis = axis
        self.weight = nn.Parameter(torch.zeros(in_features, out_features // axis.size))
        self.bias = nn.Parameter(torch.zeros(out_features // axis.size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_backward_only(self.axis, x) @ self.weight + self.bias


class RowLinear1D(nn.Module):
    """x [.., in/P] -> [.., out] replicated (all-reduce); weight [in/P, out], bias replicated."""

    def __init__(self, axis: GroupAxis, in_features: int, out_features: int) -> None:
        super().__init__()
        self.axis = axis
        self.weight = nn.Parameter(torch.zeros(in_features // axis.size, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce_forward_only(self.axis, x @ self.weight) + self.bias


class GPT2Block1D(nn.Module):
    """Pre-LN GPT-2 block: heads and MLP width split over the ranks, residual stream replicated."""

    def __init__(self, axis: GroupAxis, config: Any) -> None:
        super().__init__()
        hidden, inner = config.n_embd, config.n_inner or 4 * config.n_embd
        self.local_heads, self.head_dim = config.n_head // axis.size, hidden // config.n_head
        self.scale = self.head_dim ** -0.5 if config.scale_attn_weights else 1.0
        self.ln_1 = nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.qkv = ColumnLinear1D(axis, hidden, 3 * hidden)
        self.attn_proj = RowLinear1D(axis, hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.fc = ColumnLinear1D(axis, hidden, inner)
        self.mlp_proj = RowLinear1D(axis, inner, hidden)
        self.act = ACT2FN[config.activation_function]

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x [b, s, h/P]

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, seq, self.local_heads, self.head_dim).transpose(1, 2)  # [b, H/P, s, d]

        scores = heads(q) @ heads(k).transpose(-1, -2) * self.scale  # [b, H/P, s, s]
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
        context = (scores.softmax(-1) @ heads(v)).transpose(1, 2).reshape(batch, seq, -1)  # [b, s, h/P]
        return self.attn_proj(context)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))  # [b, s, h]
        return x + self.mlp_proj(self.act(self.fc(self.ln_2(x))))


class GPT2LMHead1D(nn.Module):
    """GPT-2 with a vocab-parallel tied embedding: ids [b, s] -> logits [b, s, V] (replicated)."""

    def __init__(self, axis: GroupAxis, config: Any) -> None:
        super().__init__()
        self.axis = axis
        self.vocab_per_rank = config.vocab_size // axis.size
        self.wte = nn.Parameter(torch.zeros(self.vocab_per_rank, config.n_embd))  # rows [p V/P, (p+1) V/P)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList(GPT2Block1D(axis, config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        start = self.axis.index * self.vocab_per_rank
        local_ids = input_ids - start
        mine = (local_ids >= 0) & (local_ids < self.vocab_per_rank)
        rows = F.embedding(local_ids.clamp(0, self.vocab_per_rank - 1), self.wte) * mine.unsqueeze(-1)  # [b, s, h]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return all_reduce_forward_only(self.axis, rows) + self.wpe(positions)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.h:
            x = block(x)
        x = all_reduce_backward_only(self.axis, self.ln_f(x))  # replicated -> consumed by vocab shards
        return _GatherLastDim.apply(x @ self.wte.t(), self.axis)  # [b, s, V/P] -> [b, s, V]

    def loss(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits = self(input_ids)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), input_ids[:, 1:].reshape(-1))


def _gpt2_rules_1d(config: Any) -> list[ShardRule]:
    """placement: column (split out dim) | row (split in dim) | vocab (split dim 0) | vector (split) | replicated."""
    rules = [ShardRule("wte", ("transformer.wte.weight",), placement="vocab"),
             ShardRule("wpe.weight", ("transformer.wpe.weight",), placement="replicated")]
    for layer in range(config.n_layer):
        src, dst = f"transformer.h.{layer}.", f"h.{layer}."
        rules += [ShardRule(f"{dst}{n}.{p}", (f"{src}{n}.{p}",), placement="replicated")
                  for n in ("ln_1", "ln_2") for p in ("weight", "bias")]
        rules += [ShardRule(f"{dst}qkv.weight", (f"{src}attn.c_attn.weight",), "qkv_fused", "column"),
                  ShardRule(f"{dst}qkv.bias", (f"{src}attn.c_attn.bias",), "qkv_fused", "vector"),
                  ShardRule(f"{dst}attn_proj.weight", (f"{src}attn.c_proj.weight",), placement="row"),
                  ShardRule(f"{dst}attn_proj.bias", (f"{src}attn.c_proj.bias",), placement="replicated"),
                  ShardRule(f"{dst}fc.weight", (f"{src}mlp.c_fc.weight",), placement="column"),
                  ShardRule(f"{dst}fc.bias", (f"{src}mlp.c_fc.bias",), placement="vector"),
                  ShardRule(f"{dst}mlp_proj.weight", (f"{src}mlp.c_proj.weight",), placement="row"),
                  ShardRule(f"{dst}mlp_proj.bias", (f"{src}mlp.c_proj.bias",), placement="replicated")]
    rules += [ShardRule(f"ln_f.{p}", (f"transformer.ln_f.{p}",), placement="replicated") for p in ("weight", "bias")]
    return rules


_SPLIT_DIM = {"column": -1, "vector": -1, "row": 0, "vocab": 0}


@dataclass
class ShardRules1D:
    """The dense -> 1D mapping of GPT-2 over P tensor-parallel ranks."""

    config: Any
    degree: int
    rules: list[ShardRule]
    aliases: dict[str, str] = field(default_factory=dict)

    @classmethod
    def for_model(cls, model: nn.Module, degree: int) -> "ShardRules1D":
        if type(model).__name__ != "GPT2LMHeadModel":
            raise ValueError(f"1D tensor parallelism supports GPT2LMHeadModel, got {type(model).__name__}")
        check_grid_size(model_dims(model), degree, extra={"vocab_size": model.config.vocab_size}, name="tp")
        return cls(model.config, degree, _gpt2_rules_1d(model.config), {"lm_head.weight": "transformer.wte.weight"})

    def shard(self, dense_model: nn.Module, axis: GroupAxis) -> GPT2LMHead1D:
        module = GPT2LMHead1D(axis, self.config)
        dense = dict(dense_model.named_parameters())
        with torch.no_grad():
            for rule in self.rules:
                canonical = to_canonical(rule, [dense[s].detach() for s in rule.sources], self.degree)
                if rule.placement != "replicated":
                    canonical = canonical.chunk(self.degree, dim=_SPLIT_DIM[rule.placement])[axis.index]
                module.get_parameter(rule.target).copy_(canonical)
        return module.to(next(dense_model.parameters()).device)

    def gather_dense_state_dict(self, module: nn.Module, axis: GroupAxis, *, grads: bool = False) -> dict[str, torch.Tensor]:
        """Collective over ``axis``: the dense tensors (or gradients) by dense key, on every rank."""
        out: dict[str, torch.Tensor] = {}
        for rule in self.rules:
            param = module.get_parameter(rule.target)
            local = param.grad if grads else param
            local = torch.zeros_like(param) if local is None else local.detach()
            if rule.placement != "replicated":
                local = all_gather(axis, local, dim=_SPLIT_DIM[rule.placement] % local.dim())
            for key, tensor in zip(rule.sources, from_canonical(rule, local, self.degree)):
                out[key] = tensor.cpu()
        for alias, key in self.aliases.items():
            out[alias] = out[key]
        return out


def parallelize_1d(model: nn.Module, axis: GroupAxis) -> tuple[GPT2LMHead1D, ShardRules1D]:
    """The 1D form of ``model`` over ``axis`` and the shard rules that map it back."""
    rules = ShardRules1D.for_model(model, axis.size)
    return rules.shard(model, axis), rules
