"""Validators compiled from the JSON Schema files, so that validity has one definition.

Outside tools validate records with the schema files beside this module; the agents must accept
exactly the same records. A general validator (``jsonschema``) costs tens of microseconds per
record, too much for a topic carrying hundreds of thousands of lines a second, so each schema
is compiled once into a tree of small closures covering the keywords the files use: ``type``,
``enum``, ``const``, ``minimum``, ``maximum``, ``minLength``, ``maxLength``, ``pattern``,
``items``, ``properties`` and ``required``. A keyword outside that set stops the compilation:
a schema the compiler does not understand must not be half enforced.

A check raises :class:`ValidationFailure` naming where the record breaks the rule
(``lines[3].rank must be an integer >= 0``); the records module turns it into its RecordError.
The path is built on the way out of a failure, not handed down: a valid record (nearly all of
them) costs no string formatting, where a path per LogBatch line was a third of its check.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["ANNOTATIONS", "Check", "ValidationFailure", "compile_schema", "glance_over_list",
           "load_schema", "schema_check"]

Check = Callable[[Any], None]

# Keywords that document or annotate and never reject a record.
ANNOTATIONS = frozenset({"$schema", "$id", "title", "description", "default"})
_KNOWN = ANNOTATIONS | {"type", "enum", "const", "minimum", "maximum", "minLength",
                        "maxLength", "pattern", "items", "properties", "required"}

_TYPE_NAMES = {"integer": "an integer", "number": "a number", "string": "a string",
               "boolean": "a boolean", "array": "a list", "object": "an object",
               "null": "null"}


class ValidationFailure(ValueError):
    """A value breaks its schema; the message says where (``path``, relative to the value
    checked) and what the rule is."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path or 'record'} must be {rule}")
        self.path = path
        self.rule = rule

    def under(self, head: str) -> ValidationFailure:
        """The same failure seen from the container holding the value at ``head``."""
        tail = self.path
        return ValidationFailure(
            head + ("." + tail if tail and not tail.startswith("[") else tail), self.rule)


def _is_type(value: Any, name: str) -> bool:
    # JSON Schema's types, not Python's: 2.0 is an integer, True is not a number.
    kind = type(value)
    if name == "integer":
        return kind is int or (kind is float and value.is_integer())
    if name == "number":
        return kind is int or kind is float
    if name == "string":
        return kind is str
    if name == "boolean":
        return kind is bool
    if name == "null":
        return value is None
    if name == "array":
        return kind is list
    if name == "object":
        return kind is dict
    raise ValueError(f"unknown JSON Schema type {name!r}")


def _describe(schema: Mapping[str, Any]) -> str:
    """The rule of a schema in words, for the reason sent to the dead-letter topic."""
    if "const" in schema:
        return f"exactly {json.dumps(schema['const'])}"
    if "enum" in schema:
        return "one of " + ", ".join(v if isinstance(v, str) else json.dumps(v)
                                     for v in schema["enum"])
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    words = " or ".join(_TYPE_NAMES[t] for t in types) or "a value"
    bounds = []
    if "minimum" in schema:
        bounds.append(f">= {schema['minimum']}")
    if "maximum" in schema:
        bounds.append(f"<= {schema['maximum']}")
    if "minLength" in schema:
        bounds.append(f"at least {schema['minLength']} characters")
    if "maxLength" in schema:
        bounds.append(f"at most {schema['maxLength']} characters")
    if "pattern" in schema:
        bounds.append(f"matching {schema['pattern']}")
    return " ".join([words, *bounds]) if len(bounds) < 2 else f"{words} ({', '.join(bounds)})"


