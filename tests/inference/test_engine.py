"""The classifier the pipeline calls: batching, abstention, empty windows, evidence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.inference import Classifier, LogWindow, ModelLoadError, load_classifier
from sibylla.inference.checkpoint import Checkpoint
from sibylla.inference.corpus import HELD_OUT_FILE, REAL_FILES
from sibylla.inference.engine import NO_LOG, ModelClassifier
from sibylla.inference.preprocess import window_from_text
from tests.inference.fixtures import NCCL_LOG, OOM_LOG


def test_load_classifier_meets_the_pipeline_contract(tiny_path: Path) -> None:
    classifier = load_classifier(str(tiny_path), device="cpu")
    assert isinstance(classifier, Classifier)
    assert classifier.version.startswith("lines-")
    assert classifier.threshold > 0


def test_missing_model_is_a_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError):
        load_classifier(str(tmp_path / "nope.safetensors"))


def test_empty_window_is_unknown_with_no_confidence(tiny: Checkpoint) -> None:
    [prediction] = ModelClassifier(tiny, device="cpu").predict([LogWindow("j", 0, tail=[])])
    assert prediction.verdict == "unknown" and prediction.confidence == 0.0
    assert prediction.category == NO_LOG


def test_batching_never_changes_a_windows_prediction(tiny: Checkpoint) -> None:
    classifier = ModelClassifier(tiny, device="cpu", batch_size=3)
    windows = [window_from_text(log, job_id=str(i)) for i, log in enumerate(
        [OOM_LOG, NCCL_LOG, "Killed", OOM_LOG + "\n" + NCCL_LOG * 3, "", "x\n" * 40])]
    together = classifier.predict(windows)
    alone = [classifier.predict([w])[0] for w in windows]
    assert [p.verdict for p in together] == [p.verdict for p in alone]
    assert [p.confidence for p in together] == pytest.approx([p.confidence for p in alone],
                                                              abs=1e-4)


def test_verdict_and_category_agree_and_threshold_abstains(tiny: Checkpoint) -> None:
    strict = ModelClassifier(tiny, device="cpu", min_confidence=0.999999)
    loose = strict.with_threshold(0.0)
    window = window_from_text(OOM_LOG)
    [abstained] = strict.predict([window])
    [decided] = loose.predict([window])
    assert abstained.verdict == "unknown" and decided.verdict != "unknown"
    from sibylla.inference.taxonomy import label_of

    assert label_of(decided.category) == decided.verdict


def test_evidence_comes_from_the_log_with_secrets_redacted(tiny: Checkpoint) -> None:
    log = OOM_LOG + "\nexport HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123"
    [prediction] = ModelClassifier(tiny, device="cpu").predict([window_from_text(log)])
    assert prediction.evidence and all(line in log or "<secret>" in line
                                       for line in prediction.evidence)
    assert not any("hf_abcdefghijklmnopqrstuvwxyz0123" in line for line in prediction.evidence)


def test_the_shipped_model_loads_and_tells_a_bug_from_a_flaky_network() -> None:
    classifier = load_classifier(device="cpu")
    oom, nccl, empty = classifier.predict([window_from_text(OOM_LOG), window_from_text(NCCL_LOG),
                                           LogWindow("j", 0, tail=[])])
    assert (oom.verdict, oom.category) == ("deterministic", "gpu_out_of_memory")
    assert (nccl.verdict, nccl.category) == ("nondeterministic", "collective_timeout")
    assert empty.verdict == "unknown"
    assert classifier.version == classifier.meta["version"]
    # Its headline numbers come from real files it did not train on; a file packaged after
    # it was trained is held out too.
    trained = set(classifier.meta["train_config"]["real_files"])
    held_out = [name for name in REAL_FILES if name not in trained]
    assert HELD_OUT_FILE in held_out
    assert set(classifier.meta["metrics"]["held_out_files"].split(", ")) <= set(held_out)



def test_a_window_of_blank_lines_is_no_log_for_the_model_and_the_pipeline(tiny: Checkpoint
                                                                          ) -> None:
    blank = LogWindow("j", 0, tail=["", "   ", "\t"])
    assert blank.empty
    assert not LogWindow("j", 0, tail=["", "Killed"]).empty
    [prediction] = ModelClassifier(tiny, device="cpu").predict([blank])
    assert (prediction.verdict, prediction.category) == ("unknown", NO_LOG)


def test_evidence_names_the_exception_not_the_imports_of_its_traceback() -> None:
    from sibylla.inference.engine import _root_line
    from sibylla.inference.preprocess import Line

    lines = [Line(text, text) for text in (
        "Traceback (most recent call last):", 'File "/x/train.py", line 3, in <module>',
        "from detectron2.config import get_cfg", "CUDA:1 (NVIDIA TITAN X, 12189MiB)",
        "[rank0]: IndentationError: unindent does not match any outer indentation level",
        "RuntimeError: later, collateral")]
    assert _root_line(lines) == 4
    assert _root_line([Line("NCCL WARN socket closed", "x"), Line("ok", "ok")]) == 0
    assert _root_line([Line("all good", "x")]) is None


@pytest.mark.parametrize("logged", [
    "F0601 10:27:47.313387  4577 math_functions.cpp:91] Check failed: error == cudaSuccess "
    "(30 vs. 0)  unknown error",
    "2018-05-09 09:37:18.401486: E tensorflow/stream_executor/cuda/cuda_event.cc:49] Error "
    "polling for event status: failed to query event: CUDA_ERROR_LAUNCH_FAILED",
    "[rank4]:[E421 02:05:38.764490322 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed",
    "I0321 21:59:14.739044 11354 solver.cpp:219] Iteration 160 (0.50 iter/s), loss = nan",
    "5/5 [==============================] - 42s 8s/step - loss: nan - val_loss: nan",
])
def test_evidence_names_a_failure_logged_without_an_exception(logged: str) -> None:
    """Caffe, TensorFlow and torch's C++ logs state a failure as a glog line at level E or F;
    a numerical failure shows first as a loss gone NaN. The stack dump and the abort after it
    are where the process died, not why."""
    from sibylla.inference.engine import _root_line
    from sibylla.inference.preprocess import Line

    lines = [Line(t, t) for t in (
        "I0601 10:27:47.1 4577 net.cpp:406] conv1 <- data", logged,
        "*** Check failure stack trace: ***", "@     0x7efd2b81f8ba  caffe::caffe_gpu_memcpy()",
        "RuntimeError: the process died", "Aborted (core dumped)")]
    assert _root_line(lines) == 1


_GLOG_PIECES = ["E0325 20:57:27.620000 2606 api.py:869] ", "[E421 02:05:38.7 Gloo.cpp:143]",
                "[F ProcessGroupNCCL.cpp:341]", "2018-05-09 09:37:18.401486: E x/y.cc:49] ",
                "loss", "LOSS", "Loss is ", ": nan", "=NaN ", "]", " ", "step 3 "]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_GLOG_PIECES) | st.text(max_size=12), max_size=8).map("".join))
def test_the_logged_failure_shortcut_agrees_with_its_pattern(text: str) -> None:
    from sibylla.inference.engine import _LOGGED_FAILURE, _logged_failure

    assert _logged_failure(text) == (_LOGGED_FAILURE.search(text) is not None)


def test_evidence_leaves_out_a_tracebacks_source_lines_but_not_its_raise() -> None:
    from sibylla.inference.engine import _evidence
    from sibylla.inference.features import Encoded
    from sibylla.inference.preprocess import Line

    texts = ('File "/x/run.py", line 9, in main', "elastic_launch(",
             'File "/x/api.py", line 3, in launch', 'raise _env_error("MASTER_ADDR")',
             'File "/x/train.py", line 3, in <module>', "OSError: [Errno 107] Transport "
             "endpoint is not connected", "step 9")
    lines = [Line(t, t) for t in texts]
    attention = [0.0, 0.5, 0.0, 0.2, 0.0, 0.1, 0.2]
    evidence = _evidence(Encoded(lines, np.full((7, 24), 5), np.zeros((7, 96), int), [],
                                 np.full(7, -1)), attention)
    assert evidence == ['raise _env_error("MASTER_ADDR")', "OSError: [Errno 107] Transport "
                        "endpoint is not connected", "step 9"]


def test_evidence_shows_what_nccl_names_after_last_error() -> None:
    from sibylla.inference.engine import _evidence
    from sibylla.inference.features import Encoded
    from sibylla.inference.preprocess import Line

    texts = ("[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp",
             "[rank0]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
             "[rank0]: Last error:",
             "[rank0]: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1c000",
             "step 9")
    lines = [Line(t, t) for t in texts]
    attention = [0.1, 0.3, 0.4, 0.0, 0.2]
    evidence = _evidence(Encoded(lines, np.full((5, 24), 5), np.zeros((5, 96), int), [],
                                 np.full(5, -1)), attention)
    assert evidence == [texts[0], texts[1], texts[3]]


def test_evidence_leaves_out_traceback_headers_frames_and_imports() -> None:
    from sibylla.inference.engine import _evidence
    from sibylla.inference.features import Encoded
    from sibylla.inference.preprocess import Line

    texts = ("Traceback (most recent call last):", 'File "/x/train.py", line 3, in <module>',
             "from detectron2.config import get_cfg", "ValueError: bad shape", "step 9")
    lines = [Line(t, t) for t in texts]
    attention = [0.4, 0.3, 0.2, 0.05, 0.05]  # attention on the noise, as it happens
    evidence = _evidence(Encoded(lines, np.full((5, 24), 5), np.zeros((5, 96), int), [],
                                 np.full(5, -1)), attention)
    assert evidence == ["ValueError: bad shape", "step 9"]


def test_cached_line_vectors_change_no_score(tiny: Checkpoint) -> None:
    # A served classifier computes each line template's vector once and reuses it; its scores
    # are those of the plain forward pass (to float rounding: a vector computed in another
    # batch may round differently), for lines with a template, lines of their own (non-ASCII,
    # a secret), the separator, and when the cache fills and starts over.
    from sibylla.inference.engine import score_encoded
    from sibylla.inference.features import encode_window
    from sibylla.inference.line_vectors import LineVectors

    logs = [OOM_LOG, NCCL_LOG, "Schritt 3 – Verlust 0.5\nRuntimeError: Größe passt nicht",
            "api_key=sk-abcdefghijklmnop1234\nKeyError: 'lr'", "step 7 loss 0.1\n" * 30 + OOM_LOG]
    encoded = [encode_window(window_from_text(log, job_id=str(i)), tiny.vocab)
               for i, log in enumerate(logs * 3)]
    model = tiny.model.eval()
    plain = score_encoded(model, encoded, batch_size=4)
    for cache in (LineVectors(model), LineVectors(model, capacity=40),
                  LineVectors(model, capacity=8)):  # fewer than a batch's lines
        for _ in range(2):  # cold, then warm
            cached = score_encoded(model, encoded, batch_size=4, lines=cache)
            for got, want in ((cached.verdict_logits, plain.verdict_logits),
                              (cached.category_probs, plain.category_probs),
                              (cached.attention, plain.attention)):
                assert len(got) == len(want)
                for row, expected in zip(got, want, strict=True):
                    assert row == pytest.approx(expected, abs=1e-5)
        assert len(cache.slots) <= cache.capacity
