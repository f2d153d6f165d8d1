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
from sibylla.inference.features import batch_input, encode_window
from sibylla.inference.model import ModelConfig, ModelInput, RecurrentClassifier
from sibylla.inference.preprocess import window_from_text
from sibylla.inference.train import Example, calibrate_temperature, choose_threshold, train_model
from sibylla.inference.vocab import Vocabulary
from tests.inference.fixtures import NCCL_LOG, OOM_LOG, TINY


def _batch(texts: list[str], vocab: Vocabulary) -> ModelInput:
    return batch_input([encode_window(window_from_text(t), vocab) for t in texts])


def test_forward_gives_both_heads_and_a_loss(tiny: Checkpoint) -> None:
    x = _batch([OOM_LOG, NCCL_LOG, "Killed"], tiny.vocab)
    logits, loss = tiny.model(x)
    assert logits.verdict.shape == (3, 2) and logits.category.shape == (3, 16)
    assert logits.attention.shape[0] == 3
    # served outputs are log-probabilities of the two paths' average
    assert torch.allclose(logits.verdict.exp().sum(1), torch.ones(3), atol=1e-5)
    assert loss is None
    _, loss = tiny.model(x, (torch.tensor([0, 1, 0]), torch.tensor([1, 12, 3])))
    assert loss is not None and loss.item() > 0


def test_a_windows_score_does_not_depend_on_its_batch_mates(tiny: Checkpoint) -> None:
    long_log = "\n".join([OOM_LOG] + [f"step {i} loss {i / 7:.3f} lr 1e-4 tokens {i}"
                                      for i in range(80)] + [NCCL_LOG])
    with torch.no_grad():
        alone, _ = tiny.model(_batch([OOM_LOG], tiny.vocab))
        together, _ = tiny.model(_batch([long_log, OOM_LOG], tiny.vocab))
    assert torch.allclose(alone.verdict[0], together.verdict[1], atol=1e-5)
    assert torch.allclose(alone.category[0], together.category[1], atol=1e-5)


def test_the_wide_path_is_fitted_and_a_fine_tune_keeps_it(tiny: Checkpoint) -> None:
    assert tiny.model.wide.weight.abs().sum() > 0 and tiny.model.idf.max() > 0
    extra = [(OOM_LOG, "deterministic", "gpu_out_of_memory")] * 4
    tuned = train_model(extra, TINY, init_from=tiny)
    assert torch.equal(tuned.model.wide.weight, tiny.model.wide.weight)
    assert torch.equal(tuned.model.idf, tiny.model.idf)


def test_save_and_load_round_trip_exactly(tiny: Checkpoint, tiny_path: Path) -> None:
    loaded = load_checkpoint(tiny_path)
    assert loaded.vocab == tiny.vocab and loaded.meta == json.loads(json.dumps(tiny.meta))
    assert loaded.model.config == tiny.model.config
    for key, value in tiny.model.state_dict().items():
        assert torch.equal(value, loaded.model.state_dict()[key])


def test_training_records_version_and_calibration(tiny: Checkpoint) -> None:
    meta = tiny.meta
    assert meta["version"].startswith("lines-") and len(meta["data_hash"]) == 64
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


def test_a_fine_tune_never_lowers_its_parents_threshold(tiny: Checkpoint) -> None:
    """The threshold was chosen on real logs of unseen projects: a fine-tune's validation
    slice (here 20-odd logs) may raise it, never lower it."""
    from sibylla.inference.synthetic import generate
    from sibylla.inference.train import examples_from_records

    parent = Checkpoint(tiny.model, tiny.vocab, {**tiny.meta, "threshold": 0.93})
    tuned = train_model(examples_from_records(generate(160, seed=5)), TINY, init_from=parent)
    assert tuned.meta["n_val"] >= 20
    assert tuned.meta["threshold"] >= 0.93


def test_a_threshold_floor_is_kept_or_raised_never_rounded_up() -> None:
    p_det, labels = [0.95, 0.9, 0.895], [0, 0, 1]
    assert choose_threshold(p_det, labels, 0.99, floor=0.88) == 0.9  # 0.895 wrong: rises
    assert choose_threshold(p_det[:2], labels[:2], 0.99, floor=0.88) == 0.88
    assert choose_threshold([0.999, 0.6], [0, 1], 0.99, floor=0.995) == 0.995


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


def test_unsure_transient_verdicts_spend_no_abstention_budget() -> None:
    """They are decided at any threshold (only do_not_retry abstains), so the budget of 2.1
    windows holds the two deterministic ones below 0.71 and the wrong one is left out."""
    p_det = [0.95, 0.9, 0.7, 0.65, 0.0, 0.35, 0.4]
    labels = [0, 0, 1, 0, 1, 1, 1]
    assert choose_threshold(p_det, labels, 0.99, floor=0.6, max_abstention=0.3) == 0.71


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
    bigger = RecurrentClassifier(ModelConfig(vocab_size=len(tiny.vocab), dim=16))
    path = save_checkpoint(bigger, tiny.vocab, tiny.meta, tmp_path / "m.safetensors")
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as fh:
        header = dict(fh.metadata())
    header["config"] = json.dumps({**json.loads(header["config"]), "dim": 8})
    save_file(load_file(str(path)), str(path), metadata=header)
    with pytest.raises(ModelLoadError, match="does not match"):
        load_checkpoint(path)
    header["format"] = "something-else/9"
    save_file(load_file(str(path)), str(path), metadata=header)
    with pytest.raises(ModelLoadError, match="format"):
        load_checkpoint(path)