def compile_schema(schema: Mapping[str, Any]) -> Check:
    """One check function enforcing ``schema`` (the subset of keywords listed above)."""
    unknown = set(schema) - _KNOWN
    if unknown:
        raise ValueError(f"schema keywords not supported: {', '.join(sorted(unknown))}")
    rule = _describe(schema)
    checks: list[Check] = []

    if "const" in schema:
        const = schema["const"]
        checks.append(lambda v: None if v == const and type(v) is type(const)
                      else _fail(rule))
    if "enum" in schema:
        checks.append(_enum_check(list(schema["enum"]), rule))
    if "type" in schema:
        names = schema["type"]
        names = (names,) if isinstance(names, str) else tuple(names)
        checks.append(_type_check(names, rule))
    numeric = [(k, schema[k]) for k in ("minimum", "maximum") if k in schema]
    if numeric:
        def bounds(v: Any) -> None:
            if type(v) in (int, float):
                for k, limit in numeric:
                    if (v < limit) if k == "minimum" else (v > limit):
                        _fail(rule)
        checks.append(bounds)
    lengths = [(k, schema[k]) for k in ("minLength", "maxLength") if k in schema]
    if lengths or "pattern" in schema:
        pattern = re.compile(schema["pattern"]) if "pattern" in schema else None

        def text(v: Any) -> None:
            if type(v) is str:
                for k, limit in lengths:
                    if (len(v) < limit) if k == "minLength" else (len(v) > limit):
                        _fail(rule)
                if pattern is not None and pattern.search(v) is None:
                    _fail(rule)
        checks.append(text)
    if "items" in schema:
        item = compile_schema(schema["items"])
        all_valid = _glance_over_objects(schema["items"])

        def items(v: Any) -> None:
            if type(v) is list:
                if all_valid is not None and all_valid(v):
                    return
                for i, entry in enumerate(v):
                    try:
                        item(entry)
                    except ValidationFailure as failure:
                        raise failure.under(f"[{i}]") from None
        checks.append(items)
    if "properties" in schema or "required" in schema:
        checks.append(_object_check(schema))

    if len(checks) == 1:
        return checks[0]

    def all_of(v: Any) -> None:
        for check in checks:
            check(v)
    return all_of


# Python types of each JSON Schema type (``integer`` also takes integral floats, see _is_type).
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,),
    "null": (type(None),), "array": (list,), "object": (dict,)}


def _type_check(names: tuple[str, ...], rule: str) -> Check:
    """``_is_type`` for any of ``names``, as one set lookup: this runs for nearly every field
    of every record (a generator over the names cost more than the lookup)."""
    for n in names:
        _is_type(None, n)  # an unknown type name fails at compile time
    kinds = frozenset(k for n in names for k in _PY_TYPES[n])
    integral_floats = "integer" in names and float not in kinds

    def check(v: Any) -> None:
        kind = type(v)
        if kind in kinds or (integral_floats and kind is float and v.is_integer()):
            return
        _fail(rule)
    return check


def _enum_check(allowed: list[Any], rule: str) -> Check:
    """One of ``allowed``, compared as JSON compares (1 is not 1.0, True is not 1)."""
    try:
        pairs = frozenset((type(a), a) for a in allowed)
    except TypeError:  # an unhashable member (a list, an object): compare one by one
        return lambda v: None if any(v == a and type(v) is type(a) for a in allowed) \
            else _fail(rule)

    def check(v: Any) -> None:
        try:
            if (type(v), v) in pairs:
                return
        except TypeError:  # an unhashable value is none of the hashable members
            pass
        _fail(rule)
    return check


@dataclass(frozen=True, slots=True)
class _Quick:
    """What makes a value valid for a property schema at a glance; anything else goes to the
    compiled check, which decides (and says why not)."""

    kinds: frozenset[type]  # valid by type alone: no other keyword constrains these
    bounded: frozenset[type]  # numbers valid within [low, high]
    low: float
    high: float
    members: frozenset[str]  # the string members of an enum
    sized: bool  # strings valid within [shortest, longest] code points (no pattern)
    shortest: int
    longest: float


def _quick(schema: Mapping[str, Any]) -> _Quick | None:
    """The :class:`_Quick` of a property's schema, or None when nothing is quick about it."""
    keys = set(schema) - ANNOTATIONS
    if keys == {"enum"}:
        members = frozenset(m for m in schema["enum"] if type(m) is str)
        return _Quick(frozenset(), frozenset(), 0, 0, members, False, 0, 0) if members else None
    if "type" not in keys or keys - {"type", "minimum", "maximum", "minLength", "maxLength",
                                     "pattern"}:
        return None
    names = schema["type"]
    names = (names,) if isinstance(names, str) else tuple(names)
    # type() is compared, never isinstance: bool is an int to Python, not to JSON Schema; an
    # integral float is an "integer" that only the compiled check accepts.
    kinds = {k for n in names for k in _PY_TYPES[n]}
    bounded = kinds & {int, float} if {"minimum", "maximum"} & keys else set()
    # A job_id's length bounds: every record has one, and its compiled check was a third of
    # a one-line record's validation.
    sized = str in kinds and "pattern" not in keys and bool({"minLength", "maxLength"} & keys)
    if {"minLength", "maxLength", "pattern"} & keys:
        kinds.discard(str)
    return _Quick(frozenset(kinds - bounded), frozenset(bounded),
                  schema.get("minimum", -math.inf), schema.get("maximum", math.inf),
                  frozenset(), sized, schema.get("minLength", 0),
                  schema.get("maxLength", math.inf))


