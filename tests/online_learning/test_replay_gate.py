"""The replay buffer stays bounded and balanced; the gate stops worse or less precise models."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sibylla.inference.api import LogWindow, Prediction
from sibylla.inference.train import Example
from sibylla.online_learning.gate import Scores, gate, score
from sibylla.online_learning.replay import ReplayBuffer
from tests.online_learning.fixtures import NCCL_LOG, OOM_LOG


def ex(i: int, label: str) -> Example:
    return Example(f"log {i}", label, "", f"s{i}")


@given(st.lists(st.sampled_from(["deterministic", "nondeterministic"]), max_size=300),
       st.integers(1, 20))
def test_buffer_is_bounded_per_class(labels: list[str], capacity: int) -> None:
    buffer = ReplayBuffer(capacity)
    buffer.extend(ex(i, label) for i, label in enumerate(labels))
    counts = buffer.counts()
    for label, kept in counts.items():
        assert kept == min(capacity, labels.count(label))


def test_sample_is_balanced_even_when_the_stream_is_not() -> None:
    buffer = ReplayBuffer(100)
    buffer.extend(ex(i, "nondeterministic") for i in range(500))
    buffer.extend(ex(i, "deterministic") for i in range(500, 520))
    sample = buffer.sample(40)
    assert len(sample) == 40 and len({e.source for e in sample}) == 40
    assert sum(e.label == "deterministic" for e in sample) == 20


def test_reservoir_keeps_old_examples() -> None:
    buffer = ReplayBuffer(50, seed=3)
    buffer.extend(ex(i, "deterministic") for i in range(1000))
    assert any(int(e.source[1:]) < 500 for e in buffer.sample(50))


class Fixed:
    """Says deterministic for OOM logs, nondeterministic otherwise (or the reverse)."""

    def __init__(self, right: bool = True) -> None:
        self.right = right

    @property
    def version(self) -> str:
        return "fixed"

    def predict(self, windows: list[LogWindow]) -> list[Prediction]:
        out = []
        for w in windows:
            oom = ("CUDA out of memory" in "\n".join(w.tail)) == self.right
            out.append(Prediction("deterministic" if oom else "nondeterministic", 0.9,
                                  "gpu_out_of_memory" if oom else "collective_timeout", []))
        return out


def test_score_counts_accuracy_and_deterministic_precision() -> None:
    data = [Example(OOM_LOG, "deterministic", "gpu_out_of_memory"),
            Example(NCCL_LOG, "nondeterministic", "collective_timeout")]
    assert score(Fixed(), data) == Scores(2, 1.0, 1.0, 1, 1.0)
    wrong = score(Fixed(right=False), data)
    assert wrong.accuracy == 0.0 and wrong.det_precision == 0.0


def scores(accuracy: float, precision: float) -> Scores:
    return Scores(100, accuracy, precision, 10, 0.9)


def test_gate_promotes_a_model_no_worse_within_tolerance() -> None:
    result = gate({"real": scores(0.90, 0.99)}, {"real": scores(0.895, 0.99)}, 0.01, 0.0)
    assert result.promote and result.reasons == []


def test_gate_rejects_less_accuracy_on_any_part() -> None:
    current = {"real": scores(0.90, 0.99), "recent": scores(0.60, 0.99)}
    candidate = {"real": scores(0.80, 0.99), "recent": scores(0.95, 0.99)}
    result = gate(current, candidate, 0.01, 0.0)
    assert not result.promote and result.reasons[0].startswith("real: accuracy")


def test_gate_rejects_a_drop_in_deterministic_precision() -> None:
    result = gate({"real": scores(0.90, 0.99)}, {"real": scores(0.95, 0.97)}, 0.01, 0.0)
    assert not result.promote and "precision" in result.reasons[0]


def test_precision_is_pooled_over_parts_so_a_few_recent_verdicts_do_not_decide() -> None:
    current = {"real": Scores(300, 0.9, 0.99, 200, 0.9), "recent": Scores(50, 0.7, 0.8, 5, 0.9)}
    candidate = {"real": Scores(300, 0.9, 0.99, 200, 0.9),
                 "recent": Scores(50, 0.8, 0.75, 4, 0.9)}
    assert gate(current, candidate, 0.01, 0.005).promote


def test_promotions_cannot_ratchet_below_the_first_model() -> None:
    first = {"real": scores(0.95, 0.99)}
    current = {"real": scores(0.935, 0.99)}  # already one promotion within tolerance
    candidate = {"real": scores(0.92, 0.99)}  # within tolerance of current, not of the first
    assert gate(current, candidate, 0.02, 0.01).promote
    result = gate(current, candidate, 0.02, 0.01, floor=first)
    assert not result.promote and "first model" in result.reasons[0]
