"""Property tests: adapters on generated payloads, valid, corrupted and arbitrary.

1. Random consistent counts (k 1..10) rendered as each engine's wire shape, bodies and
   streams, give a record that satisfies every invariant and matches the counts.
2. Any single corruption of a vLLM, SGLang or TensorRT-LLM payload (wrong type, bool for
   int, NaN/inf, negative, string keys, removed required key, inconsistent sums, oversize
   arrays) gives None; adapters are called directly, so an exception fails the test.
3. Arbitrary JSON wherever an engine puts its stats never makes an adapter raise, and any
   record that comes out survives a JSON round trip.

Budget: profile ``spec-decode-otel-fuzz`` (tests/unit/conftest.py), 200 examples per
property unless ``SPEC_DECODE_OTEL_FUZZ_EXAMPLES`` says otherwise.
"""

from __future__ import annotations

import copy
import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from openai._models import construct_type
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from spec_decode_otel import SpecDecodeAcceptanceRecord, record_from_json
from spec_decode_otel.adapters import BUILTIN_ADAPTERS, InvalidPayload, ParsedResponse, detect
from spec_decode_otel.record import MAX_SPEC_TOKENS

FUZZ = settings.get_profile("spec-decode-otel-fuzz")


# ================================================================ consistent counts


@st.composite
def spec_counts(draw):
    """Counts one request could really produce: per-step arrays, histogram and totals agree."""
    k = draw(st.integers(1, 10))
    dense = draw(st.lists(st.integers(0, 40), min_size=k + 1, max_size=k + 1))
    per_acc = [j for j, count in enumerate(dense) for _ in range(count)]
    per_acc = draw(st.permutations(per_acc)) if per_acc else []
    # Each step drafted between what it accepted and k (grammar can invalidate drafts).
    per_drf = [a + draw(st.integers(0, k - a)) for a in per_acc]
    steps, accepted, drafted = len(per_acc), sum(per_acc), sum(per_drf)
    return {
        "k": k,
        "dense": dense,
        "per_acc": list(per_acc),
        "per_drf": per_drf,
        "steps": steps,
        "accepted": accepted,
        "drafted": drafted,
        "mean": 1.0 + accepted / steps if steps else 1.0,
        "rate": accepted / drafted if drafted else 0.0,
        "usage": {"prompt_tokens": 9, "completion_tokens": steps + accepted + 1, "total_tokens": 0},
    }


def _completion(usage, *, choice_extra=None, **root):
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "x"},
        "finish_reason": "stop",
        "logprobs": None,
        **(choice_extra or {}),
    }
    return {
        "id": "r",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [choice],
        "usage": usage,
        **root,
    }


def _chunk(choices, usage=None, **root):
    out = {
        "id": "r",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": choices,
        **root,
    }
    if usage is not None:
        out["usage"] = usage
    return out


def _delta(finish=None, **extra):
    return {
        "index": 0,
        "delta": {} if finish else {"content": "x"},
        "finish_reason": finish,
        **extra,
    }


def vllm_stats(c, *, detailed, by_length):
    stats = {
        "mean_acceptance_length": c["mean"],
        "draft_acceptance_rate": c["rate"],
        "acceptance_histogram": list(c["dense"]),
        "num_spec_steps": c["steps"],
        "num_accepted_draft_tokens": c["accepted"],
        "num_draft_tokens": c["drafted"],
        "num_spec_tokens": c["k"],
    }
    if detailed:
        stats["per_step_accepted"] = list(c["per_acc"])
        stats["per_step_drafted"] = list(c["per_drf"])
    if by_length:
        stats["acceptance_histogram_by_draft_length"] = {str(c["k"]): list(c["dense"])}
    return stats


def sglang_drafted(c):
    """SGLang 0.5.23 (tokenizer_manager.py): proposed = verify steps x (draft tokens - 1)."""
    return c["steps"] * c["k"]


def lazy_histogram(dense):
    """SGLang 0.5.23 (schedule_batch.py) grows the histogram one bucket past the largest
    acceptance seen, from []: no trailing zero buckets."""
    last = max((j for j, n in enumerate(dense) if n), default=-1)
    return list(dense[: last + 1])


