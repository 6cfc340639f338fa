"""spec-decode-otel beside Sentry's OpenAI integration and Langfuse's drop-in OpenAI wrapper,
both set up in code in either order, nothing faked.

The others, real and pinned, each in a venv that ``scripts/install-coexistence-venvs.sh``
builds: sentry-sdk 2.76.0 (``sentry``; ``sentry_sdk.init`` with ``OpenAIIntegration()``
and ``traces_sample_rate=1.0``, its DSN at a receiver on loopback) and langfuse 5.2.0
(``langfuse``; ``Langfuse(base_url=...)`` at a receiver on loopback, then
``from langfuse.openai import openai``). Each run is a fresh process of
``sentry_langfuse_app.py``: chat and legacy completions, sync and async, streamed (with
``include_usage``) and not, a ``with_raw_response`` chat call streamed and not, and a
streamed chat call left after one chunk in a ``with`` block, against the simulator.

What each of them does to the SDK (the installed sources):

- Sentry 2.76.0, sentry_sdk/integrations/openai.py ``setup_once``: replaces chat
  ``Completions.create`` / ``AsyncCompletions.create`` (and embeddings, Responses) with a
  function of its own; legacy completions are not wrapped. A streamed call's
  ``response._iterator`` is replaced by its generator when ``isinstance(response, Stream)
  and hasattr(response, "_iterator")``: both hold through our stream proxy, and the
  assignment goes through it to the SDK's stream, whose ``__iter__``/``__next__`` (which
  ours call) read ``_iterator``. Its span is Sentry's own, not OpenTelemetry's, so ours is
  our own span in ``auto`` mode. Its spans arrive as a transaction (the HTTP call, from its
  auto-enabled httpx integration) and as ``span`` envelope items (``gen_ai.chat``).
- Langfuse 5.2.0, langfuse/openai.py: ``wrapt.wrap_function_wrapper`` on chat and legacy
  ``create`` (and ``parse``, embeddings, Responses), sync and async, and, at import,
  ``openai.Stream.__iter__`` / ``AsyncStream.__aiter__`` replaced by generators that end its
  generation in their ``finally`` (``_install_openai_stream_iteration_hooks``). A stream's
  ``_iterator`` is replaced through our proxy as Sentry's is; ``response.close =
  traced_close`` (and ``aclose``) lands on our proxy, which has a ``close`` of its own
  (wrapt's ``ObjectProxy.__setattr__`` keeps such a name on the proxy). A
  ``with_raw_response`` call not streamed is traced by calling ``parse()`` on what
  ``create`` returned (``_unwrap_raw_response``), ours; a streamed one is passed through
  untraced (``_should_skip_raw_response_instrumentation``). Its generation is an
  OpenTelemetry span (scope ``langfuse-sdk``, kind INTERNAL, ``langfuse.*`` attributes, no
  ``gen_ai.*``) made by ``start_observation``, never current: ``auto`` mode cannot see it,
  and rightly would not take it for a GenAI span (coexistence.py reads scope, kind and
  ``gen_ai.*``), so ours is our own span, its sibling under the user's span. Langfuse adds
  its span processor to the global tracer provider when one is set (_client/
  resource_manager.py ``_init_tracer_provider``), and its default export filter
  (_client/span_filter.py ``is_default_export_span``) sends every span with a ``gen_ai.*``
  attribute to Langfuse: ours too (pinned below).

For every call: exactly one span carrying ``spec_decode.*``, with the figures of the same
seeded call with spec-decode-otel alone; the user's content, usage and number of chunks as
without any telemetry; their telemetry as with them alone; our metrics as ours alone; no
exception, nothing logged, no span left open.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_coexistence_matrix import APP_SCOPE, OtlpReceiver, Span, decode

from installed import built_by
from otlp_values import clean_env
from spec_decode_otel.telemetry import SCOPE_NAME

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
APP = HERE / "sentry_langfuse_app.py"

OTHERS = ("sentry", "langfuse")
ORDERS = ("theirs-first", "ours-first")
RUNS = (*ORDERS, "theirs-only", "ours-only", "plain")
#: The app's calls, in its order (their seeds follow it).
LABELS = (
    *(
        f"{prefix}{api}{suffix}"
        for prefix in ("", "a")
        for api in ("chat", "text")
        for suffix in ("", "-stream")
    ),
    "raw-chat",
    "raw-chat-stream",
    "with-stream",
    "awith-stream",
)
#: Streamed chat calls left after one chunk in a ``with`` / ``async with`` block.
LEFT_IN_WITH = ("with-stream", "awith-stream")
#: The calls Sentry 2.76.0 wraps: chat, not legacy completions.
SENTRY_WRAPS = tuple(label for label in LABELS if "chat" in label)
#: The calls Langfuse 5.2.0 traces: all but a streamed ``with_raw_response``.
LANGFUSE_TRACES = tuple(label for label in LABELS if label != "raw-chat-stream")
LANGFUSE_SCOPE = "langfuse-sdk"
#: Their values that differ from run to run whoever is loaded: timings, thread ids, ids.
VARYING = frozenset(
    {
        "thread.id",
        "gen_ai.response.time_to_first_token",
        "sentry.segment.id",
        "langfuse.observation.completion_start_time",
    }
)


class Receiver:
    """An HTTP receiver on loopback that keeps every POST's path and (gunzipped) body and
    answers ``{}``: Sentry's envelope endpoint, or Langfuse's OTLP one."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.posts.append((self.path, body))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def envelope_items(body: bytes) -> list[tuple[str, Any]]:
    """A Sentry envelope's items: (type, payload)."""
    _, _, rest = body.partition(b"\n")  # the envelope's header
    items = []
    while rest.strip():
        line, _, rest = rest.partition(b"\n")
        header = json.loads(line)
        if "length" in header:
            payload, rest = rest[: header["length"]], rest[header["length"] + 1 :]
        else:
            payload, _, rest = rest.partition(b"\n")
        items.append((header["type"], json.loads(payload) if payload.strip() else None))
    return items


