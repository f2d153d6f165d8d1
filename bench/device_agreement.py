"""Do the model's verdicts on CUDA match its verdicts on the CPU?

Workers pick CUDA when a GPU is present (``SIBYLLA_DEVICE=auto``), and on CUDA the model runs
in half precision; its operating threshold was chosen from float32 scores on the CPU. A
verdict that flips between the two would make the GPU deployment decide differently from the
figures in the README. This decides every held-out real log (the packaged real files the
model was not trained on, or ``--data``) on both devices and reports how many verdicts and
served actions differ (above all any ``do_not_retry`` that only one device gives), the largest
difference in confidence, and the deterministic verdicts (the only ones withheld below the
threshold) that lie closer to it than that.

    python bench/device_agreement.py [--model PATH] [--data FILE ...] [--out FILE]

Needs a CUDA device. Writes bench/results/device-agreement.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["main"]

RESULTS = Path(__file__).parent / "results"


def compare(cpu: list[Any], cuda: list[Any], threshold: float) -> dict[str, Any]:
    """Agreement of two devices' raw predictions (made without abstention) of the same logs,
    and of the actions the worker serves for them at ``threshold`` (``policy.action_for``)."""
    from sibylla.inference.engine import at_threshold
    from sibylla.streams.policy import action_for

    pairs = list(zip(cpu, cuda, strict=True))
    deltas = [abs(a.confidence - b.confidence) if a.verdict == b.verdict else 1.0
              for a, b in pairs]
    worst = max(deltas, default=0.0)
    flips: Counter[str] = Counter()
    for a, b in pairs:
        served = (action_for(at_threshold(a, threshold)), action_for(at_threshold(b, threshold)))
        if served[0] != served[1]:
            flips[f"{served[0]} -> {served[1]}"] += 1
    return {
        "logs": len(pairs),
        "verdicts_differ": sum(a.verdict != b.verdict for a, b in pairs),
        "categories_differ": sum(a.category != b.category for a, b in pairs),
        "evidence_differs": sum(a.evidence != b.evidence for a, b in pairs),
        "actions_differ": dict(flips),
        "confidence_delta_max": round(worst, 6),
        "confidence_delta_median": round(statistics.median(deltas), 6) if deltas else 0.0,
        # Only a deterministic verdict is withheld below the threshold (engine.withheld).
        "near_threshold": sum(a.verdict == "deterministic" and abs(a.confidence - threshold)
                              <= worst for a in cpu),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="model file (default: the shipped model)")
    parser.add_argument("--data", nargs="*", default=[], help="corpus JSONL file(s) (default: "
                        "every packaged real file the model was not trained on)")
    parser.add_argument("--out", default="", help="results file")
    args = parser.parse_args(argv)

    import torch

    from sibylla.inference.checkpoint import load_checkpoint
    from sibylla.inference.corpus import load_records
    from sibylla.inference.engine import ModelClassifier
    from sibylla.inference.preprocess import window_from_text
    from sibylla.inference.train import held_out_files

    if not torch.cuda.is_available():
        parser.error("no CUDA device: this compares the CPU with CUDA")
    checkpoint = load_checkpoint(args.model or None)
    paths = args.data or held_out_files(checkpoint.meta)
    records = [r for path in paths for r in load_records(path)]
    windows = [window_from_text(r.log, job_id=r.id) for r in records]
    cpu = ModelClassifier(checkpoint, device="cpu")
    cuda = ModelClassifier(checkpoint, device="cuda")
    report = compare(cpu.with_threshold(0.0).predict(windows),
                     cuda.with_threshold(0.0).predict(windows), cpu.threshold)
    result = {"model_version": cpu.version, "threshold": cpu.threshold,
              "files": [Path(str(p)).name for p in paths],
              "cuda": torch.cuda.get_device_name(), "cuda_dtype": str(
                  next(cuda.model.parameters()).dtype), "torch": torch.__version__,
              "python": platform.python_version(), **report}
    out = Path(args.out) if args.out else RESULTS / "device-agreement.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