def sglang_details(c):
    drafted = sglang_drafted(c)
    return {
        "spec_accept_rate": c["accepted"] / drafted if drafted else 0.0,
        "spec_accept_length": (c["steps"] + c["accepted"] + 1) / max(c["steps"], 1),
        "spec_num_correct_drafts": c["accepted"],
        "spec_num_proposed_drafts": drafted,
        "spec_verify_ct": c["steps"],
        "spec_correct_drafts_histogram": lazy_histogram(c["dense"]),
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_cap_lens_histogram": [],
    }


def trt_stats(c, *, variable_k, padding=0):
    return {
        "acceptance_rate": c["rate"],
        "total_accepted_draft_tokens": c["accepted"],
        "total_draft_tokens": c["drafted"],
        "num_spec_steps": c["steps"],
        "acceptance_histogram": list(c["dense"]) + [0] * padding,
        "num_spec_tokens": None if variable_k else c["k"],
    }


def render(c, shape, stream, options):
    """One engine's wire payload (body or chunk list) for counts ``c``."""
    usage = c["usage"]
    if shape == "vllm_merged":
        metrics = {"time_to_first_token_ms": 1.0, "speculative_decoding": vllm_stats(c, **options)}
        if not stream:
            return _completion(usage, metrics=metrics)
        return [_chunk([_delta()]), _chunk([_delta("stop")]), _chunk([], usage, metrics=metrics)]
    if shape == "vllm_premerge":
        stats = vllm_stats(c, **options)
        stats["acceptance_histogram"] = {str(j): n for j, n in enumerate(c["dense"]) if n}
        if not stream:
            return _completion(usage, choice_extra={"speculative_decoding_stats": stats})
        return [
            _chunk([_delta()]),
            _chunk([_delta("stop", speculative_decoding_stats=stats)]),
            _chunk([], usage),
        ]
    if shape == "sglang_sglext":
        sglext = {"spec_tokens_details": sglang_details(c)}
        if not stream:
            return _completion(usage, sglext=sglext)
        return [
            _chunk([_delta()]),
            _chunk([_delta("stop")]),
            _chunk([], sglext=sglext),
            _chunk([], usage),
        ]
    if shape == "sglang_meta_info":
        return _completion(usage, choice_extra={"meta_info": sglang_details(c)})
    if shape == "trtllm":
        variable = options["detailed"]
        stats = trt_stats(
            c, variable_k=variable, padding=2 if variable and options["by_length"] else 0
        )
        if not stream:
            return _completion(
                usage,
                choice_extra={
                    "speculative_decoding": stats,
                    "avg_decoded_tokens_per_iter": c["mean"],
                },
            )
        return [
            _chunk([_delta(avg_decoded_tokens_per_iter=1.0)]),
            _chunk(
                [_delta("stop", speculative_decoding=stats, avg_decoded_tokens_per_iter=c["mean"])]
            ),
            _chunk([], usage),
        ]
    raise AssertionError(shape)


SHAPES = ["vllm_merged", "vllm_premerge", "sglang_sglext", "sglang_meta_info", "trtllm"]
ENGINE = {
    "vllm_merged": "vllm",
    "vllm_premerge": "vllm",
    "sglang_sglext": "sglang",
    "sglang_meta_info": "sglang",
    "trtllm": "tensorrt_llm",
}


def assert_invariants(record: SpecDecodeAcceptanceRecord):
    """Every rule of DESIGN.md, checked independently of the record's own validator."""
    hist = record.acceptance_histogram
    assert all(type(j) is int and j >= 0 and type(n) is int and n > 0 for j, n in hist.items())
    assert sum(hist.values()) == record.num_spec_steps
    assert sum(j * n for j, n in hist.items()) == record.num_accepted_draft_tokens
    assert record.num_accepted_draft_tokens <= record.num_draft_tokens
    if record.num_spec_tokens is not None:
        assert all(j <= record.num_spec_tokens for j in hist)
    assert math.isfinite(record.mean_acceptance_length)
    assert record.mean_acceptance_length >= 1.0
    assert 0.0 <= record.draft_acceptance_rate <= 1.0
    for per_step, total in (
        (record.per_step_accepted, record.num_accepted_draft_tokens),
        (record.per_step_drafted, record.num_draft_tokens),
    ):
        if per_step is not None:
            assert len(per_step) == record.num_spec_steps
            assert sum(per_step) == total
    assert SpecDecodeAcceptanceRecord.model_validate(record.model_dump(mode="json")) == record


