"""Micro-batched inference: the :class:`~.api.Classifier` the stream agents call.

Windows arrive in micro-batches of very different lengths (a two-line ``Killed`` next to a
64-line traceback). Padding them all to the longest wastes most of a recurrent pass, so the
windows are sorted by line count and cut into buckets of similar length; each bucket is one
forward pass. On CUDA the model runs in half precision. ``predict`` blocks: agents call it from
a worker thread, never from the event loop.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .api import LogWindow, Prediction, VerdictLabel, is_error_start
from .checkpoint import Checkpoint, load_checkpoint
from .features import Encoded, batch_input, encode_window
from .line_vectors import LineVectors
from .model import RecurrentClassifier
from .preprocess import Line
from .taxonomy import CATEGORIES, DETERMINISTIC, LABELS

__all__ = [
    "NO_LOG",
    "ModelClassifier",
    "VerdictScores",
    "at_threshold",
    "load_classifier",
    "pick_device",
    "score_encoded",
    "withheld",
]

logger = logging.getLogger(__name__)

NO_LOG = "no_log"  # category of a window with no lines at all
EVIDENCE_LINES = 3


def pick_device(device: str = "auto") -> torch.device:
    """CUDA when asked for or (``auto``) present, else CPU."""
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda but no CUDA device is available")
        return torch.device("cuda")
    if device not in ("auto", "cpu"):
        raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
    return torch.device("cpu")


class VerdictScores:
    """Per-window outputs of one scoring pass, in input order (numpy-free lists)."""

    def __init__(self, n: int) -> None:
        # verdict_logits: log-probabilities (the model's served output); any logits will do
        self.verdict_logits: list[list[float]] = [[0.0, 0.0]] * n
        self.category_probs: list[list[float]] = [[0.0] * len(CATEGORIES)] * n
        self.attention: list[list[float]] = [[] for _ in range(n)]


@torch.inference_mode()
def score_encoded(model: RecurrentClassifier, encoded: Sequence[Encoded], batch_size: int = 64,
                  device: torch.device | None = None, lines: LineVectors | None = None
                  ) -> VerdictScores:
    """Run ``model`` over encoded windows in batches of at most ``batch_size`` windows of
    similar line counts; ``lines``: the model's cache of line vectors, if it keeps one."""
    device = device or next(model.parameters()).device
    out = VerdictScores(len(encoded))
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].ids))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        x = batch_input([encoded[i] for i in idx]).to(device)
        read = None if lines is None else lines(x, np.concatenate([encoded[i].keys
                                                                  for i in idx]))
        logits, _ = model(x, read=read)
        verdict = logits.verdict.float().cpu().tolist()
        category = logits.category.float().exp().cpu().tolist()
        attention = logits.attention.float().cpu().tolist()
        for row, i in enumerate(idx):
            out.verdict_logits[i] = verdict[row]
            out.category_probs[i] = category[row]
            out.attention[i] = attention[row][: len(encoded[i].ids)]
    return out


def _softmax2(logits: Sequence[float], temperature: float) -> tuple[float, float]:
    a, b = logits[0] / temperature, logits[1] / temperature
    m = max(a, b)
    ea, eb = math.exp(a - m), math.exp(b - m)
    return ea / (ea + eb), eb / (ea + eb)


# The line that states a failure: an exception raised (``KeyError: (1, 2)``,
# ``torch.OutOfMemoryError: CUDA out of memory``), possibly behind a rank or logger prefix, or
# an error banner. Not the frames, source lines or imports of a traceback, nor GPU banners.
_EXCEPTION_LINE = re.compile(
    r"^(?:\[[^\]]*\]:?\s*|\w+:\s+)?(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b"
    r"|\b[A-Z]\w*(?:Error|Exception)(?::\s|$)")
# Failures stated without an exception: a glog-style line at level E or F (Caffe's
# ``F0601 10:27:47.313387 4577 math_functions.cpp:91] Check failed``, TensorFlow's
# ``2018-05-09 09:37:18.401486: E tensorflow/.../cuda_event.cc:49]``, torch elastic's
# ``E0325 20:57:27.620000 2606 .../api.py:869] failed (exitcode: -9)``, torch's C++
# ``[E421 02:05:38.764490322 ProcessGroupGloo.cpp:143]`` and ``[E ProcessGroupNCCL.cpp:341]``),
# and a loss gone NaN.
_LOGGED_FAILURE = re.compile(
    r"(?:^|[\[\s:])[EF]\d{3,4} \d\d:\d\d:\d\d\.\d+(?:\s+\d+)? [^\]\s]+:\d+\]"
    r"|\[[EF] [^\]\s]+:\d+\]"
    r"|\d\d:\d\d:\d\d\.\d+: [EF] [^\]\s]+:\d+\]"
    r"|(?i:\bloss\w*\s*(?:[:=]|is)\s*nan\b)")


