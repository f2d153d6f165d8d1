"""Training: the default data recipe, the training loop, calibration and the threshold.

``train_model(examples, config)`` trains from scratch; ``train_model(examples, config,
init_from=checkpoint)`` fine-tunes a loaded model on extra labeled examples keeping its
vocabulary (what the online-learning loop calls), and ``save_checkpoint`` writes either.

Calibration: a temperature on the verdict logits minimising the validation NLL, then the
smallest confidence threshold whose validation precision of ``deterministic`` reaches
``target_precision``: a wrong ``do_not_retry`` kills a job that would have succeeded, so the
model must rather say ``unknown`` (the scheduler's default policy) than guess.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .api import LogWindow
from .checkpoint import Checkpoint
from .corpus import REAL_FILES, TRAIN_FILES, Record, load_records, packaged_path, split_by_source
from .engine import score_encoded, withheld
from .features import Encoded, batch_input, encode_window, line_tokens
from .model import ModelConfig, RecurrentClassifier
from .preprocess import window_from_text
from .synthetic import augment, generate
from .taxonomy import CATEGORIES, LABELS
from .vocab import Vocabulary
from .wide import fit_wide

__all__ = [
    "Example",
    "TrainConfig",
    "calibrate_temperature",
    "choose_threshold",
    "default_training_records",
    "examples_from_records",
    "held_out_files",
    "train_model",
    "with_overrides",
]

logger = logging.getLogger(__name__)


class Example(NamedTuple):
    """One labeled log; a plain ``(log_text, label, category)`` tuple also works."""

    log: str
    label: str
    category: str
    source: str = ""


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides the trained model (recorded in its metadata)."""

    seed: int = 1234
    threads: int = 1  # torch threads; more is slower when the cores are shared
    dim: int = 64
    dropout: float = 0.3
    word_dropout: float = 0.1  # tokens replaced by <oov> while training: robust to new words
    deep_weight: float = 0.2  # recurrent share of the served probabilities: bench/deep_weight.py
    epochs: int = 4
    batch_size: int = 32
    lr: float = 4e-3
    weight_decay: float = 1e-4
    synthetic: int = 4000  # generated logs, balanced over the 16 categories
    real_files: tuple[str, ...] = TRAIN_FILES  # the real logs trained on; the rest held out
    real_copies: int = 6  # augmented copies of each real training log
    val_fraction: float = 0.15  # by source: whole message templates / issue threads
    min_count: int = 3  # a token enters the vocabulary when seen in this many logs
    target_precision: float = 0.98
    min_threshold: float = 0.6
    max_abstention: float = 0.05  # on validation, whose new phrasings are harder than real logs
    # Once calibrated, the wide path is fitted again with the validation logs (False: fitted
    # on the training split only, the recipe of models lines-5565a06840af and before)
    wide_sees_validation: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> TrainConfig:
        """The config a checkpoint was trained with, from its metadata: defaults for fields it
        lacks (an older checkpoint), fields this version no longer has ignored."""
        raw = meta.get("train_config") or {}
        known = {f.name for f in fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()
                      if k in known})


def default_training_records(config: TrainConfig) -> list[Record]:
    """The synthetic logs plus the real training files named in ``config``, in a fixed order."""
    records = generate(config.synthetic, seed=config.seed)
    for name in config.real_files:
        records += load_records(packaged_path(name))
    return records


def held_out_files(meta: Mapping[str, Any]) -> list[Path]:
    """Every packaged real corpus file the model with metadata ``meta`` was not trained on:
    where its held-out scores (and its operating threshold) come from."""
    trained = set(TrainConfig.from_meta(meta).real_files)
    return [packaged_path(name) for name in REAL_FILES if name not in trained]


def examples_from_records(records: Sequence[Record]) -> list[Example]:
    return [Example(r.log, r.label, r.category, r.source) for r in records]


def _expand(examples: Sequence[Example], copies: int, rng: random.Random) -> list[Example]:
    """Real logs (source not synthetic) plus ``copies`` augmented copies of each."""
    out = []
    for ex in examples:
        out.append(ex)
        if not ex.source.startswith("synthetic/"):
            out += [ex._replace(log=augment(ex.log, rng)) for _ in range(copies)]
    return out


def _windows(examples: Sequence[Example]) -> list[LogWindow]:
    return [window_from_text(ex.log) for ex in examples]


