"""The demo waits for the labels its retries make, and only for those."""

from __future__ import annotations

from sibylla.inference.corpus import Record
from sibylla.streams.demo import silent_retries


def _record(label: str, log: str) -> Record:
    category = "config_error" if label == "deterministic" else "connection_error"
    return Record("x", "org/repo#1", "f", category, label, log)


def test_a_failed_retry_without_an_error_line_is_expected_to_make_no_label() -> None:
    """A CLI usage error has no line that opens an error, so the outcome of its failed retry
    cannot be compared and casts no vote: the demo once waited out its whole timeout for the
    label of such a job (a click ``Usage:`` log the model abstained on)."""
    retried = {
        "usage": _record("deterministic", "Usage: tune [OPTIONS] COMMAND [ARGS]...\n"
                                          "Try 'tune --help' for help.\n\n"
                                          "Error: No such command 'run'."),
        "traceback": _record("deterministic", "Traceback (most recent call last):\n"
                                              '  File "train.py", line 3, in <module>\n'
                                              "KeyError: 'lr'"),
        # a transient failure's retry completes: that outcome always votes
        "transient": _record("nondeterministic", "loss 0.31\nepoch 4 done"),
    }
    assert silent_retries(retried) == ["usage"]
