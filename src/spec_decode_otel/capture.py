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

from spec_decode_otel.record import MAX_CHOICES

_EMPTY: Mapping[str, Any] = {}


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    """One response body or stream chunk, reduced to what adapters read.

    ``root`` holds at least every non-standard root field (for a raw dict it is the dict
    itself); ``choices`` holds, per choice, its non-standard fields plus ``index`` and
    ``finish_reason``; ``usage`` is the usage block as a dict, or None when absent.
    """

    root: Mapping[str, Any]
    #: At most ``MAX_CHOICES`` choices are examined; ``choice_count`` counts them all.
    choices: tuple[Mapping[str, Any], ...]
    usage: Mapping[str, Any] | None
    #: How many sequences this response shows: the largest choice index + 1, or the
    #: number of choices if larger (computed from ``choices`` when not given).
    choice_count: int = -1

    def __post_init__(self) -> None:
        if self.choice_count < 0:
            object.__setattr__(self, "choice_count", _choice_count(self.choices, 0))

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> ParsedResponse | None:
        """From a decoded JSON body or chunk; None when it is not a JSON object."""
        if not isinstance(body, Mapping):
            return None
        raw_choices = body.get("choices")
        choices: tuple[Mapping[str, Any], ...] = ()
        total = 0
        if isinstance(raw_choices, list):
            total = len(raw_choices)
            choices = tuple(
                c if isinstance(c, Mapping) else _EMPTY for c in raw_choices[:MAX_CHOICES]
            )
        usage = body.get("usage")
        usage = usage if isinstance(usage, Mapping) else None
        return cls(body, choices, usage, _choice_count(choices, total))

    @classmethod
    def from_sdk(cls, obj: Any) -> ParsedResponse:
        """From an ``openai`` ChatCompletion, ChatCompletionChunk or Completion."""
        raw_choices = getattr(obj, "choices", None) or ()
        choices = tuple(_choice_view(c) for c in raw_choices[:MAX_CHOICES])
        root = getattr(obj, "model_extra", None) or _EMPTY
        return cls(root, choices, _usage_view(obj), _choice_count(choices, len(raw_choices)))


def _choice_count(choices: tuple[Mapping[str, Any], ...], total: int) -> int:
    top = total
    for choice in choices:
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
