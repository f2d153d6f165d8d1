"""Leave-one-framework-out: does the classifier carry over to a framework it never saw?

The real logs of both corpus files are grouped into framework families; for each family a model
is trained on the generated logs plus the real logs of every *other* family, and scored on the
held-out family's real logs, next to the baselines trained on the same data. Families rather
than single frameworks, because most frameworks have too few real logs to score alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .corpus import REAL_FILES, Record, load_records, packaged_path
from .engine import ModelClassifier
from .evaluate import TABLE_KEYS, evaluate_file
from .synthetic import generate
from .train import TrainConfig, examples_from_records, train_model

__all__ = ["FAMILIES", "format_folds", "leave_one_framework_out"]

logger = logging.getLogger(__name__)

FAMILIES: dict[str, tuple[str, ...]] = {
    "pytorch": ("pytorch", "pytorch-examples", "apex"),
    "lightning": ("lightning",),
    "hugging face": ("datasets", "transformers", "accelerate", "peft", "trl", "diffusers"),
    "vision": ("yolov5", "ultralytics", "detectron2", "mmsegmentation", "torchvision", "detr",
               "dali", "torchtune"),
}


def _family(framework: str) -> str:
    return next((f for f, members in FAMILIES.items() if framework in members), "other")


def leave_one_framework_out(config: TrainConfig, families: Sequence[str] = tuple(FAMILIES)
                            ) -> dict[str, Any]:
    """Per held-out family: the model's and the baselines' scores on its real logs."""
    real = [r for name in REAL_FILES for r in load_records(packaged_path(name))]
    synthetic = generate(config.synthetic, seed=config.seed)
    folds: dict[str, Any] = {}
    for family in families:
        test = [r for r in real if _family(r.framework) == family]
        train: list[Record] = synthetic + [r for r in real if _family(r.framework) != family]
        logger.info("leave out %s: %d test logs, %d training logs", family, len(test),
                    len(train))
        checkpoint = train_model(examples_from_records(train), replace(config, real_files=()))
        report = evaluate_file(ModelClassifier(checkpoint, device="cpu"), test, train)
        folds[family] = {"n": len(test), "rows": {
            name: {k: row[k] for k in TABLE_KEYS} for name, row in report["rows"].items()}}
    return folds


def format_folds(folds: dict[str, Any]) -> str:
    """One Markdown table: per family, macro-F1 / deterministic precision / abstention."""
    names = list(next(iter(folds.values()))["rows"])
    lines = ["| held-out family | n | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for family, fold in folds.items():
        cells = [f"{r['macro_f1']:.2f} / {r['deterministic_precision']:.2f} / "
                 f"{r['abstention_rate']:.2f}" for r in fold["rows"].values()]
        lines.append(f"| {family} | {fold['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

