"""The wide path: hashed character 3-5-grams of the words a window's lines say.

On logs of projects a model never trained on, the strongest single reader measured here is a
plain softmax regression over the character n-grams of the window's words (scikit-learn's
``char_wb``: a word padded with spaces, every 3-, 4- and 5-gram, digits and hex folded): an
exception name never seen whole still shares ``rror``, ``imeout``, ``ccl`` with ones seen.
The recurrent path adds what a bag cannot see (which line came first, what a line sits next
to); the model averages the two (:class:`~.model.RecurrentClassifier`).

The n-grams are hashed into a fixed number of buckets, so a model needs no n-gram vocabulary
and new words cost nothing. A line's bucket counts are computed once per line template and
summed per window, so the stream can build them as lines arrive.
"""

from __future__ import annotations

import functools
import re
import warnings
import zlib
from collections.abc import Sequence

import numpy as np
import torch

from .taxonomy import CATEGORIES

__all__ = [
    "WIDE_BUCKETS",
    "GramCounts",
    "char_ngrams",
    "fit_softmax",
    "fit_wide",
    "fold_words",
    "line_grams",
    "merge_grams",
    "tfidf_weights",
]

# Scores as 2^18 and 2^22 do on the held-out logs; 4 MB of weights; ids fit 16 bits.
WIDE_BUCKETS = 1 << 16

# Hex words and digits folded: a run of digits is one ``0``, a hex word (``0x...``, or 8+ hex
# characters with a digit) ``0x``: addresses and ids say nothing about the failure.
_HEX_WORD = re.compile(r"\b0x[0-9a-f]+\b|\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b")
_DIGITS = re.compile(r"\d+")

# One line's or window's bucket counts: a (2, n) int64 array, bucket ids ascending over counts.
GramCounts = np.ndarray
_EMPTY: GramCounts = np.zeros((2, 0), np.int64)
_EMPTY.flags.writeable = False


def fold_words(masked: str) -> list[str]:
    """The words of a masked line (or lines), lower-cased, digits and hex words folded."""
    return _DIGITS.sub("0", _HEX_WORD.sub("0x", masked.lower())).split()


@functools.lru_cache(maxsize=1 << 17)
def char_ngrams(word: str, low: int = 3, high: int = 5) -> tuple[str, ...]:
    """scikit-learn's ``char_wb`` n-grams of one word: the word padded with a space each side,
    every n-gram for n in [low, high]; a word shorter than n gives itself once."""
    padded = f" {word} "
    out = []
    for n in range(low, high + 1):
        if len(padded) <= n:
            out.append(padded)
            continue
        out.extend(padded[i : i + n] for i in range(len(padded) - n + 1))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 17)
def _word_buckets(word: str) -> tuple[int, ...]:
    return tuple(zlib.crc32(g.encode()) % WIDE_BUCKETS for g in char_ngrams(word))


def line_grams(masked: str) -> GramCounts:
    """Bucket counts of one masked line's words (read-only: templates share them)."""
    counts: dict[int, int] = {}
    for word in fold_words(masked):
        for b in _word_buckets(word):
            counts[b] = counts.get(b, 0) + 1
    if not counts:
        return _EMPTY
    ids = sorted(counts)
    out = np.array([ids, [counts[b] for b in ids]], np.int64)
    out.flags.writeable = False
    return out


def merge_grams(windows: Sequence[Sequence[GramCounts]]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bucket ids, offsets, counts, row of each id) of windows given as their lines' counts:
    each window's lines summed per bucket, laid out as an ``EmbeddingBag`` takes them.

    Per window, a stable argsort of 16-bit bucket ids (numpy sorts them by radix, in linear
    time) and a sum per run: 9 ms instead of 32 for 64 pipeline-shaped windows, against one
    ``torch.unique`` of the whole batch's 64-bit keys.
    """
    ids_out, counts_out = [], []
    for lines in windows:
        both = np.concatenate(lines, axis=1) if lines else _EMPTY
        ids = both[0].astype(np.uint16)
        order = np.argsort(ids, kind="stable")
        ids, counts = ids[order], both[1][order]
        if len(ids):
            starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
            ids, counts = ids[starts], np.add.reduceat(counts, starts)
        ids_out.append(ids)
        counts_out.append(counts)
    lengths = torch.tensor([len(i) for i in ids_out], dtype=torch.long)
    return (torch.from_numpy(np.concatenate(ids_out or [np.zeros(0, np.uint16)])
                             .astype(np.int64)),
            torch.cumsum(lengths, 0) - lengths,
            torch.from_numpy(np.concatenate(counts_out or [np.zeros(0, np.int64)])).float(),
            torch.repeat_interleave(torch.arange(len(windows)), lengths))


def tfidf_weights(ids: torch.Tensor, counts: torch.Tensor, rows: torch.Tensor, n: int,
                  idf: torch.Tensor) -> torch.Tensor:
    """Per bucket of :func:`merge_grams`: sublinear tf times idf, each window's weights
    L2-normalised (as scikit-learn's TF-IDF)."""
    weights = (1 + torch.log(counts)) * idf[ids].float()
    norms = torch.zeros(n, device=weights.device).index_add_(0, rows, weights * weights).sqrt()
    return weights / norms.clamp_min(1e-12)[rows]


def fit_softmax(x: torch.Tensor, categories: Sequence[str], n_features: int, l2: float,
                steps: int) -> torch.Tensor:
    """Weights (features + 1 bias row, categories) of an L2-regularised softmax regression,
    full-batch Adam with the gradient written out: CSR products both ways are ~10x faster on a
    CPU than autograd through a sparse COO product."""
    y = torch.nn.functional.one_hot(torch.tensor([CATEGORIES.index(c) for c in categories]),
                                    len(CATEGORIES)).float()
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        x_csr = x.coalesce().to_sparse_csr()
        xt_csr = x.coalesce().t().coalesce().to_sparse_csr()
    weight = torch.zeros(n_features, len(CATEGORIES))
    bias = torch.zeros(len(CATEGORIES))
    weight.grad, bias.grad = torch.zeros_like(weight), torch.zeros_like(bias)
    opt = torch.optim.Adam([weight, bias], lr=0.1)
    n = max(1, x.shape[0])
    for _ in range(steps):
        probs = torch.softmax(x_csr @ weight + bias, dim=1)
        residual = (probs - y) / n  # d(mean cross-entropy) / d(logits)
        weight.grad = xt_csr @ residual + 2 * l2 * weight
        bias.grad = residual.sum(0)
        opt.step()
    return torch.cat([weight, bias[None]], dim=0)


def fit_wide(windows: Sequence[Sequence[GramCounts]], categories: Sequence[str],
             min_count: int = 2, l2: float = 1e-5, steps: int = 150
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(idf, weight (buckets, categories), bias) of the wide path fitted alone on ``windows``
    (each its lines' counts): a bucket seen in fewer than ``min_count`` windows weighs nothing
    (one log's own words)."""
    ids, _, counts, rows = merge_grams(windows)
    df = torch.bincount(ids, minlength=WIDE_BUCKETS).float()
    idf = torch.where(df >= min_count, torch.log((1 + len(windows)) / (1 + df)) + 1,
                      torch.zeros(()))
    weights = tfidf_weights(ids, counts, rows, len(windows), idf)
    x = torch.sparse_coo_tensor(torch.stack([rows, ids]), weights, (len(windows), WIDE_BUCKETS),
                                check_invariants=False)
    fitted = fit_softmax(x, categories, WIDE_BUCKETS, l2, steps)
    return idf, fitted[:-1], fitted[-1]
