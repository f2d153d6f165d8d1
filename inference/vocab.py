"""Token vocabulary with out-of-vocabulary handling, stored as JSON beside the weights."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = ["OOV", "PAD", "Vocabulary"]

PAD = "<pad>"  # index 0: padding, masked out of pooling
OOV = "<oov>"  # index 1: any token not in the vocabulary

_SERIALS = itertools.count()


class Vocabulary:
    """A fixed token -> index map; unknown tokens map to :data:`OOV`."""

    def __init__(self, tokens: Sequence[str]) -> None:
        if list(tokens[:2]) != [PAD, OOV]:
            raise ValueError("a vocabulary starts with <pad>, <oov>")
        self.tokens = list(tokens)
        self.index = {tok: i for i, tok in enumerate(self.tokens)}
        if len(self.index) != len(self.tokens):
            raise ValueError("duplicate tokens in vocabulary")
        # Identifies this vocabulary in caches of ids (an id() could be reused after GC).
        self.serial = next(_SERIALS)

    @classmethod
    def build(cls, documents: Iterable[Iterable[str]], min_count: int = 2,
              max_size: int = 20000) -> Vocabulary:
        """Tokens seen in at least ``min_count`` documents, most frequent first.

        Counting documents rather than occurrences keeps a token that one huge log repeats
        a thousand times (a user's variable name) out of the vocabulary: it would not help
        on anyone else's log.
        """
        counts: Counter[str] = Counter()
        for doc in documents:
            counts.update(set(doc))
        kept = sorted((t for t, c in counts.items() if c >= min_count and t not in (PAD, OOV)),
                      key=lambda t: (-counts[t], t))
        return cls([PAD, OOV, *kept[: max_size - 2]])

    def encode(self, tokens: Iterable[str]) -> list[int]:
        return [self.index.get(tok, 1) for tok in tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.tokens == other.tokens
