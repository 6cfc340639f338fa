"""``construct_checked`` (the adapters' way to build a record) agrees with the model.

The fast path checks the model's field rules by hand and skips pydantic's validation, so
the one thing that matters is that it never disagrees: on any field dict, valid or not,
it accepts exactly when ``SpecDecodeAcceptanceRecord(**fields)`` does, and what it
accepts is the same record down to each value's type, the fields set and the pickled
state. The property test generates consistent records and then breaks them every way a
payload or an adapter could: bools, floats, ints beyond int64, negatives, strings, int
subclasses, tuples, digit-string and non-digit histogram keys, zero buckets, per-step
arrays of the wrong length or with foreign entries, floats off the counts, extra keys.

Budget: ``SPEC_DECODE_OTEL_FUZZ_EXAMPLES`` examples (300 unless set), on the shared
profile of tests/unit/conftest.py.
"""

from __future__ import annotations

import copy
import enum
import json
import logging
import math
import os
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from record_examples import FULL

from spec_decode_otel import ParsedResponse, SpecDecodeAcceptanceRecord, detect
from spec_decode_otel.adapters._fields import build_record
from spec_decode_otel.record import MAX_ARRAY_LENGTH, MAX_COUNT, construct_checked

FUZZ = settings(
    settings.get_profile("spec-decode-otel-fuzz"),
    max_examples=int(os.environ.get("SPEC_DECODE_OTEL_FUZZ_EXAMPLES", "300")),
)
FIELDS = tuple(SpecDecodeAcceptanceRecord.model_fields)
WIRE_EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "wire-examples"


class _Int(int):
    """An int subclass: pydantic's strict mode takes it and stores a plain int."""


class _Str(str):
    """A str subclass, as an engine name."""


class _Three(enum.IntEnum):
    THREE = 3


#: Values no well-behaved adapter sends, for any field.
ODD_VALUES = (
    None,
    True,
    False,
    -1,
    0,
    1,
    3,
    MAX_COUNT,
    MAX_COUNT + 1,
    2**64 + 5,
    -(2**70),
    10**400,
    1.0,
    1.5,
    -0.0,
    math.nan,
    math.inf,
    -math.inf,
    "3",
    "",
    "x" * 65,
    b"vllm",
    [],
    [1, 2],
    (1, 2),
    {},
    {"1": 1},
    {1: 1},
    _Int(3),
    _Three.THREE,
)
COUNT_FIELDS = (
    "completion_tokens",
    "num_spec_tokens",
    "num_draft_tokens",
    "num_spec_steps",
    "num_accepted_draft_tokens",
)
ODD_COUNTS = (MAX_COUNT, MAX_COUNT + 1, 2**64, -1, True, 3.0, _Int(3), _Three.THREE, "3", None)
ODD_ENTRIES = (True, False, -1, 2**64, 10**30, 1.0, "1", None, _Int(1), _Three.THREE)
ODD_KEYS = ("1", "01", "x", "-1", "", " 1", "\u0661", True, -1, MAX_COUNT + 1, 1.0, None)
ODD_ENGINES = ("", "a" * 64, "a" * 65, "é", "\ud800", "vllm\x00", _Str("vllm"), b"vllm", 3)


@st.composite
def consistent_fields(draw: st.DrawFn) -> dict[str, Any]:
    """The fields of a record one request could really produce, some left out."""
    k = draw(st.integers(0, 6))
    steps = draw(st.integers(0, 12))
    per_acc = draw(st.lists(st.integers(0, k), min_size=steps, max_size=steps))
    if draw(st.booleans()):
        per_drf = [k] * steps  # fixed k: the usual shape
    else:
        per_drf = [a + draw(st.integers(0, k - a)) for a in per_acc]
    accepted, drafted = sum(per_acc), sum(per_drf)
    hist: dict[Any, int] = dict(Counter(per_acc))
    shape = draw(st.sampled_from(["sparse", "dense", "strings"]))
    if shape == "dense":
        hist = {j: hist.get(j, 0) for j in range(k + 1)}  # zero buckets kept
    elif shape == "strings":
        hist = {str(j): c for j, c in hist.items()}  # the record's own JSON form
    fields: dict[str, Any] = {
        "engine": draw(st.sampled_from(["vllm", "sglang", "tensorrt_llm", "llamacpp"])),
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": hist,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_steps": steps,
        "num_spec_tokens": k,
        "completion_tokens": steps + accepted + draw(st.integers(0, 2)),
        "per_step_accepted": per_acc,
        "per_step_drafted": per_drf,
    }
    for name in draw(st.sets(st.sampled_from(FIELDS[1:]), max_size=4)):
        if draw(st.booleans()):
            del fields[name]
        else:
            fields[name] = None
    return fields


def _break_value(draw: st.DrawFn, fields: dict[str, Any]) -> None:
    name = draw(st.sampled_from((*FIELDS, "unknown_field")))
    fields[name] = draw(st.sampled_from(ODD_VALUES))


