"""The policy with memory: what an attempt's log says about the job's history, and the rules
that turn a verdict plus that history into an action."""

from __future__ import annotations

import dataclasses
import re

from hypothesis import given
from hypothesis import strategies as st

from sibylla.inference.api import LogWindow, Prediction
from sibylla.schemas.records import Decision, JobEvent
from sibylla.settings import Settings
from sibylla.streams.attempts import (
    AttemptFacts,
    blamed_nodes,
    cause_line,
    facts_of,
    fingerprint,
    progress_of,
    template,
)
from sibylla.streams.memory import AttemptMemory
from sibylla.streams.metrics import WorkerMetrics
from sibylla.streams.policy import Rules, apply_memory, make_decision
from sibylla.streams.reading import read_window

RULES = Rules(max_retries=3, max_recurrence=2, max_excluded_nodes=2)

CASCADE = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/w/train.py", line 40, in <module>',
    "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered",
    "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 1800092 milliseconds",
    "terminate called after throwing an instance of 'c10::DistBackendError'",
]


def test_the_root_is_the_first_error_not_the_watchdog_cascade_after_it() -> None:
    window = LogWindow("j", 0, CASCADE[3:], CASCADE[:3], 5)
    assert cause_line(window) == CASCADE[2]
    only_cascade = LogWindow("j", 0, CASCADE[3:], [], 2)
    assert cause_line(only_cascade) == CASCADE[3]


def test_the_same_error_of_another_rank_or_step_has_the_same_fingerprint() -> None:
    a = fingerprint("collective_timeout", "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] "
                    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=48211)")
    b = fingerprint("collective_timeout", "[rank5]:[E ProcessGroupNCCL.cpp:563] [Rank 5] "
                    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=90210)")
    assert a == b
    assert a != fingerprint("nccl_network_error", "NCCL WARN NET/IB : Got completion with error")
    # Host tags go, the exception's class stays.
    assert template("gpu07: RuntimeError: CUDA error: misaligned address") == (
        "RuntimeError: CUDA error: misaligned address")
    assert fingerprint("x", "KeyError: 'lr'") != fingerprint("x", "ValueError: 'lr'")


def test_progress_counts_epochs_steps_and_checkpoints() -> None:
    lines = ["Epoch 3: 41%|████      | 410/1000 [12:01<17:18, 1.76s/it, loss=2.31]",
             "step=420 loss=2.2", "Saved checkpoint to /ckpt/step_400.pt", "iter 7"]
    assert progress_of(lines) == (3, 420, 1)


# What progress_of means, line by line with case-insensitive patterns; the worker's version
# scans the whole window at once (attempts.py says why) and must find the same.
_SPEC_EPOCH = re.compile(r"(?i)\bepoch[\s:=\[#]*(\d+)")
_SPEC_STEP = re.compile(r"(?i)\b(?:global[_ ]step|step|iter(?:ation)?|it)[\s:=\[#]*(\d+)"
                        r"|\|\s*(\d+)/\d+\s*\[")
_SPEC_CHECKPOINT = re.compile(r"(?i)\b(?:saved?|saving|wrote|writing)\b.{0,40}\bcheckpoint"
                              r"|\bcheckpoint\b.{0,40}\b(?:saved|written)\b")


def _progress_spec(lines: list[str]) -> tuple[int, int, int]:
    epoch = step = saved = 0
    for line in lines:
        epoch = max([epoch, *(int(m.group(1)) for m in _SPEC_EPOCH.finditer(line))])
        step = max([step, *(int(m.group(1) or m.group(2)) for m in _SPEC_STEP.finditer(line))])
        saved += bool(_SPEC_CHECKPOINT.search(line))
    return epoch, step, saved


_PIECES = ["Epoch", "epoch", "EPOCH", "step", "Step", "global_step", "global step", "it",
           "iter", "Iteration", "xstep", "limit", "checkpoint", "Saved", "saving", "written",
           "wrote", "|", "/", "[", "]", ":", "=", "#", " ", "\t", "_", "a", "3", "42", "1000",
           "loss", ".", "É", "\u2588"]


