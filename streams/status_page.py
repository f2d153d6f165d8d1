"""The worker's status page (``GET /``): plain server-rendered HTML, no script, no build step.

It shows what an operator looks at first: is the worker ready, which model decides (with its
gate scores when the trainer announced it), lag per partition, decisions per action over the
last hour (an inline SVG chart), the last decisions with their evidence, dead letters and the
nodes retries were sent away from. Every string that comes from a log, a record or a topic is
attacker-controlled (a job can print anything) and goes through :func:`html.escape`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from sibylla.streams.activity import MINUTES, Activity
from sibylla.streams.readiness import ReadyState

__all__ = ["render_status_page"]

EVIDENCE_CHARS = 300  # per evidence line shown; the decision on the topic has it whole
REFRESH_S = 10
ACTION_COLOURS = {"do_not_retry": "#c0392b", "retry": "#27ae60", "retry_elsewhere": "#e67e22",
                  "default_policy": "#7f8c8d"}

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse}td,th{padding:.2em .6em;text-align:left;vertical-align:top;
border-bottom:1px solid #eee}th{background:#f4f4f4}td.n{text-align:right}
pre{margin:0;white-space:pre-wrap;overflow-wrap:anywhere;font-size:12px;min-width:28em;max-width:40em}
.ok{color:#1e7e34}.bad{color:#b21f2d}.muted{color:#777}
"""


