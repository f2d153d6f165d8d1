"""Tiny models and logs for the online-learning tests (seconds to build, not minutes)."""

from __future__ import annotations

from sibylla.inference.checkpoint import Checkpoint
from sibylla.inference.features import line_tokens
from sibylla.inference.model import ModelConfig, RecurrentClassifier
from sibylla.inference.preprocess import window_from_text
from sibylla.inference.synthetic import generate
from sibylla.inference.taxonomy import CATEGORIES
from sibylla.inference.train import Example, examples_from_records
from sibylla.inference.vocab import Vocabulary
from sibylla.schemas.records import Label, Vote
from tests.inference.fixtures import NCCL_LOG, OOM_LOG

__all__ = ["NCCL_LOG", "OOM_LOG", "examples", "label", "tiny_checkpoint"]

def examples(n: int, seed: int = 0) -> list[Example]:
    return examples_from_records(generate(n, seed=seed))


def tiny_checkpoint(train: list[Example], version: str = "tiny-0") -> Checkpoint:
    """An untrained eight-dimensional model whose vocabulary comes from ``train``."""
    vocab = Vocabulary.build([line_tokens(window_from_text(ex.log)) for ex in train],
                             min_count=2)
    config = ModelConfig(vocab_size=len(vocab), n_categories=len(CATEGORIES), dim=8,
                         dropout=0.0)
    meta = {"version": version, "threshold": 0.5,
            "train_config": {"dim": 8, "batch_size": 32}}
    return Checkpoint(RecurrentClassifier(config).eval(), vocab, meta)


def label(job: str, attempt: int, verdict: str, log: str = OOM_LOG, sources: tuple[str, ...] = (
          "outcome", "model:gru"), at: float = 1000.0) -> Label:
    votes = [Vote(s, verdict, 1.0) for s in sources]  # type: ignore[arg-type]
    return Label(job, attempt, verdict, votes, log, "", at)  # type: ignore[arg-type]
