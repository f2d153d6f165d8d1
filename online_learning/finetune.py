"""Fine-tuning the current model on new plus replayed examples (a wrapper around
``sibylla.inference.train.train_model(..., init_from=...)``).

The one thing added here: the vocabulary grows. A checkpoint's vocabulary is fixed at training
time, so the words of a failure phrasing the model never saw (a new library's exception name,
a new driver's banner) all map to ``<oov>`` and no amount of fine-tuning can tell them apart.
Tokens seen in at least ``min_count`` of the fine-tune's logs join the vocabulary; their
embedding rows start small and random, every other weight is copied, so the grown model
predicts exactly as the old one on old inputs until it is trained. The wide n-gram path needs no
vocabulary and is kept as fitted on the training corpus (see ``inference/train.py``). The
current checkpoint is never modified: the gate still needs it as the baseline.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence

import torch

from sibylla.inference.checkpoint import Checkpoint
from sibylla.inference.features import line_tokens
from sibylla.inference.model import RecurrentClassifier
from sibylla.inference.preprocess import window_from_text
from sibylla.inference.train import Example, TrainConfig, train_model
from sibylla.inference.vocab import Vocabulary

__all__ = ["fine_tune", "grow_vocabulary"]

log = logging.getLogger(__name__)

NEW_ROW_STD = 0.02  # new embedding rows: near zero, so they barely move the model untrained


def grow_vocabulary(checkpoint: Checkpoint, examples: Sequence[Example], min_count: int,
                    seed: int = 0) -> Checkpoint:
    """``checkpoint`` with the tokens seen in at least ``min_count`` of ``examples`` (as the
    model reads them when served) added to its vocabulary. New rows are drawn from a
    generator seeded with ``seed`` (the same labels make the same model); the model is shared
    when nothing is new (``train_model`` copies it before training)."""
    known = checkpoint.vocab.index
    counts: Counter[str] = Counter()
    for ex in examples:
        tokens = line_tokens(window_from_text(ex.log))
        counts.update({t for t in tokens if t not in known})
    new = sorted(t for t, c in counts.items() if c >= min_count)
    if not new:
        return checkpoint
    config = dataclasses.replace(checkpoint.model.config, vocab_size=len(known) + len(new))
    grown = RecurrentClassifier(config)
    state = dict(checkpoint.model.state_dict())  # load_state_dict below copies the tensors
    old = state["tokens.weight"]  # (V_old, E)
    rows = torch.randn(len(new), old.shape[1], generator=torch.Generator().manual_seed(seed))
    state["tokens.weight"] = torch.cat([old, rows * NEW_ROW_STD])
    grown.load_state_dict(state)
    grown.eval()
    log.info("vocabulary grows by %d tokens to %d", len(new), config.vocab_size)
    return Checkpoint(grown, Vocabulary(checkpoint.vocab.tokens + new), dict(checkpoint.meta))


def fine_tune(checkpoint: Checkpoint, examples: Sequence[Example], epochs: int, lr: float,
              seed: int = 0) -> Checkpoint:
    """A new checkpoint: ``checkpoint`` (vocabulary grown) trained further on ``examples``.

    Labels are real logs, but the stream already varies them, so no augmented copies are made
    (``real_copies=0``): a fine-tune costs one pass per example per epoch. The vocabulary
    grows by the checkpoint's own ``min_count``.
    """
    config = dataclasses.replace(TrainConfig.from_meta(checkpoint.meta), epochs=epochs, lr=lr,
                                 seed=seed, real_copies=0, synthetic=0, real_files=())
    base = grow_vocabulary(checkpoint, examples, config.min_count, seed)
    return train_model(examples, config, init_from=base)
