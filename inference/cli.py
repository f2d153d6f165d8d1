"""``sibylla train``, ``sibylla evaluate`` and ``sibylla classify``.

Registering the subcommands imports nothing heavy; torch and the models load inside the
handlers, so that other ``sibylla`` commands start instantly.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the classifier's subcommands to the ``sibylla`` parser."""
    train = subparsers.add_parser(
        "train", help="train the failure classifier (reproduces the shipped model)",
        description="Train on the generated logs plus the real training files, calibrate, "
                    "choose the operating threshold and score on the held-out real logs, and "
                    "save. Same seed, same model.")
    train.add_argument("--out", default="", help="output file (default: the shipped model)")
    train.add_argument("--seed", type=int, default=None)
    train.add_argument("--deep-weight", type=float, default=None,
                       help="share of the recurrent path in the served probabilities")
    train.add_argument("--epochs", type=int, default=None)
    train.add_argument("--synthetic", type=int, default=None, help="generated logs to train on")
    train.add_argument("--threads", type=int, default=None, help="torch threads (default 1)")
    train.add_argument("--real-files", type=_real_file_names, default=None,
                       metavar="NAME[,NAME...]",
                       help="packaged real corpus files to train on (default: "
                            "corpus.TRAIN_FILES); the others stay held out")
    train.set_defaults(func=_train)

    evaluate = subparsers.add_parser(
        "evaluate", help="score the model and the baselines on a corpus file",
        description="Accuracy, macro-F1, per-class precision/recall, deterministic precision "
                    "(with its 95 % Wilson interval) at the operating threshold and at a "
                    "threshold cross-fitted by project, abstention, the cost curve, the evidence "
                    "hit rate on records with a cause line, confusion matrix and per-category "
                    "accuracy of the model and of every baseline.")
    evaluate.add_argument("--data", nargs="*", default=[],
                          help="corpus JSONL file(s) (default: every packaged real_public_*.jsonl "
                               "the model was not trained on)")
    evaluate.add_argument("--model", default="", help="model file (default: the shipped model)")
    evaluate.add_argument("--json", action="store_true", help="one JSON object on stdout")
    evaluate.add_argument("--lofo", action="store_true",
                          help="leave-one-framework-out instead: trains one model per held-out "
                               "framework family on the real logs of the others (minutes)")
    evaluate.add_argument("--folds", type=int, default=None, metavar="K",
                          help="cross-validate the training recipe instead: every packaged real "
                               "log (or --data's) decided by a model trained without its "
                               "repository's fold, K folds by repository (minutes per fold)")
    evaluate.add_argument("--synthetic", type=int, default=None,
                          help="with --lofo or --folds: generated logs per fold's training")
    evaluate.add_argument("--epochs", type=int, default=None,
                          help="with --lofo or --folds: epochs per fold")
    evaluate.set_defaults(func=_evaluate)

    classify = subparsers.add_parser(
        "classify", help="classify one job's log and explain the verdict",
        description="Prints verdict, confidence, category, scheduler action and evidence lines.")
    classify.add_argument("file", nargs="?", default="-", help="log file, or - for stdin")
    classify.add_argument("--model", default="", help="model file (default: the shipped model)")
    classify.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    classify.add_argument("--min-confidence", type=float, default=0.0)
    classify.add_argument("--json", action="store_true")
    classify.set_defaults(func=_classify)


def _train(args: argparse.Namespace) -> int:
    from .checkpoint import save_checkpoint, shipped_model_path
    from .corpus import load_records
    from .engine import ModelClassifier
    from .evaluate import evaluate_file, operating_threshold
    from .train import (
        TrainConfig,
        default_training_records,
        examples_from_records,
        held_out_files,
        train_model,
        with_overrides,
    )

    config = with_overrides(TrainConfig(), seed=args.seed, deep_weight=args.deep_weight,
                            epochs=args.epochs, synthetic=args.synthetic, threads=args.threads,
                            real_files=args.real_files)
    records = default_training_records(config)
    checkpoint = train_model(examples_from_records(records), config)
    # The operating point: chosen on real logs of projects never trained on, not on the
    # mostly generated validation split (``sibylla evaluate`` cross-fits it by project).
    files = held_out_files(checkpoint.meta)
    held_out = [r for path in files for r in load_records(path)]
    classifier = ModelClassifier(checkpoint, device="cpu")
    threshold, rule = operating_threshold(classifier, held_out)
    checkpoint.meta.update(validation_threshold=checkpoint.meta["threshold"],
                           threshold=threshold, operating_point={
                               "files": [path.name for path in files], "rule": rule})
    report = evaluate_file(classifier.with_threshold(threshold), held_out, records)
    report_files = ", ".join(path.name for path in files)
    checkpoint.meta["metrics"] = {
        "held_out_files": report_files,
        **{name: {k: row[k] for k in ("accuracy", "macro_f1", "deterministic_precision",
                                      "abstention_rate")}
           for name, row in report["rows"].items()},
    }
    path = save_checkpoint(checkpoint.model, checkpoint.vocab, checkpoint.meta,
                           args.out or shipped_model_path())
    print(f"saved {checkpoint.meta['version']} to {path} "
          f"({checkpoint.meta['trained_seconds']} s of training)")
    from .evaluate import format_table

    print(f"held-out real logs ({report_files}, {len(held_out)} records):")
    print(format_table(report))
    return 0


