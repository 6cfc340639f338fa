"""The engine-neutral view of one response body or one stream chunk.

Adapters need three things from a response: the root-level fields an engine added
(``metrics``, ``sglext``, ``timings``), the usage block, and each choice's added fields
(``speculative_decoding_stats``, ``meta_info``, ...). ``ParsedResponse`` holds exactly
those, built either from a raw JSON dict or from an ``openai`` SDK object.

For SDK objects it never calls ``model_dump``: the SDK builds its models without
validation and keeps unknown keys as plain dicts/lists in ``model_extra``, so reading
``model_extra`` is both cheaper and closer to the wire than a dump (which would also
copy the completion text we must never look at).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_EMPTY: Mapping[str, Any] = {}


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    """One response body or stream chunk, reduced to what adapters read.

    ``root`` holds at least every non-standard root field (for a raw dict it is the dict
    itself); ``choices`` holds, per choice, its non-standard fields plus ``index`` and
    ``finish_reason``; ``usage`` is the usage block as a dict, or None when absent.
    """

    root: Mapping[str, Any]
    choices: tuple[Mapping[str, Any], ...]
    usage: Mapping[str, Any] | None

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> ParsedResponse | None:
        """From a decoded JSON body or chunk; None when it is not a JSON object."""
        if not isinstance(body, Mapping):
            return None
        raw_choices = body.get("choices")
        choices: tuple[Mapping[str, Any], ...] = ()
        if isinstance(raw_choices, list):
            choices = tuple(c if isinstance(c, Mapping) else _EMPTY for c in raw_choices)
        usage = body.get("usage")
        return cls(body, choices, usage if isinstance(usage, Mapping) else None)

    @classmethod
    def from_sdk(cls, obj: Any) -> ParsedResponse:
        """From an ``openai`` ChatCompletion, ChatCompletionChunk or Completion."""
        choices = tuple(_choice_view(c) for c in (getattr(obj, "choices", None) or ()))
        return cls(getattr(obj, "model_extra", None) or _EMPTY, choices, _usage_view(obj))

    @property
    def choice_count(self) -> int:
        """How many sequences this response shows: the largest choice index + 1."""
        top = len(self.choices)
        for choice in self.choices:
            index = choice.get("index")
            if type(index) is int and index + 1 > top:
                top = index + 1
        return top


def _choice_view(choice: Any) -> Mapping[str, Any]:
    extra = getattr(choice, "model_extra", None)
    view = dict(extra) if extra else {}
    view["index"] = getattr(choice, "index", 0)
    view["finish_reason"] = getattr(choice, "finish_reason", None)
    return view


def _usage_view(obj: Any) -> Mapping[str, Any] | None:
    usage = getattr(obj, "usage", None)
    if usage is None:
        return None
    view: dict[str, Any] = dict(getattr(usage, "model_extra", None) or ())
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        view[name] = getattr(usage, name, None)
    return view


def sdk_chunk_matters(chunk: Any) -> bool:
    """Cheap per-chunk test: could this chunk carry anything an adapter reads?

    Runs on every streamed chunk, so it only touches attributes the SDK already built:
    root extras, usage, per-choice extras, and a choice index past 0 (which reveals n > 1).
    """
    if chunk.model_extra or getattr(chunk, "usage", None) is not None:
        return True
    return any(choice.model_extra or choice.index for choice in chunk.choices or ())


def is_multi_sequence(responses: Sequence[ParsedResponse]) -> bool:
    """n > 1 anywhere in the request: stats are request-level only for one sequence."""
    return any(r.choice_count > 1 for r in responses)


def last_completion_tokens(responses: Sequence[ParsedResponse]) -> int | None:
    """completion_tokens from the last non-empty usage block (streams repeat usage)."""
    for response in reversed(responses):
        usage = response.usage
        if usage:
            tokens = usage.get("completion_tokens")
            if type(tokens) is int and tokens >= 0:
                return tokens
            return None
    return None
