"""From a log window to the model's input: selected lines, tokens, ids, padded batches.

Training, serving, the TF-IDF baseline and the benchmark all go through :func:`window_tokens`,
so what a model was trained on is exactly what it is shown in production.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .api import LogWindow
from .preprocess import Line, model_lines, tokens_of_lines
from .vocab import Vocabulary

__all__ = ["MAX_TOKENS", "Encoded", "encode_window", "pad_batch", "window_tokens"]

# 512 tokens hold a 40-line error block and the tail's last lines: enough for every log in
# the real corpus once repeats are collapsed, and cheap enough for >500 windows/s on a CPU.
MAX_TOKENS = 512


def window_tokens(window: LogWindow, max_tokens: int = MAX_TOKENS
                  ) -> tuple[list[str], list[int], list[Line]]:
    """(tokens, line index of each token, selected lines) of one window."""
    lines = model_lines(window)
    tokens, owners = tokens_of_lines(lines, max_tokens)
    return tokens, owners, lines


@dataclass(frozen=True, slots=True)
class Encoded:
    """One window as ids, with what is needed to map attention back to lines."""

    ids: list[int]
    owners: list[int]
    lines: list[Line]


def encode_window(window: LogWindow, vocab: Vocabulary, max_tokens: int = MAX_TOKENS
                  ) -> Encoded:
    tokens, owners, lines = window_tokens(window, max_tokens)
    return Encoded(vocab.encode(tokens), owners, lines)


def pad_batch(seqs: Sequence[Sequence[int]]) -> torch.Tensor:
    """(B, T) long tensor, right-padded with 0; T is the longest sequence (at least 1)."""
    width = max(1, max((len(s) for s in seqs), default=1))
    out = np.zeros((len(seqs), width), dtype=np.int64)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = seq
    return torch.from_numpy(out)
