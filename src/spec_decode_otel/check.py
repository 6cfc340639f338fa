"""``spec-decode-otel check``: ask a live server whether its responses carry spec-decode
stats, through the instrumented ``openai`` SDK, and say what to change when they do not.

It answers "why is my dashboard empty?" from the server itself. Three chat requests — a
plain one, a stream as most applications make it (without ``include_usage``), and a
stream that asks for the usage chunk — go through a client instrumented exactly as in an
application, with in-memory OpenTelemetry providers. Each request's line is read from
the span the instrumentation ended: its outcome and what its record holds. The hints
after them are the instrumentation's own log lines, the ones an application gets; when
no request had stats, the command says what to switch on: for the engine whose fields
the plain call's body shows without stats (vLLM's per-request ``metrics``, llama.cpp's
``timings``), that engine's switch, else where each engine switches them on. Nothing is
exported.

``--timeout`` bounds the whole check, not each request: each request gets the time left,
and the requests run on a thread the command stops waiting for at the deadline (httpx's
timeout applies to each read, which a server that trickles bytes or SSE comments renews),
so a request still unanswered then, and those not made, are reported as errors. The
thread only makes the requests: every line is printed by the command's own thread, so a
reader that leaves (``| head``) ends the check through ``main``'s ``BrokenPipeError``
handling. Whatever the server sent is printed with its control characters escaped.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import logging.handlers
import math
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any, NamedTuple

from spec_decode_otel import telemetry as names
from spec_decode_otel._logging import logger
from spec_decode_otel._terminal import printable, write_out
from spec_decode_otel.capture import PROVIDER_SPECIFIC_FIELDS
from spec_decode_otel.instrumentation.hints import INCLUDE_USAGE, TURN_STATS_ON
from spec_decode_otel.outcome import Outcome
from spec_decode_otel.record import MAX_CHOICES
from spec_decode_otel.sse import decode_json

#: The requests made, by label: what the SDK call adds to model, messages and max_tokens.
PROBES: tuple[tuple[str, Mapping[str, Any]], ...] = (
    ("chat", {}),
    ("stream", {"stream": True}),
    ("stream + include_usage", {"stream": True, "stream_options": {"include_usage": True}}),
)
#: A prompt whose answer repeats it, so that a drafter that looks up n-grams in the text
#: (llama.cpp's ngram types, vLLM's and SGLang's n-gram / prompt lookup) has something to
#: draft: on text that does not repeat it drafts nothing, and llama.cpp then sends no counts.
MESSAGES = [
    {
        "role": "user",
        "content": "Repeat this line three times, one per line: "
        "the draft model proposes tokens and the target model verifies them.",
    }
]
#: Longest server error message printed (a server may send pages of HTML).
MAX_ERROR_CHARS = 200
WITH_RECORD = {Outcome.RECORDED.value, Outcome.PARTIAL.value}
#: Most bytes of one answer, once decompressed, that check lets the SDK read (16 MiB, the
#: largest body the instrumentation reads, ``sse.MAX_EVENT_CHARS``): a body that never
#: ends, or a gzip bomb, ends that call with an error instead of taking the memory.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: Longest ``--timeout`` taken, a day: ``Thread.join`` refuses larger ones (and nan).
MAX_TIMEOUT = 86400.0
#: What is said, instead of the switches, when no call had a record and some answer was
#: not a chat completion: the requests did not reach an OpenAI-compatible server.
NOT_CHAT = (
    "Not every answer was an OpenAI chat completion (see the lines above): check the base "
    "URL (it usually ends in /v1), and whether a proxy or a login page answers in front "
    "of the server."
)
#: What is said when no call had a record and some had stats the adapters rejected.
REJECTED = (
    "Spec-decode stats arrived but were rejected as invalid (see the lines above): the "
    "server, or a gateway in front of it, sends numbers that contradict each other or "
    "exceed a bound. Check that the server's version is one README's 'Supported engines' "
    "lists; spec-decode-otel parse on a saved response says which rule they broke."
)
#: Said when no call had a record and two adapters claimed an answer.
AMBIGUOUS = (
    "Two adapters claimed the answers (outcome ambiguous): uninstall or fix the plug-in "
    "adapter that claims another engine's fields."
)
#: Said when the plain call had stats and no stream had, not even with include_usage.
STREAMS_STRIPPED = (
    "the non-streaming call had spec-decode stats but no stream had, even with "
    "stream_options.include_usage: something in front of the engine (a gateway or "
    "proxy) drops them from streams (README: Through a gateway)"
)
#: Longest reply (--max-tokens) under which a reply with nothing drafted may just be short.
SHORT_REPLY = 16
#: How much of an error page is searched for its text.
MAX_PAGE_CHARS = 4096
_MARKUP = re.compile(r"<[^<>]{0,4096}>")
#: What a gateway or proxy answers when the server behind it does not.
GATEWAY_ERRORS = {502, 503, 504}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "base_url", type=_base_url, help="the server's OpenAI base URL, e.g. http://vllm-0:8000/v1"
    )
    parser.add_argument("--model", required=True, help="a model the server serves")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", "-"),
        help="API key (default: $OPENAI_API_KEY, else a placeholder)",
    )
    parser.add_argument(
        "--header",
        action="append",
        type=_header,
        default=[],
        metavar="NAME:VALUE",
        help="an extra request header, e.g. a gateway's (repeatable)",
    )
    parser.add_argument(
        "--request-engine-stats",
        action="append",
        type=_engine,
        default=[],
        metavar="ENGINE",
        help="add ENGINE's request fields that switch its stats on, as the "
        "request_engine_stats setting does (sglang; repeatable)",
    )
    parser.add_argument(
        "--max-tokens", type=_max_tokens, default=64, help="tokens per request (default 64)"
    )
    parser.add_argument(
        "--timeout",
        type=_timeout,
        default=60.0,
        help="seconds for the whole check, its three requests together (default 60, "
        f"at most {MAX_TIMEOUT:g})",
    )


def _base_url(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the base URL is empty")
    return text


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME:VALUE")
    return name.strip(), value.strip()


def _engine(text: str) -> str:
    from spec_decode_otel.adapters.registry import registered_adapters

    known = sorted({adapter.engine for adapter in registered_adapters()})
    if text not in known:
        raise argparse.ArgumentTypeError(f"unknown engine {text!r}; known: {', '.join(known)}")
    return text


def _max_tokens(text: str) -> int:
    try:
        tokens = int(text)
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens above 0")
    return tokens


def _timeout(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT:  # nan fails every comparison
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds above 0 and at most {MAX_TIMEOUT:g}"
        )
    return seconds


class _Answer(NamedTuple):
    """What one request got: ``problem`` when it failed, ``foreign`` when what came back
    was not a chat completion (a login page, another API's JSON), the decoded body of a
    call that is not streamed."""

    problem: str | None = None
    foreign: str | None = None
    body: Any = None
    #: The HTTP status of an error answer.
    status: int | None = None
    #: Whether the request failed because its timeout ran out (what was raised, not what
    #: its text says: a server's own message may quote "Timeout").
    timed_out: bool = False


class _Line(NamedTuple):
    label: str
    outcome: str
    said: str
    answer: _Answer


def run(args: argparse.Namespace) -> int:
    """Make the three requests and print what arrived; exit status 0 when at least one
    had a record, 1 when none had."""
    import openai
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from spec_decode_otel import instrument_client

    spans = InMemorySpanExporter()
    # Each call is read from its span, and nothing is exported: the variables that set up
    # an application's SDK (OTEL_TRACES_SAMPLER, OTEL_SDK_DISABLED, limits) must not drop
    # those spans, and the SDK's providers read them when built.
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        del os.environ[name]
    _undo_auto_instrumentation()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    # The instrumentation's warnings (its hints), kept to print after the requests.
    hints = logging.handlers.BufferingHandler(capacity=sys.maxsize)
    hints.setLevel(logging.WARNING)
    logger.addHandler(hints)
    client = openai.OpenAI(
        base_url=args.base_url,
        api_key=args.api_key,
        default_headers=dict(args.header),
        http_client=_bounded_http_client(openai),
        max_retries=0,
        timeout=args.timeout,
    )
    instrument_client(  # the engines were checked against the registry by argparse
        client,
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(),
        request_engine_stats=tuple(args.request_engine_stats),
    )
    _print(f"{args.base_url}  model {args.model}")
    lines: queue.Queue[_Line | None] = queue.Queue()
    stop = threading.Event()
    deadline = time.monotonic() + args.timeout
    prober = threading.Thread(
        target=_probe,
        args=(client, args, spans, lines, stop, deadline),
        name="spec-decode-otel-check",
        daemon=True,  # past the deadline the command exits without it
    )
    prober.start()
    done: list[_Line] = []
    try:
        while len(done) < len(PROBES):
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                line = None
            if line is None:
                break
            done.append(line)
            _print(f"  {line.label:<24}{line.outcome:<18}{line.said}".rstrip())
    finally:
        stop.set()  # the prober makes no request after this
        logger.removeHandler(hints)
    said = f"no answer within --timeout ({args.timeout:g} s for the whole check)"
    for label, _ in PROBES[len(done) :]:
        _print(f"  {label:<24}{Outcome.ERROR.value:<18}{said}")
    prober.join(max(deadline - time.monotonic(), 0.0))
    if not prober.is_alive():
        client.close()
    outcome_of = {line.label: line.outcome for line in done}
    told = [record.getMessage() for record in hints.buffer]
    if (
        outcome_of.get(PROBES[0][0]) in WITH_RECORD
        and outcome_of.get(PROBES[2][0]) == Outcome.NO_STATS.value
    ):
        # include_usage did not help: the instrumentation's advice to send it is moot.
        tail = INCLUDE_USAGE.split("%s", 1)[1]
        told = [m for m in told if not m.endswith(tail)] + [STREAMS_STRIPPED]
    for message in told:
        _print("")
        _print(f"hint: {message}")
    verdict = _verdict(done, args)
    if verdict is None:
        return 0
    _print("")
    _print(verdict)
    return 1


def _verdict(done: list[_Line], args: argparse.Namespace) -> str | None:
    """What the report ends with when no call had a record; None when one had."""
    outcomes = [line.outcome for line in done] + [Outcome.ERROR.value] * (len(PROBES) - len(done))
    if all(outcome == Outcome.ERROR.value for outcome in outcomes):
        return _none_succeeded(done, args.timeout)
    if WITH_RECORD.intersection(outcomes):
        return None
    if any(line.answer.foreign for line in done):
        return NOT_CHAT
    if Outcome.INVALID.value in outcomes:
        return REJECTED
    if Outcome.AMBIGUOUS.value in outcomes:
        return AMBIGUOUS
    bodies = [line.answer.body for line in done if line.answer.body is not None]
    fix = _fix_for(bodies[0] if bodies else None, args.max_tokens)
    if fix is None:
        fix = f"To get them, {TURN_STATS_ON}"
        if "sglang" not in args.request_engine_stats:
            fix += "; for SGLang, run check again with --request-engine-stats sglang"
    return f"No response carried spec-decode stats. {fix} (README: Why is my dashboard empty?)."


def _undo_auto_instrumentation() -> None:
    """Uninstrument what ``opentelemetry-instrument`` (or the OTel Operator's injected
    auto-instrumentation) instrumented in this process before the command ran: the
    process-wide instrumentor would take the requests from the check's own client, and
    openai-v2's span would get our attributes instead, so the check's spans were
    exported and its lines all said ``none``. An instrumentor whose module was never
    imported instrumented nothing."""
    for entry in entry_points(group="opentelemetry_instrumentor"):
        if entry.module not in sys.modules:
            continue
        try:
            instrumentor = entry.load()()
            if instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.uninstrument()
        except Exception:  # an instrumentor that cannot be undone: the check goes on
            logger.debug("could not uninstrument %s", entry.name, exc_info=True)


class AnswerTooLarge(Exception):
    """An answer went past ``MAX_ANSWER_BYTES``."""


def _bounded_http_client(openai: Any) -> Any:
    """The SDK's own HTTP client (``DefaultHttpxClient``, on httpx2 from openai 3, httpx
    before), whose responses raise :class:`AnswerTooLarge` once their decoded bytes pass
    ``MAX_ANSWER_BYTES``; None (the SDK builds its own) when the SDK's client is neither.
    Both read every body, plain or streamed, through ``Response.iter_bytes``; its
    decoder inflates one read (64 KiB) at a time, so a bomb costs at most ~1000 times
    that over the bound. A proxy from the environment has a transport of its own,
    which this one does not bound."""
    http: Any = next(
        (h for h in _http_modules() if issubclass(openai.DefaultHttpxClient, h.Client)), None
    )
    if http is None:
        return None

    class Response(http.Response):  # type: ignore[misc]  # httpx2's or httpx's
        def iter_bytes(self, chunk_size: int | None = None) -> Iterator[bytes]:
            size = 0
            for chunk in super().iter_bytes(chunk_size):
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise AnswerTooLarge(
                        f"the answer is over {MAX_ANSWER_BYTES >> 20} MiB, more than check reads"
                    )
                yield chunk

    class Transport(http.HTTPTransport):  # type: ignore[misc]
        def handle_request(self, request: Any) -> Any:
            got = super().handle_request(request)
            return Response(
                got.status_code, headers=got.headers, stream=got.stream, extensions=got.extensions
            )

    return openai.DefaultHttpxClient(transport=Transport())


def _http_modules() -> Iterator[Any]:
    """httpx2 (openai 3's) and httpx (openai 1 and 2's), those installed: either may be
    installed beside an SDK that uses the other."""
    for name in ("httpx2", "httpx"):
        try:
            yield importlib.import_module(name)
        except ModuleNotFoundError:
            continue


def _print(text: str) -> None:
    """Print a line of the report now, its control characters escaped: a reader that
    left raises ``BrokenPipeError`` here, on the command's thread, for ``main``."""
    write_out(printable(text), flush=True)