def shown(attributes: dict[str, Any]) -> str:
    return json.dumps(
        {k: ("<varies>" if k in VARYING else v) for k, v in attributes.items()}, sort_keys=True
    )


def sentry_views(posts: list[tuple[str, bytes]]) -> dict[str, list[tuple[Any, ...]]]:
    """Per call (its transaction's name): the transaction's spans and the ``span`` items of
    its segment, each as (kind, op or name, status, data or attributes)."""
    views: dict[str, list[tuple[Any, ...]]] = {}
    for _, body in posts:
        for kind, payload in envelope_items(body):
            if kind == "transaction":
                label = payload["transaction"].removeprefix("call ")
                for span in payload["spans"]:
                    views.setdefault(label, []).append(
                        ("span", span["op"], span.get("description"), span.get("status"),
                         shown(span.get("data", {})))
                    )  # fmt: skip
            elif kind == "span":
                for item in payload["items"]:
                    attrs = {k: v["value"] for k, v in item["attributes"].items()}
                    label = attrs["sentry.segment.name"].removeprefix("call ")
                    views.setdefault(label, []).append(
                        ("item", item["name"], item["status"], shown(attrs))
                    )
    return {label: sorted(view) for label, view in views.items()}


def langfuse_spans(posts: list[tuple[str, bytes]], roots: dict[str, str]) -> dict[str, list[Span]]:
    """Per call: the spans Langfuse exported, grouped by the user's root of their trace."""
    calls: dict[str, list[Span]] = {}
    for path, body in posts:
        assert path == "/api/public/otel/v1/traces", path
        for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    label = roots[span.trace_id.hex()]
                    span_of = Span.from_otlp(scope_spans.scope.name, span)
                    calls.setdefault(label, []).append(span_of)
    return calls


