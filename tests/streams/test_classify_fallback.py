"""A window the model cannot take costs only its own verdict, never its batch-mates'."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

from sibylla.inference.api import LogWindow, Prediction
from sibylla.settings import Settings
from sibylla.streams.policy import CLASSIFIER_ERROR_CATEGORY
from sibylla.streams.worker import build_worker


def _window(job_id: str, line: str) -> LogWindow:
    return LogWindow(job_id, 0, [line])


def _pipeline(tmp_path: Path, predict: object):
    settings = Settings.from_env({}, store="memory", data_dir=str(tmp_path),
                                 batch_max_wait_ms="1")
    return build_worker(settings, SimpleNamespace(version="v0", predict=predict))


async def test_a_window_the_model_fails_on_is_unknown_and_the_others_are_decided(
        tmp_path: Path) -> None:
    def predict(windows: Sequence[LogWindow]) -> list[Prediction]:
        if any("POISON" in w.tail[0] for w in windows):
            raise RuntimeError("model cannot take this window")
        return [Prediction("deterministic", 0.99, "import_error", [w.tail[0]])
                for w in windows]

    pipeline = _pipeline(tmp_path, predict)
    windows = [_window("a", "ModuleNotFoundError: x"), _window("b", "POISON"),
               LogWindow("c", 0, [])]
    read = await pipeline._classify(windows)
    assert read is not None
    predictions = [p for p, _ in read]
    assert [p.category if p else None for p in predictions] == [
        "import_error", CLASSIFIER_ERROR_CATEGORY, None]
    assert predictions[1] is not None and predictions[1].verdict == "unknown"
    # every window's text is still read: the policy and online learning need it
    assert [r.text for _, r in read] == ["ModuleNotFoundError: x", "POISON", ""]


async def test_a_model_failing_on_every_window_decides_nothing(tmp_path: Path) -> None:
    def predict(windows: Sequence[LogWindow]) -> list[Prediction]:
        raise RuntimeError("device lost")

    pipeline = _pipeline(tmp_path, predict)
    assert await pipeline._classify([_window("a", "x"), _window("b", "y")]) is None