@given(st.lists(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join), max_size=8))
def test_progress_is_what_each_line_says(lines: list[str]) -> None:
    assert progress_of(lines) == _progress_spec(lines)


def test_gpu_faults_blame_the_node_they_name_and_node_failures_all_nodes() -> None:
    lines = ["gpu07: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
             "loss 2.1"]
    assert blamed_nodes(lines, ["gpu03", "gpu07"], "FAILED") == ("gpu07",)
    assert blamed_nodes(["NVRM: Xid 48: DBE (double bit error) ECC"], ["gpu03"],
                        "FAILED") == ("gpu03",)
    assert blamed_nodes(["ok"], ["a", "b"], "NODE_FAIL") == ("a", "b")
    assert blamed_nodes(["RuntimeError: boom"], ["a"], "FAILED") == ()


def _first(verdict: str, category: str, state: str = "FAILED", attempt: int = 0,
           nodes: tuple[str, ...] = ("n1",)) -> tuple[Decision, JobEvent]:
    event = JobEvent("j", attempt, "finished", state, 1, None, nodes)
    window = LogWindow("j", attempt, ["x"], [], 1)
    prediction = Prediction(verdict, 0.95, category, [])  # type: ignore[arg-type]
    return make_decision(event, window, prediction, "m", 1.0, 1.0), event


def _facts(attempt: int, fp: str = "f", progress: tuple[int, int, int] = (0, 10, 0),
           blamed: tuple[str, ...] = (), nodes: tuple[str, ...] = ("n1",)) -> AttemptFacts:
    return AttemptFacts(attempt, fp, "collective_timeout", progress, nodes, blamed)


def test_a_transient_root_that_recurs_without_progress_stops_the_job() -> None:
    first, _ = _first("nondeterministic", "collective_timeout")
    d0, h0 = apply_memory(first, _facts(0), [], RULES)
    assert (d0.action, d0.rule, d0.recurrence, d0.retries_left) == ("retry", "transient", 1, 2)
    again, _ = _first("nondeterministic", "collective_timeout", attempt=1)
    d1, h1 = apply_memory(again, _facts(1), [h0], RULES)
    assert (d1.action, d1.recurrence, d1.progressed) == ("retry", 2, False)
    third, _ = _first("nondeterministic", "collective_timeout", attempt=2)
    d2, _ = apply_memory(third, _facts(2), [h0, h1], RULES)
    assert (d2.action, d2.rule, d2.recurrence, d2.retries_left) == (
        "do_not_retry", "same_root_recurred", 3, 1)
    # The same root, but the attempt got further (resumed from a checkpoint): retry again.
    d2, _ = apply_memory(third, _facts(2, progress=(0, 50, 1)), [h0, h1], RULES)
    assert (d2.action, d2.progressed) == ("retry", True)


def test_an_unsure_verdict_gets_the_site_rule_once_and_stops_when_its_root_recurs() -> None:
    first, _ = _first("unknown", "config_error")
    d0, h0 = apply_memory(first, _facts(0), [], RULES)
    assert (d0.action, d0.rule) == ("default_policy", "unsure")
    d1, _ = apply_memory(dataclasses.replace(first, attempt=1), _facts(1), [h0], RULES)
    assert (d1.action, d1.rule) == ("do_not_retry", "same_root_recurred")


def test_a_confident_deterministic_verdict_stops_at_once() -> None:
    first, _ = _first("deterministic", "import_error")
    d, _ = apply_memory(first, _facts(0), [], RULES)
    assert (d.action, d.rule) == ("do_not_retry", "deterministic")


