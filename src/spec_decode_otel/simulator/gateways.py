"""Gateways the simulator can answer through (request header ``x-sim-gateway``).

``litellm-proxy``: what the LiteLLM 1.110.2 proxy (``litellm --config``, routes
``hosted_vllm/`` and ``openai/`` alike) sends its client in front of the engine, for chat
and text completions, as observed from the real proxy in front of this simulator
(tests/integration/test_litellm_proxy.py pins the two against each other). A body keeps
the engine's stats where LiteLLM's models put them; a stream is rebuilt chunk by chunk
and loses them.

Only what an adapter could read is imitated: ids, ``created``, the ``model`` the proxy
renames to its own model name, and key order are left as the engine's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from spec_decode_otel.simulator.protocol import JSON

LITELLM_PROXY = "litellm-proxy"
#: The per-choice fields of OpenAI's chat and completion schemas (LiteLLM keeps these).
_STANDARD_CHOICE_FIELDS = frozenset(
    {"index", "message", "delta", "text", "logprobs", "finish_reason"}
)
#: The root fields of OpenAI's chat and completion bodies and chunks.
_STANDARD_ROOT_FIELDS = frozenset(
    {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
)
_CHUNK_ROOT_FIELDS = ("id", "object", "created", "model")
#: vLLM's choice fields LiteLLM knows beside OpenAI's (the matched stop string, the
#: token ids): where other non-standard fields move or go, these stay.
_VLLM_CHOICE_FIELDS = ("stop_reason", "token_ids")
#: The message fields of LiteLLM's ``Message``: ``role``, ``content`` and a sent
#: ``refusal`` stay, null or not; the others only when not null. Any other field
#: (vLLM's ``reasoning``) moves into the message's ``provider_specific_fields``.
_MESSAGE_FIELDS = frozenset(
    {"tool_calls", "function_call", "audio", "reasoning_content", "annotations"}
)
_MESSAGE_KEPT_FIELDS = frozenset({"role", "content", "refusal"})
#: Every field of LiteLLM's ``PromptTokensDetails``, null unless the engine sent it.
_PROMPT_TOKENS_DETAILS = dict.fromkeys(
    (
        "audio_tokens",
        "cached_tokens",
        "image_tokens",
        "text_tokens",
        "video_tokens",
        "initial_prompt_tokens",
    )
)
#: Every field of LiteLLM's ``CompletionTokensDetails``, null unless the engine sent it.
_COMPLETION_TOKENS_DETAILS = dict.fromkeys(
    (
        "accepted_prediction_tokens",
        "audio_tokens",
        "reasoning_tokens",
        "rejected_prediction_tokens",
        "text_tokens",
        "image_tokens",
        "video_tokens",
    )
)


def litellm_proxy_body(body: JSON, kind: str) -> JSON:
    """A non-streamed chat or text completion body as LiteLLM's proxy returns it.

    A text completion keeps its choices and root as the engine sent them, nulls included,
    plus ``system_fingerprint: null`` when the engine sent none (SGLang). Its ``usage``
    loses SGLang's top-level ``reasoning_tokens`` and gets both token details, null when
    the engine sent none; engine-sent details (the smg pair; llama.cpp's
    ``cached_tokens``) gain every other field of LiteLLM's models as null.

    A chat choice's non-standard fields move into its ``provider_specific_fields``
    (always there, ``{}`` when nothing moved; a null field moves as null), vLLM's two
    staying on the choice as well. Root fields (``metrics``, ``sglext``, ``timings``)
    stay, but a null one goes (vLLM's ``service_tier``, its null ``prompt_*`` and
    ``*_transfer_params``, its ``"metrics": null`` for n > 1); ``usage`` loses its null
    fields and SGLang's top-level ``reasoning_tokens``."""
    usage = body.get("usage")
    if kind != "chat":
        body = {"system_fingerprint": None, **body}
        if not isinstance(usage, dict):
            return body
        usage = {"completion_tokens_details": None, "prompt_tokens_details": None, **usage}
        usage.pop("reasoning_tokens", None)
        for key, fields in (
            ("completion_tokens_details", _COMPLETION_TOKENS_DETAILS),
            ("prompt_tokens_details", _PROMPT_TOKENS_DETAILS),
        ):
            if isinstance(usage[key], dict):
                usage[key] = {**fields, **usage[key]}
        return {**body, "usage": usage}
    choices = []
    for choice in body.get("choices") or ():
        kept = {
            k: _body_message(v) if k == "message" else v
            for k, v in choice.items()
            if k in _STANDARD_CHOICE_FIELDS or k in _VLLM_CHOICE_FIELDS
        }
        moved = {k: v for k, v in choice.items() if k not in _STANDARD_CHOICE_FIELDS}
        choices.append({**kept, "provider_specific_fields": moved})
    root = {k: v for k, v in body.items() if k in _STANDARD_ROOT_FIELDS or v is not None}
    if isinstance(usage, dict):
        root["usage"] = {
            k: v for k, v in usage.items() if v is not None and k != "reasoning_tokens"
        }
    return {**root, "choices": choices}


