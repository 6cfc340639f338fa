"""SpecDecodeAcceptanceRecord: JSON round trip, immutability, invariants, partial records."""

from __future__ import annotations

import json
import math
import operator
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from record_examples import FULL

from spec_decode_otel import SpecDecodeAcceptanceRecord as Record
from spec_decode_otel.record import MAX_SPEC_STEPS, MAX_SPEC_TOKENS


def make(**changes) -> Record:
    return Record(**{**FULL, **changes})


# ---------------------------------------------------------------- JSON round trip


def test_json_dump_has_string_histogram_keys_and_validates_back_to_an_equal_record():
    record = make()
    dumped = record.model_dump(mode="json")
    assert dumped["acceptance_histogram"] == {"0": 5, "1": 4, "2": 3, "3": 2}
    text = json.dumps(dumped)
    again = Record.model_validate(json.loads(text))
    assert again == record
    assert again.acceptance_histogram == {0: 5, 1: 4, 2: 3, 3: 2}
    assert Record.model_validate_json(record.model_dump_json()) == record


def test_json_dump_lists_every_field_including_unreported_ones_as_null():
    dumped = Record(engine="tensorrt_llm", mean_acceptance_length=2.5).model_dump(mode="json")
    assert set(dumped) == set(Record.model_fields)
    assert dumped["num_spec_steps"] is None
    assert dumped["acceptance_histogram"] is None


def test_zero_buckets_are_dropped_so_dense_and_sparse_inputs_give_equal_records():
    with_zeros = make(acceptance_histogram={0: 5, 1: 4, 2: 3, 3: 2, 4: 0}, num_spec_tokens=4)
    without = make(num_spec_tokens=4)
    assert with_zeros.acceptance_histogram == {0: 5, 1: 4, 2: 3, 3: 2}
    assert with_zeros == without


def test_empty_histogram_with_zero_steps_round_trips():
    record = Record(
        engine="vllm",
        mean_acceptance_length=1.0,
        draft_acceptance_rate=0.0,
        acceptance_histogram={},
        num_accepted_draft_tokens=0,
        num_draft_tokens=0,
        num_spec_steps=0,
        num_spec_tokens=3,
    )
    assert Record.model_validate(record.model_dump(mode="json")) == record
    assert record.model_dump(mode="json")["acceptance_histogram"] == {}


# ---------------------------------------------------------------- immutability


@pytest.mark.parametrize("field", ["engine", "num_spec_steps", "acceptance_histogram"])
def test_record_fields_cannot_be_reassigned(field):
    record = make()
    with pytest.raises(ValidationError):
        setattr(record, field, None)
    assert record == make()


def test_unknown_fields_are_refused():
    with pytest.raises(ValidationError):
        make(tokens_per_second=120.3)


def test_model_copy_with_update_leaves_the_original_untouched():
    record = make()
    changed = record.model_copy(update={"completion_tokens": 99})
    assert record.completion_tokens == 31
    assert changed.completion_tokens == 99


# ---------------------------------------------------------------- invariants


_NO_PER_STEP = dict(per_step_accepted=None, per_step_drafted=None)
_NO_FLOATS = dict(mean_acceptance_length=None, draft_acceptance_rate=None)

