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
so a request still unanswered then, and those not made, are reported as errors.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from spec_decode_otel import telemetry as names
from spec_decode_otel._logging import logger
from spec_decode_otel.instrumentation.hints import TURN_STATS_ON
from spec_decode_otel.outcome import Outcome
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base_url", help="the server's OpenAI base URL, e.g. http://vllm-0:8000/v1")
    parser.add_argument("--model", required=True, help="a model the server serves")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", "-"),
        help="API key (default: $OPENAI_API_KEY, else a placeholder)",
    )
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="an extra request header, e.g. a gateway's (repeatable)",
    )
    parser.add_argument(
        "--request-engine-stats",
        action="append",
        default=[],
        metavar="ENGINE",
        help="add ENGINE's request fields that switch its stats on, as the "
        "request_engine_stats setting does (sglang; repeatable)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=64, help="tokens per request (default 64)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds for the whole check, its three requests together (default 60)",
    )


class _Lines:
    """The probes' lines, printed by the thread making the requests until the command
    stops waiting for it (``close``), then by the command."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []
        self.body: Any = None
        self._lock = threading.Lock()
        self._closed = False

    def add(self, label: str, outcome: str, said: str, body: Any) -> bool:
        """Print one probe's line; False once closed (the line is dropped)."""
        with self._lock:
            if self._closed:
                return False
            self.outcomes.append(outcome)
            self.body = self.body if self.body is not None else body
            print(f"  {label:<24}{outcome:<18}{said}".rstrip())
            return True

    def close(self, timeout: float) -> None:
        """Stop taking lines, and print those of the probes without one as errors."""
        with self._lock:
            self._closed = True
        for label, _ in PROBES[len(self.outcomes) :]:
            self.outcomes.append(Outcome.ERROR.value)
            said = f"no answer within --timeout ({timeout:g} s for the whole check)"
            print(f"  {label:<24}{Outcome.ERROR.value:<18}{said}")


class _Hints(logging.Handler):
    """Keeps the instrumentation's warnings (its hints) to print after the requests."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run(args: argparse.Namespace) -> int:
    """Make the three requests and print what arrived; exit status 0 when at least one
    had a record, 1 when none had."""
    import openai
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from spec_decode_otel import instrument_client

    headers = dict(_header(h) for h in args.header)
    spans = InMemorySpanExporter()
    # Each call is read from its span, and nothing is exported: the variables that set up
    # an application's SDK (OTEL_TRACES_SAMPLER, OTEL_SDK_DISABLED, limits) must not drop
    # those spans, and the SDK's providers read them when built.
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        del os.environ[name]
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    hints = _Hints()
    logger.addHandler(hints)
    client = openai.OpenAI(
        base_url=args.base_url,
        api_key=args.api_key,
        default_headers=headers,
        max_retries=0,
        timeout=args.timeout,
    )
    try:
        instrument_client(
            client,
            tracer_provider=tracer_provider,
            meter_provider=MeterProvider(),
            request_engine_stats=tuple(args.request_engine_stats),
        )
    except ValueError as exc:  # an unknown engine
        raise SystemExit(f"spec-decode-otel check: {exc}") from None
    print(f"{args.base_url}  model {args.model}")
    lines = _Lines()
    deadline = time.monotonic() + args.timeout
    prober = threading.Thread(
        target=_probe,
        args=(client, args, spans, lines, deadline),
        name="spec-decode-otel-check",
        daemon=True,  # past the deadline the command exits without it
    )
    prober.start()
    prober.join(max(deadline - time.monotonic(), 0.0))
    lines.close(args.timeout)
    if not prober.is_alive():
        client.close()
    logger.removeHandler(hints)
    for message in hints.messages:
        print(f"\nhint: {message}")
    outcomes = lines.outcomes
    if all(outcome == Outcome.ERROR.value for outcome in outcomes):
        print("\nNo call succeeded: check the URL, the model and the key (--header for a gateway).")
        return 1
    if not WITH_RECORD.intersection(outcomes):
        fix = _fix_for(lines.body) or f"To get them, {TURN_STATS_ON}"
        print(f"\nNo response carried spec-decode stats. {fix}", end="")
        print(" (README: Why is my dashboard empty?).")
        return 1
    return 0


def _probe(
    client: Any, args: argparse.Namespace, spans: Any, lines: _Lines, deadline: float
) -> None:
    """Make the requests in turn, each with the time left, each line printed as it ends."""
    for label, extra in PROBES:
        left = deadline - time.monotonic()
        if left <= 0:
            return  # the command reports what is left
        problem, answer = _request(client, args, extra, left)
        ended = spans.get_finished_spans()
        spans.clear()
        attributes = (ended[-1].attributes or {}) if ended else {}
        outcome = str(attributes.get(names.SD_OUTCOME, "none"))
        if not lines.add(label, outcome, problem or _describe(attributes), answer):
            return


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise SystemExit(f"spec-decode-otel check: --header {text!r} is not NAME:VALUE")
    return name.strip(), value.strip()


def _request(
    client: Any, args: argparse.Namespace, extra: Mapping[str, Any], timeout: float
) -> tuple[str | None, Any]:
    """Make one request with ``timeout`` and read it to its end: what went wrong, else
    None, and the decoded body of a call that is not streamed (read raw, then parsed as
    an application would, which ends its span), else None."""
    import openai

    body = None
    request = {
        "model": args.model,
        "messages": MESSAGES,
        "max_tokens": args.max_tokens,
        "timeout": timeout,
        **extra,
    }
    try:
        if extra.get("stream"):
            for _ in client.chat.completions.create(**request):
                pass
        else:
            raw = client.chat.completions.with_raw_response.create(**request)
            raw.parse()
            body = decode_json(raw.http_response.content)
    except openai.APIStatusError as exc:
        return f"HTTP {exc.status_code}: {str(exc.message)[:MAX_ERROR_CHARS]}", None
    except Exception as exc:  # whatever the server does (older SDKs raise a cut stream's
        # transport error as it is), the command reports it rather than a traceback
        problem = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, openai.APIConnectionError) and exc.__cause__ is not None:
            # "Connection error." alone: the transport's reason (refused, unknown host,
            # TLS, no scheme in the URL) is only the cause
            problem += f" ({exc.__cause__})"
        return problem[:MAX_ERROR_CHARS], None
    return None, body


def _fix_for(body: Any) -> str | None:
    """The one switch to name when the body shows which engine answered without stats:
    vLLM's per-request ``metrics`` null, or with ``speculative_decoding`` null (0.34.0:
    the server runs without a speculative config, or without per-request spec-decode
    metrics; ``metrics`` is null unless its timing fields are on too), or ``timings``
    without draft counts (llama.cpp sends them only for a reply it drafted for; mlx-vlm
    sends null ones without a drafter)."""
    if not isinstance(body, Mapping):
        return None
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
        )
    return None


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
