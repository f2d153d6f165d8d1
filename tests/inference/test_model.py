"""The recurrent model, training, fine-tuning and checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sibylla.inference.checkpoint import (
    Checkpoint,
    ModelLoadError,
    load_checkpoint,
    save_checkpoint,
)
from sibylla.inference.model import ModelConfig, RecurrentClassifier
from sibylla.inference.train import Example, calibrate_temperature, choose_threshold, train_model
from tests.inference.fixtures import TINY


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_forward_gives_both_heads_and_a_loss(cell: str) -> None:
    model = RecurrentClassifier(ModelConfig(vocab_size=30, cell=cell, embed_dim=8, hidden_dim=8))
    x = torch.randint(1, 30, (3, 11))
    logits, loss = model(x)
    assert logits.verdict.shape == (3, 2) and logits.category.shape == (3, 16)
    assert loss is None
    _, loss = model(x, (torch.tensor([0, 1, 0]), torch.tensor([1, 12, 3])))
    assert loss is not None and loss.item() > 0


def test_a_windows_score_does_not_depend_on_its_batch_mates() -> None:
    torch.manual_seed(0)
    model = RecurrentClassifier(ModelConfig(vocab_size=30, embed_dim=8, hidden_dim=8)).eval()
    short = torch.randint(1, 30, (1, 5))
    padded = torch.cat([short, torch.zeros(1, 20, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a, _ = model(short)
        b, _ = model(padded)
    assert torch.allclose(a.verdict, b.verdict, atol=1e-6)


def test_save_and_load_round_trip_exactly(tiny: Checkpoint, tiny_path: Path) -> None:
    loaded = load_checkpoint(tiny_path)
    assert loaded.vocab == tiny.vocab and loaded.meta == json.loads(json.dumps(tiny.meta))
    assert loaded.model.config == tiny.model.config
    for key, value in tiny.model.state_dict().items():
        assert torch.equal(value, loaded.model.state_dict()[key])


def test_training_records_version_and_calibration(tiny: Checkpoint) -> None:
    meta = tiny.meta
    assert meta["version"].startswith("lstm-") and len(meta["data_hash"]) == 64
    assert 0.5 <= meta["threshold"] <= 0.99 and meta["temperature"] > 0
    assert meta["train_config"]["seed"] == TINY.seed


def test_training_is_reproducible_with_a_fixed_seed(tiny: Checkpoint) -> None:
    from sibylla.inference.synthetic import generate
    from sibylla.inference.train import examples_from_records

    again = train_model(examples_from_records(generate(96, seed=3)), TINY)
    assert again.meta["version"] == tiny.meta["version"]
    for key, value in tiny.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[key])


def test_fine_tuning_works_on_a_copy_and_names_its_parent(tiny: Checkpoint) -> None:
    extra = [("RuntimeError: CUDA error: uncorrectable ECC error encountered",
              "nondeterministic", "gpu_hardware_error")] * 4
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    tuned = train_model(extra, TINY, init_from=tiny)
    assert tuned.vocab == tiny.vocab
    assert all(torch.equal(v, tiny.model.state_dict()[k]) for k, v in before.items())
    assert tuned.meta["fine_tuned_from"] == tiny.meta["version"]
    assert tuned.meta["version"] != tiny.meta["version"]


def test_plain_tuples_and_examples_are_accepted() -> None:
    assert Example(*("log", "deterministic", "syntax_error")).source == ""


def test_temperature_softens_overconfident_logits() -> None:
    logits = torch.tensor([[4.0, -4.0], [4.0, -4.0], [-4.0, 4.0], [-4.0, 4.0]])
    labels = torch.tensor([0, 1, 1, 0])  # half wrong: the right temperature is large
    assert calibrate_temperature(logits, labels) > 3


def test_threshold_rises_until_deterministic_precision_is_reached() -> None:
    p_det = [0.95, 0.9, 0.7, 0.65, 0.0]
    labels = [0, 0, 1, 0, 1]  # the 0.7 one is wrong
    assert choose_threshold(p_det, labels, 0.99, floor=0.6) == 0.71


def test_threshold_stops_rising_at_the_abstention_budget() -> None:
    p_det = [0.95, 0.9, 0.7, 0.65, 0.0]
    labels = [0, 0, 1, 0, 1]
    assert choose_threshold(p_det, labels, 0.99, floor=0.6, max_abstention=0.2) == 0.70


def _corrupt(path: Path, tmp_path: Path) -> Path:
    bad = tmp_path / "bad.safetensors"
    data = bytearray(path.read_bytes())
    bad.write_bytes(bytes(data[: len(data) // 2]))
    return bad


def test_broken_files_give_one_clear_error(tiny: Checkpoint, tiny_path: Path,
                                           tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        load_checkpoint(tmp_path / "missing.safetensors")
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_checkpoint(_corrupt(tiny_path, tmp_path))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a model at all")
    with pytest.raises(ModelLoadError):
        load_checkpoint(garbage)


def test_a_checkpoint_that_does_not_match_its_config_is_refused(tiny: Checkpoint,
                                                                tmp_path: Path) -> None:
    bigger = RecurrentClassifier(ModelConfig(vocab_size=len(tiny.vocab), embed_dim=16,
                                             hidden_dim=8))
    path = save_checkpoint(bigger, tiny.vocab, tiny.meta, tmp_path / "m.safetensors")
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as fh:
        header = dict(fh.metadata())
    header["config"] = json.dumps({**json.loads(header["config"]), "embed_dim": 8})
    save_file(load_file(str(path)), str(path), metadata=header)
    with pytest.raises(ModelLoadError, match="does not match"):
        load_checkpoint(path)
    header["format"] = "something-else/9"
    save_file(load_file(str(path)), str(path), metadata=header)
    with pytest.raises(ModelLoadError, match="format"):
        load_checkpoint(path)
