"""``sibylla train --real-files``: which real logs to train on, refused when none would be
left to choose the operating threshold on or when a name is not a packaged file."""

from __future__ import annotations

import pytest

from sibylla.cli import build_parser
from sibylla.inference.corpus import HELD_OUT_FILE, REAL_FILES, TRAIN_FILES


def test_real_files_names_the_packaged_files_trained_on() -> None:
    args = build_parser().parse_args(["train", "--real-files",
                                      f"{TRAIN_FILES[0]}, {HELD_OUT_FILE}"])
    assert args.real_files == (TRAIN_FILES[0], HELD_OUT_FILE)
    assert build_parser().parse_args(["train"]).real_files is None  # the default recipe


@pytest.mark.parametrize("value", ["real_public_zz.jsonl", ",".join(REAL_FILES), " , "])
def test_real_files_refuses_unknown_names_and_training_on_everything(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["train", "--real-files", value])
    assert exit_info.value.code == 2
    assert "--real-files" in capsys.readouterr().err