def _probe(
    client: Any,
    args: argparse.Namespace,
    spans: Any,
    lines: queue.Queue[_Line | None],
    stop: threading.Event,
    deadline: float,
) -> None:
    """Make the requests in turn, each with the time left, each line handed to the
    command as it ends; stop once the command stopped waiting (the deadline, or a reader
    that left)."""
    try:
        for label, extra in PROBES:
            left = deadline - time.monotonic()
            if left <= 0 or stop.is_set():
                return  # the command reports what is left
            answer = _request(client, args, extra, left)
            ended = spans.get_finished_spans()
            spans.clear()
            attributes = (ended[-1].attributes or {}) if ended else {}
            outcome = str(attributes.get(names.SD_OUTCOME, "none"))
            said = answer.problem or answer.foreign or _describe(attributes)
            lines.put(_Line(label, outcome, said, answer))
    finally:
        lines.put(None)


def _request(
    client: Any, args: argparse.Namespace, extra: Mapping[str, Any], timeout: float
) -> _Answer:
    """Make one request with ``timeout`` and read it to its end: what went wrong, or what
    came back instead of a chat completion, and the decoded body of a call that is not
    streamed (read raw, then parsed as an application would, which ends its span)."""
    import openai

    request = {
        "model": args.model,
        "messages": MESSAGES,
        "max_tokens": args.max_tokens,
        "timeout": timeout,
        **extra,
    }
    try:
        if extra.get("stream"):
            stream = client.chat.completions.create(**request)
            events = completions = 0
            for chunk in stream:
                events += 1
                completions += isinstance(getattr(chunk, "choices", None), list)
            if completions:
                return _Answer()
            kind = stream.response.headers.get("content-type", "no content-type")
            return _Answer(foreign=f"not a chat completion stream: {kind}, {events} events")
        raw = client.chat.completions.with_raw_response.create(**request)
        raw.parse()
        body = decode_json(raw.http_response.content)
    except openai.APIStatusError as exc:
        message = str(exc.message)
        if message == f"Error code: {exc.status_code}":
            # openai 3 says only a JSON error's message: show what the page says instead
            message += f" - {_page_text(exc.response)}"
        elif message.lstrip().startswith("<"):  # openai 1 and 2 say a page as it came
            message = _without_markup(message)
        problem = f"HTTP {exc.status_code}: {message[:MAX_ERROR_CHARS]}"
        return _Answer(problem=problem, status=exc.status_code)
    except Exception as exc:  # whatever the server does (older SDKs raise a cut stream's
        # transport error as it is), the command reports it rather than a traceback
        problem = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, openai.APIConnectionError) and exc.__cause__ is not None:
            # "Connection error." alone: the transport's reason (refused, unknown host,
            # TLS, no scheme in the URL) is only the cause
            problem += f" ({exc.__cause__})"
        return _Answer(problem=problem[:MAX_ERROR_CHARS], timed_out=_is_timeout(exc))
    if isinstance(body, Mapping) and isinstance(body.get("choices"), list):
        return _Answer(body=body)
    kind = raw.http_response.headers.get("content-type", "no content-type")
    start = raw.http_response.content[:60].decode("utf-8", "replace")
    return _Answer(foreign=f"not a chat completion: {kind}, {start!r}")