@FUZZ
@given(
    c=spec_counts(),
    shape=st.sampled_from(SHAPES),
    stream=st.booleans(),
    detailed=st.booleans(),
    by_length=st.booleans(),
)
def test_consistent_counts_in_any_engine_shape_give_the_generating_record(
    c, shape, stream, detailed, by_length
):
    payload = render(c, shape, stream, {"detailed": detailed, "by_length": by_length})
    record = record_from_json(payload)
    assert record is not None
    assert record.engine == ENGINE[shape]
    assert_invariants(record)
    assert record.acceptance_histogram == {j: n for j, n in enumerate(c["dense"]) if n}
    sglang = shape.startswith("sglang")
    drafted = sglang_drafted(c) if sglang else c["drafted"]
    rate = c["accepted"] / drafted if drafted else 0.0
    assert record.num_spec_steps == c["steps"]
    assert record.num_accepted_draft_tokens == c["accepted"]
    assert record.num_draft_tokens == drafted
    assert record.completion_tokens == c["usage"]["completion_tokens"]
    assert math.isclose(record.mean_acceptance_length, c["mean"], rel_tol=1e-12)
    assert math.isclose(record.draft_acceptance_rate, rate, rel_tol=1e-12, abs_tol=1e-15)
    if shape == "trtllm" and detailed:
        expected_k = None
    elif sglang:  # k = proposed / steps, unknown without a step
        expected_k = c["k"] if c["steps"] else None
    else:
        expected_k = c["k"]
    assert record.num_spec_tokens == expected_k
    if shape.startswith("vllm") and detailed:
        assert record.per_step_accepted == c["per_acc"]
        assert record.per_step_drafted == c["per_drf"]
    else:
        assert record.per_step_accepted is None


@FUZZ
@given(c=spec_counts(), shape=st.sampled_from(SHAPES), stream=st.booleans())
def test_sdk_objects_of_consistent_payloads_give_the_same_record_as_dicts(c, shape, stream):
    payload = render(c, shape, stream, {"detailed": True, "by_length": False})
    if isinstance(payload, list):
        objects = [
            construct_type(type_=ChatCompletionChunk, value=copy.deepcopy(p)) for p in payload
        ]
        # What the stream observer keeps: chunks with a non-standard field, usage, or a
        # finish reason.
        objects = [
            o
            for o in objects
            if o.model_extra
            or o.usage is not None
            or any(c.model_extra or c.finish_reason for c in o.choices)
        ]
    else:
        objects = [construct_type(type_=ChatCompletion, value=copy.deepcopy(payload))]
    from_sdk = detect([ParsedResponse.from_sdk(o) for o in objects])
    assert from_sdk is not None
    assert from_sdk == record_from_json(payload)


# ================================================================ corruption


def adapt_strictly(payload):
    """Run the built-in adapters with no isolation: an exception fails the test."""
    chunks = payload if isinstance(payload, list) else [payload]
    responses = [ParsedResponse.from_dict(p) for p in chunks]
    claims = [a for a in BUILTIN_ADAPTERS if a.can_adapt(responses)]
    records = [_adapt(a, responses) for a in claims]
    for record in records:
        if record is not None:
            assert_round_trips(record)
    return claims, records


def _adapt(adapter, responses):
    """``adapt``, with InvalidPayload (the documented way to reject) as None."""
    try:
        return adapter.adapt(responses)
    except InvalidPayload:
        return None


def assert_round_trips(record):
    assert isinstance(record, SpecDecodeAcceptanceRecord)
    assert SpecDecodeAcceptanceRecord.model_validate(record.model_dump(mode="json")) == record


_REMOVED = object()


def _replace(values: list, i: int, value) -> list:
    return [*values[:i], value, *values[i + 1 :]]


#: A dense histogram longer than any k the record allows.
OVERSIZE = [0] * (MAX_SPEC_TOKENS + 2)


@st.composite
def bad_count(draw, value):
    """A replacement for an exact non-negative int count that is not one."""
    return draw(
        st.sampled_from(
            [
                str(value),
                float(value),
                float(value) + 0.5,
                True,
                False,
                -value - 1,
                math.nan,
                math.inf,
                -math.inf,
                [value],
                {"value": value},
                None,
                _REMOVED,
            ]
        )
    )


@st.composite
def bad_number(draw, value):
    """A replacement for a float field that is not a finite JSON number."""
    return draw(
        st.sampled_from(
            [
                str(value),
                True,
                False,
                math.nan,
                math.inf,
                -math.inf,
                [value],
                {"v": value},
                None,
                10**400,
            ]
        )
    )