def _logged_failure(text: str) -> bool:
    """:data:`_LOGGED_FAILURE`, behind literals every match holds (a search costs more)."""
    return (("]" in text or "oss" in text or "OSS" in text)
            and _LOGGED_FAILURE.search(text) is not None)


_NOT_A_CAUSE = re.compile(r"^(?:Traceback \(most recent|File \"|from \S+ import |import \S|"
                          r"During handling of|The above exception)")
# NCCL states what went wrong on the line after ``Last error:`` (``Duplicate GPU detected``,
# ``Error while creating shared memory segment``): the header's attention is that line's.
_ANNOUNCES_NEXT = "Last error:"


def _root_line(lines: Sequence[Line]) -> int | None:
    """Index of the first line that states the failure: the first exception or logged failure
    (:data:`_LOGGED_FAILURE`), else the first error-opening line that is not a traceback's
    header (see :data:`ERROR_START`)."""
    fallback = None
    for i, line in enumerate(lines):
        text = line.shown
        if not text or _NOT_A_CAUSE.match(text):
            continue
        if _EXCEPTION_LINE.search(text) or _logged_failure(text):
            return i
        if fallback is None and is_error_start(text):
            fallback = i
    return fallback


def _is_frame_source(text: str, previous: str) -> bool:
    """A traceback's source line (the code under a ``File "..."`` frame), which shows where a
    failure passed, not what it was; a ``raise`` or ``assert`` line may be the cause."""
    return (previous.startswith('File "') and not _EXCEPTION_LINE.search(text)
            and not text.startswith(("raise ", "assert ")))


def _evidence(enc: Encoded, attention: Sequence[float]) -> list[str]:
    """The line stating the failure (:func:`_root_line`: attention alone often picks a GPU
    banner or an import of the traceback) and the lines that received most attention, bar a
    traceback's header, frames, source lines and imports, and a header announcing the next
    line (:data:`_ANNOUNCES_NEXT`), in log order, at most :data:`EVIDENCE_LINES`."""
    weight: dict[int, float] = {}
    previous, announced = "", 0.0
    for i, w in enumerate(attention):
        shown = enc.lines[i].shown
        if shown.endswith(_ANNOUNCES_NEXT):
            announced = w
        elif shown and not _NOT_A_CAUSE.match(shown) and not _is_frame_source(shown, previous):
            weight[i], announced = max(w, announced), 0.0
        previous = shown
    root = _root_line(enc.lines)
    chosen = [] if root is None else [root]
    for i in sorted(weight, key=weight.__getitem__, reverse=True):
        if len(chosen) >= EVIDENCE_LINES:
            break
        if i != root:
            chosen.append(i)
    return [enc.lines[i].shown for i in sorted(chosen)]


def withheld(verdict: str, confidence: float, threshold: float) -> bool:
    """Whether a ``verdict`` this confident is withheld (``unknown``) at ``threshold``.

    Only ``do_not_retry`` needs the threshold. A wrong one kills a job a retry would have
    saved; a wrong ``retry`` costs one more attempt, and the policy with memory stops a root
    that recurs (policy.py). Abstaining on a transient lean bought no precision and sent the
    job to the site's default policy, which on the clusters Sibylla is for (they retry
    blindly) retries it anyway: in the cross-validation of every real log it took more than
    half of the abstention budget that the surest ``do_not_retry`` needed
    (docs/classifier.md). A site that does not retry failed jobs sets a floor for ``retry``
    (``min_retry_confidence``, streams/policy.py)."""
    return verdict == LABELS[0] and confidence < threshold


def at_threshold(prediction: Prediction, threshold: float) -> Prediction:
    """``prediction`` as decided at ``threshold`` (:func:`withheld`): ``unknown`` when
    withheld, its category and evidence kept (they say what the model leaned to)."""
    if not withheld(prediction.verdict, prediction.confidence, threshold):
        return prediction
    return dataclasses.replace(prediction, verdict="unknown")