def _is_timeout(exc: Exception) -> bool:
    """Whether ``exc`` says a timeout ran out: the SDK's ``APITimeoutError``, or the
    transport's own timeout (httpx2's or httpx's), which openai 2.54 and earlier raise as
    it is from a stream's reads (openai 3.63 wraps it), or the standard library's."""
    import openai

    timeouts = (openai.APITimeoutError, TimeoutError)
    timeouts += tuple(http.TimeoutException for http in _http_modules())
    return isinstance(exc, timeouts)


def _fix_for(body: Any, max_tokens: int) -> str | None:
    """The one switch to name when the body shows which engine answered without stats:
    vLLM's per-request ``metrics`` null, or with ``speculative_decoding`` null (0.34.0:
    the server runs without a speculative config, or without per-request spec-decode
    metrics; ``metrics`` is null unless its timing fields are on too), or ``timings``
    without draft counts (llama.cpp sends them only for a reply it drafted for; mlx-vlm
    sends null ones without a drafter)."""
    if not isinstance(body, Mapping):
        return None
    if _premerge_stats_off(body.get("choices")):
        return (
            "The server sends a pre-merge vLLM build's per-choice speculative_decoding_stats "
            "as null: start it with --speculative-config and --per-request-spec-decode-stats"
        )
    metrics, timings = body.get("metrics"), body.get("timings")
    if ("metrics" in body and metrics is None) or (
        isinstance(metrics, Mapping) and not metrics.get("speculative_decoding")
    ):
        return (
            "The server sends vLLM's per-request metrics without speculative_decoding: "
            "start vLLM with --speculative-config and --per-request-spec-decode-metrics summary"
        )
    if isinstance(timings, Mapping) and timings.get("draft_n") is None:
        return (
            "The server sends timings (llama.cpp, mlx-vlm) without draft counts, so nothing "
            "was drafted for this reply: start llama-server with --spec-type (draft-simple "
            "with -md, or an n-gram type, which drafts only where the text repeats), or give "
            "mlx-vlm a drafter"
            + (
                f"; or the reply was too short to draft for (--max-tokens {max_tokens})"
                if max_tokens < SHORT_REPLY
                else ""
            )
        )
    return None