@dataclass
class Run:
    """What one process reported and exported."""

    report: dict[str, Any]
    calls: dict[str, list[Span]]  # label -> the call's spans in the user's export
    roots: dict[str, str]  # label -> the span id of the call's root
    metrics: dict[tuple[str, str], float]
    theirs: dict[str, list[Any]]  # label -> what they sent of the call (views)
    langfuse: dict[str, list[Span]]  # label -> the spans Langfuse exported

    @property
    def results(self) -> dict[str, Any]:
        results: dict[str, Any] = self.report["results"]
        return results

    def ours(self, label: str) -> list[Span]:
        return [s for s in self.calls.get(label, []) if s.spec_decode]


def run_app(venvs: Path, simulator_url: str, other: str, order: str) -> Run:
    python = venvs / other / "bin" / "python"
    user, theirs = OtlpReceiver(), Receiver()
    env = clean_env(
        "PYTHON",
        "SENTRY_",
        "LANGFUSE_",
        SIMULATOR_URL=simulator_url,
        OTLP_ENDPOINT=user.endpoint,
        THEIR_ENDPOINT=theirs.endpoint,
        COEX_OTHER=other,
        COEX_ORDER=order,
        PYTHONPATH=str(REPO / "src"),
    )
    try:
        done = subprocess.run(
            [str(python), str(APP)], env=env, capture_output=True, text=True, timeout=180
        )
    finally:
        user.close()
        theirs.close()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if order == "plain":
        return Run(report, {}, {}, {}, {}, {})
    roots_by_trace = {}
    roots = {}
    for request in user.sink.traces:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                if scope_spans.scope.name == APP_SCOPE:
                    for span in scope_spans.spans:
                        label = span.name.removeprefix("call ")
                        roots_by_trace[span.trace_id.hex()] = label
                        roots[label] = span.span_id.hex()
    calls, metrics = decode(user.sink)
    if other == "sentry":
        return Run(report, calls, roots, metrics, sentry_views(theirs.posts), {})
    langfuse = langfuse_spans(theirs.posts, roots_by_trace)
    views = {
        label: sorted(
            (s.name, s.kind, s.parent_id == roots[label], shown(s.attributes))
            for s in spans
            if s.scope == LANGFUSE_SCOPE
        )
        for label, spans in langfuse.items()
        if any(s.scope == LANGFUSE_SCOPE for s in spans)
    }
    return Run(report, calls, roots, metrics, views, langfuse)


@pytest.fixture(scope="module")
def runs(simulator_url: str) -> Iterator[dict[tuple[str, str], Future[Run]]]:
    """Every run starts now, two at a time; each test waits for those it reads."""
    venvs = built_by("install-coexistence-venvs.sh", "SPEC_DECODE_OTEL_COEXISTENCE_VENVS")
    with ThreadPoolExecutor(2) as pool:
        futures = {
            (other, order): pool.submit(run_app, venvs, simulator_url, other, order)
            for other in OTHERS
            for order in RUNS
        }
        try:
            yield futures
        finally:
            for future in futures.values():
                future.cancel()


def get(runs: dict[tuple[str, str], Future[Run]], other: str, order: str) -> Run:
    return runs[(other, order)].result()


def assert_clean(run: Run, recorded: int) -> None:
    """No call raised, no span is left open, nothing was logged at WARNING or above;
    ``recorded`` spans carried ``spec_decode.*``."""
    assert sorted(run.results) == sorted(LABELS)
    assert [label for label, r in run.results.items() if "error" in r] == []
    assert run.report["open_spans"] == []
    assert run.report["recorded"] == recorded
    assert run.report["logged"] == []