# Category indices of each verdict: a prediction's category agrees with its verdict.
_DET_CATEGORIES = [i for i, c in enumerate(CATEGORIES) if c in DETERMINISTIC]
_NONDET_CATEGORIES = [i for i, c in enumerate(CATEGORIES) if c not in DETERMINISTIC]


class ModelClassifier:
    """A loaded recurrent model behind the :class:`~.api.Classifier` protocol."""

    def __init__(self, checkpoint: Checkpoint, device: str = "auto", min_confidence: float = 0.0,
                 batch_size: int = 64) -> None:
        self.device = pick_device(device)
        model = checkpoint.model
        if self.device.type != "cpu":  # moving and halving are in place: leave the caller's
            model = copy.deepcopy(model)  # checkpoint on the CPU in float32 (fine-tunes copy it)
        self.model = model.to(self.device).eval()
        if self.device.type == "cuda":
            self.model.half()
        self.vocab = checkpoint.vocab
        self.meta: dict[str, Any] = checkpoint.meta
        self.temperature = float(self.meta.get("temperature", 1.0))
        self.threshold = min_confidence or float(self.meta.get("threshold", 0.5))
        self.batch_size = batch_size
        self._lock = threading.Lock()  # one forward pass at a time per model
        self._lines = LineVectors(self.model)  # each template's line vector, once

    @property
    def version(self) -> str:
        return str(self.meta.get("version", "unversioned"))

    def with_threshold(self, threshold: float) -> ModelClassifier:
        """The same model deciding at another confidence threshold (0: never abstain)."""
        other = copy.copy(self)
        other.threshold = threshold
        return other

    def predict(self, windows: Sequence[LogWindow]) -> list[Prediction]:
        return self.predict_encoded([None if w.empty else  # "no log": no verdict
                                     encode_window(w, self.vocab) for w in windows])

    def predict_encoded(self, encoded: Sequence[Encoded | None]) -> list[Prediction]:
        """:meth:`predict` of windows already encoded with this model's vocabulary (e.g. by an
        :class:`~.incremental.IncrementalFeatures`); None stands for an empty window."""
        live = [i for i, enc in enumerate(encoded) if enc is not None]
        with self._lock:
            scores = score_encoded(self.model, [encoded[i] for i in live],  # type: ignore[misc]
                                   self.batch_size, self.device, self._lines)
        out = [Prediction("unknown", 0.0, NO_LOG, []) for _ in encoded]
        for row, i in enumerate(live):
            enc = encoded[i]
            assert enc is not None
            out[i] = self._decide(enc, scores.verdict_logits[row], scores.category_probs[row],
                                  scores.attention[row])
        return out

    def _decide(self, enc: Encoded, verdict_logits: Sequence[float],
                category_probs: Sequence[float], attention: Sequence[float]) -> Prediction:
        p_det, p_nondet = _softmax2(verdict_logits, self.temperature)
        label = LABELS[0] if p_det >= p_nondet else LABELS[1]
        confidence = max(p_det, p_nondet)
        # The category agrees with the verdict: the most likely category of that verdict.
        is_det = label == LABELS[0]
        allowed = _DET_CATEGORIES if is_det else _NONDET_CATEGORIES
        category = CATEGORIES[max(allowed, key=lambda i: category_probs[i])]
        verdict: VerdictLabel = "deterministic" if is_det else "nondeterministic"
        return at_threshold(Prediction(verdict, round(confidence, 4), category,
                                       _evidence(enc, attention)), self.threshold)


def load_classifier(model_path: str | None = None, device: str = "auto",
                    min_confidence: float = 0.0) -> ModelClassifier:
    """The classifier the pipeline uses: the shipped model unless ``model_path`` names one.

    ``min_confidence`` 0 keeps the threshold calibrated at training time; raises
    :class:`~.checkpoint.ModelLoadError` when the file cannot be used.
    """
    checkpoint = load_checkpoint(model_path or None)
    classifier = ModelClassifier(checkpoint, device=device, min_confidence=min_confidence)
    logger.info("loaded classifier %s on %s (threshold %.3f)", classifier.version,
                classifier.device, classifier.threshold)
    return classifier