@st.composite
def bad_dense(draw, dense):
    """A replacement for a dense histogram that is malformed or inconsistent."""
    kind = draw(st.sampled_from(["entry", "string-keys", "oversize", "type", "bump", "length"]))
    if kind == "entry":
        i = draw(st.integers(0, len(dense) - 1))
        bad = draw(st.sampled_from([True, False, 1.0, "1", -1, math.nan, None, [1]]))
        return _replace(dense, i, bad)
    if kind == "string-keys":
        return {str(j): n for j, n in enumerate(dense)}
    if kind == "oversize":
        return OVERSIZE
    if kind == "type":
        return draw(st.sampled_from([None, _REMOVED, "1,2", 3]))
    if kind == "bump":  # one bucket off by a nonzero amount: sums no longer agree
        i = draw(st.integers(0, len(dense) - 1))
        delta = draw(st.integers(1, 5))
        return _replace(dense, i, dense[i] + delta)
    return [*dense, draw(st.integers(0, 3))] if draw(st.booleans()) else dense[:-1]


@st.composite
def bad_per_step(draw, values, k):
    # (An array over MAX_SPEC_STEPS is not malformed: the record drops the arrays, see
    # test_adapters.py.)
    kind = draw(st.sampled_from(["entry", "type", "length", "sum"]))
    if kind == "entry" and values:
        i = draw(st.integers(0, len(values) - 1))
        bad = draw(st.sampled_from([True, 1.0, "1", -1, math.nan, [1], k + 1]))
        return _replace(values, i, bad)
    if kind == "type":
        return draw(st.sampled_from(["1,2", {"0": 1}, 3, True]))
    if kind == "length" or not values:
        return [*values, 0]
    i = draw(st.integers(0, len(values) - 1))
    return _replace(values, i, values[i] + 1)


def _set(mapping, key, value):
    if value is _REMOVED:
        mapping.pop(key, None)
    else:
        mapping[key] = value


@st.composite
def corrupted_vllm(draw):
    c = draw(spec_counts())
    stats = vllm_stats(c, detailed=True, by_length=False)
    field = draw(
        st.sampled_from(
            [
                "num_spec_steps",
                "num_accepted_draft_tokens",
                "num_draft_tokens",
                "num_spec_tokens",
                "mean_acceptance_length",
                "draft_acceptance_rate",
                "acceptance_histogram",
                "per_step_accepted",
                "per_step_drafted",
                "inconsistent",
                "by_draft_length",
            ]
        )
    )
    if field in ("mean_acceptance_length", "draft_acceptance_rate"):
        _set(stats, field, draw(bad_number(stats[field])))
    elif field == "acceptance_histogram":
        _set(stats, field, draw(bad_dense(stats[field])))
    elif field in ("per_step_accepted", "per_step_drafted"):
        _set(stats, field, draw(bad_per_step(stats[field], c["k"])))
    elif field == "inconsistent":
        target = draw(
            st.sampled_from(
                [
                    "num_spec_steps",
                    "num_accepted_draft_tokens",
                    "mean_acceptance_length",
                    "draft_acceptance_rate",
                ]
            )
        )
        if target.startswith("num_"):
            stats[target] += draw(st.integers(1, 5))
        elif target == "mean_acceptance_length":
            stats[target] += draw(st.sampled_from([0.01, 0.5, 3.0]))
        else:
            stats[target] = stats[target] + 0.01 if stats[target] < 0.5 else stats[target] - 0.01
    elif field == "by_draft_length":
        stats["acceptance_histogram_by_draft_length"] = {
            str(c["k"]): draw(bad_dense(list(c["dense"])))
        }
    else:
        _set(stats, field, draw(bad_count(stats[field])))
    # The pre-merge revision has its own histogram shape and never had the by-length field.
    premerge = draw(st.booleans()) and field not in (
        "acceptance_histogram",
        "num_spec_tokens",
        "by_draft_length",
    )
    if premerge:  # same corruption in the pre-merge location, histogram string-keyed
        stats["acceptance_histogram"] = {str(j): n for j, n in enumerate(c["dense"]) if n}
        return _completion(c["usage"], choice_extra={"speculative_decoding_stats": stats}), field
    return _completion(c["usage"], metrics={"speculative_decoding": stats}), field


