"""The status page's memory stays bounded and its HTML never lets a log line become markup."""

from __future__ import annotations

import re

from sibylla.schemas.records import Decision
from sibylla.streams.activity import MINUTES, RECENT_DECISIONS, Activity, DeadLetterNote
from sibylla.streams.readiness import ReadyState
from sibylla.streams.status_page import render_status_page

NOW = 1_800_000_000.0
EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)>'
READY = ReadyState(True, "serving 2 partition(s)", [0, 1], 3.2)


def decision(job_id: str, action: str = "do_not_retry", at: float = NOW,
             evidence: list[str] | None = None, nodes: list[str] | None = None) -> Decision:
    return Decision(job_id, 0, "deterministic", 0.97, "python_runtime_error", action,  # type: ignore[arg-type]
                    nodes or [], evidence or [], "lstm-1", at, 120.0)


def test_log_text_and_names_are_escaped_everywhere() -> None:
    activity = Activity(EVIL)
    activity.set_model(EVIL, EVIL, {EVIL: {EVIL: {EVIL: 0.5}}})
    activity.on_decision(decision(EVIL, evidence=[EVIL], nodes=[EVIL], action="retry_elsewhere"))
    activity.on_dead_letter(DeadLetterNote(NOW, EVIL, "invalid_json", EVIL))
    activity.set_lag({(EVIL, 0): 3}, NOW)
    page = render_status_page(activity, ReadyState(False, EVIL, [], None), EVIL, NOW)
    assert "<script" not in page and "<img" not in page
    assert page.count("&lt;script&gt;") >= 9  # title, model, device, scores, job, evidence, ...


def test_the_page_shows_decisions_lag_dead_letters_and_says_when_there_are_none() -> None:
    empty = render_status_page(Activity("lstm-1"), READY, "w1", NOW)
    assert "Not measured yet" in empty and "No decisions in the last hour" in empty
    assert "None yet: no decision of the last hour sent a retry away" in empty
    assert "Gate scores: not known" in empty

    activity = Activity("lstm-1")
    activity.on_decision(decision("job-a", "do_not_retry", NOW - 120))
    activity.on_decision(decision("job-b", "retry_elsewhere", NOW - 60, nodes=["gpu-7"]))
    activity.on_decision(decision("job-c", "retry_elsewhere", NOW, nodes=["gpu-7", "gpu-8"]))
    activity.set_lag({("sibylla.logs", 0): 12, ("sibylla.logs", 1): 3400}, NOW - 2)
    activity.on_dead_letter(DeadLetterNote(NOW, "sibylla.logs", "too_long", "line too long"))
    page = render_status_page(activity, READY, "w1", NOW)
    assert re.search(r"<tr><td>sibylla.logs</td><td>12</td><td>3,400</td></tr>", page)
    assert 'data-action="retry_elsewhere">2</b>' in page
    assert 'data-action="do_not_retry">1</b>' in page
    assert "<tr><td>gpu-7</td><td>2</td></tr><tr><td>gpu-8</td><td>1</td></tr>" in page
    assert "too_long 1" in page
    rows = re.findall(r'<span class=job-id>(job-\w)</span>', page)
    assert rows == ["job-c", "job-b", "job-a"]  # newest first


def test_memory_is_bounded_and_old_minutes_leave_the_chart() -> None:
    activity = Activity("lstm-1")
    times = [NOW - 2 * 3600 + 60 * i for i in range(100)]  # one a minute, 2 h to 21 min ago
    for i, at in enumerate(times):
        activity.on_decision(decision(f"job-{i}", at=at))
    assert len(activity.decisions) == RECENT_DECISIONS
    assert len(activity._minutes) <= MINUTES
    per_minute = activity.actions_per_minute(NOW)["do_not_retry"]
    assert len(per_minute) == MINUTES
    assert sum(per_minute) == sum(1 for at in times if at // 60 > NOW // 60 - MINUTES) == 39
    assert per_minute[-20:] == [0] * 20  # the last 20 minutes had none


def test_the_page_says_where_the_model_runs_also_once_its_announcement_comes_again() -> None:
    activity = Activity("lstm-1")
    activity.set_model("lstm-1", "cuda")
    activity.set_scores({"lstm-1": {"real": {"det_precision": 0.99}}})  # announced again
    page = render_status_page(activity, READY, "w1", NOW)
    assert "Deciding with <b id=model-version>lstm-1</b> on <b id=model-device>cuda</b>." in page
    assert "det_precision 0.99" in page
