"""Each line template's vector, computed once per loaded model.

The recurrent path turns every line it reads into a vector (token and 3-gram embedding bags,
a linear layer): about a quarter of a served forward pass. That vector depends only on the
line's features, which every line of a template shares (:mod:`.features`), and on the model,
which does not change while it serves (eval mode: no dropout). Jobs print the same few dozen
templates over and over, so a loaded classifier keeps the vectors of the templates it has
seen in one table, and a batch computes only the lines it has not seen (plus the lines of
their own, which have no template).
"""

from __future__ import annotations

import numpy as np
import torch

from .model import ModelInput, RecurrentClassifier

__all__ = ["LineVectors"]

# 32,768 templates of 64 floats: 8 MiB. The template cache of preprocess holds 16,384.
CAPACITY = 1 << 15


class LineVectors:
    """The line vectors of one model, by template serial (:attr:`~.features.Encoded.keys`).
    Not thread-safe: the classifier calls it under its lock."""

    def __init__(self, model: RecurrentClassifier, capacity: int = CAPACITY) -> None:
        weight = model.line.weight
        self.model = model
        self.capacity = capacity
        self.table = torch.zeros(capacity, model.config.dim, dtype=weight.dtype,
                                 device=weight.device)
        self.slots: dict[int, int] = {}  # template serial -> row of the table

    @torch.inference_mode()
    def __call__(self, x: ModelInput, keys: np.ndarray) -> torch.Tensor:
        """(N, dim) vectors of ``x``'s N lines, ``keys`` their template serials (negative: a
        line of its own, computed and not kept): ``model.read_lines`` of them, rows of the
        same template computed once."""
        if len(keys) > self.capacity:  # more lines than the table holds: nothing kept
            return self.model.read_lines(x.tokens, x.grams)
        slots = self.slots
        if len(slots) + len(keys) > self.capacity:  # room for this batch's new templates
            slots.clear()
        found = np.fromiter((slots.get(k, -1) for k in keys.tolist()), np.int64, len(keys))
        missing = np.flatnonzero(found < 0)
        if missing.size == 0:
            return self.table[torch.from_numpy(found).to(self.table.device)]
        kept = keys[missing] >= 0
        new_keys, first = np.unique(keys[missing][kept], return_index=True)
        own = missing[~kept]
        rows = torch.from_numpy(np.concatenate([missing[kept][first], own]))
        vectors = self.model.read_lines(x.tokens[rows.to(x.tokens.device)],
                                        x.grams[rows.to(x.grams.device)])
        start = len(slots)
        self.table[start : start + len(new_keys)] = vectors[: len(new_keys)]
        slots.update(zip(new_keys.tolist(), range(start, start + len(new_keys)), strict=True))
        found[missing[kept]] = [slots[k] for k in keys[missing][kept].tolist()]
        found[own] = 0  # any row: overwritten below
        out = self.table[torch.from_numpy(found).to(self.table.device)]
        if own.size:
            out[torch.from_numpy(own).to(out.device)] = vectors[len(new_keys):]
        return out