def test_the_budget_is_spent_by_the_jobs_own_failures_not_by_node_failures() -> None:
    history = [dataclasses.replace(_facts(i, fp=f"f{i}", progress=(0, i * 10, 0)),
                                   charged=i != 1) for i in range(4)]
    first, _ = _first("nondeterministic", "connection_error", attempt=4)
    d, _ = apply_memory(first, _facts(4, fp="new", progress=(0, 99, 0)), history, RULES)
    assert (d.action, d.rule, d.retries_left) == ("do_not_retry", "retry_budget_spent", 0)
    history[2] = dataclasses.replace(history[2], charged=False)
    d, _ = apply_memory(first, _facts(4, fp="new", progress=(0, 99, 0)), history, RULES)
    assert (d.action, d.retries_left) == ("retry", 0)


def test_a_node_failure_is_retried_elsewhere_free_of_charge_whatever_the_log_says() -> None:
    first, _ = _first("deterministic", "config_error", state="NODE_FAIL", nodes=("n4",))
    d, h = apply_memory(first, _facts(0, blamed=("n4",), nodes=("n4",)), [], RULES)
    assert (d.action, d.rule, d.exclude_nodes, d.retries_left) == (
        "retry_elsewhere", "not_job_fault", ["n4"], 3)
    assert h.charged is False


def test_blamed_nodes_are_excluded_across_attempts_newest_first_within_the_cap() -> None:
    history = [_facts(0, fp="a", blamed=("n1",)), _facts(1, fp="b", blamed=("n2",))]
    first, _ = _first("nondeterministic", "collective_timeout", attempt=2, nodes=("n3",))
    d, _ = apply_memory(first, _facts(2, fp="c", progress=(0, 99, 0), blamed=("n3",),
                                      nodes=("n3",)), history, RULES)
    assert (d.action, d.rule) == ("retry_elsewhere", "hardware_blamed")
    assert d.avoid_nodes == ["n3"]
    assert d.exclude_nodes == ["n2", "n3"]  # capped at 2: the oldest blame drops out


def test_facts_of_an_attempt_without_a_log_have_no_fingerprint() -> None:
    facts = facts_of(0, read_window(LogWindow("j", 0, [], [], 0)), "no_log", ("n1",), "FAILED")
    assert facts.fingerprint == "" and facts.blamed == ()
    assert AttemptFacts.from_dict(facts.to_dict()) == facts


def test_facts_of_a_window_name_its_root_its_progress_and_the_node_its_fault_names() -> None:
    lines = ["epoch 3 step 1200 loss 0.4", "saved checkpoint to /ckpt/3", *CASCADE,
             "gpu07: NVRM: Xid 79: GPU has fallen off the bus"]
    window = LogWindow("j", 0, lines, CASCADE, len(lines))
    facts = facts_of(1, read_window(window), "gpu_hardware", ("gpu03", "gpu07"), "FAILED")
    assert facts.fingerprint == fingerprint("gpu_hardware", cause_line(window))
    assert facts.progress == (3, 1200, 1)
    assert facts.blamed == ("gpu07",)


def test_the_worker_gives_unsure_transient_verdicts_the_site_rule_when_told_to() -> None:
    """SIBYLLA_MIN_RETRY_CONFIDENCE reaches the worker's decisions, which then treat the
    verdict as unsure: one retry by the site's rule, stopped when its root recurs."""
    settings = Settings.from_env({"SIBYLLA_MIN_RETRY_CONFIDENCE": "0.9"})
    memory = AttemptMemory({}, settings, WorkerMetrics())
    unsure = Prediction("nondeterministic", 0.6, "connection_error", [])
    window = LogWindow("j", 0, ["ConnectionResetError: [Errno 104] reset by peer"], [], 1)
    actions = []
    for attempt in (0, 1):
        event = JobEvent("j", attempt, "finished", "FAILED", 1, None, ("gpu-1",), 8)
        decision = memory.decide(event, window, unsure, read_window(window), "m", 10.0, 9.0)
        actions.append((decision.action, decision.rule))
    assert actions == [("default_policy", "unsure"), ("do_not_retry", "same_root_recurred")]
