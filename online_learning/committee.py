"""The committee: extra models whose verdicts vote beside the deciding model's
(``SIBYLLA_COMMITTEE``).

A committee of one, the deciding model, can only agree with itself. Models of different kinds
err differently, so several of them agreeing is evidence, and their disagreement with retry
outcomes is the trainer's drift signal. Members, comma-separated:

- ``rules``: the transient-error pattern schedulers use today
  (:class:`~sibylla.inference.baselines.RegexRules`); no training, always fully confident;
- ``tfidf``: TF-IDF + logistic regression (:class:`~sibylla.inference.baselines.TfidfLogReg`)
  fitted at start on the shipped model's training recipe (about 15 s on one core);
- a path to a model file, e.g. one trained with ``sibylla train --seed 7``; it votes under
  its version.

Each member votes ``committee_weight × confidence`` (see ``votes.py``), so a committee alone
labels only when three members agree with full confidence, and such labels never train or
validate a model (they only refill the replay buffer).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from sibylla.inference.api import Classifier
from sibylla.settings import ENV_PREFIX, SettingsError

__all__ = ["build_committee"]

log = logging.getLogger(__name__)

SETTING = ENV_PREFIX + "COMMITTEE"  # OnlineSettings.committee


def build_committee(spec: str, device: str = "auto") -> dict[str, Classifier]:
    """The committee named by ``spec`` (see module docstring), name -> classifier.

    Raises :class:`SettingsError` naming the setting for a member that is neither a known
    baseline nor a readable model file, or for one named twice.
    """
    committee: dict[str, Classifier] = {}
    for member in (m.strip() for m in spec.split(",")):
        if not member:
            continue
        model = _member(member, device)
        name = model.version
        if name in committee:
            raise SettingsError(f"{SETTING}: {member!r} is in the committee twice ({name})")
        committee[name] = model
    if committee:
        log.info("committee voting beside the deciding model: %s", ", ".join(committee))
    return committee


def _member(member: str, device: str) -> Classifier:
    from sibylla.inference.baselines import RegexRules

    if member == "rules":
        return RegexRules()
    if member == "tfidf":
        return _fitted_tfidf()
    if not Path(member).is_file():
        raise SettingsError(f"{SETTING}: {member!r} is not rules, tfidf or a model file")
    from sibylla.inference import load_classifier
    from sibylla.inference.checkpoint import ModelLoadError

    try:
        return load_classifier(member, device)
    except ModelLoadError as exc:
        raise SettingsError(f"{SETTING}: {exc}") from None


def _fitted_tfidf() -> Classifier:
    from sibylla.inference.baselines import TfidfLogReg
    from sibylla.inference.preprocess import window_from_text
    from sibylla.inference.train import TrainConfig, default_training_records

    t0 = time.monotonic()
    records = default_training_records(TrainConfig())
    model = TfidfLogReg().fit([window_from_text(r.log) for r in records],
                              [r.category for r in records])
    log.info("committee: tfidf fitted on %d logs in %.0f s", len(records),
             time.monotonic() - t0)
    return model
