"""From a log window to the model's input: the lines it reads, their features, batches.

Training, serving and the incremental featuriser all go through :func:`encode_selected`, so
what a model was trained on is exactly what it is shown in production. A line's features that
do not depend on a vocabulary (tokens, hashed 3-grams, wide n-gram counts) are computed once
per line template (:mod:`.preprocess`) and shared by every line of that shape.
:func:`window_tokens` is the token-level view the word TF-IDF baseline reads.
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from .api import LogWindow
from .model import ModelInput
from .preprocess import SEPARATOR, SEPARATOR_LINE, Line, Prepared, budget_tokens, select_window
from .vocab import Vocabulary
from .wide import GramCounts, line_grams, merge_grams

__all__ = [
    "MAX_LINES",
    "MAX_TOKENS",
    "Encoded",
    "batch_input",
    "encode_selected",
    "encode_window",
    "line_tokens",
    "window_tokens",
]

# 512 tokens hold a 40-line error block and the tail's last lines (the word TF-IDF's input).
MAX_TOKENS = 512


class _SeparatorEntry:
    """Stands for :data:`SEPARATOR_LINE` among prepared lines."""

    line = SEPARATOR_LINE
    template = None

    @staticmethod
    def tokens() -> list[str]:
        return [SEPARATOR]


_SEPARATOR: Any = _SeparatorEntry()


def window_tokens(window: LogWindow, max_tokens: int = MAX_TOKENS
                  ) -> tuple[list[str], list[int], list[Line]]:
    """(tokens, line index of each token, selected lines) of one window, at most
    ``max_tokens`` of them."""
    first, tail = select_window(window)
    selected = [*first, _SEPARATOR, *tail]
    tokens, owners = budget_tokens([p.tokens() for p in selected], len(first), max_tokens)
    return tokens, owners, [p.line for p in selected]


# The model reads at most 64 lines: the first error block's first 24 (where the root cause
# is), a separator, the tail's last ones (how the process died); each line's first 24 tokens.
MAX_LINES = 64
FIRST_LINES = 24
MAX_LINE_TOKENS = 24
MAX_LINE_GRAMS = 96
GRAM_BUCKETS = 1 << 14  # ModelConfig.gram_buckets of every model built here


@dataclass(frozen=True, slots=True, eq=False)
class Encoded:
    """One window as the model reads it: per line read, token ids (n, ``MAX_LINE_TOKENS``)
    and hashed 3-gram ids (n, ``MAX_LINE_GRAMS``), 0-padded; the wide n-gram counts of every
    selected line; the lines themselves (evidence maps attention to them). Only ``ids``
    depends on a vocabulary. ``keys`` (n,): per line read, what its features are shared by
    (its template's serial; 0 the separator; -1 a line of its own), for the per-model cache of
    line vectors (:mod:`.line_vectors`). Equal when every field but ``keys`` (an identity
    within one process, not content) is."""

    lines: list[Line]
    ids: np.ndarray
    grams: np.ndarray
    wide: list[GramCounts]  # per selected line, summed when batched
    keys: np.ndarray

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Encoded) and self.lines == other.lines
                and np.array_equal(self.ids, other.ids)
                and np.array_equal(self.grams, other.grams)
                and len(self.wide) == len(other.wide)
                and all(np.array_equal(a, b) for a, b in zip(self.wide, other.wide,
                                                             strict=True)))

    __hash__ = None  # type: ignore[assignment]  # arrays inside


def _padded(values: Sequence[int], width: int) -> np.ndarray:
    """``values`` as a read-only int64 row of ``width``, 0-padded (rows are shared)."""
    row = np.zeros(width, np.int64)
    row[: len(values)] = values
    row.flags.writeable = False
    return row


class _LineFeatures:
    """What a line contributes whatever the vocabulary: its tokens, 3-gram ids, wide counts."""

    __slots__ = ("tokens", "grams", "wide")

    def __init__(self, tokens: list[str], wide: GramCounts) -> None:
        self.tokens = tokens
        self.grams = _padded(list(itertools.islice(
            (g for t in tokens for g in _token_grams(t)), MAX_LINE_GRAMS)), MAX_LINE_GRAMS)
        self.wide = wide

    @classmethod
    def of(cls, p: Prepared) -> _LineFeatures:
        # Tokens without <nl> (lines are steps already); the wide counts from the template's
        # masked text: digits are folded, so every line of a template counts the same.
        return cls(p.tokens()[:-1][:MAX_LINE_TOKENS],
                   line_grams(p.line.masked if p.template is None else p.template.masked))


@functools.lru_cache(maxsize=1 << 16)
def _token_grams(token: str) -> tuple[int, ...]:
    t = f"<{token}>"
    return tuple(zlib.crc32(t[i : i + 3].encode()) % (GRAM_BUCKETS - 1) + 1
                 for i in range(max(1, len(t) - 2)))


_SEPARATOR_FEATURES = _LineFeatures([SEPARATOR], line_grams(""))


def _features(p: Prepared) -> _LineFeatures:
    """A line's features, kept with its template (computed once per template)."""
    if p is _SEPARATOR:
        return _SEPARATOR_FEATURES
    tpl = p.template
    if tpl is None:
        return _LineFeatures.of(p)
    features = tpl.features
    if not isinstance(features, _LineFeatures):
        features = tpl.features = _LineFeatures.of(p)
    return features


def _ids(p: Prepared, features: _LineFeatures, vocab: Vocabulary) -> np.ndarray:
    """A line's token ids as a padded row, kept with its template (one lookup per template
    and model)."""
    tpl = p.template
    if tpl is None:  # a line of the general path, or the separator
        return _padded(vocab.encode(features.tokens), MAX_LINE_TOKENS)
    ids = tpl.ids.get(vocab.serial)
    if ids is None:
        if len(tpl.ids) >= 4:  # models swapped in over time: keep the ids of the last few
            tpl.ids.clear()
        ids = tpl.ids[vocab.serial] = _padded(vocab.encode(features.tokens), MAX_LINE_TOKENS)
    return ids


T = TypeVar("T")


def model_lines(first: Sequence[T], tail: Sequence[T], separator: T) -> list[T]:
    """Of a selected window's lines (or anything kept beside them), those the model reads:
    see :data:`MAX_LINES`."""
    head = first[:FIRST_LINES]
    return [*head, separator, *tail[max(0, len(tail) - (MAX_LINES - 1 - len(head))):]]


def _key(p: Prepared) -> int:
    """What a line read shares its features with (see :attr:`Encoded.keys`)."""
    if p is _SEPARATOR:
        return 0
    return -1 if p.template is None else p.template.serial


def encode_selected(first: Sequence[Prepared], tail: Sequence[Prepared], vocab: Vocabulary
                    ) -> Encoded:
    """:class:`Encoded` of lines chosen by :func:`~.preprocess.select_prepared`."""
    first_features = [_features(p) for p in first]  # once per line: a line of the general
    tail_features = [_features(p) for p in tail]    # path has no template to keep them
    read = model_lines(first, tail, _SEPARATOR)
    features = model_lines(first_features, tail_features, _SEPARATOR_FEATURES)
    return Encoded([p.line for p in read],
                   np.stack([_ids(p, f, vocab) for p, f in zip(read, features, strict=True)]),
                   np.stack([f.grams for f in features]),
                   [f.wide for f in (*first_features, *tail_features)],
                   np.fromiter((_key(p) for p in read), np.int64, len(read)))


def encode_window(window: LogWindow, vocab: Vocabulary) -> Encoded:
    return encode_selected(*select_window(window), vocab)


def line_tokens(window: LogWindow) -> list[str]:
    """The tokens the model reads of ``window`` (what a vocabulary is built from)."""
    return [t for p in model_lines(*select_window(window), _SEPARATOR)
            for t in _features(p).tokens]


def batch_input(encoded: Sequence[Encoded], wide: bool = True) -> ModelInput:
    """The :class:`~.model.ModelInput` of windows (lines in a grid as wide as the most lines
    of any of them); without the wide path's counts unless ``wide`` (training the recurrent
    path does not read them; merging them is 6.5 of the 6.9 ms a batch of 64 takes to build)."""
    n_lines = [len(e.ids) for e in encoded]
    width = max(n_lines, default=1)
    slots = np.concatenate([np.arange(n) + b * width for b, n in enumerate(n_lines)]
                           or [np.zeros(0, np.int64)])
    return ModelInput(torch.from_numpy(np.concatenate([e.ids for e in encoded])),
                      torch.from_numpy(np.concatenate([e.grams for e in encoded])),
                      torch.tensor(n_lines), torch.from_numpy(slots),
                      *merge_grams([e.wide for e in encoded] if wide else []))
