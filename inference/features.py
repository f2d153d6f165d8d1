"""From a log window to the model's input: selected lines, tokens, ids, padded batches.

Training, serving, the TF-IDF baseline and the benchmark all go through :func:`window_tokens`,
so what a model was trained on is exactly what it is shown in production.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .api import LogWindow
from .preprocess import SEPARATOR, SEPARATOR_LINE, Line, Prepared, budget_tokens, select_window
from .vocab import Vocabulary

__all__ = [
    "MAX_TOKENS",
    "Encoded",
    "encode_selected",
    "encode_window",
    "pad_batch",
    "separator_entry",
    "window_tokens",
]

# 512 tokens hold a 40-line error block and the tail's last lines: enough for every log in
# the real corpus once repeats are collapsed, and cheap enough for >500 windows/s on a CPU.
MAX_TOKENS = 512


def _selected(window: LogWindow) -> tuple[list[Prepared], int]:
    first, tail = select_window(window)
    return [*first, _SEPARATOR, *tail], len(first)


class _SeparatorEntry:
    """Stands for :data:`SEPARATOR_LINE` among prepared lines."""

    line = SEPARATOR_LINE

    @staticmethod
    def tokens() -> list[str]:
        return [SEPARATOR]


_SEPARATOR: Any = _SeparatorEntry()


def separator_entry() -> Prepared:
    """The entry standing for :data:`~.preprocess.SEPARATOR_LINE` among prepared lines."""
    return _SEPARATOR


def window_tokens(window: LogWindow, max_tokens: int = MAX_TOKENS
                  ) -> tuple[list[str], list[int], list[Line]]:
    """(tokens, line index of each token, selected lines) of one window."""
    selected, sep = _selected(window)
    tokens, owners = budget_tokens([p.tokens() for p in selected], sep, max_tokens)
    return tokens, owners, [p.line for p in selected]


@dataclass(frozen=True, slots=True)
class Encoded:
    """One window as ids, with what is needed to map attention back to lines."""

    ids: list[int]
    owners: list[int]
    lines: list[Line]


def _ids(p: Prepared, vocab: Vocabulary) -> list[int]:
    """Ids of a prepared line's tokens, kept with its template (one lookup per template)."""
    tpl = p.template
    if tpl is None:
        return vocab.encode(p.tokens())
    ids = tpl.ids.get(vocab.serial)
    if ids is None:
        if len(tpl.ids) >= 4:  # models swapped in over time: keep the ids of the last few
            tpl.ids.clear()
        ids = tpl.ids[vocab.serial] = vocab.encode(p.tokens())
    return ids


def encode_selected(selected: Sequence[Prepared], sep: int, vocab: Vocabulary,
                    max_tokens: int = MAX_TOKENS) -> Encoded:
    """:class:`Encoded` of lines chosen by :func:`~.preprocess.select_prepared`, the separator
    (``SEPARATOR_LINE``'s entry) at index ``sep``."""
    sep_ids = vocab.encode([SEPARATOR])
    per_line = [sep_ids if i == sep else _ids(p, vocab) for i, p in enumerate(selected)]
    ids, owners = budget_tokens(per_line, sep, max_tokens)
    return Encoded(ids, owners, [p.line for p in selected])


def encode_window(window: LogWindow, vocab: Vocabulary, max_tokens: int = MAX_TOKENS
                  ) -> Encoded:
    selected, sep = _selected(window)
    return encode_selected(selected, sep, vocab, max_tokens)


def pad_batch(seqs: Sequence[Sequence[int]]) -> torch.Tensor:
    """(B, T) long tensor, right-padded with 0; T is the longest sequence (at least 1)."""
    width = max(1, max((len(s) for s in seqs), default=1))
    out = np.zeros((len(seqs), width), dtype=np.int64)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = seq
    return torch.from_numpy(out)
