"""GPT-2 and BERT assembled from 2D layers, with the dense model's names and hyper-parameters.

Problem: the 2D form of a ``transformers`` model cannot reuse the model's own
forward code (it reshapes with full sizes and builds masks for the whole
batch), yet it must compute exactly what that code computes.

Approach: a small twin module per architecture, built from the dense
``config`` only (``sharding.py`` fills in the sharded weights), mirroring the
dense module tree closely enough that parameter names mostly match. Every
forward takes this rank's batch slice (rows of grid row i) and returns
column-j blocks ([b/q, s, h/q]) or logits replicated within the grid row.
Dropout is not applied (the 2D form would need tensor-parallel-aware RNG
streams); configure dropout 0 when comparing with the dense model.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers.activations import ACT2FN

from .comm import Grid2D
from .layers import Attention2D, Embedding2D, Head2D, LayerNorm2D, Linear2D, MLP2D, causal_lm_loss_2d, cross_entropy_2d

__all__ = ["GPT2LMHead2D", "Bert2D"]


class GPT2Block2D(nn.Module):
    """Pre-LN block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, grid: Grid2D, config: Any) -> None:
        super().__init__()
        hidden = config.n_embd
        head_dim = hidden // config.n_head
        self.ln_1 = LayerNorm2D(grid, hidden, config.layer_norm_epsilon)
        self.attn = Attention2D(grid, hidden, config.n_head, causal=True,
                                scale=1.0 / math.sqrt(head_dim) if config.scale_attn_weights else 1.0)
        self.ln_2 = LayerNorm2D(grid, hidden, config.layer_norm_epsilon)
        self.mlp = MLP2D(grid, hidden, config.n_inner or 4 * hidden, ACT2FN[config.activation_function])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # [b/q, s, h/q]
        return x + self.mlp(self.ln_2(x))


class GPT2LMHead2D(nn.Module):
    """GPT-2 with its tied LM head: ids [b/q, s] -> logits [b/q, s, V] (replicated in grid row i)."""

    def __init__(self, grid: Grid2D, config: Any) -> None:
        super().__init__()
        self.grid = grid
        self.wte = Embedding2D(grid, config.vocab_size, config.n_embd)
        self.wpe = Embedding2D(grid, config.n_positions, config.n_embd)
        self.h = nn.ModuleList(GPT2Block2D(grid, config) for _ in range(config.n_layer))
        self.ln_f = LayerNorm2D(grid, config.n_embd, config.layer_norm_epsilon)
        self.lm_head = Head2D(grid, config.n_embd, config.vocab_size, bias=False, tied_to=self.wte)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """ids [b/q, s] -> final hidden block [b/q, s, h/q]."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)  # [b/q, s, h/q] + [s, h/q]
        for block in self.h:
            x = block(x)
        return self.ln_f(x)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.hidden_states(input_ids))

    def loss(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over the whole grid batch."""
        return causal_lm_loss_2d(self.grid, self(input_ids), input_ids)


class BertLayer2D(nn.Module):
    """Post-LN encoder layer: ln(x + attn(x)), then ln(x + mlp(x))."""

    def __init__(self, grid: Grid2D, config: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.attention = Attention2D(grid, hidden, config.num_attention_heads, causal=False)
        self.attention_ln = LayerNorm2D(grid, hidden, config.layer_norm_eps)
        self.mlp = MLP2D(grid, hidden, config.intermediate_size, ACT2FN[config.hidden_act])
        self.output_ln = LayerNorm2D(grid, hidden, config.layer_norm_eps)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention_ln(self.attention(x, additive_mask) + x)  # [b/q, s, h/q]
        return self.output_ln(self.mlp(x) + x)


class Bert2D(nn.Module):
    """BertModel (optionally with the pooler and a sequence-classification head) on the grid."""

    def __init__(self, grid: Grid2D, config: Any, *, pooler: bool, num_labels: int | None) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.grid = grid
        self.word_embeddings = Embedding2D(grid, config.vocab_size, hidden, padding_idx=config.pad_token_id)
        self.position_embeddings = Embedding2D(grid, config.max_position_embeddings, hidden)
        self.token_type_embeddings = Embedding2D(grid, config.type_vocab_size, hidden)
        self.embeddings_ln = LayerNorm2D(grid, hidden, config.layer_norm_eps)
        self.layer = nn.ModuleList(BertLayer2D(grid, config) for _ in range(config.num_hidden_layers))
        self.pooler = Linear2D(grid, hidden, hidden) if pooler else None
        self.classifier = Head2D(grid, hidden, num_labels, bias=True) if num_labels else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """ids, mask, token types [b/q, s] -> {"sequence": [b/q, s, h/q], "pooled": [b/q, h/q], "logits": [b/q, C]}."""
        seq = input_ids.shape[1]
        positions = torch.arange(seq, device=input_ids.device)
        token_type_ids = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) + self.position_embeddings(positions)
        x = self.embeddings_ln(x)  # [b/q, s, h/q]
        additive_mask = None
        if attention_mask is not None:  # [b/q, s] of 1 (attend) / 0 (padding) -> [b/q, 1, 1, s] additive
            additive_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layer:
            x = layer(x, additive_mask)
        out = {"sequence": x}
        if self.pooler is not None:
            out["pooled"] = torch.tanh(self.pooler(x[:, 0]))  # [b/q, h/q]
            if self.classifier is not None:
                out["logits"] = self.classifier(out["pooled"])  # [b/q, C]
        return out

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Sequence-classification cross-entropy over the whole grid batch."""
        return cross_entropy_2d(self.grid, self(input_ids, attention_mask)["logits"], labels)