def test_ours_alone_records_every_call_once_and_changes_no_result(
    runs: dict[tuple[str, str], Future[Run]],
) -> None:
    """The baseline: with spec-decode-otel alone each call has one span of ours under the
    user's span (``recorded``, but for the streams left after one chunk: not read to the
    end), with the same figures in either venv, one ``spec_decode.requests`` point, and
    the user's content, usage and chunks as without any telemetry."""
    for other in OTHERS:
        alone, plain = get(runs, other, "ours-only"), get(runs, other, "plain")
        assert_clean(alone, recorded=len(LABELS))
        assert plain.results == alone.results
        # the first chunk carries the role only
        assert [label for label, r in plain.results.items() if not r["content"]] == list(
            LEFT_IN_WITH
        )
        for label in LABELS:
            (span,) = alone.ours(label)
            assert span.scope == SCOPE_NAME, label
            assert span.parent_id == alone.roots[label], label
            outcome = span.spec_decode["spec_decode.outcome"]
            if label in LEFT_IN_WITH:
                assert span.spec_decode["spec_decode.read_to_end"] is False
            else:
                assert outcome == "recorded", (other, label)
        assert alone.metrics[(SCOPE_NAME, "spec_decode.requests")] == len(LABELS)
    sentry, langfuse = get(runs, "sentry", "ours-only"), get(runs, "langfuse", "ours-only")
    assert {k: s.spec_decode for k in LABELS for s in sentry.ours(k)} == {
        k: s.spec_decode for k in LABELS for s in langfuse.ours(k)
    }


def test_each_other_alone_records_the_calls_it_wraps(
    runs: dict[tuple[str, str], Future[Run]],
) -> None:
    """Each is loaded and records (module docstring): Sentry a ``gen_ai.chat`` span for
    each chat call it saw to its end (not the stream left in a ``with`` block: its
    generator ends its span only after the last chunk), Langfuse a generation for every
    call but the streamed ``with_raw_response`` one, each ended as the call ends."""
    sentry = get(runs, "sentry", "theirs-only")
    assert_clean(sentry, recorded=0)
    gen_ai = sorted(
        label
        for label, view in sentry.theirs.items()
        for kind, name, *_ in view
        if kind == "item" and name == "chat m"
    )
    assert gen_ai == sorted(label for label in SENTRY_WRAPS if label not in LEFT_IN_WITH)
    assert sorted(sentry.theirs) == sorted(LABELS)  # one transaction per call

    langfuse = get(runs, "langfuse", "theirs-only")
    assert_clean(langfuse, recorded=0)
    assert sorted(langfuse.theirs) == sorted(LANGFUSE_TRACES)
    for label in LANGFUSE_TRACES:
        ((name, kind, under_root, _),) = langfuse.theirs[label]
        assert (name, kind, under_root) == ("OpenAI-generation", 1, True), label
    assert langfuse.report["langfuse_open_after_with"] is False
    assert langfuse.report["langfuse_open_after_async_with"] is False
    for run in (sentry, langfuse):
        assert [s for spans in run.calls.values() for s in spans if s.spec_decode] == []
        assert {k for k in run.metrics if k[0] == SCOPE_NAME} == set()


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("other", OTHERS)
def test_each_call_has_one_record_of_ours_alone_and_theirs_unchanged(
    runs: dict[tuple[str, str], Future[Run]], other: str, order: str
) -> None:
    """Both set up in code in ``order``: each call has exactly one span with
    ``spec_decode.*``, our own under the user's span (neither of them makes a current
    OpenTelemetry span for the call), with ours-alone's figures; the user's content, usage
    and chunks as without telemetry; what they send as with them alone; our metrics as
    ours alone."""
    case, plain = get(runs, other, order), get(runs, other, "plain")
    theirs_alone, ours_alone = get(runs, other, "theirs-only"), get(runs, other, "ours-only")
    assert_clean(case, recorded=len(LABELS))
    assert case.results == plain.results
    for label in LABELS:
        (span,) = case.ours(label)
        (alone,) = ours_alone.ours(label)
        assert span.spec_decode == alone.spec_decode, label
        assert span.scope == SCOPE_NAME, label
        assert span.parent_id == case.roots[label], label
        assert case.theirs.get(label) == theirs_alone.theirs.get(label), label
    assert sorted(case.theirs) == sorted(theirs_alone.theirs)
    assert case.metrics == ours_alone.metrics


