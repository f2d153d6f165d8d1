"""The restart budget of a worker whose faust crashed on a broker that answers again."""

from __future__ import annotations

from sibylla.streams.worker import RESTART_LIMIT, RESTART_WINDOW_S, next_restarts


def test_a_worker_stops_starting_again_once_its_restarts_fill_the_window() -> None:
    """A broker that answers its bootstrap but advertises an address nobody can reach makes
    every start crash: the worker gives up after the budget instead of looping forever."""
    history, now = "", 1_000.0
    for _ in range(RESTART_LIMIT):
        following = next_restarts(history, now)
        assert following is not None
        history, now = following, now + 1.0
    assert next_restarts(history, now) is None


def test_restarts_older_than_the_window_are_forgotten() -> None:
    """A worker that served for hours between two blips is not refused its next restart."""
    now = 50_000.0
    old = ",".join(str(now - RESTART_WINDOW_S - offset) for offset in range(RESTART_LIMIT))
    following = next_restarts(old, now)
    assert following is not None
    assert [float(stamp) for stamp in following.split(",")] == [now]
