"""A tiny trained model shared by the inference tests (seconds, not minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sibylla.inference.checkpoint import Checkpoint, save_checkpoint
from sibylla.inference.synthetic import generate
from sibylla.inference.train import examples_from_records, train_model
from tests.inference.fixtures import TINY


@pytest.fixture(scope="session")
def tiny() -> Checkpoint:
    return train_model(examples_from_records(generate(96, seed=3)), TINY)


@pytest.fixture(scope="session")
def tiny_path(tiny: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(tiny.model, tiny.vocab, tiny.meta,
                           tmp_path_factory.mktemp("model") / "tiny.safetensors")