def _break_count(draw: st.DrawFn, fields: dict[str, Any]) -> None:
    # completion_tokens and k take part in few invariants, so the int64 bound alone
    # decides there; on the totals it usually breaks a sum as well.
    name = draw(st.sampled_from(COUNT_FIELDS))
    fields[name] = draw(st.sampled_from(ODD_COUNTS))


def _break_float(draw: st.DrawFn, fields: dict[str, Any]) -> None:
    name = draw(st.sampled_from(["mean_acceptance_length", "draft_acceptance_rate"]))
    value = fields.get(name)
    if type(value) is not float or not math.isfinite(value):
        return
    # Either side of the 1e-6 agreement tolerance, and far off it.
    factor = draw(st.sampled_from([1 + 5e-7, 1 - 5e-7, 1 + 2e-6, 1 - 2e-6, 0.5, 2.0]))
    fields[name] = draw(st.sampled_from([value * factor, value + 1e-9, value - 1e-5, int(value)]))


def _break_histogram(draw: st.DrawFn, fields: dict[str, Any]) -> None:
    hist = fields.get("acceptance_histogram")
    if not isinstance(hist, dict):
        return
    hist = dict(hist)
    how = draw(st.sampled_from(["key", "count", "zero", "drop", "duplicate"]))
    if how == "key" and hist:
        old = draw(st.sampled_from(sorted(hist, key=repr)))
        hist[draw(st.sampled_from(ODD_KEYS))] = hist.pop(old)
    elif how == "count" and hist:
        key = draw(st.sampled_from(sorted(hist, key=repr)))
        hist[key] = draw(st.sampled_from((*ODD_ENTRIES, 0, MAX_COUNT, MAX_COUNT + 1)))
    elif how == "zero":
        hist[draw(st.integers(0, 9))] = 0
    elif how == "drop" and hist:
        del hist[draw(st.sampled_from(sorted(hist, key=repr)))]
    elif how == "duplicate" and hist:  # one bucket under both its int and string key
        key = draw(st.sampled_from(sorted(hist, key=repr)))
        if type(key) is int:
            hist[str(key)] = hist[key]
        elif type(key) is str and key.isascii() and key.isdigit():
            hist[int(key)] = hist[key]
    fields["acceptance_histogram"] = hist


def _break_per_step(draw: st.DrawFn, fields: dict[str, Any]) -> None:
    name = draw(st.sampled_from(["per_step_accepted", "per_step_drafted"]))
    values = fields.get(name)
    if type(values) is not list:
        return
    values = list(values)
    how = draw(st.sampled_from(["entry", "longer", "shorter", "bump", "tuple", "oversize"]))
    if how == "entry" and values:
        values[draw(st.integers(0, len(values) - 1))] = draw(st.sampled_from(ODD_ENTRIES))
    elif how == "longer":
        values.append(draw(st.integers(0, 3)))
    elif how == "shorter" and values:
        values.pop()
    elif how == "bump" and values:
        i = draw(st.integers(0, len(values) - 1))
        if type(values[i]) is int:
            values[i] += draw(st.sampled_from([-1, 1, 255, 256, 300]))
    elif how == "tuple":
        values = tuple(values)
    elif how == "oversize":
        values = [0] * (MAX_ARRAY_LENGTH + 1)
    fields[name] = values


def _break_engine(draw: st.DrawFn, fields: dict[str, Any]) -> None:
    if draw(st.booleans()):
        fields["engine"] = draw(st.sampled_from(ODD_ENGINES))
    else:
        fields.pop("engine", None)


BREAKERS = (
    _break_value,
    _break_count,
    _break_float,
    _break_histogram,
    _break_per_step,
    _break_engine,
)


@st.composite
def field_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """Consistent fields, then up to three breakages (none in about a quarter)."""
    fields = draw(consistent_fields())
    for breaker in draw(st.lists(st.sampled_from(BREAKERS), max_size=3)):
        breaker(draw, fields)
    return fields


def _outcome(build, fields: dict[str, Any]) -> SpecDecodeAcceptanceRecord | Exception:
    try:
        return build(**fields)
    except (ValueError, TypeError) as exc:
        return exc


def assert_same_record(fast: SpecDecodeAcceptanceRecord, slow: SpecDecodeAcceptanceRecord):
    assert type(fast) is type(slow)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.__getstate__() == slow.__getstate__()
    for name in FIELDS:
        mine, theirs = getattr(fast, name), getattr(slow, name)
        assert type(mine) is type(theirs), name
        if isinstance(mine, list):
            assert [type(v) for v in mine] == [type(v) for v in theirs], name
        if isinstance(mine, dict):
            mine_types = [(type(j), type(c)) for j, c in mine.items()]
            assert mine_types == [(type(j), type(c)) for j, c in theirs.items()], name


@st.composite
def singly_broken_field_dicts(draw: st.DrawFn, breaker) -> dict[str, Any]:
    """Consistent fields with one breakage: the rule it breaks is the only one at stake."""
    fields = draw(consistent_fields())
    breaker(draw, fields)
    return fields


