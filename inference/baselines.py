"""Baselines the model must beat, behind the same :class:`~.api.Classifier` protocol.

- :class:`RegexRules`: what schedulers do today: retry when a transient-error pattern matches.
- :class:`TfidfLogReg`: TF-IDF over the model's own tokens (unigrams and bigrams) and a
  multinomial logistic regression over the categories, in torch (no scikit-learn dependency).
- :class:`CharTfidfLogReg`: the same regression over character 3-5-grams within words
  (scikit-learn's ``char_wb``) of the lines the model reads, digits and hex folded: robust to
  words no vocabulary has seen, the strongest cheap baseline on unseen projects.
- :class:`ConstantVerdict`: always retry, or never retry.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from .api import LogWindow, Prediction
from .features import window_tokens
from .preprocess import select_window
from .taxonomy import CATEGORIES, DETERMINISTIC, LABELS
from .vocab import Vocabulary
from .wide import char_ngrams, fit_softmax, fold_words

__all__ = ["TRANSIENT", "CharTfidfLogReg", "ConstantVerdict", "RegexRules", "TfidfLogReg"]

# A transient-error pattern of the kind cluster schedulers and retry wrappers use.
TRANSIENT = re.compile(
    r"(?i)time(?:d)? ?out|connection (?:reset|refused|closed|aborted)|broken pipe|"
    r"\bnccl\b|\becc\b|\bxid\b|killed|sigterm|sigkill|preempt|node fail|cancelled|"
    r"unavailable|stale file handle|input/output error|transport endpoint|"
    r"\b50[234]\b|\b429\b|too many requests|temporar|network|socket|rendezvous|unreachable"
)


def _text(window: LogWindow) -> list[str]:
    return [*window.first_error, *window.tail]


class RegexRules:
    """Nondeterministic when any line matches :data:`TRANSIENT`, else deterministic."""

    version = "regex-rules"

    def predict(self, windows: Sequence[LogWindow]) -> list[Prediction]:
        out = []
        for window in windows:
            hits = [line for line in _text(window) if TRANSIENT.search(line)]
            if hits:
                out.append(Prediction("nondeterministic", 1.0, "connection_error", hits[:3]))
            else:
                out.append(Prediction("deterministic", 1.0, "python_runtime_error", []))
        return out


class ConstantVerdict:
    """The same verdict for every window: always-retry or never-retry."""

    def __init__(self, verdict: str) -> None:
        if verdict not in LABELS:
            raise ValueError(verdict)
        self.verdict = verdict
        self.category = "python_runtime_error" if verdict == LABELS[0] else "connection_error"

    @property
    def version(self) -> str:
        return "never-retry" if self.verdict == LABELS[0] else "always-retry"

    def predict(self, windows: Sequence[LogWindow]) -> list[Prediction]:
        return [Prediction(self.verdict, 1.0, self.category, []) for _ in windows]  # type: ignore[arg-type]


def _ngrams(tokens: Sequence[str]) -> list[str]:
    return [*tokens, *(f"{a} {b}" for a, b in zip(tokens, tokens[1:], strict=False))]


class TfidfLogReg:
    """TF-IDF (sublinear tf, L2-normalised) + softmax regression over the 16 categories."""

    version = "tfidf-logreg"

    def __init__(self, l2: float = 1e-4, steps: int = 150, min_count: int = 2) -> None:
        self.l2, self.steps, self.min_count = l2, steps, min_count
        self.vocab: Vocabulary | None = None
        self.idf: list[float] | None = None  # looked up per n-gram: a list, not a tensor
        self.weight: torch.Tensor | None = None

    def _features(self, docs: Sequence[list[str]]) -> torch.Tensor:
        assert self.vocab is not None and self.idf is not None
        rows, cols, vals = [], [], []
        for r, doc in enumerate(docs):
            counts = Counter(i for i in self.vocab.encode(doc) if i > 1)
            norm = math.sqrt(sum(((1 + math.log(c)) * self.idf[i]) ** 2
                                 for i, c in counts.items())) or 1.0
            for i, c in counts.items():
                rows.append(r)
                cols.append(i)
                vals.append((1 + math.log(c)) * self.idf[i] / norm)
        indices = torch.tensor([rows, cols], dtype=torch.long).reshape(2, -1)
        return torch.sparse_coo_tensor(indices, torch.tensor(vals), (len(docs), len(self.vocab)),
                                       dtype=torch.float32, check_invariants=False).coalesce()

    @staticmethod
    def _docs(windows: Sequence[LogWindow]) -> list[list[str]]:
        return [_ngrams(window_tokens(w)[0]) for w in windows]

    def fit(self, windows: Sequence[LogWindow], categories: Sequence[str]) -> TfidfLogReg:
        docs = self._docs(windows)
        self.vocab = Vocabulary.build(docs, min_count=self.min_count, max_size=50000)
        df = Counter(i for doc in docs for i in set(self.vocab.encode(doc)))
        self.idf = [math.log((1 + len(docs)) / (1 + df.get(i, 0))) + 1
                    for i in range(len(self.vocab))]
        self.weight = fit_softmax(self._features(docs), categories, len(self.vocab), self.l2,
                                   self.steps)
        return self

    def predict(self, windows: Sequence[LogWindow]) -> list[Prediction]:
        if self.weight is None:
            raise RuntimeError("TfidfLogReg.predict before fit")
        return _decide_softmax(self._features(self._docs(windows)), self.weight, windows)


def _decide_softmax(x: torch.Tensor, weight: torch.Tensor, windows: Sequence[LogWindow]
                    ) -> list[Prediction]:
    """Verdict (the summed probability of the deterministic categories), confidence and the
    verdict's most likely category, per window; ``unknown``/``no_log`` for an empty one."""
    probs = torch.softmax(torch.sparse.mm(x, weight[:-1]) + weight[-1], dim=1)
    det = torch.tensor([c in DETERMINISTIC for c in CATEGORIES])
    out = []
    for row, window in zip(probs, windows, strict=True):
        if window.empty:
            out.append(Prediction("unknown", 0.0, "no_log", []))
            continue
        p_det = float(row[det].sum())
        label = LABELS[0] if p_det >= 0.5 else LABELS[1]
        allowed = row.masked_fill(det != (label == LABELS[0]), -1.0)
        category = CATEGORIES[int(allowed.argmax())]
        out.append(Prediction(label, round(max(p_det, 1 - p_det), 4), category, []))  # type: ignore[arg-type]
    return out


