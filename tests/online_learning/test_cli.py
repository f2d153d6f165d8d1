"""``sibylla models list`` shows every candidate and the gate's reasons; the commands are
registered without importing torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sibylla.cli import main
from sibylla.online_learning.store import ModelEntry, ModelStore
from tests.online_learning.fixtures import examples, tiny_checkpoint


def test_models_list_shows_candidates_current_and_reasons(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ModelStore(tmp_path)
    store.record(ModelEntry("base-0", "base"), tiny_checkpoint(examples(8), "base-0"))
    store.set_current("base-0")
    store.record(ModelEntry("bad-1", "rejected", reasons=["real: accuracy 0.5 < 0.9 - 0.01"],
                            scores={"candidate": {"real": {"accuracy": 0.5}}}, parent="base-0"))
    assert main(["models", "list", "--models-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "* base-0" in out
    assert "bad-1" in out and "0.500" in out and "rejected: real: accuracy" in out


def test_registering_the_commands_does_not_import_torch() -> None:
    code = ("import sys; from sibylla.cli import build_parser; build_parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
