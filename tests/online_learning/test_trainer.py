"""The trainer: where labels go, when it fine-tunes, and that only a good candidate is promoted."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from sibylla.inference.checkpoint import Checkpoint
from sibylla.inference.train import Example
from sibylla.online_learning.finetune import fine_tune, grow_vocabulary
from sibylla.online_learning.settings import OnlineSettings
from sibylla.online_learning.store import ModelStore
from sibylla.online_learning.trainer import Trainer
from tests.online_learning.fixtures import NCCL_LOG, examples, label, tiny_checkpoint

SETTINGS = OnlineSettings(finetune_every=4, drift_min_labels=2, drift_window=10,
                          holdout_every=1_000_000, replay_size=50)


def leaning(checkpoint: Checkpoint, verdict_bias: tuple[float, float], version: str
            ) -> Checkpoint:
    """A copy whose verdict head always says one thing, confidently."""
    out = copy.deepcopy(checkpoint)
    with torch.no_grad():
        out.model.verdict_head.weight.zero_()
        out.model.verdict_head.bias.copy_(torch.tensor(verdict_bias))
    out.meta = {**out.meta, "version": version}
    return out


@pytest.fixture
def base() -> Checkpoint:
    return leaning(tiny_checkpoint(examples(32)), (-8.0, 8.0), "base-0")  # nondeterministic


def trainer(tmp_path: Path, base: Checkpoint, candidate: Checkpoint,
            settings: OnlineSettings = SETTINGS) -> Trainer:
    def tune(cp: Checkpoint, exs: Sequence[Example], epochs: int, lr: float, seed: int
             ) -> Checkpoint:
        return candidate

    validation = [Example(NCCL_LOG, "nondeterministic", "collective_timeout")] * 4
    return Trainer(settings, ModelStore(tmp_path), base, validation, tune=tune)


def test_labels_fill_new_until_a_fine_tune_is_due(tmp_path: Path, base: Checkpoint) -> None:
    t = trainer(tmp_path, base, base)
    uses = [t.add_label(label(f"j{i}", 0, "nondeterministic", log=NCCL_LOG)) for i in range(3)]
    assert uses == ["new"] * 3 and t.due() is None
    assert t.add_label(label("j-models-only", 0, "nondeterministic", sources=("model:a",))) \
        == "replay"  # the models' own echo never counts as new
    assert t.add_label(label("j-empty", 0, "deterministic", log="")) == "skipped"
    t.add_label(label("j3", 0, "nondeterministic", log=NCCL_LOG))
    assert t.due() == "labels"


def test_disagreement_between_committee_and_outcomes_triggers_drift(tmp_path: Path,
                                                                   base: Checkpoint) -> None:
    t = trainer(tmp_path, base, base)
    for i in range(2):
        lab = label(f"j{i}", 0, "nondeterministic", log=NCCL_LOG)
        lab.votes[1] = type(lab.votes[1])("model:gru", "deterministic", 0.5)
        t.add_label(lab)
    assert t.drift == 1.0 and t.due() == "drift"


def test_a_candidate_no_worse_is_promoted_and_stored(tmp_path: Path, base: Checkpoint) -> None:
    t = trainer(tmp_path, base, leaning(base, (-8.0, 8.0), "cand-1"))
    for i in range(4):
        t.add_label(label(f"j{i}", 0, "nondeterministic", log=NCCL_LOG))
    report = t.step("labels")
    assert report.result.promote and report.n_new == 4
    store = ModelStore(tmp_path)  # re-read from disk: what `sibylla models list` shows
    assert store.current is not None and store.current.version == "cand-1"
    assert store.current.parent == "base-0" and store.current.sha256
    assert t.classifier.version == "cand-1" and not t.new


def test_a_worse_candidate_is_rejected_and_the_current_model_stays(tmp_path: Path,
                                                                   base: Checkpoint) -> None:
    t = trainer(tmp_path, base, leaning(base, (8.0, -8.0), "bad-1"))
    for i in range(4):
        t.add_label(label(f"j{i}", 0, "deterministic"))  # an adversarial burst
    report = t.step("labels")
    assert not report.result.promote
    assert any("accuracy" in r for r in report.result.reasons)
    store = ModelStore(tmp_path)
    assert store.current is not None and store.current.version == "base-0"
    assert [e.status for e in store.entries()] == ["base", "rejected"]
    assert t.classifier.version == "base-0"


def test_a_restarted_trainer_resumes_from_the_promoted_model(tmp_path: Path,
                                                             base: Checkpoint) -> None:
    t = trainer(tmp_path, base, leaning(base, (-8.0, 8.0), "cand-1"))
    for i in range(4):
        t.add_label(label(f"j{i}", 0, "nondeterministic", log=NCCL_LOG, at=100.0 + i))
    t.step("labels")
    again = trainer(tmp_path, base, base)
    assert again.classifier.version == "cand-1"
    # Labels it was trained on come back from the topic: replay only, not new.
    assert again.add_label(label("j0", 0, "nondeterministic", log=NCCL_LOG, at=100.0)) == "replay"


def test_fine_tune_grows_the_vocabulary_and_leaves_the_current_model_alone() -> None:
    train = examples(32)
    current = tiny_checkpoint(train)
    before = {k: v.clone() for k, v in current.model.state_dict().items()}
    novel = [Example(f"FrobnicatorFault: zorblax quux failed on {i}\n" + NCCL_LOG,
                     "nondeterministic", "collective_timeout", f"n{i}") for i in range(30)]
    grown = grow_vocabulary(current, novel, min_count=3)
    assert "zorblax" in grown.vocab.index and "zorblax" not in current.vocab.index
    candidate = fine_tune(current, novel + train[:10], epochs=1, lr=1e-3)
    assert candidate.meta["version"] != current.meta["version"]
    assert candidate.meta["fine_tuned_from"] == current.meta["version"]
    assert all(torch.equal(v, before[k]) for k, v in current.model.state_dict().items())


def test_after_a_rollback_the_trainer_fine_tunes_the_rolled_back_model(
        tmp_path: Path, base: Checkpoint) -> None:
    seen: list[str] = []

    def tune(cp: Checkpoint, exs: Sequence[Example], epochs: int, lr: float, seed: int
             ) -> Checkpoint:
        seen.append(cp.meta["version"])
        return leaning(base, (-8.0, 8.0), f"cand-{len(seen)}")

    validation = [Example(NCCL_LOG, "nondeterministic", "collective_timeout")]
    t = Trainer(SETTINGS, ModelStore(tmp_path), base, validation, tune=tune)
    for round_ in range(2):
        for i in range(4):
            t.add_label(label(f"j{round_}-{i}", 0, "nondeterministic", log=NCCL_LOG,
                              at=100.0 * (round_ + 1) + i))
        if round_ == 0:
            t.step("labels")
            ModelStore(tmp_path).set_current("base-0")  # the operator's `models rollback`
    t.step("labels")
    assert seen == ["base-0", "base-0"]


def test_the_same_labels_make_the_same_model() -> None:
    """A fine-tune is reproducible: an operator can rebuild a candidate from its labels."""
    train = examples(32)
    current = tiny_checkpoint(train)
    novel = [Example(f"FrobnicatorFault: zorblax quux failed on {i}\n" + NCCL_LOG,
                     "nondeterministic", "collective_timeout", f"n{i}") for i in range(30)]
    first, again = (fine_tune(current, novel + train[:10], epochs=1, lr=1e-3, seed=3)
                    for _ in range(2))
    assert first.vocab.tokens == again.vocab.tokens
    assert all(torch.equal(a, b) for a, b in zip(first.model.state_dict().values(),
                                                 again.model.state_dict().values(), strict=True))
