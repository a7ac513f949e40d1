"""The built-in small transformer over token sequences, as a sequence classifier.

Input: the loader's `features`, float32 [B, S], whose values are token ids (a
Parquet column `tokens` of type fixed_size_list<int32>[S], as written by
preprocessing/synthetic/tokens.py). The loader yields every feature column as float32, which
holds integers below 2^24 exactly, so `TokenTransformer.forward` casts them
back to int64 ids; the logged network therefore takes the same float32 matrix
as the classifier does. Token and position embeddings, `num_layers`
pre-norm blocks (multi-head self-attention over the whole sequence, then a
GELU feed-forward), a final norm, the mean over positions, and a linear head
to the class logits. No dropout, so a run is a function of its seed.

Parallelism lives in training/distributed/parallelize.py, which relies on the names here:
`blocks` (the unit FSDP2 shards), `attention.wq/wk/wv/wo` and
`feed_forward.w1/w2` (the column- and row-wise tensor-parallel layers), and an
attention that infers the number of heads from its input width, so that a
rank holding half the heads (tensor parallel) runs the same code.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from training.models.classifier import Classifier
from training.models.config import TransformerConfig


class Attention(nn.Module):
    """Multi-head self-attention without a mask; heads = local width // head_dim."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.head_dim = d_model // num_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (
            proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
            for proj in (self.wq, self.wk, self.wv)
        )
        out = F.scaled_dot_product_attention(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    """Linear, GELU, linear."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm residual attention, then pre-norm residual feed-forward."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = Attention(config.d_model, config.num_heads)
        self.ffn_norm = nn.LayerNorm(config.d_model)
        self.feed_forward = FeedForward(config.d_model, config.ffn_mult * config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class TokenTransformer(nn.Module):
    """Token ids (as float32 [B, S]) to class logits [B, num_classes]."""

    def __init__(self, config: TransformerConfig, seq_len: int, num_classes: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embeddings = nn.Embedding(seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, num_classes)
        self.register_buffer("positions", torch.arange(seq_len), persistent=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        tokens = features.long()
        # A shorter input (a sequence cut to its real tokens) takes the first positions.
        positions = cast(torch.Tensor, self.positions)[: tokens.shape[1]]
        x = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


class TokenClassifier(Classifier):
    """Classify a token sequence with `TokenTransformer` (`model.transformer` sizes)."""

    def build_network(self, num_features: int, num_classes: int) -> nn.Module:
        return TokenTransformer(self.config.transformer, num_features, num_classes)