# name -> (changes to the valid FULL record, text the validation error must contain).
# Each case breaks exactly one rule, so the message proves which rule caught it.
INVALID = {
    "histogram_sum_differs_from_steps": (
        dict(acceptance_histogram={0: 6, 1: 4, 2: 3, 3: 2}, **_NO_PER_STEP, **_NO_FLOATS),
        "do not sum to num_spec_steps",
    ),
    "histogram_weighted_sum_differs_from_accepted": (
        dict(acceptance_histogram={0: 4, 1: 5, 2: 3, 3: 2}, **_NO_PER_STEP, **_NO_FLOATS),
        "account for the accepted",
    ),
    "accepted_exceeds_drafted": (
        dict(num_draft_tokens=15, **_NO_PER_STEP, **_NO_FLOATS),
        "exceed drafted",
    ),
    "bucket_beyond_num_spec_tokens": (
        dict(num_spec_tokens=2, **_NO_PER_STEP),
        "beyond num_spec_tokens",
    ),
    "per_step_accepted_wrong_length": (
        dict(per_step_accepted=[0] * 4 + [1] * 4 + [2] * 3 + [3] * 2 + [0, 0]),
        "per_step_accepted length",
    ),
    "per_step_accepted_wrong_sum": (
        dict(per_step_accepted=[0] * 5 + [1] * 4 + [2] * 3 + [3, 2]),
        "per_step_accepted does not sum",
    ),
    "per_step_drafted_wrong_length": (dict(per_step_drafted=[3] * 13), "per_step_drafted length"),
    "per_step_drafted_wrong_sum": (
        dict(per_step_drafted=[3] * 13 + [2]),
        "per_step_drafted does not sum",
    ),
    "per_step_accepts_more_than_it_drafted": (
        dict(
            per_step_accepted=[3] + [0] * 4 + [1] * 4 + [2] * 3 + [3, 0],
            per_step_drafted=[2] + [3] * 12 + [4],
            num_spec_tokens=4,
        ),
        "accepted more drafts than it drafted",
    ),
    "per_step_drafts_more_than_k": (
        dict(per_step_drafted=[2] + [3] * 12 + [4]),
        "drafted more than num_spec_tokens",
    ),
    "per_step_without_steps": (
        dict(acceptance_histogram=None, num_spec_steps=None, mean_acceptance_length=None),
        "per_step_accepted length",
    ),
    "histogram_without_steps": (
        dict(num_spec_steps=None, **_NO_PER_STEP, **_NO_FLOATS),
        "histogram needs",
    ),
    "histogram_without_accepted": (
        dict(num_accepted_draft_tokens=None, **_NO_PER_STEP, **_NO_FLOATS),
        "histogram needs",
    ),
    "mean_below_one": (
        dict(acceptance_histogram=None, **_NO_PER_STEP, mean_acceptance_length=0.99),
        "must be in [1, 257]",
    ),
    # Beyond every draft of k = 256 accepted: also no float that sums past the largest
    # one in a summary (1e308 twice was inf, and --json printed Infinity).
    "mean_beyond_k_max": (
        dict(
            acceptance_histogram=None,
            **_NO_PER_STEP,
            draft_acceptance_rate=None,
            num_spec_steps=None,
            num_accepted_draft_tokens=None,
            num_draft_tokens=None,
            num_spec_tokens=None,
            mean_acceptance_length=1e308,
        ),
        "must be in [1, 257]",
    ),
    "mean_contradicts_counts": (
        dict(mean_acceptance_length=1 + 16 / 14 + 1e-3),
        "mean_acceptance_length contradicts",
    ),
    "rate_above_one": (dict(draft_acceptance_rate=1.5), "in [0, 1]"),
    "rate_negative": (dict(draft_acceptance_rate=-0.1), "in [0, 1]"),
    "rate_contradicts_counts": (
        dict(draft_acceptance_rate=16 / 42 + 1e-3),
        "draft_acceptance_rate contradicts",
    ),
    "mean_nan": (dict(mean_acceptance_length=math.nan), "finite number"),
    "mean_inf": (dict(mean_acceptance_length=math.inf), "finite number"),
    "rate_bool": (dict(draft_acceptance_rate=True), "finite number"),
    "rate_string": (dict(draft_acceptance_rate="0.38"), "finite number"),
    "negative_count": (dict(completion_tokens=-1), "greater than or equal to 0"),
    "bool_count": (dict(completion_tokens=True), "valid integer"),
    "float_count": (dict(completion_tokens=31.0), "valid integer"),
    "string_count": (dict(completion_tokens="31"), "valid integer"),
    "negative_histogram_key": (
        dict(acceptance_histogram={-1: 5, 1: 4, 2: 3, 3: 2}),
        "ints in 0..MAX_SPEC_TOKENS",
    ),
    "bool_histogram_count": (
        dict(acceptance_histogram={0: 5, 1: 3, 2: 3, 3: 2, 4: True}, **_NO_PER_STEP),
        "valid integer",
    ),
    "bool_histogram_key": (
        dict(acceptance_histogram={0: 5, True: 4, 2: 3, 3: 2}),
        "ints in 0..MAX_SPEC_TOKENS",
    ),
    "non_digit_histogram_key": (
        dict(acceptance_histogram={"x": 5, 1: 4, 2: 3, 3: 2}),
        "ints in 0..MAX_SPEC_TOKENS",
    ),
    "duplicate_histogram_key": (
        dict(acceptance_histogram={"0": 5, 0: 5, 1: 4, 2: 3, 3: 2}),
        "duplicate",
    ),
    "histogram_not_a_mapping": (dict(acceptance_histogram=[5, 4, 3, 2]), "mapping"),
    "histogram_over_cap": (
        dict(acceptance_histogram={j: 1 for j in range(MAX_SPEC_TOKENS + 2)}),
        "more buckets than MAX_SPEC_TOKENS",
    ),
    "histogram_key_over_bound": (
        dict(acceptance_histogram={str(MAX_SPEC_TOKENS + 1): 1}, num_spec_tokens=None),
        "ints in 0..MAX_SPEC_TOKENS",
    ),
    "huge_histogram_key": (
        dict(acceptance_histogram={"30000000": 1}, num_spec_tokens=None),
        "ints in 0..MAX_SPEC_TOKENS",
    ),
    "k_over_bound": (dict(num_spec_tokens=MAX_SPEC_TOKENS + 1), "less than or equal"),
    "bool_in_per_step": (dict(per_step_drafted=[3] * 13 + [True]), "valid integer"),
    "per_step_over_cap": (dict(per_step_drafted=[0] * (MAX_SPEC_STEPS + 1)), "at most"),
    "empty_engine": (dict(engine=""), "at least 1"),
}


