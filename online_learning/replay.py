"""A bounded replay buffer: a uniform sample of every example seen, kept per verdict class.

Fine-tuning only on the newest labels makes a model forget what it knew (catastrophic
forgetting), and the newest labels are skewed: a job Sibylla stopped with ``do_not_retry`` never
gets a retry-outcome vote, so new labels lean to ``nondeterministic``. One reservoir per class
keeps a uniform sample of each class's whole history in bounded memory, and :meth:`sample` draws
the classes evenly, so a fine-tune sees both verdicts however lopsided the stream is.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from sibylla.inference.taxonomy import LABELS
from sibylla.inference.train import Example

__all__ = ["ReplayBuffer"]


class ReplayBuffer:
    """At most ``capacity`` examples per verdict class (reservoir sampling, Algorithm R)."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._rng = random.Random(seed)
        self._kept: dict[str, list[Example]] = {label: [] for label in LABELS}
        self._seen: dict[str, int] = dict.fromkeys(LABELS, 0)

    def add(self, example: Example) -> None:
        kept = self._kept[example.label]
        self._seen[example.label] += 1
        if len(kept) < self.capacity:
            kept.append(example)
            return
        slot = self._rng.randrange(self._seen[example.label])
        if slot < self.capacity:
            kept[slot] = example

    def extend(self, examples: Iterable[Example]) -> None:
        for example in examples:
            self.add(example)

    def sample(self, n: int) -> list[Example]:
        """Up to ``n`` distinct examples, half from each class (the rest from the other class
        when one has too few)."""
        pools = [list(kept) for kept in self._kept.values()]
        for pool in pools:
            self._rng.shuffle(pool)
        out: list[Example] = []
        share = n // len(pools)
        for pool in pools:
            out += pool[:share]
        leftovers = [ex for pool in pools for ex in pool[share:]]
        self._rng.shuffle(leftovers)
        return out + leftovers[: max(0, n - len(out))]

    def __len__(self) -> int:
        return sum(len(kept) for kept in self._kept.values())

    def counts(self) -> dict[str, int]:
        """Examples kept per class."""
        return {label: len(kept) for label, kept in self._kept.items()}
