"""``sibylla evaluate --folds K``: every real log decided by classifiers trained without its
repository, scored like a held-out file."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sibylla.cli import main
from sibylla.inference import crossval
from sibylla.inference.corpus import Record, project_of
from sibylla.inference.synthetic import generate
from tests.inference.fixtures import TINY


def _real_like(n_repos: int, per_repo: int) -> list[Record]:
    """Generated logs posing as real ones, ``per_repo`` from each of ``n_repos`` repositories."""
    logs = generate(n_repos * per_repo, seed=5)
    return [replace(r, id=f"R{i}", source=f"owner/repo{i % n_repos}#{i}")
            for i, r in enumerate(logs)]


def test_every_log_is_decided_by_classifiers_that_never_saw_its_repository(
        monkeypatch: pytest.MonkeyPatch) -> None:
    records = _real_like(n_repos=6, per_repo=3)
    trained_on: list[set[str]] = []
    real_train = crossval.train_model

    def spy(examples: Any, config: Any) -> Any:
        trained_on.append({ex.source.split("#")[0] for ex in examples})
        return real_train(examples, config)

    monkeypatch.setattr(crossval, "train_model", spy)
    report = crossval.cross_validate(TINY, records, folds=3)

    assert report["n"] == len(records) == sum(report["fold_sizes"])
    assert report["projects"] == 6
    # one model per non-empty fold, none trained on a repository of the logs it decided
    held_out = [{project_of(r) for r in records if crossval.project_fold(r, 3) == k}
                for k in range(3)]
    held_out = [repos for repos in held_out if repos]
    assert len(trained_on) == len(held_out)
    for seen, repos in zip(trained_on, held_out, strict=True):
        assert not seen & repos
    # scored like a held-out file: the baselines beside the model, the model's operating point
    # cross-fitted (a fold's model has none of its own)
    assert {"model, no abstention", "char tf-idf + logistic regression",
            "tf-idf + logistic regression", "model, cross-fitted threshold"} <= set(report["rows"])
    assert "model" not in report["rows"]
    assert report["model"] == report["rows"]["model, cross-fitted threshold"]
    assert 0.0 <= report["macro_f1"] <= 1.0


def test_fewer_than_two_folds_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    with pytest.raises(ValueError, match="at least 2 folds"):
        crossval.cross_validate(TINY, _real_like(2, 1), folds=1)
    assert main(["evaluate", "--folds", "1"]) == 2
    assert "at least 2 folds" in capsys.readouterr().err