@pytest.mark.parametrize(("changes", "message"), INVALID.values(), ids=INVALID.keys())
def test_violating_an_invariant_raises_validation_error(changes, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        make(**changes)


def test_the_unmodified_baseline_is_valid():
    # Guards the INVALID table: each case differs from this valid record only as named.
    record = make()
    assert not record.is_partial
    assert record.num_spec_steps == 14


def test_engine_floats_within_tolerance_of_the_counts_are_kept_verbatim():
    record = make(mean_acceptance_length=1 + 16 / 14 + 1e-9)
    assert record.mean_acceptance_length == 1 + 16 / 14 + 1e-9


def test_zero_steps_and_zero_drafts_define_mean_one_and_rate_zero():
    zero = dict(
        acceptance_histogram={},
        num_accepted_draft_tokens=0,
        num_draft_tokens=0,
        num_spec_steps=0,
        per_step_accepted=[],
        per_step_drafted=[],
    )
    assert make(**zero, mean_acceptance_length=1.0, draft_acceptance_rate=0.0).num_spec_steps == 0
    with pytest.raises(ValidationError):
        make(**zero, mean_acceptance_length=2.0, draft_acceptance_rate=0.0)
    with pytest.raises(ValidationError):
        make(**zero, mean_acceptance_length=1.0, draft_acceptance_rate=0.5)


def test_integer_floats_are_accepted_as_numbers():
    record = Record(
        engine="llamacpp", mean_acceptance_length=2, num_spec_steps=2, num_accepted_draft_tokens=2
    )
    assert record.mean_acceptance_length == 2.0
    assert type(record.mean_acceptance_length) is float


def test_counts_too_large_for_a_float_raise_validation_error_not_overflow():
    with pytest.raises(ValidationError):
        Record(
            engine="x",
            mean_acceptance_length=2.0,
            num_spec_steps=1,
            num_accepted_draft_tokens=10**400,
            num_draft_tokens=10**401,
        )
    with pytest.raises(ValidationError):
        Record(engine="x", mean_acceptance_length=10**400)


# ---------------------------------------------------------------- partial records


def test_record_with_only_a_mean_is_partial_and_keeps_the_rest_unreported():
    record = Record(engine="tensorrt_llm", mean_acceptance_length=2.5, completion_tokens=50)
    assert record.is_partial
    assert record.acceptance_histogram is None
    assert record.num_spec_steps is None
    assert record.draft_acceptance_rate is None
    assert record.dense_histogram() == []
    assert record.accepted_at_position() == []


def test_counts_without_steps_are_partial():
    record = Record(
        engine="llamacpp",
        draft_acceptance_rate=0.5,
        num_accepted_draft_tokens=5,
        num_draft_tokens=10,
    )
    assert record.is_partial
    assert record.mean_acceptance_length is None


def test_full_record_is_not_partial_even_without_per_step_arrays():
    assert not make(per_step_accepted=None, per_step_drafted=None).is_partial


# ---------------------------------------------------------------- derived views


def test_dense_histogram_has_k_plus_one_buckets_with_zeros_filled():
    record = make(
        acceptance_histogram={0: 5, 1: 4, 3: 5},
        num_accepted_draft_tokens=19,
        num_draft_tokens=42,
        per_step_accepted=None,
        mean_acceptance_length=None,
        draft_acceptance_rate=None,
    )
    assert record.dense_histogram() == [5, 4, 0, 5]


def test_dense_histogram_without_k_ends_at_the_largest_bucket():
    record = make(num_spec_tokens=None, per_step_drafted=None)
    assert record.dense_histogram() == [5, 4, 3, 2]


def test_dense_histogram_with_k_and_no_steps_is_all_zero():
    record = make(
        acceptance_histogram={},
        num_spec_steps=0,
        num_accepted_draft_tokens=0,
        num_draft_tokens=0,
        per_step_accepted=None,
        per_step_drafted=None,
        mean_acceptance_length=1.0,
        draft_acceptance_rate=0.0,
    )
    assert record.dense_histogram() == [0, 0, 0, 0]
    assert record.accepted_at_position() == [0, 0, 0]


def test_accepted_at_position_counts_steps_that_accepted_a_prefix_reaching_each_position():
    # 5 steps accepted 0, 4 accepted 1, 3 accepted 2, 2 accepted 3 (prefix acceptance):
    # position 0 accepted in 4+3+2 steps, position 1 in 3+2, position 2 in 2.
    assert make().accepted_at_position() == [9, 5, 2]


def test_accepted_at_position_sums_to_the_accepted_draft_total():
    record = make()
    assert sum(record.accepted_at_position()) == record.num_accepted_draft_tokens


# ---------------------------------------------------------------- per-step arrays


def per_step_record(per_acc, per_drf, k=None, **changes):
    fields = dict(
        engine="vllm",
        num_spec_steps=len(per_acc if per_acc is not None else per_drf),
        num_accepted_draft_tokens=sum(per_acc) if per_acc is not None else 0,
        num_draft_tokens=sum(per_drf) if per_drf is not None else 0,
        num_spec_tokens=k,
        per_step_accepted=per_acc,
        per_step_drafted=per_drf,
    )
    return Record(**{**fields, **changes})


def test_per_step_counts_above_one_byte_are_validated_like_small_ones():
    record = per_step_record([200, 0, 156], [200, 200, 200], k=200)
    assert record.per_step_accepted == [200, 0, 156]
    with pytest.raises(ValidationError, match="accepted more drafts"):
        per_step_record([200, 2, 156], [200, 1, 200], k=200)
    with pytest.raises(ValidationError, match="drafted more than num_spec_tokens"):
        per_step_record([0, 0, 0], [200, 1, 200], k=199)


@pytest.mark.parametrize(
    ("per_acc", "per_drf"),
    [([-1, 2], [3, 3]), ([2, 1], [-3, 9]), ([0, 0], [-1, -1]), ([-300, 301], [301, 301])],
    ids=["accepted", "drafted-varied", "drafted-uniform", "beyond-a-byte"],
)
def test_negative_per_step_entries_are_rejected(per_acc, per_drf):
    totals = dict(
        num_accepted_draft_tokens=max(0, sum(per_acc)), num_draft_tokens=max(0, sum(per_drf))
    )
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        per_step_record(per_acc, per_drf, **totals)


def test_per_step_drafted_alone_is_checked_against_k():
    assert per_step_record(None, [3, 2, 3], k=3).per_step_drafted == [3, 2, 3]
    with pytest.raises(ValidationError, match="drafted more than num_spec_tokens"):
        per_step_record(None, [3, 4, 3], k=3)


def _naive_per_step_ok(per_acc, per_drf, steps, accepted, drafted, k) -> bool:
    """The per-step rules of DESIGN.md, written the obvious way (reference for the record)."""
    if accepted > drafted or (k is not None and k > MAX_SPEC_TOKENS):
        return False
    for values, total in ((per_acc, accepted), (per_drf, drafted)):
        if values is not None and (
            len(values) != steps or any(v < 0 for v in values) or sum(values) != total
        ):
            return False
    if per_acc is not None and per_drf is not None and any(map(operator.gt, per_acc, per_drf)):
        return False
    return not (per_drf and k is not None and max(per_drf) > k)


entries = st.one_of(
    st.integers(0, 6), st.integers(250, 260), st.integers(-2, -1), st.integers(0, 10**6)
)


@st.composite
def per_step_cases(draw):
    steps = draw(st.integers(0, 20))
    per_acc = draw(st.none() | st.lists(entries, min_size=steps, max_size=steps))
    uniform = st.builds(lambda v: [v] * steps, entries)
    per_drf = draw(st.none() | uniform | st.lists(entries, min_size=steps, max_size=steps))
    if per_acc is not None and per_drf is not None and draw(st.booleans()):
        per_acc = list(map(min, per_acc, per_drf))  # pairs that respect accepted <= drafted
    accepted = sum(per_acc) if per_acc is not None else draw(st.integers(0, 50))
    drafted = sum(per_drf) if per_drf is not None else accepted + draw(st.integers(0, 50))
    accepted = max(0, accepted + draw(st.sampled_from([0, 0, 0, 1, -1])))
    drafted = max(0, drafted + draw(st.sampled_from([0, 0, 0, 1])))
    if draw(st.booleans()):  # sometimes a step count that does not match the arrays
        steps += draw(st.sampled_from([1, -1])) if steps else 1
    k = draw(st.none() | st.integers(0, 6) | st.integers(250, 300) | st.integers(0, 10**6))
    return per_acc, per_drf, steps, accepted, drafted, k


@settings.get_profile("spec-decode-otel-fuzz")
@given(per_step_cases())
def test_per_step_validation_agrees_with_the_naive_rules(case):
    per_acc, per_drf, steps, accepted, drafted, k = case
    expected = _naive_per_step_ok(*case)
    try:
        Record(
            engine="x",
            num_spec_steps=steps,
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
            num_spec_tokens=k,
            per_step_accepted=per_acc,
            per_step_drafted=per_drf,
        )
    except ValidationError:
        assert not expected
    else:
        assert expected
