"""Decoders generated from the JSON Schema files: bytes to validated objects in one pass in C.

A LogBatch costs the worker three passes in Python-driven C per line before its lines reach a
window: ``orjson`` builds a dict per line, the compiled check of :mod:`.validate` glances over
each field of them, and the lines are picked out. msgspec decodes the record straight into
structs while checking types, bounds and lengths, at a fraction of that cost
(docs/pipeline-bench.md, finding 25).

The struct types are generated from the schema file, so validity keeps one definition, and
only for the keywords whose meaning msgspec shares exactly (``type``, ``enum`` of strings,
``minimum``, ``maximum``, ``minLength``, ``maxLength``, ``items``, ``properties``,
``required``). A schema using any other keyword raises :class:`Unsupported` when its decoder
is built (at import, for the worker's): like the compiled checks of :mod:`.validate`, a
decoder must not half enforce a schema. A decoder may be stricter than the schema, never more
lenient: JSON Schema counts ``2.0`` as an integer and msgspec does not. A caller therefore
treats a decoder's refusal as "not sure", and decides that record with the compiled check,
which also says where it breaks the rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, Literal, Union

import msgspec

from sibylla.schemas.validate import ANNOTATIONS, load_schema

__all__ = ["Unsupported", "fast_decoder", "msgspec_type"]

_SUPPORTED = ANNOTATIONS | {"type", "enum", "minimum", "maximum", "minLength", "maxLength",
                             "items", "properties", "required"}


class Unsupported(ValueError):
    """The schema uses a keyword, or a form of one, that msgspec would not enforce alike."""


def msgspec_type(schema: Mapping[str, Any], name: str = "Record") -> Any:
    """The msgspec type accepting what ``schema`` accepts (or less: see the module's
    docstring). A property the record lacks is ``msgspec.UNSET``; unknown properties are
    skipped, as the contract lets writers add fields. Raises :class:`Unsupported`."""
    unknown = set(schema) - _SUPPORTED
    if unknown:
        raise Unsupported(f"{name}: keywords without a msgspec equivalent: {sorted(unknown)}")
    if "enum" in schema:
        values = schema["enum"]
        if "type" in schema or not values or not all(isinstance(v, str) for v in values):
            raise Unsupported(f"{name}: only an enum of strings, alone")
        return Literal[tuple(values)]
    types = schema.get("type")
    if types is None:
        raise Unsupported(f"{name}: a schema without a type accepts any value")
    kinds = [_one_type(schema, kind, name) for kind in
             ([types] if isinstance(types, str) else types)]
    return kinds[0] if len(kinds) == 1 else Union[tuple(kinds)]  # noqa: UP007 - built


def _one_type(schema: Mapping[str, Any], kind: str, name: str) -> Any:
    low, high = schema.get("minimum"), schema.get("maximum")
    if kind == "string":
        shortest, longest = schema.get("minLength"), schema.get("maxLength")
        if shortest is None and longest is None:
            return str
        return Annotated[str, msgspec.Meta(min_length=shortest, max_length=longest)]
    if kind == "integer":
        if low is None and high is None:
            return int
        return Annotated[int, msgspec.Meta(ge=low, le=high)]
    if kind == "number":  # an int stays an int, as orjson gives it
        if low is None and high is None:
            return Union[int, float]  # noqa: UP007 - a member of a built Union
        return Union[Annotated[int, msgspec.Meta(ge=low, le=high)],  # noqa: UP007
                     Annotated[float, msgspec.Meta(ge=_float_within(low, up=True),
                                                   le=_float_within(high, up=False))]]
    if kind == "boolean":
        return bool
    if kind == "array":
        if "items" not in schema:
            raise Unsupported(f"{name}: an array without items")
        return list[msgspec_type(schema["items"], f"{name}Item")]  # type: ignore[misc]
    if kind == "object":
        return _struct(schema, name)
    raise Unsupported(f"{name}: type {kind!r}")


def _float_within(bound: float | None, up: bool) -> float | None:
    """A float bound within the schema's own bound: ``maximum`` 2**63 - 1 is no float, and
    rounded (to 2**63) it would let 2**63 through. ``up``: a lower bound, rounded up."""
    if bound is None:
        return None
    edge = float(bound)
    if (edge < bound) if up else (edge > bound):
        edge = math.nextafter(edge, math.inf if up else -math.inf)
    return edge


def _struct(schema: Mapping[str, Any], name: str) -> type[msgspec.Struct]:
    required = set(schema.get("required", ()))
    properties = schema.get("properties", {})
    if not required <= set(properties):
        raise Unsupported(f"{name}: a required property without a schema")
    fields: list[Any] = []
    for prop, sub in properties.items():
        if not prop.isidentifier():
            raise Unsupported(f"{name}: property {prop!r} is not a field name")
        kind = msgspec_type(sub, f"{name}_{prop}")
        if prop in required:
            fields.insert(0, (prop, kind))  # fields without a default come first
        else:
            fields.append((prop, Union[kind, msgspec.UnsetType], msgspec.UNSET))  # noqa: UP007
    return msgspec.defstruct(name, fields)


@cache
def fast_decoder(schema_file: str) -> msgspec.json.Decoder[Any]:
    """The decoder of a schema file's records (e.g. ``logbatch.schema.json``). Its ``decode``
    raises ``msgspec.DecodeError`` (``ValidationError`` is one) for any record it does not
    accept."""
    schema = load_schema(schema_file)
    return msgspec.json.Decoder(msgspec_type(schema, schema.get("title", "Record")))
