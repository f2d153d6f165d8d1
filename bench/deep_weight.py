"""How much the recurrent path weighs next to the wide n-gram path (``TrainConfig.deep_weight``).

Chosen on the training data only: the real training file's logs are split into folds by
project; for each fold a model is trained (the shipped recipe) on the generated logs plus the
other folds' real logs, and decides the fold's logs at each weight of its recurrent path. The
held-out files that ``sibylla evaluate`` reports on are never read. For each weight it prints
macro-F1 without abstention and deterministic precision (95 % interval) and abstention at the
threshold cross-fitted by project, and writes bench/results/deep-weight.json. The shipped
weight is the one with the best macro-F1; ties go to the smaller weight, the convex wide path
being the one that does not change with the random stream (85 logs: one log is 0.01).

    python bench/deep_weight.py [--folds 5] [--epochs 4]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sibylla.inference.api import Prediction
from sibylla.inference.corpus import Record, load_records, packaged_path, project_of
from sibylla.inference.crossval import repository_folds
from sibylla.inference.engine import ModelClassifier
from sibylla.inference.evaluate import cross_fitted
from sibylla.inference.features import encode_window
from sibylla.inference.metrics import score
from sibylla.inference.preprocess import window_from_text
from sibylla.inference.synthetic import generate
from sibylla.inference.train import TrainConfig, examples_from_records, train_model

RESULTS = Path(__file__).parent / "results"
WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)


def _fold_predictions(config: TrainConfig, train: Sequence[Record], test: Sequence[Record]
                      ) -> dict[float, list[Prediction]]:
    """Per recurrent weight, the test logs as decided (without abstention) by a model trained
    on ``train``: the same trained paths, averaged at each weight by the model itself."""
    checkpoint = train_model(examples_from_records(train), config)
    classifier = ModelClassifier(checkpoint, device="cpu").with_threshold(0.0)
    encoded = [encode_window(window_from_text(r.log), checkpoint.vocab) for r in test]
    out = {}
    for w in WEIGHTS:
        # the bench's own model: only the share of its recurrent path changes
        checkpoint.model.config = replace(checkpoint.model.config, deep_weight=w)
        out[w] = classifier.predict_encoded(encoded)
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
    by_weight: dict[float, list[Any]] = {w: [None] * len(real) for w in WEIGHTS}
    for k, (test_idx, others) in enumerate(repository_folds(real, args.folds)):
        print(f"fold {k + 1}/{args.folds}: {len(test_idx)} held out", flush=True)
        for w, fold in _fold_predictions(config, synthetic + others,
                                         [real[i] for i in test_idx]).items():
            for i, p in zip(test_idx, fold, strict=True):
                by_weight[w][i] = p
    rows = {}
    for w, predictions in by_weight.items():
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