def _t(value: object) -> str:
    return escape(str(value), quote=True)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], row_class: str = "") -> str:
    """A table; ``rows`` hold HTML already escaped by the caller."""
    th = "".join(f"<th>{_t(h)}</th>" for h in head)
    body = "".join(f"<tr{row_class}>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _scores(scores: Mapping[str, Any]) -> str:
    """Gate scores as the trainer announces them: {model: {part: {metric: value}}}."""
    rows: list[list[str]] = []
    for model, parts in scores.items():
        if not isinstance(parts, Mapping):
            rows.append([_t(model), "", _t(parts)])
            continue
        for part, metrics in parts.items():
            shown = (", ".join(f"{_t(k)} {v:.3f}" if isinstance(v, float) else f"{_t(k)} {_t(v)}"
                               for k, v in metrics.items())
                     if isinstance(metrics, Mapping) else _t(metrics))
            rows.append([_t(model), _t(part), shown])
    return _table(["model", "validation part", "scores"], rows)


def _model(activity: Activity) -> str:
    on = (f" on <b id=model-device>{_t(activity.model_device)}</b>"
          if activity.model_device else "")
    out = f"<p>Deciding with <b id=model-version>{_t(activity.model_version)}</b>{on}.</p>"
    if activity.model_scores:
        return out + "<p>Gate scores when it was promoted:</p>" + _scores(activity.model_scores)
    return out + ("<p class=muted>Gate scores: not known (this model was loaded at start, "
                  "not announced by the trainer since).</p>")


def _lag(activity: Activity, now: float) -> str:
    """One row per topic, one column per partition."""
    if activity.lag_at is None:
        return "<p class=muted>Not measured yet.</p>"
    partitions = sorted({p for _, p in activity.lag})
    topics = sorted({t for t, _ in activity.lag})
    rows = [[_t(topic)] + [f"{activity.lag[(topic, p)]:,}" if (topic, p) in activity.lag else ""
                           for p in partitions] for topic in topics]
    return (f"<p>Records not yet committed, per partition, measured {now - activity.lag_at:.0f} s "
            "ago (end offset minus the group's committed offset).</p>"
            + _table(["topic", *(f"p{p}" for p in partitions)], rows))


def _chart(per_minute: Mapping[str, list[int]]) -> str:
    """Stacked bars, one per minute of the last hour, coloured by action."""
    step, bar, height = 10, 8, 90
    width = step * MINUTES
    peak = max((sum(c[i] for c in per_minute.values()) for i in range(MINUTES)), default=0)
    if peak == 0:
        return "<p class=muted>No decisions in the last hour.</p>"
    rects: list[str] = []
    for i in range(MINUTES):
        y = float(height)
        for action, counts in per_minute.items():
            if counts[i]:
                h = counts[i] / peak * (height - 4)
                y -= h
                colour = ACTION_COLOURS.get(action, "#34495e")
                rects.append(f'<rect x="{step * i + 1}" y="{y:.1f}" width="{bar}" '
                             f'height="{h:.1f}" fill="{colour}"><title>{_t(action)}: '
                             f"{counts[i]}</title></rect>")
    legend = " ".join(
        f'<span style="color:{ACTION_COLOURS.get(a, "#34495e")}">■</span> {_t(a)} '
        f'<b class=action-total data-action="{_t(a)}">{sum(c)}</b>'
        for a, c in per_minute.items())
    axis = (f'<text x="0" y="{height + 14}" font-size="11">60 min ago</text>'
            f'<text x="{width}" y="{height + 14}" font-size="11" text-anchor="end">now</text>')
    return (f'<svg width="{width}" height="{height + 18}" role="img" '
            f'aria-label="decisions per minute"><rect width="{width}" height="{height}" '
            f'fill="#f6f6f6"/>{"".join(rects)}{axis}</svg>'
            f"<p>Decisions per minute, stacked by action (peak {peak}/min); last hour: {legend}"
            "</p>")


def _decisions(activity: Activity) -> str:
    if not activity.decisions:
        return "<p class=muted>None yet.</p>"
    rows = []
    for d in reversed(activity.decisions):
        evidence = "\n".join(line[:EVIDENCE_CHARS] for line in d.evidence)
        rows.append([
            _clock(d.decided_at), f"<span class=job-id>{_t(d.job_id)}</span>", _t(d.attempt),
            _t(d.verdict), f"{d.confidence:.2f}", f"<b class=action>{_t(d.action)}</b>"
            + (" (explored)" if d.explored else ""),
            f"{_t(d.category)}<br><small class=muted>{_t(d.model_version)}</small>",
            f"{d.latency_ms / 1000:.1f}",
            f"<pre>{_t(evidence)}</pre>" if evidence else "<span class=muted>no log</span>",
        ])
    return _table(["time (UTC)", "job", "attempt", "verdict", "confidence", "action",
                   "category, model", "latency s", "evidence"], rows, " class=decision")


def _dead_letters(activity: Activity) -> str:
    if not activity.dead_letters_by_kind:
        return "<p class=muted>None since this worker started.</p>"
    counts = ", ".join(f"{_t(k)} {n}" for k, n in sorted(activity.dead_letters_by_kind.items()))
    rows = [[_clock(n.at), _t(n.topic), _t(n.kind), _t(n.reason)]
            for n in reversed(activity.dead_letters)]
    return (f"<p>Since start, by reason class: {counts}. The records are on the dead-letter "
            "topic.</p>" + _table(["time (UTC)", "from topic", "class", "reason"], rows))


def _suspects(activity: Activity, now: float) -> str:
    nodes = activity.suspect_nodes(now)
    if not nodes:
        return "<p class=muted>None yet: no decision of the last hour sent a retry away from " \
               "a node.</p>"
    return _table(["node", "retries sent elsewhere (last hour)"],
                  [[_t(node), str(count)] for node, count in nodes])


def render_status_page(activity: Activity, ready: ReadyState, worker: str,
                       now: float | None = None) -> str:
    """The whole page for ``activity`` and ``ready``; ``worker`` names this process."""
    now = time.time() if now is None else now
    state = (f"<b class=ok id=ready>ready</b>: {_t(ready.reason)}" if ready.ready
             else f"<b class=bad id=ready>not ready</b>: {_t(ready.reason)}")
    sections = [
        ("Model", _model(activity)),
        ("Consumer lag", _lag(activity, now)),
        ("Decisions per action", _chart(activity.actions_per_minute(now))),
        ("Dead letters", _dead_letters(activity)),
        ("Suspect nodes", _suspects(activity, now)),
        ("Last decisions", _decisions(activity)),
    ]
    body = "".join(f"<h2>{_t(title)}</h2>{html}" for title, html in sections)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="refresh" content="{REFRESH_S}">'
            f"<title>Sibylla worker {_t(worker)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>Sibylla worker {_t(worker)}</h1><p>{state} · {_clock(now)} UTC · "
            '<a href="/metrics">metrics</a> · <a href="/ready">ready</a></p>'
            f"{body}</body></html>")