def _char_doc(window: LogWindow) -> Counter[str]:
    """Word counts of the lines the model reads (masked, lower-cased, digits and hex folded)."""
    first, tail = select_window(window)
    return Counter(fold_words("\n".join(p.line.masked for p in (*first, *tail))))


class CharTfidfLogReg:
    """Character 3-5-gram TF-IDF (sublinear tf, L2-normalised) + softmax regression."""

    version = "char-tfidf-logreg"

    def __init__(self, l2: float = 1e-5, steps: int = 150, min_count: int = 2,
                 max_features: int = 200_000) -> None:
        self.l2, self.steps, self.min_count, self.max_features = l2, steps, min_count, max_features
        self.index: dict[str, int] = {}
        self.idf: np.ndarray | None = None
        self.weight: torch.Tensor | None = None
        self._word_ids: dict[str, np.ndarray] = {}

    def _ids(self, word: str) -> np.ndarray:
        ids = self._word_ids.get(word)
        if ids is None:
            index = self.index
            ids = np.fromiter((index[g] for g in char_ngrams(word) if g in index), np.int64)
            if len(self._word_ids) < 1 << 18:
                self._word_ids[word] = ids
        return ids

    def _features(self, docs: Sequence[Counter[str]]) -> torch.Tensor:
        assert self.idf is not None
        rows, cols, vals = [], [], []
        for r, doc in enumerate(docs):
            parts = [(self._ids(w), c) for w, c in doc.items()]
            ids = np.concatenate([p for p, _ in parts] or [np.zeros(0, np.int64)])
            weights = np.concatenate([np.full(len(p), c, np.float64) for p, c in parts]
                                     or [np.zeros(0)])
            uniq, inverse = np.unique(ids, return_inverse=True)
            counts = np.bincount(inverse, weights=weights, minlength=len(uniq))
            tfidf = (1 + np.log(counts)) * self.idf[uniq] if len(uniq) else counts
            norm = float(np.sqrt((tfidf ** 2).sum())) or 1.0
            rows.append(np.full(len(uniq), r))
            cols.append(uniq)
            vals.append(tfidf / norm)
        indices = torch.from_numpy(np.stack([np.concatenate(rows or [np.zeros(0, np.int64)]),
                                             np.concatenate(cols or [np.zeros(0, np.int64)])]))
        return torch.sparse_coo_tensor(
            indices.long(), torch.from_numpy(np.concatenate(vals or [np.zeros(0)])).float(),
            (len(docs), len(self.index)), check_invariants=False).coalesce()

    def fit(self, windows: Sequence[LogWindow], categories: Sequence[str]) -> CharTfidfLogReg:
        docs = [_char_doc(w) for w in windows]
        df: Counter[str] = Counter()
        for doc in docs:
            df.update({g for w in doc for g in char_ngrams(w)})
        kept = sorted((g for g, c in df.items() if c >= self.min_count),
                      key=lambda g: (-df[g], g))[: self.max_features]
        self.index = {g: i for i, g in enumerate(kept)}
        self._word_ids = {}
        self.idf = np.array([math.log((1 + len(docs)) / (1 + df[g])) + 1 for g in kept])
        self.weight = fit_softmax(self._features(docs), categories, len(kept), self.l2,
                                   self.steps)
        return self

    def predict(self, windows: Sequence[LogWindow]) -> list[Prediction]:
        if self.weight is None:
            raise RuntimeError("CharTfidfLogReg.predict before fit")
        return _decide_softmax(self._features([_char_doc(w) for w in windows]), self.weight,
                               windows)
