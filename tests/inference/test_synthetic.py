"""The synthetic corpus: every category, deterministic, realistic, label-safe augmentation."""

from __future__ import annotations

import random
from collections import Counter

from sibylla.inference.api import is_error_start
from sibylla.inference.corpus import split_by_source
from sibylla.inference.synthetic import augment, generate
from sibylla.inference.synthetic_messages import MESSAGES
from sibylla.inference.taxonomy import CATEGORIES, label_of


def test_same_seed_same_corpus_other_seed_other_corpus() -> None:
    assert generate(40, seed=1) == generate(40, seed=1)
    assert generate(40, seed=1) != generate(40, seed=2)


def test_every_category_is_generated_with_its_label() -> None:
    records = generate(len(CATEGORIES) * 5, seed=0)
    counts = Counter(r.category for r in records)
    assert set(counts) == set(CATEGORIES) and len(set(counts.values())) == 1
    assert all(r.label == label_of(r.category) for r in records)


def test_every_category_has_several_phrasings() -> None:
    assert set(MESSAGES) == set(CATEGORIES)
    assert all(len(templates) >= 10 for templates in MESSAGES.values())


def test_logs_look_like_failed_jobs() -> None:
    records = generate(200, seed=5)
    assert sum(any(is_error_start(line) for line in r.log.splitlines()) for r in records) > 190
    text = "\n".join(r.log for r in records)
    for marker in ("Traceback (most recent call last):", "[rank", "it/s", "ChildFailedError",
                   "srun: error", "mpirun"):
        assert marker in text, marker
    assert len({r.framework for r in records}) >= 6


def test_augmentation_varies_the_text_but_keeps_the_cause() -> None:
    rng = random.Random(0)
    log = "step 1 loss 0.5\nstep 2 loss 0.4\nOSError: [Errno 116] Stale file handle"
    variants = {augment(log, rng) for _ in range(30)}
    assert len(variants) > 5
    assert all("Stale file handle" in v for v in variants)


def test_split_by_source_holds_out_whole_templates() -> None:
    records = generate(400, seed=2)
    train, test = split_by_source(records, 0.2)
    assert test and train
    assert not {r.source for r in train} & {r.source for r in test}
