"""The failure classifier: a GRU over a window's lines, averaged with a wide n-gram path.

A log is read the way an engineer reads it: line by line. Each line the model reads (the first
error block, then the tail: :mod:`.features`) becomes one vector, the mean embedding of its
tokens plus the mean embedding of their hashed character 3-grams (so a word no vocabulary saw
still means something), through a linear layer. A bidirectional GRU runs over those lines (at
most 64 steps, not ~500 tokens: about seven times faster than a token-level LSTM), then
attention and max pooling feed two heads. The verdict head answers the scheduler's question;
the category head names the cause and regularises the encoder. Attention over lines also says
which lines drove the decision (the evidence shown to users).

The wide path (:mod:`.wide`) is a softmax regression over the window's hashed character
3-5-grams, fitted apart (it is convex: :func:`~.wide.fit_wide`), never by the recurrent loss,
which would let the recurrent path, that fits the training logs perfectly, silence it. Served,
the two paths' probabilities are averaged with ``deep_weight``: on projects it never trained
on, the bag of n-grams generalises best; the GRU knows order and context.

One config dataclass rebuilds the model exactly (it travels in every checkpoint).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from .taxonomy import CATEGORIES, DETERMINISTIC
from .wide import WIDE_BUCKETS, tfidf_weights

__all__ = ["Logits", "ModelConfig", "ModelInput", "RecurrentClassifier"]


@dataclass(frozen=True)
class ModelConfig:
    """Constructor arguments of :class:`RecurrentClassifier` (saved in checkpoints)."""

    vocab_size: int
    n_categories: int = 16
    dim: int = 64  # logs have a small, repetitive vocabulary: 64 is plenty
    gram_buckets: int = 1 << 14  # hashed character 3-grams of the tokens, per line
    wide_buckets: int = WIDE_BUCKETS
    dropout: float = 0.3  # few real examples: regularise hard
    category_weight: float = 0.5  # weight of the category loss next to the verdict loss
    deep_weight: float = 0.5  # share of the recurrent path in the served probabilities

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown model config fields: {sorted(unknown)}")
        return cls(**raw)


class ModelInput(NamedTuple):
    """A batch of B windows of at most L lines (built by :func:`~.features.batch_input`).

    ``tokens`` (N, T) and ``grams`` (N, G): per line read, token ids and hashed 3-gram ids,
    0-padded; ``n_lines`` (B,), on the CPU; ``slots`` (N,): each line's place in the (B, L)
    grid, so that padding lines cost nothing; the wide path's buckets per window as
    :func:`~.wide.merge_grams` lays them out (ids, offsets, counts, rows).
    """

    tokens: torch.Tensor
    grams: torch.Tensor
    n_lines: torch.Tensor
    slots: torch.Tensor
    wide_ids: torch.Tensor
    wide_offsets: torch.Tensor
    wide_counts: torch.Tensor
    wide_rows: torch.Tensor

    def to(self, device: torch.device) -> ModelInput:
        if device.type == "cpu":
            return self
        return ModelInput(self.tokens.to(device), self.grams.to(device), self.n_lines,
                          *(t.to(device) for t in self[3:]))


class Logits(NamedTuple):
    """Verdict (B, 2) and category (B, C) log-probabilities, attention over lines (B, L)."""

    verdict: torch.Tensor
    category: torch.Tensor
    attention: torch.Tensor


class RecurrentClassifier(nn.Module):
    """See module docstring."""

    idf: torch.Tensor  # (wide_buckets,) buffers, declared for the type checker
    deterministic: torch.Tensor  # (n_categories,) bool

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.dim
        self.tokens = nn.EmbeddingBag(config.vocab_size, dim, mode="mean", padding_idx=0)
        self.grams = nn.EmbeddingBag(config.gram_buckets, dim, mode="mean", padding_idx=0)
        self.line = nn.Linear(2 * dim, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True, bidirectional=True)
        self.attn = nn.Linear(2 * dim, 1)
        self.drop = nn.Dropout(config.dropout)
        self.verdict_head = nn.Linear(4 * dim, 2)
        self.category_head = nn.Linear(4 * dim, config.n_categories)
        # The wide path: fitted by wide.fit_wide (full-batch, apart), never by the loss below.
        self.wide = nn.EmbeddingBag(config.wide_buckets, config.n_categories, mode="sum")
        self.wide.weight.requires_grad_(False)
        nn.init.zeros_(self.wide.weight)
        self.wide_bias = nn.Parameter(torch.zeros(config.n_categories), requires_grad=False)
        self.register_buffer("idf", torch.zeros(config.wide_buckets))
        self.register_buffer("deterministic", torch.tensor(
            [c in DETERMINISTIC for c in CATEGORIES[: config.n_categories]]), persistent=False)

    def read_lines(self, tokens: torch.Tensor, grams: torch.Tensor) -> torch.Tensor:
        """(N, dim) vectors of N lines from their token and 3-gram ids (see ModelInput)."""
        return torch.tanh(self.line(torch.cat([self.tokens(tokens), self.grams(grams)], 1)))

    def deep(self, x: ModelInput, read: torch.Tensor | None = None) -> Logits:
        """The recurrent path's raw logits (what training minimises). ``read``: the lines'
        vectors when known already (:meth:`read_lines` of ``x``'s lines, e.g. cached)."""
        batch = x.n_lines.shape[0]
        width = max(1, int(x.n_lines.max())) if batch else 1
        if read is None:
            read = self.read_lines(x.tokens, x.grams)
        lines = read.new_zeros(batch * width, read.shape[1]).index_copy(0, x.slots, read)
        lines = self.drop(lines.view(batch, width, -1))
        packed = nn.utils.rnn.pack_padded_sequence(lines, x.n_lines.clamp_min(1),
                                                   batch_first=True, enforce_sorted=False)
        h, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], batch_first=True,
                                                total_length=width)
        pad = (torch.arange(width)[None, :] >= x.n_lines[:, None]).to(h.device)
        scores = self.attn(torch.tanh(h)).squeeze(-1).float().masked_fill(pad, -1e9)
        weights = torch.softmax(scores, 1).to(h.dtype)
        attended = torch.bmm(weights.unsqueeze(1), h).squeeze(1)
        maxed = h.masked_fill(pad.unsqueeze(-1), -1e4).amax(1)
        pooled = self.drop(torch.cat([attended, maxed], 1))
        return Logits(self.verdict_head(pooled), self.category_head(pooled), weights)

    def wide_probs(self, x: ModelInput) -> torch.Tensor:
        """(B, C) category probabilities of the wide path."""
        weights = tfidf_weights(x.wide_ids, x.wide_counts, x.wide_rows, x.n_lines.shape[0],
                                self.idf)
        logits = self.wide(x.wide_ids, x.wide_offsets,
                           per_sample_weights=weights.to(self.wide.weight.dtype))
        return torch.softmax((logits + self.wide_bias).float(), 1)

    def forward(self, x: ModelInput, targets: tuple[torch.Tensor, torch.Tensor] | None = None,
                read: torch.Tensor | None = None) -> tuple[Logits, torch.Tensor | None]:
        """Without ``targets``: (served log-probabilities, None). With ``targets`` = (verdict
        (B,), category (B,)) class indices: (the recurrent path's logits, its loss), what
        training minimises; the wide path is not computed (``x`` may come without it, see
        :func:`~.features.batch_input`). ``read``: see :meth:`deep`."""
        deep = self.deep(x, read)
        if targets is not None:
            verdict_target, category_target = targets
            loss = F.cross_entropy(deep.verdict.float(), verdict_target)
            return deep, loss + self.config.category_weight * F.cross_entropy(
                deep.category.float(), category_target)
        wide = self.wide_probs(x)
        p_det = wide[:, self.deterministic].sum(1)
        w = self.config.deep_weight
        verdict = torch.log(w * torch.softmax(deep.verdict.float(), 1)
                            + (1 - w) * torch.stack([p_det, 1 - p_det], 1))
        category = torch.log(w * torch.softmax(deep.category.float(), 1) + (1 - w) * wide)
        return Logits(verdict, category, deep.attention), None