@FUZZ
@given(corrupted_vllm())
def test_any_single_corruption_of_a_vllm_payload_gives_no_record(case):
    payload, field = case
    claims, records = adapt_strictly(payload)
    assert [a.engine for a in claims] == ["vllm"]
    assert records == [None], field
    assert record_from_json(payload) is None


@st.composite
def corrupted_sglang(draw):
    c = draw(spec_counts())
    details = sglang_details(c)
    field = draw(
        st.sampled_from(
            [
                "spec_verify_ct",
                "spec_num_correct_drafts",
                "spec_num_proposed_drafts",
                "spec_correct_drafts_histogram",
                "inconsistent",
            ]
        )
    )
    if field == "spec_correct_drafts_histogram":
        assume(c["steps"] > 0)  # (with no step the lazily grown histogram is [])
        orig = details[field]
        bad = draw(bad_dense(orig))
        assume(bad is not _REMOVED and bad is not None)  # absent histogram = older builds
        assume(bad != [])  # [] with steps > 0 is SGLang's "no histogram": partial, valid
        if isinstance(bad, list) and len(bad) > len(orig):
            # A trailing zero bucket contradicts no count, even past k + 1: the record
            # keeps nonzero buckets only. (SGLang 0.5.23 never sends one: its
            # ``update_spec_correct_drafts_histogram``, schedule_batch.py, grows the list
            # to the largest acceptance seen.) An earlier version of this assumption
            # kept such a bucket past k + 1 and expected no record: a rare random failure.
            assume(bad[-1] != 0)
        details[field] = bad
    elif field == "inconsistent":
        target = draw(st.sampled_from(["spec_verify_ct", "spec_num_correct_drafts"]))
        # (one more step beside an empty histogram is the "no histogram" case: valid)
        assume(target != "spec_verify_ct" or c["steps"] > 0)
        details[target] += draw(st.integers(1, 5))
    else:
        bad = draw(bad_count(details[field]))
        # A null or missing drafted count is "not reported" (older builds): partial, valid.
        assume(not (field == "spec_num_proposed_drafts" and bad in (None, _REMOVED)))
        _set(details, field, bad)
    where = draw(st.sampled_from(["sglext", "meta_info"]))
    if where == "sglext":
        return _completion(c["usage"], sglext={"spec_tokens_details": details})
    return _completion(c["usage"], choice_extra={"meta_info": details})


@FUZZ
@given(corrupted_sglang())
def test_any_single_corruption_of_an_sglang_payload_gives_no_record(payload):
    claims, records = adapt_strictly(payload)
    assert [a.engine for a in claims] == ["sglang"]
    assert records == [None]


@st.composite
def corrupted_trtllm(draw):
    c = draw(spec_counts())
    stats = trt_stats(c, variable_k=False)
    field = draw(
        st.sampled_from(
            [
                "num_spec_steps",
                "total_accepted_draft_tokens",
                "total_draft_tokens",
                "num_spec_tokens",
                "acceptance_rate",
                "acceptance_histogram",
                "inconsistent",
            ]
        )
    )
    if field == "acceptance_rate":
        bad = draw(bad_number(stats[field]))
        assume(bad is not None)  # a null rate is derived from the counts
        stats[field] = bad
    elif field == "acceptance_histogram":
        stats[field] = draw(bad_dense(stats[field]))
        if stats[field] is _REMOVED:
            del stats[field]
    elif field == "inconsistent":
        target = draw(st.sampled_from(["num_spec_steps", "total_accepted_draft_tokens"]))
        stats[target] += draw(st.integers(1, 5))
    else:
        bad = draw(bad_count(stats[field]))
        assume(not (field == "num_spec_tokens" and bad in (None, _REMOVED)))  # variable k
        _set(stats, field, bad)
    return _completion(c["usage"], choice_extra={"speculative_decoding": stats})


@FUZZ
@given(corrupted_trtllm())
def test_any_single_corruption_of_a_trtllm_payload_gives_no_record(payload):
    claims, records = adapt_strictly(payload)
    assert [a.engine for a in claims] == ["tensorrt_llm"]
    assert records == [None]


# ================================================================ arbitrary JSON

