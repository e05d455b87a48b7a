"""Convert an unmodified ``transformers`` GPT-2 / BERT into its 2D-parallel form, and back.

Problem: the dense model is the reference (tests compare against it,
checkpoints are written in its format), so the 2D form must be derived from
it from the outside: which dense tensor becomes which block on rank (i, j),
and how the q² blocks reassemble into the dense tensor.

Approach: a :class:`ShardRules2D` is a list of :class:`ShardRule`, one per 2D
parameter, naming the dense source tensor(s), a *transform* to one canonical
[in, out]-style tensor (transpose ``nn.Linear``; re-lay-out q | k | v so each
grid column holds complete heads) and a *placement* on the grid (matrix block
[k_i, n_j]; column vector: hidden slice j, then chunk i; replicated). Sharding
applies transform then placement; :meth:`ShardRules2D.gather_dense_state_dict`
all-gathers the blocks over the grid and inverts both, yielding a state dict
with the dense model's keys (tied weights included) that ``load_state_dict``
accepts. Sizes that do not fit the grid are refused up front with the nearest
q that would work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ....core.fields import check_int
from .comm import Grid2D, all_gather
from .layers import splits_over_column
from .models import Bert2D, GPT2LMHead2D

__all__ = ["ShardRule", "ShardRules2D", "parallelize_2d", "qkv_permutation", "to_canonical", "from_canonical",
           "model_dims", "check_grid_size"]

SUPPORTED = ("GPT2LMHeadModel", "BertModel", "BertForSequenceClassification")


@dataclass(frozen=True)
class ShardRule:
    """How one 2D parameter (``target``) is cut from the dense tensors ``sources``."""

    target: str
    sources: tuple[str, ...]
    transform: str = "none"        # none | transpose | qkv_fused | qkv_separate
    placement: str = "matrix"      # matrix | column_vector | replicated
    dim: int = 0                   # the hidden dimension of a column vector


def qkv_permutation(hidden: int, parts: int) -> torch.Tensor:
    """Column order for a fused [.., 3h] q|k|v tensor so that part p holds q, k, v of its h/parts units."""
    width = hidden // parts
    order = [kind * hidden + p * width + c for p in range(parts) for kind in range(3) for c in range(width)]
    return torch.tensor(order, dtype=torch.long)


def to_canonical(rule: ShardRule, tensors: list[torch.Tensor], parts: int) -> torch.Tensor:
    """Dense source tensors -> one tensor in [in, out] (or [n]) layout, q|k|v interleaved per part."""
    if rule.transform == "none":
        return tensors[0]
    if rule.transform == "transpose":
        return tensors[0].t()
    if rule.transform == "qkv_fused":
        fused = tensors[0]  # [in, 3h] (Conv1D) or [3h]
    elif rule.transform == "qkv_separate":
        fused = torch.cat([t.t() if t.dim() == 2 else t for t in tensors], dim=-1)  # nn.Linear [h, in] x3 -> [in, 3h]
    else:
        raise ValueError(f"ShardRule.transform must be none|transpose|qkv_fused|qkv_separate, got {rule.transform!r}")
    return fused[..., qkv_permutation(fused.shape[-1] // 3, parts)]


def from_canonical(rule: ShardRule, tensor: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """Inverse of :func:`to_canonical`: the dense source tensors, in ``rule.sources`` order."""
    if rule.transform == "none":
        return [tensor]
    if rule.transform == "transpose":
        return [tensor.t().contiguous()]
    inverse = torch.argsort(qkv_permutation(tensor.shape[-1] // 3, parts))
    fused = tensor[..., inverse]
    if rule.transform == "qkv_fused":
        return [fused]
    return [c.t().contiguous() if c.dim() == 2 else c.contiguous() for c in fused.chunk(3, dim=-1)]


def _place(rule: ShardRule, tensor: torch.Tensor, q: int, i: int, j: int) -> torch.Tensor:
    """Canonical tensor -> the block rank (i, j) stores."""
    if rule.placement == "replicated":
        return tensor
    if rule.placement == "matrix":
        rows, cols = tensor.shape[0] // q, tensor.shape[1] // q
        return tensor[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols]
    width = tensor.shape[rule.dim] // q
    column = tensor.narrow(rule.dim, j * width, width)
    if splits_over_column(tensor.shape[rule.dim], q):
        return column.narrow(rule.dim, i * (width // q), width // q)
    return column


def _assemble(rule: ShardRule, blocks: torch.Tensor, q: int, split: bool) -> torch.Tensor:
    """blocks [q (i), q (j), *block] -> canonical tensor (``split``: a column vector stored as n/q² chunks)."""
    if rule.placement == "replicated":
        return blocks[0, 0]
    if rule.placement == "matrix":
        return torch.cat([torch.cat(list(blocks[i]), dim=1) for i in range(q)], dim=0)
    columns = [torch.cat(list(blocks[:, j]), dim=rule.dim) if split else blocks[0, j] for j in range(q)]
    return torch.cat(columns, dim=rule.dim)


def model_dims(model_or_config: Any) -> dict[str, int]:
    """The sizes a grid must divide: hidden, heads, inner (MLP) size."""
    config = getattr(model_or_config, "config", model_or_config)
    if getattr(config, "model_type", None) == "gpt2":
        return {"hidden_size": config.n_embd, "num_attention_heads": config.n_head,
                "intermediate_size": config.n_inner or 4 * config.n_embd}
    if getattr(config, "model_type", None) == "bert":
        return {"hidden_size": config.hidden_size, "num_attention_heads": config.num_attention_heads,
                "intermediate_size": config.intermediate_size}
    raise ValueError(f"model type {getattr(config, 'model_type', None)!r} is not supported; supported: gpt2, bert")


def check_grid_size(dims: dict[str, int], q: int, *, extra: dict[str, int] | None = None, name: str = "q") -> None:
    """Refuse a grid side (or 1D degree) ``q`` that does not divide every size, naming the nearest valid one."""
    check_int(name, q, 1)
    sizes = {**dims, **(extra or {})}
    bad = {k: v for k, v in sizes.items() if v % q}
    if not bad:
        return
    limit = max(sizes.values())
    valid = [c for c in range(1, limit + 1) if all(v % c == 0 for v in sizes.values())]
    nearest = min(valid, key=lambda c: (abs(c - q), c))
    what = ", ".join(f"{k}={v}" for k, v in bad.items())
    raise ValueError(f"{name}={q} does not divide {what}; nearest valid {name} is {nearest} (valid: {valid})")


def _gpt2_rules(config: Any) -> list[ShardRule]:
    rules = [ShardRule("wte.table.shard", ("transformer.wte.weight",), placement="column_vector", dim=1),
             ShardRule("wpe.table.shard", ("transformer.wpe.weight",), placement="column_vector", dim=1)]
    for layer in range(config.n_layer):
        src, dst = f"transformer.h.{layer}.", f"h.{layer}."
        for norm in ("ln_1", "ln_2"):
            rules += [ShardRule(f"{dst}{norm}.{p}.shard", (f"{src}{norm}.{p}",), placement="column_vector")
                      for p in ("weight", "bias")]
        rules += [ShardRule(f"{dst}attn.qkv.weight", (f"{src}attn.c_attn.weight",), "qkv_fused"),
                  ShardRule(f"{dst}attn.qkv.bias.shard", (f"{src}attn.c_attn.bias",), "qkv_fused", "column_vector")]
        for mine, theirs in (("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
            rules += [ShardRule(f"{dst}{mine}.weight", (f"{src}{theirs}.weight",)),
                      ShardRule(f"{dst}{mine}.bias.shard", (f"{src}{theirs}.bias",), placement="column_vector")]
    rules += [ShardRule(f"ln_f.{p}.shard", (f"transformer.ln_f.{p}",), placement="column_vector") for p in ("weight", "bias")]
    return rules


def _bert_rules(config: Any, prefix: str, pooler: bool, classifier: bool) -> list[ShardRule]:
    emb = f"{prefix}embeddings."
    rules = [ShardRule(f"{name}.table.shard", (f"{emb}{name}.weight",), placement="column_vector", dim=1)
             for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    rules += [ShardRule(f"embeddings_ln.{p}.shard", (f"{emb}LayerNorm.{p}",), placement="column_vector") for p in ("weight", "bias")]

    def linear(mine: str, theirs: str) -> list[ShardRule]:
        return [ShardRule(f"{mine}.weight", (f"{theirs}.weight",), "transpose"),
                ShardRule(f"{mine}.bias.shard", (f"{theirs}.bias",), placement="column_vector")]

    def norm(mine: str, theirs: str) -> list[ShardRule]:
        return [ShardRule(f"{mine}.{p}.shard", (f"{theirs}.{p}",), placement="column_vector") for p in ("weight", "bias")]

    for layer in range(config.num_hidden_layers):
        src, dst = f"{prefix}encoder.layer.{layer}.", f"layer.{layer}."
        heads = [f"{src}attention.self.{n}" for n in ("query", "key", "value")]
        rules += [ShardRule(f"{dst}attention.qkv.weight", tuple(f"{h}.weight" for h in heads), "qkv_separate"),
                  ShardRule(f"{dst}attention.qkv.bias.shard", tuple(f"{h}.bias" for h in heads), "qkv_separate", "column_vector")]
        rules += linear(f"{dst}attention.proj", f"{src}attention.output.dense")
        rules += norm(f"{dst}attention_ln", f"{src}attention.output.LayerNorm")
        rules += linear(f"{dst}mlp.fc", f"{src}intermediate.dense") + linear(f"{dst}mlp.proj", f"{src}output.dense")
        rules += norm(f"{dst}output_ln", f"{src}output.LayerNorm")
    if pooler:
        rules += linear("pooler", f"{prefix}pooler.dense")
    if classifier:
        rules += [ShardRule("classifier.weight.shard", ("classifier.weight",), placement="column_vector", dim=1),
                  ShardRule("classifier.bias", ("classifier.bias",), placement="replicated")]
    return rules


@dataclass
class ShardRules2D:
    """The dense -> 2D mapping of one model architecture on a q x q grid."""

    architecture: str
    config: Any
    q: int
    rules: list[ShardRule]
    aliases: dict[str, str] = field(default_factory=dict)  # tied dense key -> the key it repeats

    @classmethod
    def for_model(cls, model: nn.Module, q: int) -> "ShardRules2D":
        architecture = type(model).__name__
        if architecture not in SUPPORTED:
            raise ValueError(f"model class {architecture!r} is not supported for 2D tensor parallelism; supported: {SUPPORTED}")
        config = model.config
        check_grid_size(model_dims(config), q)
        if getattr(config, "add_cross_attention", False) or getattr(config, "scale_attn_by_inverse_layer_idx", False):
            raise ValueError("config.add_cross_attention / scale_attn_by_inverse_layer_idx are not supported in the 2D form")
        if architecture == "GPT2LMHeadModel":
            return cls(architecture, config, q, _gpt2_rules(config), {"lm_head.weight": "transformer.wte.weight"})
        has_pooler = getattr(model, "pooler", None) is not None or architecture == "BertForSequenceClassification"
        prefix = "bert." if architecture == "BertForSequenceClassification" else ""
        classifier = architecture == "BertForSequenceClassification"
        return cls(architecture, config, q, _bert_rules(config, prefix, has_pooler, classifier))

    def build(self, grid: Grid2D) -> nn.Module:
        """An empty 2D module for these rules on ``grid``."""
        if grid.q != self.q:
            raise ValueError(f"the shard rules are for q={self.q} but the grid has q={grid.q}")
        if self.architecture == "GPT2LMHeadModel":
            return GPT2LMHead2D(grid, self.config)
        classify = self.architecture == "BertForSequenceClassification"
        pooler = any(r.target.startswith("pooler.") for r in self.rules)
        return Bert2D(grid, self.config, pooler=pooler, num_labels=self.config.num_labels if classify else None)

    def shard(self, dense_model: nn.Module, grid: Grid2D) -> nn.Module:
        """Build the 2D module and fill rank (i, j)'s blocks from the dense model's weights."""
        module = self.build(grid)
        dense = dict(dense_model.named_parameters())
        with torch.no_grad():
            for rule in self.rules:
                canonical = to_canonical(rule, [dense[s].detach() for s in rule.sources], self.q)
                block = _place(rule, canonical, self.q, grid.i, grid.j)
                target = module.get_parameter(rule.target)
                if target.shape != block.shape:
                    raise ValueError(f"{rule.target}: block shape {tuple(block.shape)} != parameter {tuple(target.shape)}")
                target.copy_(block)
        return module.to(next(dense_model.parameters()).device)

    def gather_dense_state_dict(self, module: nn.Module, grid: Grid2D, *, grads: bool = False) -> dict[str, torch.Tensor]:
        """All-gather every block over the grid and return the dense tensors (or their gradients) by dense key.

        Collective: every rank of the grid must call it; every rank gets the full result.
        """
        out: dict[str, torch.Tensor] = {}
        for rule in self.rules:
            param = module.get_parameter(rule.target)
            local = param.grad if grads else param
            local = torch.zeros_like(param) if local is None else local.detach()
            blocks = _gather_grid(grid, local)  # [q, q, *block]
            split = rule.placement == "column_vector" and module.get_submodule(rule.target.rsplit(".", 1)[0]).split
            canonical = _assemble(rule, blocks, self.q, split)
            for key, tensor in zip(rule.sources, from_canonical(rule, canonical, self.q)):
                out[key] = tensor.cpu()
        for alias, key in self.aliases.items():
            out[alias] = out[key]
        return out


def _gather_grid(grid: Grid2D, local: torch.Tensor) -> torch.Tensor:
    """Every rank's block, indexed [i, j]: gather along the row (over j), then along the column (over i)."""
    row = all_gather(grid.row, local.unsqueeze(0), dim=0)  # [q (j), *block]
    return all_gather(grid.col, row.unsqueeze(0), dim=0)  # [q (i), q (j), *block]


def parallelize_2d(model: nn.Module, grid: Grid2D) -> tuple[nn.Module, ShardRules2D]:
    """The 2D form of ``model`` on ``grid`` and the shard rules that map it back."""
    rules = ShardRules2D.for_model(model, grid.q)
    return rules.shard(model, grid), rules
