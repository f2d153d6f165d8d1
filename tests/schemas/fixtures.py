"""Hypothesis strategies for log records: valid LogBatches as shippers send them, and the
same with one field broken, so that properties meet both sides of every rule."""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import strategies as st

INT64_MAX = 2**63 - 1

# Values at and around the schemas' bounds: 2**63 - 1 is no float, and 2**63 as a float is
# beyond the bound although float(2**63 - 1) equals it.
edges = st.sampled_from([INT64_MAX, 2**63, -(2**63), -(2**63) - 1, 9.223372036854776e18,
                         -9.223372036854776e18, 9.2233720368547748e18, 2.0, -0.0, 1e300, 0,
                         -1, "", "x" * 257])
anything = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=6),
                     st.floats(allow_nan=False, allow_infinity=False), edges, st.just({}),
                     st.just([]), st.just([{"line": "x"}]))

shipped_entry = st.fixed_dictionaries(
    {"line": st.text(max_size=40)},
    optional={"ts": st.one_of(st.floats(-1e12, 1e12), st.integers(-(2**63), INT64_MAX),
                              st.text(max_size=8)),
              "stream": st.sampled_from(["stdout", "stderr"]), "host": st.text(max_size=5),
              "rank": st.integers(0, INT64_MAX), "added_by_a_newer_shipper": anything})
shipped_batch = st.fixed_dictionaries(
    {"job_id": st.text(min_size=1, max_size=256), "lines": st.lists(shipped_entry, max_size=5)},
    optional={"attempt": st.integers(0, INT64_MAX), "eos": st.booleans()})


@st.composite
def broken_batch(draw: st.DrawFn) -> dict[str, Any]:
    """A shipped LogBatch with one field, of the record or of one of its lines, replaced or
    removed."""
    record = draw(shipped_batch)
    target = record
    if record["lines"] and draw(st.booleans()):
        target = draw(st.sampled_from(record["lines"]))
    name = draw(st.sampled_from(sorted({*target, "ts", "stream", "rank", "attempt", "eos"})))
    if draw(st.integers(0, 4)) == 0:
        target.pop(name, None)
    else:
        target[name] = draw(anything)
    return record


def schema_valid(record: Any, schema: dict[str, Any]) -> bool:
    """Whether ``record`` is valid by ``schema``, as outside tools judge it (jsonschema)."""
    try:
        jsonschema.validate(record, schema)
    except jsonschema.ValidationError:
        return False
    return True
