"""The majority rule: who wins, when nothing is published, and the signature of an error."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sibylla.inference.api import LogWindow, Prediction
from sibylla.online_learning.settings import OnlineSettings
from sibylla.online_learning.votes import (
    AttemptRecord,
    committee_votes,
    error_signature,
    operator_vote,
    outcome_vote,
    tally,
    window_text,
)
from sibylla.schemas.records import Vote

RULE = OnlineSettings().vote_rule()
LABELS = ("deterministic", "nondeterministic")


def confident(verdict: str, confidence: float = 1.0) -> Prediction:
    return Prediction(verdict, confidence, "", [])  # type: ignore[arg-type]


def test_outcome_alone_labels() -> None:
    vote = outcome_vote("sig", next_completed=True, next_signature=None, rule=RULE)
    assert tally([vote], RULE) == "nondeterministic"  # type: ignore[list-item]


def test_outcome_beats_a_unanimous_committee_that_disagrees() -> None:
    committee = committee_votes({m: confident("deterministic") for m in ("gru", "lstm", "tfidf")},
                                RULE)
    outcome = outcome_vote("sig", True, None, RULE)
    assert outcome is not None
    assert tally([*committee, outcome], RULE) == "nondeterministic"


def test_committee_alone_needs_three_confident_models() -> None:
    three = committee_votes({m: confident("deterministic") for m in ("a", "b", "c")}, RULE)
    assert tally(three, RULE) == "deterministic"
    unsure = committee_votes({m: confident("deterministic", 0.8) for m in ("a", "b", "c")}, RULE)
    assert tally(unsure, RULE) is None
    split = committee_votes({"a": confident("deterministic"), "b": confident("deterministic"),
                             "c": confident("nondeterministic")}, RULE)
    assert tally(split, RULE) is None


def test_unknown_verdicts_abstain() -> None:
    assert committee_votes({"gru": confident("unknown", 0.55)}, RULE) == []


def test_operator_outweighs_everything_else() -> None:
    votes = [*committee_votes({m: confident("nondeterministic") for m in "abc"}, RULE),
             Vote("outcome", "nondeterministic", RULE.outcome_weight),
             operator_vote("deterministic", RULE, "alice")]
    assert tally(votes, RULE) == "deterministic"


def test_retry_outcome_votes() -> None:
    same = outcome_vote("RuntimeError: x", False, "RuntimeError: x", RULE)
    assert same is not None and same.label == "deterministic"
    assert outcome_vote("RuntimeError: x", False, "OSError: y", RULE) is None
    assert outcome_vote("", False, "", RULE) is None  # no error line: nothing to compare


vote_lists = st.lists(st.builds(Vote, st.sampled_from(["outcome", "operator", "model:a"]),
                                st.sampled_from(LABELS), st.floats(0, 20)), max_size=8)


@given(vote_lists)
def test_a_label_always_has_the_majority_and_ties_never_label(votes: list[Vote]) -> None:
    det = sum(v.weight for v in votes if v.label == "deterministic")
    nondet = sum(v.weight for v in votes if v.label == "nondeterministic")
    result = tally(votes, RULE)
    if det == nondet:
        assert result is None
    if result == "deterministic":
        assert det > nondet and det - nondet >= RULE.min_margin and det >= RULE.min_weight
    if result == "nondeterministic":
        assert nondet > det and nondet - det >= RULE.min_margin and nondet >= RULE.min_weight


@given(vote_lists)
def test_vote_order_does_not_matter(votes: list[Vote]) -> None:
    assert tally(votes, RULE) == tally(list(reversed(votes)), RULE)


def window(*lines: str) -> LogWindow:
    return LogWindow("j", 0, list(lines), list(lines))


def test_same_error_on_another_rank_and_host_has_the_same_signature() -> None:
    a = window("step 10", "Traceback (most recent call last):", '  File "/a/t.py", line 3',
               "[rank0]: RuntimeError: shapes (64x512 and 1024x10) on gpu-node-17")
    b = window("Traceback (most recent call last):", '  File "/b/t.py", line 9',
               "[rank7]: RuntimeError: shapes (32x512 and 1024x10) on gpu-node-3")
    c = window("Traceback (most recent call last):", "OSError: [Errno 5] Input/output error")
    assert error_signature(a) == error_signature(b) != ""
    assert error_signature(a) != error_signature(c)
    assert error_signature(window("epoch 3 done", "saving")) == ""


def test_label_log_redacts_secrets_and_keeps_the_first_error() -> None:
    w = LogWindow("j", 0, ["teardown", "exit 1"], ["ValueError: token=hf_abcdefghijklmnopqrstu"])
    text = window_text(w)
    assert "hf_abcdefghijklmnop" not in text
    assert text.splitlines()[0].startswith("ValueError") and text.endswith("exit 1")


def test_record_publishes_once_per_label_change_and_survives_serialisation() -> None:
    record = AttemptRecord("j", 0, "log", "", "sig", decided=True)
    record = record.with_vote(Vote("outcome", "deterministic", 2.0))
    label = record.label_due(RULE)
    assert label is not None and label.label == "deterministic"
    record = AttemptRecord.from_bytes(AttemptRecord(**{**record.__dict__,
                                                       "published": "deterministic"}).to_bytes())
    assert record.label_due(RULE) is None  # already published
    relabeled = record.with_vote(operator_vote("nondeterministic", RULE, "alice")).label_due(RULE)
    assert relabeled is not None and relabeled.label == "nondeterministic"
    assert {v.source for v in relabeled.votes} == {"outcome", "operator"}


def test_no_label_before_the_window_is_known() -> None:
    record = AttemptRecord("j", 0).with_vote(operator_vote("deterministic", RULE, "alice"))
    assert record.label_due(RULE) is None