def _body_message(message: object) -> object:
    """A chat body's message as LiteLLM's ``Message`` rebuilds it (vLLM's null ``audio``
    and ``function_call`` and SGLang's null ``reasoning_content`` go; vLLM's
    ``reasoning`` moves)."""
    if not isinstance(message, dict):
        return message
    out = {
        k: v
        for k, v in message.items()
        if k in _MESSAGE_KEPT_FIELDS or (k in _MESSAGE_FIELDS and v is not None)
    }
    moved = {k: v for k, v in message.items() if k not in _MESSAGE_KEPT_FIELDS | _MESSAGE_FIELDS}
    if moved:
        out["provider_specific_fields"] = moved
    return out


def litellm_proxy_chunks(chunks: Iterable[JSON], kind: str, include_usage: bool) -> Iterator[JSON]:
    """A chat or text completion stream as LiteLLM's proxy rebuilds it (one sequence:
    the real proxy sends several sequences' role and finish chunks in an order of its
    own).

    Root fields other than ``usage`` go (vLLM's ``metrics`` and null fields, llama.cpp's
    and mlx-vlm's ``timings``), but a chat chunk's own ``system_fingerprint``. ``usage``
    stays on a chunk without choices only (vLLM's ``continuous_usage_stats`` go); when
    the request asked for usage and no such chunk came (llama.cpp's completions finish
    chunk carries it), the proxy ends the stream with one of its own holding the last
    usage seen. A chunk left with neither choices nor usage is not sent (SGLang's
    ``sglext`` chunk; the real proxy sends it as an empty ``{"choices": []}`` on a chat
    stream that asked for usage: nothing an adapter reads, so not imitated)."""
    chunks = list(chunks)
    fingerprint = next(
        (c["system_fingerprint"] for c in chunks if c.get("system_fingerprint")), None
    )
    usage_sent = False
    last_usage: JSON | None = None
    roles: set[object] = set()  # the sequences whose role was sent
    for chunk in chunks:
        if chunk.get("choices") and isinstance(chunk.get("usage"), dict):
            last_usage = chunk["usage"]
        raw_choices = chunk.get("choices") or ()
        if any(_text(c, kind) and c.get("finish_reason") for c in raw_choices):
            # vLLM's last chunk, SGLang's last completions one: the text and the finish
            # come as two chunks
            text = [_stream_choice({**c, "finish_reason": None}, kind, True) for c in raw_choices]
            yield _chunk(chunk, _role_once(text, roles))
            finish = [_stream_choice(_without_text(c), kind, True) for c in raw_choices]
            finish = _role_once(finish, roles)
            # chat: the proxy sends this one once the stream has ended: with its fingerprint
            yield _chunk(chunk, finish, fingerprint if kind == "chat" else None)
            continue
        choices = [_stream_choice(c, kind, c.get("finish_reason") is not None) for c in raw_choices]
        choices = _role_once(choices, roles)
        usage = chunk.get("usage") if not choices else None
        if not choices and not usage:
            continue
        # a chat chunk keeps its own fingerprint (vLLM: the usage chunk's; llama.cpp:
        # every chunk's); a text completion chunk never does
        kept = chunk.get("system_fingerprint") if kind == "chat" else None
        out = _chunk(chunk, choices, kept)
        if usage:
            out["usage"] = _stream_usage(usage)
            usage_sent = True
        yield out
    if include_usage and not usage_sent and last_usage is not None and chunks:
        yield {**_chunk(chunks[-1], []), "usage": _stream_usage(last_usage)}


