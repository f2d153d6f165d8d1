"""SIBYLLA_COMMITTEE: which extra models vote beside the deciding one, and their votes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest

from sibylla.inference.api import LogWindow
from sibylla.inference.checkpoint import shipped_model_path
from sibylla.online_learning.committee import build_committee
from sibylla.online_learning.settings import OnlineSettings
from sibylla.online_learning.worker import OnlineLearning
from sibylla.settings import SettingsError
from tests.online_learning.test_worker_votes import (
    ERROR,
    batch,
    decision,
    fake_pipeline,
    labels,
    read,
)

OOM = ["torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
NCCL = ["RuntimeError: NCCL communicator was aborted on rank 3: Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE) ran for 1800000 "
        "milliseconds before timing out."]


def test_no_committee_by_default() -> None:
    assert OnlineSettings.from_env({}).committee == ""
    assert build_committee("") == {}


def test_the_committee_names_its_members_by_model_version() -> None:
    committee = build_committee(f" rules, {shipped_model_path()} ", device="cpu")
    assert list(committee)[0] == "regex-rules"
    assert list(committee)[1].startswith("lines-")


@pytest.mark.parametrize("spec, message", [
    ("rules,gpt", "SIBYLLA_COMMITTEE: 'gpt' is not rules, tfidf or a model file"),
    ("rules, rules", "SIBYLLA_COMMITTEE: 'rules' is in the committee twice"),
])
def test_a_bad_committee_stops_start_up_naming_the_setting(spec: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        build_committee(spec)


def test_a_model_file_that_cannot_be_loaded_is_a_setting_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not a model")
    with pytest.raises(SettingsError, match="SIBYLLA_COMMITTEE: .*broken.safetensors"):
        build_committee(str(broken))


def test_tfidf_is_fitted_at_start_and_tells_transient_from_deterministic() -> None:
    [(name, tfidf)] = build_committee("tfidf").items()
    oom, nccl = tfidf.predict([LogWindow("a", 0, OOM, OOM), LogWindow("b", 0, NCCL, NCCL)])
    assert name == "tfidf-logreg"
    assert (oom.verdict, nccl.verdict) == ("deterministic", "nondeterministic")


async def test_every_member_votes_and_the_label_carries_their_votes() -> None:
    p = fake_pipeline()
    committee = build_committee(f"rules,{shipped_model_path()}", device="cpu")
    ol = OnlineLearning(p, OnlineSettings(), committee)
    await ol.on_decided([read(LogWindow("job", 0, ERROR, ERROR),
                              decision(0, "deterministic", 0.9))])
    done = orjson.dumps({"job_id": "job", "attempt": 1, "event": "finished",
                         "state": "COMPLETED"})
    await ol._outcomes_batch(batch(done))
    [label] = labels(p.t.labels)
    assert label.label == "nondeterministic"  # the outcome outweighs three models
    sources = {v.source: v.label for v in label.votes}
    assert sources == {"outcome": "nondeterministic", "model:primary": "deterministic",
                       "model:regex-rules": "deterministic",
                       f"model:{list(committee)[1]}": "deterministic"}


async def test_each_decision_of_a_batch_gets_the_votes_on_its_own_window() -> None:
    # The committee predicts once per decide batch; a window with no line gets no vote.
    ol = OnlineLearning(fake_pipeline(), OnlineSettings(), build_committee("tfidf"))
    batch = [read(LogWindow(job, 0, lines, lines), dataclasses.replace(decision(0), job_id=job))
             for job, lines in (("oom", OOM), ("silent", []), ("nccl", NCCL))]
    await ol.on_decided(batch)

    def committee(job: str) -> dict[str, str]:
        record = ol._get(job, 0)
        assert record is not None and record.decided
        return {source: vote.label for source, vote in record.votes.items()}

    assert committee("oom") == {"model:tfidf-logreg": "deterministic"}
    assert committee("nccl") == {"model:tfidf-logreg": "nondeterministic"}
    assert committee("silent") == {}
