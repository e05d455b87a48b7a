"""Language models as layer chains: transformers BERT and GPT-2, and a toy transformer.

A pipeline stage passes one tensor, so every unit here takes and returns one:
token ids [B, T] into the embeddings, hidden states [B, T, H] between blocks,
logits [B, T, V] out of the head. The attention masks the original models
build in their top-level ``forward`` are rebuilt inside the units: none for
BERT (every token attends to every token, as with an all-ones mask) and
causal attention for GPT-2 (its attention applies ``is_causal`` when given no
mask under the SDPA implementation, which these builders select).

Input and output embeddings are untied by default (``tie_word_embeddings=
False``) so that every parameter belongs to exactly one layer and a stage
boundary never splits a shared weight; pass ``tie_word_embeddings=True`` to
get the published parameter counts (110M BERT-base, 124M GPT-2 small).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .sequence import InputSpec, LayerSequence, token_cross_entropy

__all__ = [
    "build_bert", "bert_sequence", "build_gpt2", "gpt2_sequence",
    "build_toy_transformer", "toy_transformer_sequence", "HF_KEYS",
]

# Zoo overrides handled here rather than passed to the transformers config.
HF_KEYS = ("seq_len",)


def _first(output):
    """transformers blocks return a tensor (5.x) or a tuple whose first item is the hidden states."""
    return output[0] if isinstance(output, (tuple, list)) else output


class BertEmbeddingUnit(nn.Module):
    """Token ids [B, T] -> hidden [B, T, H] (word + position + token-type embeddings, norm, dropout)."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids=input_ids)


class EncoderBlockUnit(nn.Module):
    """One transformer block, hidden [B, T, H] -> [B, T, H], with the attention mask built inside (none)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return _first(self.block(hidden, attention_mask=None))


def _hf_config(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in HF_KEYS}


def build_bert(config: dict) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    hf = BertConfig(attn_implementation="sdpa", **_hf_config(config))
    return BertForMaskedLM(hf)


def bert_sequence(model: nn.Module, name: str, config: dict) -> LayerSequence:
    units: list[tuple[str, nn.Module]] = [("embeddings", BertEmbeddingUnit(model.bert.embeddings))]
    units += [(f"layer_{i}", EncoderBlockUnit(layer)) for i, layer in enumerate(model.bert.encoder.layer)]
    units.append(("mlm_head", model.cls))
    spec = InputSpec(shape=(config["seq_len"],), dtype=torch.long, high=config["vocab_size"],
                     num_targets=config["vocab_size"])
    return LayerSequence(units, name=name, task="masked-lm", input_spec=spec, config=config,
                         loss_fn=token_cross_entropy)


class GPT2EmbeddingUnit(nn.Module):
    """Token ids [B, T] -> hidden [B, T, H]: token + learned position embeddings, dropout."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)  # [1, T]
        return self.drop(self.wte(input_ids) + self.wpe(positions))


class GPT2HeadUnit(nn.Module):
    """Hidden [B, T, H] -> logits [B, T, V]: final layer norm and the language-model head."""

    def __init__(self, ln_f: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.ln_f, self.lm_head = ln_f, lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(hidden))


def build_gpt2(config: dict) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2Config(attn_implementation="sdpa", **_hf_config(config))
    return GPT2LMHeadModel(hf)


def gpt2_sequence(model: nn.Module, name: str, config: dict) -> LayerSequence:
    body = model.transformer
    units: list[tuple[str, nn.Module]] = [("embeddings", GPT2EmbeddingUnit(body.wte, body.wpe, body.drop))]
    units += [(f"block_{i}", EncoderBlockUnit(block)) for i, block in enumerate(body.h)]
    units.append(("head", GPT2HeadUnit(body.ln_f, model.lm_head)))
    spec = InputSpec(shape=(config["seq_len"],), dtype=torch.long, high=config["vocab_size"],
                     num_targets=config["vocab_size"])
    return LayerSequence(units, name=name, task="causal-lm", input_spec=spec, config=config,
                         loss_fn=token_cross_entropy)


class ToyEmbedding(nn.Module):
    """Token ids [B, T] -> hidden [B, T, D] with learned positions."""

    def __init__(self, vocab_size: int, dim: int, max_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(max_len, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)  # [T]
        return self.tokens(ids) + self.positions(positions)


class ToyBlock(nn.Module):
    """Pre-norm causal self-attention and MLP, hidden [B, T, D] -> [B, T, D]."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads, got dim={dim}, heads={heads}")
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(dim, dim=-1)  # each [B, T, D]
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, heads, T, D/heads]
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, dim))
        return x + self.mlp(self.norm2(x))


class ToyHead(nn.Module):
    """Hidden [B, T, D] -> logits [B, T, V]."""

    def __init__(self, dim: int, vocab_size: int) -> None:
        super().__init__()
        self.norm, self.out = nn.LayerNorm(dim), nn.Linear(dim, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def build_toy_transformer(config: dict) -> nn.Module:
    dim, vocab = config["dim"], config["vocab_size"]
    modules = [("embeddings", ToyEmbedding(vocab, dim, config["max_len"]))]
    modules += [(f"block_{i}", ToyBlock(dim, config["heads"])) for i in range(config["layers"])]
    modules.append(("head", ToyHead(dim, vocab)))
    model = nn.Sequential()
    for unit_name, module in modules:
        model.add_module(unit_name, module)
    for param in model.parameters():
        if param.dim() > 1:
            nn.init.normal_(param, std=1.0 / math.sqrt(param.shape[-1]))
    return model


def toy_transformer_sequence(model: nn.Sequential, name: str, config: dict) -> LayerSequence:
    spec = InputSpec(shape=(config["seq_len"],), dtype=torch.long, high=config["vocab_size"],
                     num_targets=config["vocab_size"])
    return LayerSequence(list(model.named_children()), name=name, task="causal-lm", input_spec=spec,
                         config=config, loss_fn=token_cross_entropy)