def _role_once(choices: list[JSON], roles: set[object]) -> list[JSON]:
    """A chat delta's ``role`` only on its sequence's first chunk (mlx-vlm sends it on
    every chunk; the proxy keeps the first)."""
    out = []
    for choice in choices:
        delta = choice.get("delta")
        if isinstance(delta, dict) and "role" in delta:
            if choice.get("index") in roles:
                choice = {**choice, "delta": {k: v for k, v in delta.items() if k != "role"}}
            roles.add(choice.get("index"))
        out.append(choice)
    return out


def _chunk(chunk: JSON, choices: list[JSON], fingerprint: object = None) -> JSON:
    out: JSON = {k: chunk[k] for k in _CHUNK_ROOT_FIELDS if k in chunk}
    if fingerprint:
        out["system_fingerprint"] = fingerprint
    out["choices"] = choices
    return out


def _text(choice: JSON, kind: str) -> object:
    if kind == "chat":
        return (choice.get("delta") or {}).get("content")
    return choice.get("text")


def _without_text(choice: JSON) -> JSON:
    return {**choice, "delta": {}} if "delta" in choice else {**choice, "text": ""}


def _stream_choice(choice: JSON, kind: str, finished: bool) -> JSON:
    """One choice of a rebuilt chunk; ``finished``: of the engine's finish chunk (its text
    part too, which keeps ``stop_reason``).

    ``finish_reason`` and ``logprobs`` are sent only when not null. A chat chunk before
    the finish keeps the choice's non-null non-standard fields (TensorRT-LLM's running
    ``avg_decoded_tokens_per_iter``; SGLang's null ``matched_stop`` goes) and vLLM's
    ``token_ids`` even null; the finish chunk loses the stats but vLLM's ``stop_reason``,
    and has no text."""
    out: JSON = {"index": choice.get("index", 0)}
    finish = choice.get("finish_reason")
    if kind == "chat":
        delta = choice.get("delta") or {}
        if isinstance(delta, dict):  # null fields go (SGLang's reasoning_content, mlx-vlm's
            # tool_calls, name, ..., llama.cpp's role chunk content), as does a finish's ""
            delta = {
                k: v
                for k, v in delta.items()
                if v is not None and not (k == "content" and v == "" and finish is not None)
            }
        out["delta"] = delta
        if finish is None:  # the chunks before the finish chunk keep the engine's extras
            out.update(
                (k, v)
                for k, v in choice.items()
                if k not in _STANDARD_CHOICE_FIELDS
                and k != "stop_reason"
                and (v is not None or k == "token_ids")
            )
    elif finish is None or choice.get("text"):
        out["text"] = choice.get("text", "")
    if finish is not None:
        out["finish_reason"] = finish
    if finished and "stop_reason" in choice:
        out["stop_reason"] = choice["stop_reason"]
    if choice.get("logprobs") is not None:
        out["logprobs"] = choice["logprobs"]
    return out


def _stream_usage(usage: JSON) -> JSON:
    """The usage chunk's: a null ``prompt_tokens_details`` and SGLang's top-level
    ``reasoning_tokens`` go; the engine's ``completion_tokens_details`` (the smg pair)
    stay, with ``reasoning_tokens`` added; without them the proxy sends
    ``reasoning_tokens`` and ``text_tokens``."""
    details = usage.get("completion_tokens_details")
    if isinstance(details, dict) and details:
        details = {"reasoning_tokens": 0, **details}
    else:
        details = {"reasoning_tokens": 0, "text_tokens": usage.get("completion_tokens", 0)}
    kept = {
        k: v
        for k, v in usage.items()
        if k != "reasoning_tokens" and not (k == "prompt_tokens_details" and v is None)
    }
    return {**kept, "completion_tokens_details": details}


class Gateway(NamedTuple):
    """How a gateway rewrites a non-streamed body and a stream, given the request kind."""

    body: Callable[[JSON, str], JSON]
    chunks: Callable[[Iterable[JSON], str, bool], Iterator[JSON]]


GATEWAYS = {LITELLM_PROXY: Gateway(litellm_proxy_body, litellm_proxy_chunks)}