def _targets(examples: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    verdict = torch.tensor([LABELS.index(ex.label) for ex in examples])
    category = torch.tensor([CATEGORIES.index(ex.category) for ex in examples])
    return verdict, category


def calibrate_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature in [0.5, 10] minimising the NLL of ``labels`` (grid search: robust)."""
    best, best_nll = 1.0, math.inf
    for t in torch.linspace(0.5, 10.0, 96).tolist():
        nll = torch.nn.functional.cross_entropy(logits / t, labels).item()
        if nll < best_nll:
            best, best_nll = t, nll
    return round(best, 4)


def choose_threshold(p_det: Sequence[float], labels: Sequence[int], target_precision: float,
                     floor: float, max_abstention: float = 1.0) -> float:
    """Smallest confidence (>= ``floor``) at which ``deterministic`` precision reaches target.

    ``p_det`` are calibrated probabilities of ``deterministic``, ``labels`` verdict indices
    (0 = deterministic). The threshold stops rising before more than ``max_abstention`` of the
    windows would be ``unknown``: a model that abstains on everything protects no one's GPUs.
    Only deterministic verdicts abstain (:func:`~.engine.withheld`).
    """
    steps = max(0, int(round((0.99 - floor) * 100)))  # none above 0.99: floor alone
    candidates = [floor] + [round(floor + i * 0.01, 2) for i in range(1, steps + 1)]
    previous = candidates[0]
    for t in candidates:
        abstaining = sum(withheld(LABELS[0], p, t) for p in p_det if p >= 0.5)
        if abstaining > max_abstention * len(p_det):
            return previous
        decided = [y for p, y in zip(p_det, labels, strict=True) if p >= t]
        if not decided or sum(y == 0 for y in decided) / len(decided) >= target_precision:
            return t
        previous = t
    return candidates[-1]


def _batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Length-bucketed batches in random order: similar lengths pad little."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    chunk = batch_size * 20
    out = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: lengths[i])
        out += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    rng.shuffle(out)
    return out


def _version(records_hash: str, config: TrainConfig) -> str:
    h = hashlib.sha256((records_hash + json.dumps(config.to_dict(), sort_keys=True)).encode())
    return f"lines-{h.hexdigest()[:12]}"


def train_model(examples: Sequence[Example | tuple[str, str, str]], config: TrainConfig,
                init_from: Checkpoint | None = None) -> Checkpoint:
    """Train (or fine-tune ``init_from``) on ``examples``; returns the calibrated checkpoint."""
    t0 = time.monotonic()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    exs = [Example(*ex) for ex in examples]
    exs = [ex if ex.source else ex._replace(source=hashlib.sha1(ex.log.encode()).hexdigest())
           for ex in exs]
    train_raw, val = _split(exs, config.val_fraction, str(config.seed))
    train = _expand(train_raw, config.real_copies, rng)
    train_windows = _windows(train)
    if init_from is not None:  # a copy: the original may be serving predictions right now
        vocab, model = init_from.vocab, copy.deepcopy(init_from.model)
    else:
        vocab = Vocabulary.build([line_tokens(w) for w in train_windows],
                                 min_count=config.min_count)
        model = RecurrentClassifier(ModelConfig(
            vocab_size=len(vocab), n_categories=len(CATEGORIES), dim=config.dim,
            dropout=config.dropout, deep_weight=config.deep_weight))
    train_enc = [encode_window(w, vocab) for w in train_windows]
    val_enc = [encode_window(w, vocab) for w in _windows(val)]
    written_enc: list[Encoded] = []  # the training logs as written (no augmented copies)
    if init_from is None:  # stage 1: the wide path, fitted alone on the logs as written
        written = {id(ex) for ex in train_raw}
        written_enc = [enc for ex, enc in zip(train, train_enc, strict=True) if id(ex) in written]
        _fit_wide_path(model, written_enc, train_raw)
    y_verdict, y_category = _targets(train)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=config.lr, weight_decay=config.weight_decay)
    best_state, best_loss = None, math.inf
    for epoch in range(config.epochs):
        model.train()
        total = 0.0
        for idx in _batches([len(e.ids) for e in train_enc], config.batch_size, rng):
            x = batch_input([train_enc[i] for i in idx], wide=False)
            x = x._replace(tokens=_word_dropout(x.tokens, config.word_dropout))
            _, loss = model(x, (y_verdict[idx], y_category[idx]))
            assert loss is not None
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            total += loss.item() * len(idx)
        val_loss = _val_loss(model, val_enc, val) if val else total / len(train)
        logger.info("epoch %d: train loss %.4f, val loss %.4f (%.0f s)", epoch + 1,
                    total / len(train), val_loss, time.monotonic() - t0)
        if val_loss < best_loss:
            best_loss = val_loss
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    meta = _calibrate(model, val_enc, val, config, init_from)
    if init_from is None and val and config.wide_sees_validation:
        # Calibrated, the wide path is fitted again on the validation logs too: it is convex
        # and needs no held-out logs to stop, and every real thread it reads helps on
        # projects it never saw (docs/classifier.md).
        _fit_wide_path(model, [*written_enc, *val_enc], [*train_raw, *val])
    records_hash = hashlib.sha256("\n".join(f"{e.label}\t{e.category}\t{e.log}"
                                            for e in exs).encode()).hexdigest()
    meta.update(version=_version(records_hash, config), data_hash=records_hash,
                train_config=config.to_dict(), n_train=len(train), n_val=len(val),
                trained_seconds=round(time.monotonic() - t0, 1),
                fine_tuned_from=init_from.meta.get("version") if init_from else None)
    return Checkpoint(model, vocab, meta)


def _fit_wide_path(model: RecurrentClassifier, encoded: Sequence[Encoded],
                   examples: Sequence[Example]) -> None:
    """Stage 1 (see :mod:`.model`): the wide path's idf and weights, fitted alone. A fine-tune
    keeps them: refitted on a few hundred new labels, the bag would forget the corpus."""
    idf, weight, bias = fit_wide([e.wide for e in encoded], [ex.category for ex in examples])
    with torch.no_grad():
        model.idf.copy_(idf)
        model.wide.weight.copy_(weight)
        model.wide_bias.copy_(bias)


def _word_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """``x`` with a fraction ``p`` of its real tokens replaced by the OOV id (1).

    Logs from other projects are full of words the vocabulary never saw; hiding known words at
    random during training teaches the model to decide from the words that remain.
    """
    if p <= 0:
        return x
    drop = (torch.rand(x.shape) < p) & (x > 1)
    return x.masked_fill(drop, 1)


def _split(exs: list[Example], fraction: float, salt: str) -> tuple[list[Example], list[Example]]:
    records = [Record(str(i), ex.source, "", ex.category, ex.label, "") for i, ex in enumerate(exs)]
    train, val = split_by_source(records, fraction, salt)
    return [exs[int(r.id)] for r in train], [exs[int(r.id)] for r in val]


def _val_loss(model: RecurrentClassifier, encoded: Sequence[Encoded],
              val: Sequence[Example]) -> float:
    """Verdict cross-entropy on the validation split: the decision that matters selects."""
    model.eval()
    logits = torch.tensor(score_encoded(model, encoded, batch_size=128).verdict_logits)
    return torch.nn.functional.cross_entropy(logits, _targets(val)[0]).item()


def _calibrate(model: RecurrentClassifier, encoded: Sequence[Encoded], val: Sequence[Example],
               config: TrainConfig, init_from: Checkpoint | None) -> dict[str, Any]:
    """Temperature and threshold from the validation split; a fine-tune's threshold may rise
    above its parent's but never fall below it.

    The parent's threshold was chosen on real logs of projects it never trained on (``sibylla
    train``); a fine-tune's validation slice is a few dozen examples, mostly replayed. Chosen
    afresh on the slice, the threshold fell towards the floor, and fine-tunes of the shipped
    model stopped many more transient failures of unseen projects
    (``bench/bench_finetune.py``). The temperature is still fitted on the slice: labels that
    contradict the model soften it, so it abstains more, which held precision in the drift
    experiment's noisy-label streams (docs/online_learning.md). A slice under 20 examples
    decides nothing: the parent's calibration is kept as it is."""
    parent = init_from.meta if init_from is not None else {}
    floor = float(parent.get("threshold", config.min_threshold))
    if len(val) < 20:
        return {"temperature": parent.get("temperature", 1.0), "threshold": floor}
    scores = score_encoded(model, encoded)
    logits = torch.tensor(scores.verdict_logits)
    labels, _ = _targets(val)
    temperature = calibrate_temperature(logits, labels)
    p_det = torch.softmax(logits / temperature, dim=1)[:, 0]
    threshold = choose_threshold(p_det.tolist(), labels.tolist(), config.target_precision,
                                 floor, config.max_abstention)
    accuracy = float(((p_det < 0.5).long() == labels).float().mean())
    return {"temperature": temperature, "threshold": threshold,
            "val_metrics": {"verdict_accuracy": round(accuracy, 4)}}


def with_overrides(config: TrainConfig, **overrides: Any) -> TrainConfig:
    """``config`` with the non-None ``overrides`` applied (for command-line flags)."""
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})

