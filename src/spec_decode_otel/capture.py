"""The engine-neutral view of one response body or one stream chunk.

Adapters need four things from a response: the root-level fields an engine added
(``metrics``, ``sglext``, ``timings``), the usage block, each choice's added fields
(``speculative_decoding_stats``, ``meta_info``, ...), and sometimes the request the
response answers. ``ParsedResponse`` holds exactly those, built either from a raw JSON
dict or from an ``openai`` SDK object.

For SDK objects it never calls ``model_dump``: the SDK builds its models without
validation and keeps unknown keys as plain dicts/lists in ``model_extra``, so reading
``model_extra`` is both cheaper and closer to the wire than a dump (which would also
copy the completion text we must never look at).

Wire variants are folded in here, once, so no adapter has to know them:

- Gateways: LiteLLM's proxy moves each choice's non-standard fields into
  ``choices[i].provider_specific_fields``; the choice view puts them back beside the
  choice's own fields (an own field wins unless it is null).
- The Responses API: a ``Response`` (or the ``response`` carried by a
  ``response.completed`` stream event) has no choices; its root fields (vLLM's
  ``metrics``) and the event's own root fields (llama.cpp's ``timings``) make one root,
  and its ``input_tokens``/``output_tokens`` are shown as ``prompt_tokens``/
  ``completion_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spec_decode_otel.record import MAX_CHOICES, MAX_COUNT

_EMPTY: Mapping[str, Any] = {}
#: Where LiteLLM's proxy puts the per-choice fields it does not know.
PROVIDER_SPECIFIC_FIELDS = "provider_specific_fields"
#: The usage counts adapters read, in Chat Completions names, and their Responses names.
_USAGE_NAMES = (
    ("prompt_tokens", "input_tokens"),
    ("completion_tokens", "output_tokens"),
    ("total_tokens", "total_tokens"),
)
_PREDICTION_COUNTS = ("accepted_prediction_tokens", "rejected_prediction_tokens")


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    """One response body or stream chunk, reduced to what adapters read.

    ``root`` holds at least every non-standard root field (for a raw chat or completion
    dict it is the dict itself); ``choices`` holds, per choice, its non-standard fields
    plus ``index`` and ``finish_reason``; ``usage`` is the usage block as a dict (with
    ``completion_tokens_details`` when sent), or None when absent.
    """

    root: Mapping[str, Any]
    #: At most ``MAX_CHOICES`` choices are examined; ``choice_count`` counts them all.
    choices: tuple[Mapping[str, Any], ...]
    usage: Mapping[str, Any] | None
    #: How many sequences this response shows: the largest choice index + 1, or the
    #: number of choices if larger (computed from ``choices`` when not given).
    choice_count: int = -1
    #: The JSON body of the request this response answers, when known; None when it is
    #: not (a saved response replayed without its request). Adapters must treat None as
    #: "unknown", never as "empty".
    request: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.choice_count < 0:
            object.__setattr__(self, "choice_count", _choice_count(self.choices, 0))

    @classmethod
    def from_dict(
        cls, body: Mapping[str, Any], request: Mapping[str, Any] | None = None
    ) -> ParsedResponse | None:
        """From a decoded JSON body, chunk or Responses stream event; None when it is not
        a JSON object."""
        if not isinstance(body, Mapping):
            return None
        inner = body.get("response")
        if isinstance(inner, Mapping) and isinstance(body.get("type"), str):
            # A Responses stream event carrying the response (response.completed, ...).
            root = {**inner, **{k: v for k, v in body.items() if k != "response"}}
            return cls(root, (), _usage_dict(inner.get("usage"), True), 0, request)
        raw_choices = body.get("choices")
        choices: tuple[Mapping[str, Any], ...] = ()
        total = 0
        if isinstance(raw_choices, list):
            total = len(raw_choices)
            choices = tuple(_dict_choice_view(c) for c in raw_choices[:MAX_CHOICES])
        usage = _usage_dict(body.get("usage"), body.get("object") == "response")
        return cls(body, choices, usage, _choice_count(choices, total), request)

    @classmethod
    def from_sdk(cls, obj: Any, request: Mapping[str, Any] | None = None) -> ParsedResponse:
        """From an ``openai`` ChatCompletion, ChatCompletionChunk, Completion, Responses
        ``Response`` or Responses stream event."""
        root = getattr(obj, "model_extra", None) or _EMPTY
        inner = getattr(obj, "response", None)
        if inner is not None and hasattr(inner, "output"):
            # A Responses stream event carrying the response: both roots count.
            root = {**(getattr(inner, "model_extra", None) or _EMPTY), **root}
            return cls(root, (), _usage_view(getattr(inner, "usage", None), True), 0, request)
        raw_choices = sdk_choices(obj)
        choices = tuple(_choice_view(c) for c in raw_choices[:MAX_CHOICES])
        return cls(
            root,
            choices,
            _usage_view(getattr(obj, "usage", None), getattr(obj, "object", None) == "response"),
            _choice_count(choices, len(raw_choices)),
            request,
        )


def sdk_choices(obj: Any) -> Sequence[Any]:
    """An SDK object's ``choices`` (or a LiteLLM response's, as seen by the LiteLLM
    callback); () when the server sent something else than a list there. The SDK builds
    its objects from the server's JSON without validating it, so any field, and any
    choice in the list, can hold whatever JSON the server sent."""
    choices = getattr(obj, "choices", None)
    return choices if isinstance(choices, (list, tuple)) else ()


def _choice_count(choices: tuple[Mapping[str, Any], ...], total: int) -> int:
    top = total
    for choice in choices:
        index = choice.get("index")
        if type(index) is int and index + 1 > top:
            top = index + 1
    return top


def _with_provider_fields(view: Mapping[str, Any]) -> Mapping[str, Any]:
    """The choice with LiteLLM's ``provider_specific_fields`` put back beside its own
    fields (an own field wins unless it is null)."""
    moved = view.get(PROVIDER_SPECIFIC_FIELDS)
    if not isinstance(moved, Mapping) or not moved:
        return view
    return {**view, **{k: v for k, v in moved.items() if view.get(k) is None}}


def _dict_choice_view(choice: Any) -> Mapping[str, Any]:
    return _with_provider_fields(choice) if isinstance(choice, Mapping) else _EMPTY


def _choice_view(choice: Any) -> Mapping[str, Any]:
    if not hasattr(choice, "model_extra"):
        return _EMPTY  # not an object in the JSON: no choice fields at all
    extra = choice.model_extra
    view = dict(extra) if extra else {}
    view["index"] = getattr(choice, "index", 0)
    view["finish_reason"] = getattr(choice, "finish_reason", None)
    return _with_provider_fields(view)


def usage_view(usage: Any, responses: bool) -> Mapping[str, Any] | None:
    """A usage block, raw JSON or the SDK's object, with the Chat Completions count names
    adapters read; ``responses``: it answers a Responses API call (see :func:`_usage_dict`)."""
    if usage is None or isinstance(usage, Mapping):
        return _usage_dict(usage, responses)
    return _usage_view(usage, responses)


def _usage_dict(usage: Any, responses: bool) -> Mapping[str, Any] | None:
    """A raw usage block with the Chat Completions count names adapters read. Those of a
    Responses API usage (``responses``) are its own counts, whatever Chat names it also
    carries; any other block keeps its Chat counts and gets the ones it lacks."""
    if not isinstance(usage, Mapping):
        return None
    get = usage.get
    names = [
        (o, t) for o, t in _USAGE_NAMES if get(t) is not None and (responses or get(o) is None)
    ]
    if not names:
        return usage
    view = dict(usage)
    for ours, theirs in names:
        view[ours] = usage[theirs]
    return view


def _usage_view(usage: Any, responses: bool) -> Mapping[str, Any] | None:
    """An SDK usage object (chat, completion or Responses) as a dict of what adapters
    read, named and chosen as :func:`_usage_dict` does."""
    if usage is None:
        return None
    view: dict[str, Any] = dict(getattr(usage, "model_extra", None) or ())
    for ours, theirs in _USAGE_NAMES:
        first, then = (theirs, ours) if responses else (ours, theirs)
        value = getattr(usage, first, None)
        view[ours] = value if value is not None else getattr(usage, then, None)
    details = getattr(usage, "completion_tokens_details", None)
    if isinstance(details, Mapping):
        # openai < 1.45 has no such field: the SDK keeps the server's dict as an extra.
        view["completion_tokens_details"] = dict(details)
    elif details is not None:
        counts = dict(getattr(details, "model_extra", None) or ())
        for name in _PREDICTION_COUNTS:
            counts[name] = getattr(details, name, None)
        view["completion_tokens_details"] = counts
    return view


def is_multi_sequence(responses: Sequence[ParsedResponse]) -> bool:
    """n > 1 anywhere in the request: stats are request-level only for one sequence."""
    return any(r.choice_count > 1 for r in responses)


def last_usage(responses: Sequence[ParsedResponse]) -> Mapping[str, Any]:
    """The last non-empty usage block (streams repeat usage), or an empty one."""
    return next((r.usage for r in reversed(responses) if r.usage), _EMPTY)


def last_completion_tokens(responses: Sequence[ParsedResponse]) -> int | None:
    """completion_tokens from the last non-empty usage block; None (unknown) when it is
    absent or beyond what OTLP can carry."""
    tokens = last_usage(responses).get("completion_tokens")
    return tokens if type(tokens) is int and 0 <= tokens <= MAX_COUNT else None


def request_of(responses: Sequence[ParsedResponse]) -> Mapping[str, Any] | None:
    """The request body the responses answer, or None when it is not known."""
    return next((r.request for r in responses if r.request is not None), None)