def _quick_for_all(q: _Quick, values: list[Any]) -> bool:
    """True when each of ``values`` is valid at a glance of ``q``: what the per-value glance of
    :func:`_object_check` decides, for a whole column at once (set, min and max run in C)."""
    kinds = set(map(type, values))
    rest = kinds - q.kinds
    if not rest:
        return True
    if str in rest:
        strings = values if kinds == {str} else [v for v in values if type(v) is str]
        if q.members:
            if not q.members.issuperset(strings):
                return False
        elif not (q.sized and q.shortest <= min(map(len, strings))
                  and max(map(len, strings)) <= q.longest):
            return False
        rest.discard(str)
    if rest:
        if not rest <= q.bounded:
            return False
        numbers = values if kinds <= q.bounded else [v for v in values if type(v) in q.bounded]
        if not (q.low <= min(numbers) and max(numbers) <= q.high):
            return False
    return True


def _glance_over_objects(schema: Mapping[str, Any]) -> Callable[[list[Any]], bool] | None:
    """For an array's ``items`` schema that is an object of quick properties: a function
    telling, for a whole list, that every entry is valid, or None when no glance exists.

    False only means "not sure": the compiled check then looks at each entry and says where
    one breaks the rules. A LogBatch's hundreds of lines are checked a field at a time across
    all entries instead of an entry at a time (the per-entry glance was ~1.7 us a line, two
    thirds of parsing a batched record).
    """
    if set(schema) - ANNOTATIONS - {"type", "required", "properties"} or \
            schema.get("type") != "object":
        return None
    quick: dict[str, _Quick | None] = {name: _quick(sub) for name, sub
                                       in schema.get("properties", {}).items()}
    required = frozenset(schema.get("required", ()))

    def all_valid(entries: list[Any]) -> bool:
        if not entries:
            return True
        if set(map(type, entries)) != {dict}:
            return False
        present = set(itertools.chain.from_iterable(entries))  # every key of every entry
        if not required <= present:
            return False
        for name in present | required:
            constrained = name in quick
            if not constrained and name not in required:
                continue  # a field the schema says nothing of: any value
            try:
                values = list(map(operator.itemgetter(name), entries))
            except KeyError:  # some entries lack it
                if name in required:
                    return False
                values = [e[name] for e in entries if name in e]
            if constrained:
                q = quick[name]
                if q is None or not _quick_for_all(q, values):
                    return False
        return True
    return all_valid


def _object_check(schema: Mapping[str, Any]) -> Check:
    props = {name: compile_schema(sub) for name, sub in schema.get("properties", {}).items()}
    # A LogBatch's lines (hundreds per record) are checked field by field; the compiled
    # checks' closures cost several times the glance of _Quick (validating was ~13% of the
    # worker's busy samples while it ingested batched records).
    quick = {name: q for name, sub in schema.get("properties", {}).items()
             if (q := _quick(sub)) is not None}
    required = list(schema.get("required", ()))

    def check(v: Any) -> None:
        if type(v) is not dict:
            return  # ``type`` says what a non-object is; properties only apply to objects
        for name in required:
            if name not in v:
                raise ValidationFailure(name, "present (it is required)")
        # The record's fields, not the schema's: a LogBatch line holds one or two of five.
        for name, value in v.items():
            q = quick.get(name)
            if q is not None:
                kind = type(value)
                if (kind in q.kinds or (kind in q.bounded and q.low <= value <= q.high)
                        or (kind is str and (value in q.members or (
                            q.sized and q.shortest <= len(value) <= q.longest)))):
                    continue
            prop = props.get(name)
            if prop is not None:
                try:
                    prop(value)
                except ValidationFailure as failure:
                    raise failure.under(name) from None
    return check


def _fail(rule: str) -> None:
    raise ValidationFailure("", rule)


@cache
def load_schema(name: str) -> dict[str, Any]:
    """A schema file of this package, e.g. ``logline.schema.json``."""
    text = resources.files("sibylla.schemas").joinpath(name).read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def schema_check(name: str, pointer: str = "") -> Check:
    """The compiled check of a schema file, or of a part of it (``properties/lines/items``)."""
    node: Any = load_schema(name)
    for part in filter(None, pointer.split("/")):
        node = node[part]
    return compile_schema(node)


@cache
def glance_over_list(name: str) -> Callable[[list[Any]], bool]:
    """For a schema file of objects: a function telling, for a list of values, that every one
    is valid (True), or that some may not be (False: check each with :func:`schema_check`).

    Valid records arrive by the thousand; checking them a field at a time across the list
    costs a fraction of checking them one at a time."""
    glance = _glance_over_objects(load_schema(name))
    if glance is None:
        raise ValueError(f"{name}: no glance over a list of its objects")
    return glance