@pytest.mark.parametrize("order", ORDERS)
def test_langfuse_also_exports_our_span_as_it_exports_every_gen_ai_span(
    runs: dict[tuple[str, str], Future[Run]], order: str
) -> None:
    """Langfuse 5.2.0 sends Langfuse every span of the global tracer provider that carries
    a ``gen_ai.*`` attribute (_client/span_filter.py ``is_default_export_span``), so ours
    reaches Langfuse too, beside its generation, as an observation of its own (and,
    its parent not being exported there, marked ``langfuse.internal.is_app_root``). A
    user who wants only Langfuse's own passes ``should_export_span`` to ``Langfuse()``."""
    case = get(runs, "langfuse", order)
    for label in LABELS:
        ours = [s for s in case.langfuse[label] if s.scope == SCOPE_NAME]
        (exported,) = case.ours(label)
        assert [s.span_id for s in ours] == [exported.span_id], label
        assert ours[0].spec_decode == exported.spec_decode, label
        assert ours[0].attributes.get("langfuse.internal.is_app_root") is True, label
        scopes = sorted({s.scope for s in case.langfuse[label]})
        expected = [LANGFUSE_SCOPE, SCOPE_NAME] if label in LANGFUSE_TRACES else [SCOPE_NAME]
        assert scopes == expected, label
    alone = get(runs, "langfuse", "theirs-only")
    assert {s.scope for spans in alone.langfuse.values() for s in spans} == {LANGFUSE_SCOPE}


@pytest.mark.parametrize("order", ORDERS)
def test_langfuse_ends_its_generation_as_a_with_block_exits_beside_us(
    runs: dict[tuple[str, str], Future[Run]], order: str
) -> None:
    """Langfuse 5.2.0 (langfuse/openai.py ``_instrument_openai_stream``) sets
    ``response.close = traced_close``, which ends its generation, on the stream it is
    given: ours. wrapt's ``ObjectProxy.__setattr__`` keeps a name the proxy's class has
    (our proxy has ``close``) on the proxy, so the SDK's ``Stream.__exit__``, which calls
    ``self.close()`` on the SDK's stream, no longer reached it: the generation of a stream
    left in a ``with`` block stayed open until the stream was reclaimed, where alone it
    ends as the block exits. Our ``__exit__``/``__aexit__`` call a ``close`` set on the
    proxy (spec_decode_otel/instrumentation/streams.py)."""
    for run in (get(runs, "langfuse", "theirs-only"), get(runs, "langfuse", order)):
        assert run.report["langfuse_open_after_with"] is False
        assert run.report["langfuse_open_after_async_with"] is False


def test_with_langfuse_as_the_only_sdk_our_spans_go_to_langfuse_and_the_lost_metrics_are_said(
    simulator_url: str,
) -> None:
    """A user whose only OpenTelemetry set-up is Langfuse's (``langfuse_only_app.py``):
    Langfuse sets the global TracerProvider, nothing sets a MeterProvider. Our spans,
    which carry ``gen_ai.*``, pass Langfuse's default export filter and reach Langfuse,
    with their record; our metrics go to the API's stand-in and are lost, and the
    ``no-sdk`` hint says so once, naming metrics only. Nothing else is logged."""
    venvs = built_by("install-coexistence-venvs.sh", "SPEC_DECODE_OTEL_COEXISTENCE_VENVS")
    theirs = Receiver()
    env = clean_env(
        "PYTHON",
        "LANGFUSE_",
        SIMULATOR_URL=simulator_url,
        THEIR_ENDPOINT=theirs.endpoint,
        PYTHONPATH=os.pathsep.join((str(REPO / "src"), str(HERE))),
    )
    try:
        done = subprocess.run(
            [str(venvs / "langfuse" / "bin" / "python"), str(HERE / "langfuse_only_app.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        theirs.close()
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["content"] is True and report["chunks"] > 2
    (hint,) = report["logged"]
    assert hint.startswith("spec_decode_otel: WARNING: calls are instrumented but no ")
    assert "configured for metrics (spans keep the record)" in hint
    ours = [
        Span.from_otlp(scope_spans.scope.name, span)
        for path, body in theirs.posts
        for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
        if scope_spans.scope.name == SCOPE_NAME
    ]
    assert [s.spec_decode["spec_decode.outcome"] for s in ours] == ["recorded", "recorded"]
    assert all(s.spec_decode["spec_decode.num_accepted_draft_tokens"] > 0 for s in ours)
