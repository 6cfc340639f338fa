"""Reading what LiteLLM hands a callback: which attempt it reports on, the endpoint it
called, the body it kept (in the shape the openai SDK gives), and its timestamps.

Everything here reads the ``kwargs`` / response of one LiteLLM callback hook and nothing
else; :mod:`.litellm` decides what to record from it. LiteLLM passes these as loosely
typed dicts that differ by route and release, so every reader returns None (or the
empty answer) for what it does not recognise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from spec_decode_otel.sse import decode_json

#: Request fields that are content (never read, never kept): chat, completions, the
#: Responses API's and Anthropic Messages'.
CONTENT = frozenset({"messages", "prompt", "input", "instructions", "system"})
#: What is kept of a request's ``prediction`` (Predicted Outputs: the text the model is
#: expected to write, content too): only that there was one, which decides how the
#: ``usage`` pair is read.
PREDICTION_KEPT: Mapping[str, Any] = {"type": "content"}


def request_kept(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request body as kept until LiteLLM reports the call's end (which it may never
    do): without its content."""
    kept = {k: v for k, v in body.items() if k not in CONTENT}
    if kept.get("prediction") is not None:
        kept["prediction"] = PREDICTION_KEPT
    return kept


#: Choice fields that are content (never read) or that the choice view sets itself.
_NOT_STATS = frozenset({"text", "message", "delta", "logprobs", "index", "finish_reason"})


#: One attempt of a LiteLLM call: its call id, and when that attempt's request began.
Key = tuple[str, str]


def attempt(kwargs: Mapping[str, Any]) -> Key | None:
    """The attempt LiteLLM reports on, or None when it carries no call id.

    One call id can cover several attempts: LiteLLM's Router retries and falls back with
    one ``litellm.completion`` per attempt, and the LiteLLM proxy (or any caller passing
    ``litellm_call_id``) gives them all the request's id. LiteLLM stamps each attempt's
    start (``current_attempt_api_call_start_time``, before it ``api_call_start_time``)
    in the details it hands every hook of that attempt.
    """
    call_id = kwargs.get("litellm_call_id")
    if not isinstance(call_id, str):
        return None
    for name in ("current_attempt_api_call_start_time", "api_call_start_time"):
        stamp = kwargs.get(name)
        if isinstance(stamp, datetime):
            return call_id, stamp.isoformat()
    return call_id, ""


@dataclass(frozen=True)
class _Choice:
    index: int
    finish_reason: Any
    model_extra: Mapping[str, Any]


@dataclass(frozen=True)
class SdkShaped:
    """A LiteLLM response seen as the openai SDK shapes one: what ``ParsedResponse``'s
    SDK view and ``Call`` read (``model``, ``choices``, ``usage``, ``model_extra``),
    without the content."""

    model: Any
    choices: tuple[_Choice, ...]
    usage: Any
    model_extra: Mapping[str, Any]

    @classmethod
    def of(cls, response: Any, *, keep_usage: bool) -> SdkShaped:
        root = getattr(response, "model_extra", None) or {}
        choices = []
        for position, choice in enumerate(getattr(response, "choices", None) or ()):
            fields = {
                k: v
                for k, v in (getattr(choice, "model_extra", None) or {}).items()
                if k not in _NOT_STATS
            }
            moved = getattr(choice, "provider_specific_fields", None)
            if isinstance(moved, Mapping) and moved:
                fields["provider_specific_fields"] = moved  # the choice view folds them back
            reason = moved.get("native_finish_reason") if isinstance(moved, Mapping) else None
            index = getattr(choice, "index", position)
            choices.append(
                _Choice(
                    index if type(index) is int else position,
                    reason if isinstance(reason, str) else getattr(choice, "finish_reason", None),
                    fields,
                )
            )
        return cls(
            getattr(response, "model", None),
            tuple(choices),
            getattr(response, "usage", None) if keep_usage else None,
            {k: v for k, v in root.items() if k not in ("usage", "choices")},
        )


def logged_body(original: Any) -> Mapping[str, Any] | SdkShaped | None:
    """The server's answer as LiteLLM logged it (``original_response``): the body's JSON
    text (its own handler, and the SDK's parsed body re-serialized; for the Responses
    API, the completed response, streamed or not) or the SDK's ``Completion``; both keep
    every field the server sent. None for anything else (an error's text, nothing logged
    yet), and for a text over ``MAX_EVENT_CHARS``, which is not decoded a second time:
    the caller falls back to LiteLLM's own response object, as for any body it cannot
    read."""
    if isinstance(original, str):
        body = decode_json(original)
        if not isinstance(body, Mapping):
            return None
        return body if any(isinstance(body.get(k), list) for k in ("choices", "output")) else None
    if hasattr(original, "choices") and hasattr(original, "model_extra"):
        return SdkShaped.of(original, keep_usage=True)
    return None


def kept_body(kwargs: Mapping[str, Any], response: Any) -> Any:
    """The closest thing to the server's body that LiteLLM kept: the body it logged, else
    its own response object, which can lose some fields (a text completion LiteLLM
    answered through the chat endpoint comes back without the chat body's root fields).
    A Responses API object is taken as it is: LiteLLM's keeps the server's root fields
    as extras, as the openai SDK's does."""
    body = logged_body(kwargs.get("original_response"))
    if body is not None:
        return body
    if responses_call(kwargs):
        return response
    return SdkShaped.of(response, keep_usage=True)