def _real_file_names(value: str) -> tuple[str, ...]:
    """``--real-files``: packaged real corpus files, comma-separated; at least one of them
    must stay out of training (the operating threshold is chosen there)."""
    from .corpus import REAL_FILES

    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in REAL_FILES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"not packaged real files: {unknown or value!r} (packaged: {', '.join(REAL_FILES)})")
    if set(REAL_FILES) <= set(names):
        raise argparse.ArgumentTypeError("every real file would be trained on: none is left "
                                         "to choose the operating threshold on")
    return names


def _evaluate(args: argparse.Namespace) -> int:
    if args.lofo:
        return _lofo(args)
    if args.folds is not None:
        return _cross_validate(args)
    from .checkpoint import ModelLoadError
    from .corpus import load_records
    from .engine import load_classifier
    from .evaluate import evaluate_file, format_report
    from .train import held_out_files

    try:
        model = load_classifier(args.model or None, device="cpu")
        paths = args.data or held_out_files(model.meta)
        records = [r for path in paths for r in load_records(path)]
    except (ModelLoadError, ValueError, OSError) as exc:
        print(f"sibylla evaluate: {exc}", file=sys.stderr)
        return 2
    report = evaluate_file(model, records)
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    names = ", ".join(str(getattr(path, "name", path)) for path in paths)
    print(f"{names}: {len(records)} records from {report['projects']} projects; model "
          f"{model.version} at threshold {model.threshold:.2f}")
    if report["overlap_with_training"]:
        print(f"WARNING: {report['overlap_with_training']} records share a source with the "
              "training data; these are not held-out scores")
    print(format_report(report))
    m = report["model"]
    print("\nmodel per class:", json.dumps(m["per_class"]))
    print("model confusion (true -> predicted):", json.dumps(m["confusion"]))
    print("model per category:")
    for cat, row in m["per_category"].items():
        print(f"  {cat:30s} n={row['n']:3d} verdict {row['verdict_accuracy']:.2f} "
              f"category {row['category_accuracy']:.2f}")
    return 0


def _lofo(args: argparse.Namespace) -> int:
    from .lofo import format_folds, leave_one_framework_out
    from .train import TrainConfig, with_overrides

    config = with_overrides(TrainConfig(), synthetic=args.synthetic, epochs=args.epochs)
    folds = leave_one_framework_out(config)
    if args.json:
        print(json.dumps(folds, sort_keys=True))
    else:
        print("macro-F1 / deterministic precision / abstention per held-out framework family")
        print(format_folds(folds))
    return 0


def _cross_validate(args: argparse.Namespace) -> int:
    from .corpus import REAL_FILES, load_records, packaged_path
    from .crossval import cross_validate
    from .evaluate import format_report
    from .train import TrainConfig, with_overrides

    config = with_overrides(TrainConfig(), synthetic=args.synthetic, epochs=args.epochs)
    try:
        paths = args.data or [packaged_path(name) for name in REAL_FILES]
        records = [r for path in paths for r in load_records(path)]
        report = cross_validate(config, records, args.folds)
    except (ValueError, OSError) as exc:
        print(f"sibylla evaluate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    print(f"{len(records)} real logs from {report['projects']} projects in {args.folds} folds "
          f"by repository ({', '.join(map(str, report['fold_sizes']))} logs); each decided by "
          "classifiers trained without its fold (the recipe, not the shipped weights)")
    print(format_report(report))
    return 0


def _classify(args: argparse.Namespace) -> int:
    from .checkpoint import ModelLoadError
    from .engine import load_classifier
    from .preprocess import window_from_text

    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8",
                                                                errors="replace").read()
        classifier = load_classifier(args.model or None, args.device, args.min_confidence)
    except (ModelLoadError, OSError) as exc:
        print(f"sibylla classify: {exc}", file=sys.stderr)
        return 2
    from sibylla.streams.policy import action_for  # the pipeline's own rule

    prediction = classifier.predict([window_from_text(text, job_id=args.file)])[0]
    action = action_for(prediction)
    if args.json:
        print(json.dumps({"verdict": prediction.verdict, "confidence": prediction.confidence,
                          "category": prediction.category, "action": action,
                          "evidence": prediction.evidence, "model_version": classifier.version}))
        return 0
    print(f"verdict:    {prediction.verdict}")
    print(f"confidence: {prediction.confidence:.3f} (threshold {classifier.threshold:.2f})")
    print(f"category:   {prediction.category}")
    print(f"action:     {action}")
    print("evidence:")
    for line in prediction.evidence:
        print(f"  {line}")
    print(f"model:      {classifier.version}")
    return 0
