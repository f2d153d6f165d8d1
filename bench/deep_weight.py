"""How much the recurrent path weighs next to the wide n-gram path (``TrainConfig.deep_weight``).

Chosen on the training data only: the real training file's logs are split into folds by
project; for each fold a model is trained (the shipped recipe) on the generated logs plus the
other folds' real logs, and scores the fold's logs with each path apart. The held-out files that
``sibylla evaluate`` reports on are never read. For each weight of the recurrent path it prints
macro-F1 without abstention and deterministic precision (95 % interval) and abstention at the
threshold cross-fitted by project, and writes bench/results/deep-weight.json. The shipped
weight is the one with the best macro-F1; ties go to the smaller weight, the convex wide path
being the one that does not change with the random stream (85 logs: one log is 0.01).

    python bench/deep_weight.py [--folds 5] [--epochs 4]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from sibylla.inference.api import Prediction
from sibylla.inference.corpus import Record, load_records, packaged_path, project_of
from sibylla.inference.evaluate import cross_fitted
from sibylla.inference.features import batch_input, encode_window
from sibylla.inference.metrics import score
from sibylla.inference.preprocess import window_from_text
from sibylla.inference.synthetic import generate
from sibylla.inference.taxonomy import CATEGORIES, DETERMINISTIC, LABELS
from sibylla.inference.train import TrainConfig, examples_from_records, train_model

RESULTS = Path(__file__).parent / "results"
WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
_DET = torch.tensor([c in DETERMINISTIC for c in CATEGORIES])


def _fold(record: Record, folds: int) -> int:
    digest = hashlib.sha256(project_of(record).encode()).digest()
    return int.from_bytes(digest[:8], "big") % folds


def _paths(config: TrainConfig, train: Sequence[Record], test: Sequence[Record]
           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per test log: (recurrent, wide) category probabilities of a model trained on ``train``."""
    checkpoint = train_model(examples_from_records(train), config)
    model = checkpoint.model.eval()
    x = batch_input([encode_window(window_from_text(r.log), checkpoint.vocab) for r in test])
    with torch.inference_mode():
        deep = model.deep(x)
        wide = model.wide_probs(x)
    verdict = torch.softmax(deep.verdict, 1)
    category = torch.softmax(deep.category, 1)
    # the recurrent path's deterministic share comes from its verdict head, as when served
    return [(torch.cat([verdict[i], category[i]]), wide[i]) for i in range(len(test))]


def _predictions(paths: Sequence[tuple[torch.Tensor, torch.Tensor]], w: float
                 ) -> list[Prediction]:
    out = []
    for deep, wide in paths:
        p_det = w * float(deep[0]) + (1 - w) * float(wide[_DET].sum())
        category = w * deep[2:] + (1 - w) * wide
        is_det = p_det >= 0.5
        allowed = category.masked_fill(_DET != is_det, -1.0)
        out.append(Prediction(LABELS[0] if is_det else LABELS[1],  # type: ignore[arg-type]
                              max(p_det, 1 - p_det), CATEGORIES[int(allowed.argmax())], []))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=None)
    args = parser.parse_args(argv)
    config = TrainConfig()
    config = replace(config, real_files=(), epochs=args.epochs or config.epochs)
    synthetic = generate(config.synthetic, seed=config.seed)
    real = [r for name in TrainConfig().real_files for r in load_records(packaged_path(name))]
    paths: list[Any] = [None] * len(real)
    for k in range(args.folds):
        test_idx = [i for i, r in enumerate(real) if _fold(r, args.folds) == k]
        train = synthetic + [r for r in real if _fold(r, args.folds) != k]
        print(f"fold {k + 1}/{args.folds}: {len(test_idx)} held out", flush=True)
        for i, p in zip(test_idx, _paths(config, train, [real[i] for i in test_idx]),
                        strict=True):
            paths[i] = p
    rows = {}
    for w in WEIGHTS:
        predictions = _predictions(paths, w)
        m = score([r.label for r in real], [p.verdict for p in predictions],
                  [r.category for r in real], [p.category for p in predictions])
        crossed = cross_fitted(predictions, real)
        rows[str(w)] = {"macro_f1": m["macro_f1"],
                        "cross_fitted_deterministic_precision":
                            crossed["deterministic_precision"],
                        "cross_fitted_deterministic_precision_ci":
                            crossed["deterministic_precision_ci"],
                        "cross_fitted_abstention_rate": crossed["abstention_rate"]}
        print(f"deep weight {w:.1f}: macro-F1 {m['macro_f1']:.4f}, cross-fitted det. "
              f"precision {crossed['deterministic_precision']:.4f} "
              f"{crossed['deterministic_precision_ci']} at "
              f"{crossed['abstention_rate']:.1%} abstention", flush=True)
    best = max(WEIGHTS, key=lambda w: (rows[str(w)]["macro_f1"], -w))
    result = {"records": len(real), "projects": len({project_of(r) for r in real}),
              "folds": args.folds, "epochs": config.epochs, "best_deep_weight": best,
              "shipped_deep_weight": TrainConfig().deep_weight, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "deep-weight.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"best deep weight: {best} (shipped: {TrainConfig().deep_weight})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