#: LiteLLM's Responses API calls (``litellm.responses`` / ``aresponses``).
_RESPONSES_CALLS = frozenset({"responses", "aresponses"})


def responses_call(kwargs: Mapping[str, Any]) -> bool:
    """A Responses API call: LiteLLM reports a streamed one's end with the completed
    response, whole (what the ``response.completed`` event carried, without the event's
    own fields), not with chunks it rebuilt."""
    return kwargs.get("call_type") in _RESPONSES_CALLS


def sent_by_responses_handler(kwargs: Mapping[str, Any]) -> bool:
    """LiteLLM's Responses handler is about to send this Responses call itself, with its
    own HTTP client (``response_api_handler``, litellm/llms/custom_httpx/
    llm_http_handler.py, logs a Responses body, with its ``input``, just before): no
    openai SDK request belongs to it. A Responses call LiteLLM answers through a chat
    completion (litellm/responses/litellm_completion_transformation/, for providers
    without a Responses route, which may go through the SDK) logs the chat body instead.
    """
    if not responses_call(kwargs):
        return False
    body = request_body(kwargs)
    return body is not None and "input" in body and "messages" not in body


def failure_logged(kwargs: Mapping[str, Any]) -> bool:
    """LiteLLM has already logged a failure on these call details, so it reports no
    failure of this attempt: a ``Logging`` object logs one failure a request
    (``should_run_logging``'s ``has_logged_async_failure`` / ``has_logged_sync_failure``,
    litellm/litellm_core_utils/litellm_logging.py, LiteLLM 1.110.2), and the proxy's Router
    runs every attempt of a request on the request's one (``failure_already_logged``,
    litellm/router_rust/surface/health.py)."""
    return kwargs.get("has_logged_async_failure") is True or (
        kwargs.get("has_logged_sync_failure") is True
    )


def request_body(kwargs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The JSON body LiteLLM built for the request (logged before it sends it)."""
    additional = kwargs.get("additional_args")
    body = additional.get("complete_input_dict") if isinstance(additional, Mapping) else None
    return body if isinstance(body, Mapping) else None


def include_usage(kwargs: Mapping[str, Any]) -> bool:
    """The stream asked for the server's usage chunk (else LiteLLM estimates usage, which
    the openai wrapper would not report)."""
    for options in (
        kwargs.get("stream_options"),
        (kwargs.get("optional_params") or {}).get("stream_options"),
    ):
        if isinstance(options, Mapping) and options.get("include_usage") is True:
            return True
    return False


def server(kwargs: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """Host and port of the endpoint LiteLLM called."""
    params = kwargs.get("litellm_params")
    base = params.get("api_base") if isinstance(params, Mapping) else None
    if not isinstance(base, str) or not base:
        return None, None
    return url_server(base)


def mocked(kwargs: Mapping[str, Any]) -> bool:
    """A ``mock_response`` call, which LiteLLM answers itself: no server was asked, so it
    is no call of ours. LiteLLM 1.110.2's ``mock_completion`` (main.py) logs its start
    with the key ``mock-key`` and no ``api_base``; a real call's start has the endpoint
    LiteLLM is about to call, whatever its key."""
    return kwargs.get("api_key") == "mock-key" and server(kwargs) == (None, None)


def client_left(kwargs: Mapping[str, Any]) -> bool:
    """The proxy's client hung up on a stream. LiteLLM's proxy (1.110.2,
    ``_bill_partial_streamed_spend_on_disconnect`` in proxy/common_request_processing.py)
    then reports a success built from the chunks read so far, its finish reason made up
    (``stop``), and marks it in ``litellm_params.metadata.client_disconnected``."""
    params = kwargs.get("litellm_params")
    metadata = params.get("metadata") if isinstance(params, Mapping) else None
    return isinstance(metadata, Mapping) and metadata.get("client_disconnected") is True


def url_server(url: str) -> tuple[str | None, int | None]:
    """Host and port of ``url`` (``server.address``, ``server.port``): the scheme's
    default port when it names none, None for a port out of range."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = {"https": 443, "http": 80}.get(parts.scheme)
    return parts.hostname or None, port


def server_name(kwargs: Mapping[str, Any]) -> str:
    """``host:port`` of the endpoint LiteLLM called, as the openai wrapper notes it."""
    host, port = server(kwargs)
    return f"{host}:{port}"


def attempt_start(kwargs: Mapping[str, Any]) -> datetime | None:
    """When this attempt's request began (the call's start is the first attempt's)."""
    for name in ("current_attempt_api_call_start_time", "api_call_start_time", "start_time"):
        stamp = kwargs.get(name)
        if isinstance(stamp, datetime):
            return stamp
    return None


def now_beside(stamp: datetime | None) -> datetime | None:
    """Now, in ``stamp``'s time zone (LiteLLM's stamps may be naive); None without one."""
    return None if stamp is None else datetime.now(stamp.tzinfo)


def nanoseconds(moment: Any) -> int | None:
    return int(moment.timestamp() * 1e9) if isinstance(moment, datetime) else None


def seconds(start: Any, end: Any) -> float | None:
    if isinstance(start, datetime) and isinstance(end, datetime):
        return max((end - start).total_seconds(), 0.0)
    return None
