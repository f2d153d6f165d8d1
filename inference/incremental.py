"""An incremental featuriser: a job's lines are prepared as they arrive, not at its end.

:class:`IncrementalFeatures` keeps the same bounded window as the stream (the stream's own
:class:`~sibylla.streams.window.TailWindow`, so the limits and the first-error rule are the
stream's) and, beside each kept line, that line already redacted and masked
(:func:`~.preprocess.prepare_line`). When the job ends, :meth:`IncrementalFeatures.encode`
only selects lines and looks ids up: a decision then costs little more than the forward pass
(:meth:`~.engine.ModelClassifier.predict_encoded`). What it returns is exactly
``encode_window(window, vocab)`` of the window the stream would have kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from sibylla.streams.window import DEFAULT_LIMITS, TailWindow, WindowLimits

from .api import LogWindow
from .features import Encoded, encode_selected
from .preprocess import Prepared, prepare_line, select_prepared
from .vocab import Vocabulary

__all__ = ["IncrementalFeatures"]


class IncrementalFeatures:
    """One job attempt's window, its lines prepared as they are fed. Not thread-safe."""

    __slots__ = ("window", "_tail", "_first")

    def __init__(self, limits: WindowLimits | None = None) -> None:
        self.window = TailWindow(limits or DEFAULT_LIMITS)
        self._tail: deque[Prepared] = deque()  # parallel to the window's tail
        self._first: list[Prepared] = []  # parallel to window.first_error

    def feed(self, lines: Iterable[str], now: float = 0.0) -> None:
        """Append lines in the order printed (the window's limits apply as in the stream)."""
        window, first = self.window, self.window.first_error
        printed = list(lines)
        in_block = len(first)
        window.extend(printed, now)
        # the new lines the tail keeps, as kept (a huge one keeps its end)
        kept = window.lines(max(window.tail_len - len(printed), 0))
        prepared_tail = self._tail
        prepared_tail.extend(map(prepare_line, kept))
        while len(prepared_tail) > window.tail_len:
            prepared_tail.popleft()
        # the lines that joined the first error block (the tail may not keep them all)
        self._first.extend(map(prepare_line, first[in_block:]))

    def log_window(self, job_id: str = "", attempt: int = 0) -> LogWindow:
        return self.window.to_log_window(job_id, attempt)

    @property
    def empty(self) -> bool:
        """No non-blank line (see :attr:`~.api.LogWindow.empty`)."""
        window = self.window
        return not any(line.strip() for line in (*window.first_error, *window.tail))

    def encode(self, vocab: Vocabulary) -> Encoded:
        """The model's input: ``encode_window(self.log_window(), vocab)``."""
        return encode_selected(*select_prepared(self._first, self._tail), vocab)
