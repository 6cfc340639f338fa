"""LiteLLM beside genai-openai and OpenLLMetry, under ``opentelemetry-instrument``, nothing faked.

The others, real and pinned, each in a venv with litellm 1.110.2 (the test extra's pin)
that ``scripts/install-coexistence-venvs.sh`` builds: opentelemetry-instrumentation-genai-openai
1.3b0 (``genai-openai-litellm``) and OpenLLMetry's opentelemetry-instrumentation-openai
0.62.4 (``openllmetry-litellm``). Each run is a fresh process of ``litellm_coexistence_app.py``
under ``opentelemetry-instrument`` (both instrumentors loaded from their entry points, in
the order a copy of their metadata on ``PYTHONPATH`` gives, as in
test_coexistence_matrix.py), exporting OTLP/HTTP to a receiver in this process: LiteLLM chat
and text completions on the ``openai/`` and ``hosted_vllm/`` routes, sync and async,
streamed and not, against the simulator, then one chat call with the openai SDK itself.

What each instrumentation sees of those calls (the installed sources):

- LiteLLM 1.110.2 posts an ``openai/`` chat call with ``OpenAI.post("/chat/completions")``
  (``make_sync_openai_chat_completion_request`` and its async twin,
  litellm/llms/openai/openai.py), and a ``hosted_vllm/`` one with its own HTTP handler;
  every text completion, both routes, goes through
  ``completions.with_raw_response.create`` (litellm/llms/openai/completion/handler.py).
- genai-openai 1.3b0 (``__init__.py``) wraps chat ``Completions.create``/``parse``,
  embeddings and the Responses API: no LiteLLM call here, only the SDK's own chat call.
- OpenLLMetry 0.62.4 (``v1/__init__.py``) wraps chat and legacy ``Completions.create``:
  every LiteLLM text completion (``openai.completion``, ended as ``create`` returns) and
  the SDK's chat call; no LiteLLM chat call. Its completion wrapper records no metrics.

For every call: exactly one span carrying ``spec_decode.*``, with the figures of the same
seeded call with spec-decode-otel alone; their spans and metrics as with them alone; the
user's content and usage as in a run with no telemetry at all; no exception, nothing
logged but our note on LiteLLM-rebuilt streams, no span left open. One exception, pinned
below: OpenLLMetry itself empties a sync streamed text completion, whoever else is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_coexistence_matrix import (
    OtlpReceiver,
    Span,
    decode,
    distribution_files,
    metadata_dir,
    zero_code_env,
)

from installed import built_by
from otlp_values import clean_env
from spec_decode_otel.telemetry import SCOPE_NAME

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
APP = HERE / "litellm_coexistence_app.py"
APP_SCOPE = "coexistence-app"

#: name -> (venv, distribution, the scope of its spans and metrics)
OTHERS = {
    "genai-openai": (
        "genai-openai-litellm",
        "opentelemetry-instrumentation-genai-openai",
        "opentelemetry.instrumentation.genai.openai",
    ),
    "openllmetry": (
        "openllmetry-litellm",
        "opentelemetry-instrumentation-openai",
        "opentelemetry.instrumentation.openai.v1",
    ),
}
ORDERS = ("theirs-first", "ours-first")
RUNS = (*ORDERS, "theirs-only", "ours-only", "plain")
#: The app's calls, in its order: route, API, sync/async, streamed or not; then the SDK's.
LITELLM_CALLS = tuple(
    f"{route}-{prefix}{api}{suffix}"
    for route in ("openai", "hosted")
    for api in ("chat", "text")
    for prefix in ("", "a")
    for suffix in ("", "-stream")
)
SDK_CALL = "sdk-chat"
LABELS = (*LITELLM_CALLS, SDK_CALL)
#: Streams LiteLLM's own handler rebuilds chunk by chunk, without the stats (README).
NO_STATS = ("hosted-chat-stream", "hosted-achat-stream")
#: What our LiteLLM callback logs once: the note on those streams.
STREAM_NOTE = "spec_decode_otel: WARNING: LiteLLM rebuilds the chunks of streams"
#: The sync streamed text completions OpenLLMetry 0.62.4 reads to the end itself (below).
EMPTIED_BY_OPENLLMETRY = ("openai-text-stream", "hosted-text-stream")


@dataclass
class Run:
    """What one process reported and exported."""

    report: dict[str, Any]
    calls: dict[str, list[Span]]  # label -> the call's spans, its root excluded
    metrics: dict[tuple[str, str], float]  # (scope, metric) -> total
    stderr: str

    @property
    def results(self) -> dict[str, Any]:
        """Label -> the content and usage the user got, or the error raised."""
        results: dict[str, Any] = self.report["results"]
        return results

    def ours(self, label: str) -> list[Span]:
        return [s for s in self.calls.get(label, []) if s.spec_decode]

    def theirs(self, label: str, scope: str) -> list[tuple[Any, ...]]:
        return sorted(s.theirs_view() for s in self.calls.get(label, []) if s.scope == scope)

    def their_span_names(self, label: str, scope: str) -> list[str]:
        return [s.name for s in self.calls.get(label, []) if s.scope == scope]

    def metrics_of(self, *, ours: bool) -> dict[tuple[str, str], float]:
        return {k: v for k, v in self.metrics.items() if (k[0] == SCOPE_NAME) == ours}


def run_app(venvs: Path, workdir: Path, simulator_url: str, other: str, order: str) -> Run:
    """One fresh process of the app in ``other``'s venv: under ``opentelemetry-instrument``
    with both instrumentors in ``order`` (or one of them disabled), or ``plain``."""
    venv, distribution, _ = OTHERS[other]
    python = venvs / venv / "bin" / "python"
    env = clean_env(
        "PYTHON",
        "LITELLM_",
        SIMULATOR_URL=simulator_url,
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        COEX_WAY="plain" if order == "plain" else "zero-code",
        PYTHONPATH=str(REPO / "src"),
    )
    argv = [str(python), str(APP)]
    receiver = None
    if order != "plain":
        ours = metadata_dir(
            workdir / f"{other}-{order}-ours",
            distribution_files(sys.executable, "spec-decode-otel"),
        )
        theirs = metadata_dir(
            workdir / f"{other}-{order}-theirs", distribution_files(str(python), distribution)
        )
        first, second = (theirs, ours) if order.startswith("theirs") else (ours, theirs)
        receiver = OtlpReceiver()
        env |= zero_code_env("litellm-coexistence-app", receiver.endpoint, order)
        env["PYTHONPATH"] = os.pathsep.join(map(str, (first, second, REPO / "src")))
        argv = [str(python.parent / "opentelemetry-instrument"), *argv]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    finally:
        if receiver is not None:
            receiver.close()
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if receiver is None:
        return Run(report, {}, {}, done.stderr)
    calls, metrics = decode(receiver.sink)
    return Run(report, calls, metrics, done.stderr)


@pytest.fixture(scope="module")
def runs(simulator_url: str) -> Iterator[dict[tuple[str, str], Future[Run]]]:
    """Every run starts now, two at a time; each test waits for those it reads."""
    venvs = built_by("install-coexistence-venvs.sh", "SPEC_DECODE_OTEL_COEXISTENCE_VENVS")
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(2) as pool:
        futures = {
            (other, order): pool.submit(run_app, venvs, Path(workdir), simulator_url, other, order)
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


def their_spans_alone(other: str, label: str) -> list[str]:
    """The spans ``other`` makes for a call (see the module docstring)."""
    if label == SDK_CALL:
        return ["chat m" if other == "genai-openai" else "openai.chat"]
    if other == "openllmetry" and "text" in label:
        return ["openai.completion"]
    return []


def assert_clean(run: Run, recorded: int) -> None:
    """No call raised, no span is left open, nothing but our stream note was logged, no
    exception reached stderr (an ``__del__``'s included); ``recorded`` spans carried
    ``spec_decode.*``."""
    assert sorted(run.results) == sorted(LABELS)
    assert [label for label, r in run.results.items() if "error" in r] == []
    assert run.report["open_spans"] == []
    assert run.report["recorded"] == recorded
    assert [line for line in run.report["logged"] if not line.startswith(STREAM_NOTE)] == []
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


def test_ours_alone_under_zero_code_records_every_litellm_call_once(
    runs: dict[tuple[str, str], Future[Run]],
) -> None:
    """The baseline the coexistence runs compare with is real: with spec-decode-otel alone
    (the other disabled by ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``) each call has one
    span of ours, ``recorded`` but for the streams LiteLLM's own handler rebuilds, one
    ``spec_decode.requests`` point, and the user's content and usage as without telemetry."""
    for other in OTHERS:
        alone, plain = get(runs, other, "ours-only"), get(runs, other, "plain")
        assert_clean(alone, recorded=len(LABELS))
        assert plain.results == alone.results
        assert [label for label, r in plain.results.items() if not r["content"]] == []
        for label in LABELS:
            (span,) = alone.ours(label)
            assert span.scope == SCOPE_NAME, label
            outcome = "no_stats" if label in NO_STATS else "recorded"
            assert span.spec_decode["spec_decode.outcome"] == outcome, (other, label)
        assert alone.metrics_of(ours=True)[(SCOPE_NAME, "spec_decode.requests")] == len(LABELS)
        assert alone.metrics_of(ours=False) == {}


@pytest.mark.parametrize("other", list(OTHERS))
def test_each_other_alone_sees_only_the_litellm_calls_sent_through_create(
    runs: dict[tuple[str, str], Future[Run]], other: str
) -> None:
    """What each instrumentation alone makes of the app's calls (module docstring: neither
    sees a LiteLLM chat call, which LiteLLM posts with ``OpenAI.post`` or its own handler;
    OpenLLMetry sees every text completion), and that it is loaded and records: its span
    for the SDK's chat call, its GenAI client metrics for it alone."""
    alone = get(runs, other, "theirs-only")
    _, _, scope = OTHERS[other]
    assert_clean(alone, recorded=0)
    for label in LABELS:
        assert alone.their_span_names(label, scope) == their_spans_alone(other, label), label
        assert alone.ours(label) == []
    assert alone.metrics_of(ours=True) == {}
    their_metrics = alone.metrics_of(ours=False)
    assert their_metrics[(scope, "gen_ai.client.operation.duration")] == 1  # the SDK call's
    assert their_metrics[(scope, "gen_ai.client.token.usage")] == 2


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("other", list(OTHERS))
def test_each_litellm_call_has_one_record_and_theirs_unchanged_under_zero_code(
    runs: dict[tuple[str, str], Future[Run]], other: str, order: str
) -> None:
    """Both loaded by ``opentelemetry-instrument`` in ``order``: each call has exactly one
    span with ``spec_decode.*``, with ours-alone's figures; theirs where they make one (an
    OpenLLMetry completion span or the SDK call's span, which ``auto`` mode enriches while
    it is open; a text stream, read after OpenLLMetry ended its span, has ours as its
    child), else ours under the app's root. Their spans and metrics are as with them
    alone, our metrics count each call once, and the user gets what they get without us.

    Beside OpenLLMetry, the sync text streams it reads itself, inside its span
    (:func:`test_openllmetry_reads_a_sync_litellm_text_stream_before_the_user`), enrich
    its span like a call that is not streamed."""
    case = get(runs, other, order)
    theirs_alone, ours_alone = get(runs, other, "theirs-only"), get(runs, other, "ours-only")
    _, _, scope = OTHERS[other]
    # entry-point order, which opentelemetry-instrument loads them in
    loaded = [name for name in case.report["entry_points"] if name in ("openai", "spec_decode")]
    assert loaded == (
        ["openai", "spec_decode"] if order == "theirs-first" else ["spec_decode", "openai"]
    )

    assert_clean(case, recorded=len(LABELS))
    assert case.results == theirs_alone.results  # what the user gets is theirs alone's
    for label in LABELS:
        ours = case.ours(label)
        assert len(ours) == 1, (label, [(s.scope, s.name) for s in case.calls[label]])
        span = ours[0]
        (alone,) = ours_alone.ours(label)
        assert span.spec_decode == alone.spec_decode, label
        their_spans = [s for s in case.calls[label] if s.scope == scope]
        read_in_theirs = other == "openllmetry" and label in EMPTIED_BY_OPENLLMETRY
        if their_spans and (read_in_theirs or not label.endswith("-stream")):
            assert span in their_spans, label  # theirs, enriched
        elif their_spans:  # theirs ended as ``create`` returned: ours, its child
            assert span.scope == SCOPE_NAME, label
            assert span.parent_id == their_spans[0].span_id, label
        else:  # ours, under the app's root (``decode`` leaves the roots out)
            assert span.scope == SCOPE_NAME, label
            assert case.calls[label] == [span], label
            assert span.parent_id, label
        assert case.theirs(label, scope) == theirs_alone.theirs(label, scope), label
    assert case.metrics_of(ours=False) == theirs_alone.metrics_of(ours=False)
    ours_metrics, alone_metrics = case.metrics_of(ours=True), ours_alone.metrics_of(ours=True)
    assert ours_metrics[(SCOPE_NAME, "spec_decode.requests")] == len(LABELS)
    assert ours_metrics == alone_metrics


@pytest.mark.parametrize("order", ("theirs-only", *ORDERS))
def test_openllmetry_reads_a_sync_litellm_text_stream_before_the_user(
    runs: dict[tuple[str, str], Future[Run]], order: str
) -> None:
    """A defect of OpenLLMetry's, pinned: it empties a sync streamed text completion sent
    through ``completions.with_raw_response.create`` (as LiteLLM sends every text
    completion, and as the openai SDK user may), spec-decode-otel loaded or not.

    opentelemetry-instrumentation-openai 0.62.4, shared/completion_wrappers.py
    ``completion_wrapper``: ``create`` returned a ``LegacyAPIResponse``, not a ``Stream``,
    so it takes the non-streaming path, ``_handle_response``; shared/__init__.py
    ``model_as_dict`` calls the response's ``parse()``, which gives the ``Stream`` (and
    caches it: openai 3.63.0, _legacy_response.py), and ``_set_response_attributes`` asks
    ``"error" in response`` of it, which iterates the stream to its end. LiteLLM's
    ``parse()`` then gets the same, spent stream: the user reads no content and no usage.
    An ``AsyncStream`` has no ``__iter__``, so ``in`` raises (``dont_throw`` swallows it)
    and async streams are untouched.

    Beside us the call is still recorded, from the chunks OpenLLMetry's ``in`` read: it
    was recorded ``no_stats``, because wrapt's ``ObjectProxy.__contains__`` handed ``in``
    to the wrapped ``Stream``, past our stream proxy's observer (fixed in
    spec_decode_otel/instrumentation/streams.py, ``SyncStreamProxy.__contains__``)."""
    run, plain = get(runs, "openllmetry", order), get(runs, "openllmetry", "plain")
    for label in LITELLM_CALLS:
        if label in EMPTIED_BY_OPENLLMETRY:
            assert run.results[label] == {"content": "", "usage": None}, label
            assert plain.results[label]["content"], label
        else:
            assert run.results[label] == plain.results[label], label
    assert run.results[SDK_CALL] == plain.results[SDK_CALL]
    if order != "theirs-only":
        for label in EMPTIED_BY_OPENLLMETRY:
            (span,) = run.ours(label)
            assert span.spec_decode["spec_decode.outcome"] == "recorded", label
    # genai-openai wraps no text completion: every LiteLLM result as without telemetry
    assert get(runs, "genai-openai", order).results == get(runs, "genai-openai", "plain").results