@FUZZ
@given(field_dicts())
def test_fast_path_accepts_exactly_what_the_model_accepts_and_builds_the_same_record(fields):
    assert_fast_path_agrees(fields)


@pytest.mark.parametrize("breaker", BREAKERS, ids=lambda b: b.__name__.removeprefix("_break_"))
def test_fast_path_agrees_with_the_model_on_each_kind_of_breakage_alone(breaker):
    @FUZZ
    @given(singly_broken_field_dicts(breaker))
    def agrees(fields):
        assert_fast_path_agrees(fields)

    agrees()


def assert_fast_path_agrees(fields: dict[str, Any]) -> None:
    before = copy.deepcopy(fields)
    slow = _outcome(SpecDecodeAcceptanceRecord, fields)
    fast = _outcome(construct_checked, fields)
    assert repr(fields) == repr(before)  # neither path touched the caller's values
    event("accepted" if isinstance(slow, SpecDecodeAcceptanceRecord) else "rejected")
    if isinstance(slow, Exception):
        assert isinstance(fast, ValueError), f"model rejected ({slow!r}), fast path gave {fast!r}"
        return
    assert isinstance(fast, SpecDecodeAcceptanceRecord), f"model accepted, fast path: {fast!r}"
    assert_same_record(fast, slow)
    again = SpecDecodeAcceptanceRecord.model_validate_json(fast.model_dump_json())
    assert again == fast


def test_the_generator_reaches_both_verdicts_often():
    # Guards the property above against a generator that (after some refactor) only ever
    # produces rejections, which would make it pass without comparing a single record.
    verdicts: Counter[bool] = Counter()

    @settings(FUZZ, max_examples=200, database=None)
    @given(field_dicts())
    def sample(fields):
        verdicts[isinstance(_outcome(SpecDecodeAcceptanceRecord, fields), Exception)] += 1

    sample()
    assert verdicts[False] >= 40 and verdicts[True] >= 40, verdicts


# ---------------------------------------------------------------- fixed examples


def test_fast_path_record_is_frozen_pickles_and_round_trips_through_json():
    record = construct_checked(**FULL)
    with pytest.raises(ValidationError):
        record.num_spec_steps = 3
    assert pickle.loads(pickle.dumps(record)) == record
    dumped = json.loads(record.model_dump_json())
    assert SpecDecodeAcceptanceRecord.model_validate(dumped) == record
    assert record.model_copy(update={"completion_tokens": 40}).completion_tokens == 40


def test_fast_path_record_owns_its_lists_and_histogram():
    fields = copy.deepcopy(FULL)
    record = construct_checked(**fields)
    fields["per_step_accepted"].append(9)
    fields["per_step_drafted"][0] = 0
    fields["acceptance_histogram"][7] = 1
    assert record == SpecDecodeAcceptanceRecord(**FULL)


@pytest.mark.parametrize(
    "changes",
    [
        {"unknown_field": 1},
        {"per_step_drafted": [3] * 13 + [True]},
        {"num_spec_tokens": True},
        {"engine": "\ud800"},
        {"engine": "a" * 65},
        {"acceptance_histogram": {"0": 5, 0: 5, 1: 4, 2: 3, 3: 2}},
        {"mean_acceptance_length": 1 + 16 / 14 + 1e-5},
    ],
    ids=["extra", "bool-step", "bool-k", "surrogate", "long-engine", "dup-key", "off-mean"],
)
def test_build_record_turns_a_rejection_into_none_and_a_debug_log(caplog, changes):
    caplog.set_level(logging.DEBUG, logger="spec_decode_otel")
    fields = {**FULL, **changes}
    engine = fields.pop("engine")
    fields.pop("completion_tokens")
    assert build_record(engine, [], **fields) is None
    assert any("payload rejected" in r.getMessage() for r in caplog.records)


def test_values_of_other_types_get_pydantics_coercions():
    # A tuple for a list, an int subclass for a count, a str subclass for the engine: the
    # model converts them, and the fast path hands them to the model.
    record = construct_checked(
        **{
            **FULL,
            "engine": _Str("vllm"),
            "num_spec_tokens": _Three.THREE,
            "per_step_drafted": tuple(FULL["per_step_drafted"]),
            "per_step_accepted": [_Int(v) for v in FULL["per_step_accepted"]],
        }
    )
    assert_same_record(record, SpecDecodeAcceptanceRecord(**FULL))


@pytest.mark.parametrize("path", sorted(WIRE_EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_every_wire_example_detects_to_a_record_the_model_would_build(path):
    # tests/unit/test_vectors.py pins each expected record; this pins that detection,
    # now on the fast path, still yields exactly the model's record for the same fields.
    vector = json.loads(path.read_text(encoding="utf-8"))
    payload = [vector["response"]] if "response" in vector else vector["chunks"]
    record = detect([ParsedResponse.from_dict(body) for body in payload])
    assert (record is None) == (vector["expected_record"] is None)
    if record is not None:
        fields = {name: getattr(record, name) for name in record.model_fields_set}
        assert_same_record(record, SpecDecodeAcceptanceRecord(**fields))