def _premerge_stats_off(choices: Any) -> bool:
    """Whether a choice carries pre-merge vLLM's ``speculative_decoding_stats`` as null,
    its shape with the stats off; on the choice, or where LiteLLM's proxy moves it."""
    if not isinstance(choices, list):
        return False
    for choice in choices[:MAX_CHOICES]:
        if not isinstance(choice, Mapping):
            continue
        moved = choice.get(PROVIDER_SPECIFIC_FIELDS)
        for fields in (choice, moved if isinstance(moved, Mapping) else {}):
            if (
                "speculative_decoding_stats" in fields
                and fields["speculative_decoding_stats"] is None
            ):
                return True
    return False


def _page_text(response: Any) -> str:
    """The start of an error page's text, its markup dropped: an nginx 502 page, a
    sign-in page, a framework's ``{"detail": "Not Found"}``."""
    try:
        text = response.text
    except Exception:  # an unreadable body: the status says enough
        return ""
    return _without_markup(text)


def _without_markup(text: str) -> str:
    return " ".join(_MARKUP.sub(" ", text[:MAX_PAGE_CHARS]).split())


def _none_succeeded(done: list[_Line], timeout: float) -> str:
    """The verdict when every call failed: what the failures point at."""
    statuses = {line.answer.status for line in done}
    if statuses & GATEWAY_ERRORS:
        return (
            "No call succeeded: a gateway or proxy answered for a server behind it that "
            "is down or unreachable (HTTP 502, 503 or 504): check the inference server, "
            "and that the gateway routes --model to it."
        )
    if 429 in statuses:
        return (
            "No call succeeded: the server or a gateway in front of it is rate-limiting "
            "(HTTP 429): run check again later, or with a key whose limit allows it."
        )
    if statuses & {401, 403}:
        return (
            "No call succeeded: the server or a gateway refused the credentials (HTTP 401 "
            "or 403): check --api-key (default $OPENAI_API_KEY) and any header the "
            "gateway needs (--header)."
        )
    timed_out = len(done) < len(PROBES) or any(line.answer.timed_out for line in done)
    if statuses <= {None} and timed_out:  # no HTTP status: nothing answered
        return (
            f"No call was answered within --timeout ({timeout:g} s for the whole "
            "check): raise it for a slow or busy server, or check the URL."
        )
    return (
        "No call succeeded: check the URL (it usually ends in /v1), the model and the key "
        "(--header for a gateway)."
    )


def _describe(attributes: Mapping[str, Any]) -> str:
    """What the record holds, in the terms of README's record table."""
    engine = attributes.get(names.SD_ENGINE)
    if engine is None:
        return ""
    parts = [f"engine {engine}"]
    for key, label in (
        (names.SD_MEAN_ACCEPTANCE_LENGTH, "mean acceptance length"),
        (names.SD_DRAFT_ACCEPTANCE_RATE, "acceptance rate"),
        (names.SD_NUM_SPEC_TOKENS, "k"),
        (names.SD_NUM_SPEC_STEPS, "steps"),
        (names.SD_NUM_DRAFT_TOKENS, "drafted"),
        (names.SD_NUM_ACCEPTED_DRAFT_TOKENS, "accepted"),
    ):
        value = attributes.get(key)
        if isinstance(value, float):
            parts.append(f"{label} {value:.3f}")
        elif value is not None:
            parts.append(f"{label} {value}")
    return "  ".join(parts)
