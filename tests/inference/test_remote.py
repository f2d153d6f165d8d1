"""The model in a process of its own decides as it does in the worker's process, and a model
process that dies costs one batch, not the worker's decisions from then on."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sibylla.inference.api import LogWindow
from sibylla.inference.checkpoint import ModelLoadError, load_checkpoint
from sibylla.inference.engine import ModelClassifier
from sibylla.inference.remote import ModelProcessError, ProcessClassifier

OOM = ["step 1 loss 0.5"] * 20 + ["Traceback (most recent call last):",
                                   "torch.OutOfMemoryError: CUDA out of memory."]
NCCL = ["step 1 loss 0.5"] * 20 + [
    "[rank3]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout"]


def windows() -> list[LogWindow]:
    return [LogWindow("oom", 0, OOM, OOM[-2:], len(OOM)),
            LogWindow("nccl", 1, NCCL, NCCL[-1:], len(NCCL))]


@pytest.fixture(scope="module")
def remote(tiny_path: Path) -> Iterator[ProcessClassifier]:
    classifier = ProcessClassifier(str(tiny_path), device="cpu", threads=1)
    yield classifier
    classifier.close()


def test_a_model_process_decides_as_the_model_does_in_process(
        remote: ProcessClassifier, tiny_path: Path) -> None:
    local = ModelClassifier(load_checkpoint(str(tiny_path)), device="cpu")
    assert remote.version == local.version
    assert remote.threshold == local.threshold
    assert (remote.device, remote.threads) == ("cpu", 1)
    assert remote.pid is not None and remote.pid != os.getpid()
    assert remote.predict(windows()) == local.predict(windows())


def test_a_killed_model_process_fails_its_batch_and_the_next_batch_starts_another(
        remote: ProcessClassifier) -> None:
    before = remote.predict(windows())
    dead = remote.pid
    assert dead is not None
    os.kill(dead, signal.SIGKILL)
    with pytest.raises(ModelProcessError, match="died"):
        remote.predict(windows())
    assert remote.predict(windows()) == before
    assert remote.pid not in (None, dead)


def test_a_model_that_cannot_be_loaded_says_why_in_the_worker(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        ProcessClassifier(str(tmp_path / "missing.safetensors"), device="cpu")


def test_closing_stops_the_model_process_without_reporting_a_crash(
        tiny_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    classifier = ProcessClassifier(str(tiny_path), device="cpu")
    pid = classifier.pid
    assert pid is not None
    with caplog.at_level(logging.WARNING, logger="sibylla.inference.remote"):
        classifier.close()
    assert caplog.records == []  # a swap closes the old model: not an error to page on
    assert classifier.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