FIELD_NAMES = sorted(
    {
        "speculative_decoding",
        "speculative_decoding_stats",
        "spec_tokens_details",
        "meta_info",
        "acceptance_histogram",
        "acceptance_histogram_by_draft_length",
        "num_spec_steps",
        "num_accepted_draft_tokens",
        "num_draft_tokens",
        "num_spec_tokens",
        "mean_acceptance_length",
        "draft_acceptance_rate",
        "per_step_accepted",
        "per_step_drafted",
        "spec_verify_ct",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_correct_drafts_histogram",
        "spec_accepted_drafts",
        "spec_proposed_drafts",
        "spec_accept_histogram",
        "spec_accept_token_num",
        "spec_draft_token_num",
        "acceptance_rate",
        "total_accepted_draft_tokens",
        "total_draft_tokens",
        "avg_decoded_tokens_per_iter",
        "draft_n",
        "draft_n_accepted",
        "draft_rounds",
        "index",
        "completion_tokens",
        "3",
        "0",
    }
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([10**400, -1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(FIELD_NAMES)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=6), children, max_size=6)
    ),
    max_leaves=16,
)
# Objects with the engines' own keys and arbitrary values reach deeper into the adapters.
keyed_objects = st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=8)
stats_like = json_values | keyed_objects


@st.composite
def arbitrary_payload(draw):
    root = {}
    for name in ("metrics", "sglext", "timings"):
        if draw(st.booleans()):
            inner = draw(stats_like)
            key = {
                "metrics": "speculative_decoding",
                "sglext": "spec_tokens_details",
                "timings": None,
            }[name]
            root[name] = {key: inner} if key and draw(st.booleans()) else inner
    choices = []
    for index in range(draw(st.integers(0, 2))):
        extra = draw(
            st.dictionaries(
                st.sampled_from(
                    [
                        "speculative_decoding_stats",
                        "meta_info",
                        "speculative_decoding",
                        "avg_decoded_tokens_per_iter",
                        "index",
                    ]
                ),
                stats_like,
                max_size=3,
            )
        )
        choices.append({"index": index, "finish_reason": "stop", **extra})
    usage = draw(st.none() | st.fixed_dictionaries({"completion_tokens": json_values}))
    body = {
        "id": "r",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": choices,
        **root,
    }
    if usage is not None:
        body["usage"] = usage
    return body


@FUZZ
@given(st.lists(arbitrary_payload(), min_size=1, max_size=3))
def test_arbitrary_json_where_engines_put_stats_never_makes_an_adapter_raise(chunks):
    adapt_strictly(chunks)
    record = record_from_json(chunks)
    if record is not None:
        assert_round_trips(record)


@FUZZ
@given(arbitrary_payload())
def test_arbitrary_json_in_sdk_objects_never_makes_capture_or_adapters_raise(body):
    obj = construct_type(type_=ChatCompletionChunk, value=copy.deepcopy(body))
    responses = [ParsedResponse.from_sdk(obj)]
    for adapter in BUILTIN_ADAPTERS:
        if adapter.can_adapt(responses):
            record = _adapt(adapter, responses)
            if record is not None:
                assert_round_trips(record)
    record = detect(responses)
    if record is not None:
        assert_round_trips(record)


@FUZZ
@given(json_values)
def test_arbitrary_json_as_a_whole_payload_gives_none_or_a_valid_record(value):
    record = record_from_json(value)
    assert record is None or isinstance(record, SpecDecodeAcceptanceRecord)
    if record is not None:
        assert_round_trips(record)


unknown_keys = st.dictionaries(
    st.text(min_size=1, max_size=6).map(lambda s: "x_" + s), json_values, max_size=4
)


@FUZZ
@given(c=spec_counts(), shape=st.sampled_from(SHAPES), extra=unknown_keys, data=st.data())
def test_unknown_keys_beside_the_stats_do_not_change_the_record(c, shape, extra, data):
    options = {"detailed": True, "by_length": False}
    clean = render(c, shape, False, options)
    noisy = copy.deepcopy(clean)
    stats_holder = {
        "vllm_merged": lambda b: b["metrics"]["speculative_decoding"],
        "vllm_premerge": lambda b: b["choices"][0]["speculative_decoding_stats"],
        "sglang_sglext": lambda b: b["sglext"]["spec_tokens_details"],
        "sglang_meta_info": lambda b: b["choices"][0]["meta_info"],
        "trtllm": lambda b: b["choices"][0]["speculative_decoding"],
    }[shape](noisy)
    target = data.draw(st.sampled_from(["stats", "root", "choice"]))
    {"stats": stats_holder, "root": noisy, "choice": noisy["choices"][0]}[target].update(extra)
    record = record_from_json(noisy)
    assert record is not None
    assert record == record_from_json(clean)
    assert_round_trips(record)
