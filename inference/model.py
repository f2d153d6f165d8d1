"""The recurrent failure classifier: embedding -> GRU or LSTM -> pooling -> two heads.

One config dataclass rebuilds the model exactly (it travels in every checkpoint). The verdict
head answers the scheduler's question (retry or not); the category head names the cause and
regularises the encoder: sixteen fine-grained targets teach it more than two coarse ones.
Attention pooling also tells which lines drove the decision (the evidence shown to users);
max pooling keeps a single decisive token ("Stale", "ECC") from being averaged away.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["Logits", "ModelConfig", "RecurrentClassifier"]


@dataclass(frozen=True)
class ModelConfig:
    """Constructor arguments of :class:`RecurrentClassifier` (saved in checkpoints)."""

    vocab_size: int
    n_categories: int = 16
    cell: Literal["gru", "lstm"] = "gru"
    embed_dim: int = 64  # logs have a small, repetitive vocabulary: 64 is plenty
    hidden_dim: int = 64  # per direction; keeps CPU inference well above 500 windows/s
    bidirectional: bool = True  # the cause may be read before or after its context
    dropout: float = 0.3  # few real examples: regularise hard
    category_weight: float = 0.5  # weight of the category loss next to the verdict loss

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown model config fields: {sorted(unknown)}")
        return cls(**raw)


class Logits(NamedTuple):
    """Raw outputs: verdict (B, 2), category (B, C), attention weights (B, T)."""

    verdict: torch.Tensor
    category: torch.Tensor
    attention: torch.Tensor


def _reverse_each(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, T, D) with each row's first ``lengths[b]`` steps reversed, padding left in place."""
    t = torch.arange(x.shape[1], device=x.device)[None, :]  # (1, T)
    idx = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # (B, T)
    return x.gather(1, idx.unsqueeze(-1).expand_as(x))


class RecurrentClassifier(nn.Module):
    """See module docstring. Input: token ids (B, T), 0 = padding."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=0)
        rnn = nn.GRU if config.cell == "gru" else nn.LSTM
        self.rnn = rnn(config.embed_dim, config.hidden_dim, batch_first=True)
        # The backward direction is a second RNN over each sequence reversed in place (padding
        # stays at the end), not the fused bidirectional RNN: that one would start reading at
        # the padding, so a window's verdict would depend on the length of its batch mates.
        self.rnn_back = (rnn(config.embed_dim, config.hidden_dim, batch_first=True)
                         if config.bidirectional else None)
        width = config.hidden_dim * (2 if config.bidirectional else 1)
        self.attn = nn.Linear(width, 1)
        self.drop = nn.Dropout(config.dropout)
        self.verdict_head = nn.Linear(2 * width, 2)
        self.category_head = nn.Linear(2 * width, config.n_categories)

    def forward(self, x: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[Logits, torch.Tensor | None]:
        """(logits, loss); ``targets`` = (verdict (B,), category (B,)) class indices."""
        pad = x == 0  # (B, T)
        emb = self.drop(self.embed(x))  # (B, T, E); padding embeds to zeros
        # No packing (3-10x slower on a CPU): padding is only ever on the right, where it
        # cannot reach the forward states, and pooling masks it out.
        h, _ = self.rnn(emb)  # (B, T, H)
        if self.rnn_back is not None:
            lengths = (~pad).sum(1)
            back, _ = self.rnn_back(_reverse_each(emb, lengths))
            h = torch.cat([h, _reverse_each(back, lengths)], dim=-1)  # (B, T, 2H)
        scores = self.attn(torch.tanh(h)).squeeze(-1).masked_fill(pad, float("-inf"))
        scores[:, 0] = scores[:, 0].masked_fill(pad[:, 0], 0.0)  # an all-padding row stays finite
        weights = torch.softmax(scores.float(), dim=1).to(h.dtype)  # (B, T)
        attended = torch.bmm(weights.unsqueeze(1), h).squeeze(1)  # (B, W)
        maxed = h.masked_fill(pad.unsqueeze(-1), float("-inf")).amax(1)  # (B, W)
        maxed = torch.where(torch.isfinite(maxed), maxed, torch.zeros_like(maxed))
        pooled = self.drop(torch.cat([attended, maxed], dim=1))  # (B, 2W)
        logits = Logits(self.verdict_head(pooled), self.category_head(pooled), weights)
        if targets is None:
            return logits, None
        verdict, category = targets
        loss = F.cross_entropy(logits.verdict.float(), verdict)
        loss = loss + self.config.category_weight * F.cross_entropy(logits.category.float(),
                                                                    category)
        return logits, loss
