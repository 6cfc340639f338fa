"""LiteLLM: records for the calls LiteLLM sends with its own HTTP handler.

LiteLLM's ``hosted_vllm/`` chat route posts with its own HTTP client, so the openai wrapper
never sees it. ``SpecDecodeLiteLLMCallback`` is a LiteLLM callback (LiteLLM's supported
extension point, ``litellm.integrations.custom_logger.CustomLogger``) that turns what
LiteLLM keeps of each response into the same record, span and metric points the openai
wrapper makes for the same server response. ``SpecDecodeInstrumentor().instrument()``
registers one when the application imports ``litellm``; without the instrumentor, one line
does it::

    litellm.callbacks.append(SpecDecodeLiteLLMCallback())  # same keywords as instrument()

What LiteLLM keeps (checked with LiteLLM 1.110): a non-streaming response keeps the
engines' root fields (vLLM's ``metrics``, SGLang's ``sglext``, llama.cpp's ``timings``) as
extra fields, and a chat choice's own fields (pre-merge vLLM, TensorRT-LLM) move into
``provider_specific_fields`` (a text completion choice keeps them as extra fields). A
stream is rebuilt chunk by chunk from a fixed set of fields, so none of those survive it:
streams that only LiteLLM's own handler carried get outcome ``no_stats``. A Responses API
call (``litellm.responses``) is reported with its completed response, streamed or not;
an Anthropic Messages call (``litellm.anthropic.messages``, the proxy's ``/v1/messages``)
with the chat completion (or Responses call) LiteLLM answered it from.

One record per call: calls LiteLLM sends through the openai SDK (``openai/``,
``custom_openai/``, ``llamafile/``, ``lm_studio/``, and every text completion) are
recorded by the openai wrapper, from the wire and streams included, when
``SpecDecodeInstrumentor`` is on; this callback then skips them (see
:mod:`spec_decode_otel.integrations` for the mark, and for streams the response id, that
tell). Several callbacks, or LiteLLM's sync and async success events for one call, still
give one record. Each attempt of LiteLLM's Router (a retry, a fallback) is a call of its
own, with its own span on the deployment it reached, even under one ``litellm_call_id``.

The span is made when LiteLLM logs a non-streamed call's answer, or reports a streamed
or failed call's end, with the call's own start and end times, as a child of the span
that was current when the call started. A stream the caller drops (or closes) before
its end, which LiteLLM never reports (chat, Responses, a text completion's, read in part,
unread, or closed after its last content chunk), ends when it is reclaimed, or, for
an async Responses stream, closed (as the proxy closes it when its client hangs up):
``not_read_to_end`` when LiteLLM's own handler read it, as the openai wrapper ends an SDK
stream dropped early; one the SDK read keeps only the wrapper's span. The classes
patched for this are put back once no callback is registered. LiteLLM's own
OpenTelemetry callback makes and ends its ``litellm_request`` span inside its logging
handler, which no callback can add attributes to: with it on, each call has LiteLLM's
span and ours (only ours carries ``spec_decode.*``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import wrapt
from litellm.integrations.custom_logger import CustomLogger
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from spec_decode_otel._attributes import current_attributes
from spec_decode_otel._fork import fork_safe_lock
from spec_decode_otel._logging import report_internal_error, warn_once
from spec_decode_otel.instrumentation import _build, finalizer
from spec_decode_otel.instrumentation.call import Call, finish_reasons
from spec_decode_otel.instrumentation.patches import ABSENT, Patches
from spec_decode_otel.instrumentation.streams import _StreamProxyBase
from spec_decode_otel.instrumentation.wrapper import (
    Instrumentation,
    _requested_sequences,
)
from spec_decode_otel.integrations import (
    SdkMark,
    current_mark,
    last_sdk_request,
    open_litellm_calls,
    set_open_litellm_calls,
    took_openai_stream,
    took_openai_stream_error,
)
from spec_decode_otel.integrations import _litellm_kwargs as wire

#: LiteLLM call types → GenAI operation names. Other calls (embeddings, ...) are not ours.
OPERATIONS: Mapping[str, str] = {
    "completion": "chat",
    "acompletion": "chat",
    "text_completion": "text_completion",
    "atext_completion": "text_completion",
    # The Responses API: operation ``chat``, as the openai wrapper names it.
    "responses": "chat",
    "aresponses": "chat",
    # Anthropic's Messages API (``litellm.anthropic.messages``, the proxy's /v1/messages),
    # which LiteLLM answers from a chat completion (or a Responses call) to the server.
    "anthropic_messages": "chat",
}
#: Calls started but not yet reported ended, and calls already recorded, kept at most.
MAX_CALLS = 4096


def _ours(kwargs: Mapping[str, Any]) -> bool:
    """A call of a type we record (:data:`OPERATIONS`)."""
    return kwargs.get("call_type") in OPERATIONS


@dataclass
class _Started:
    """What is known when a LiteLLM call starts (before its route is known)."""

    mark: SdkMark
    #: The caller's context: the span's parent, and the coexistence check.
    context: Context
    #: ``spec_decode_otel.attributes`` in force where the call was made.
    user: Mapping[str, Any]
    #: The JSON body LiteLLM built, for adapters that read the request, without its
    #: content (:func:`._litellm_kwargs.request_kept`): a call LiteLLM never reports
    #: ended must not keep it.
    request: Mapping[str, Any] | None
    #: Sequences the request asked for (``n``, times the prompts of a completion).
    sequences: int
    #: The callback that saw it start: it records the call if its stream is dropped.
    callback: SpecDecodeLiteLLMCallback
    #: What its end needs of LiteLLM's call details (:func:`_kept`: none of the content),
    #: for an attempt LiteLLM retries without reporting it ended (:meth:`_Calls.start`).
    kept: Mapping[str, Any]
    #: The process that started it: a forked child's copy is the parent's to end.
    pid: int = dataclasses.field(default_factory=os.getpid)
    #: The generator that sends the request when first read, which LiteLLM logged as
    #: the response (:meth:`SpecDecodeLiteLLMCallback._responded`), weakly: the call
    #: is forgotten when it is reclaimed.
    sender: weakref.ref[Any] | None = None
    #: The identity of LiteLLM's call details it started on, when LiteLLM had already
    #: logged a failure on them (:func:`._litellm_kwargs.failure_logged`): its own
    #: failure goes unreported (:meth:`_Calls.silent_before`).
    silent_on: int | None = None


class _Calls:
    """Attempts started and not yet ended, and attempts already ended.

    Shared by every callback instance, so one attempt gives one record however many
    callbacks (or LiteLLM's sync and async success events) report it. Both are bounded:
    an attempt LiteLLM never reports ended is forgotten eventually. A stream the caller
    drops before its end is one: it is ended when the collector reclaims it
    (:func:`_watch_dropped_streams`).
    """

    def __init__(self) -> None:
        self._started: OrderedDict[wire.Key, _Started] = OrderedDict()
        self._ended: OrderedDict[wire.Key, None] = OrderedDict()
        #: The started attempts' keys, by their marks.
        self._keys: dict[SdkMark, wire.Key] = {}
        self._lock = fork_safe_lock()

    def start(self, call_id: wire.Key, make: Any) -> _Started:
        """The attempt's start, made now unless it already started.

        A start of an attempt already ended is a new one under the same key (a LiteLLM
        without attempt stamps): LiteLLM reports a failed attempt's end before the
        Router starts the next one.
        """
        with self._lock:
            self._ended.pop(call_id, None)
            started = self._started.get(call_id)
            if started is None:
                started = self._started[call_id] = make()
                self._keys[started.mark] = call_id
                if len(self._started) > MAX_CALLS:
                    self._keys.pop(self._started.popitem(last=False)[1].mark, None)
                set_open_litellm_calls(len(self._started))
            return started

    def retried(self, call_id: wire.Key, before: SdkMark) -> _Started | None:
        """Ends and returns the attempt whose mark ``before`` is, when it is an earlier
        attempt of ``call_id``'s call still open: its call started another attempt in
        the same context (the same thread or task), which LiteLLM does only once an
        attempt failed. Attempts of one call id made side by side (in other tasks) do not
        see each other's marks."""
        with self._lock:
            key = self._keys.get(before)
        if key is None or key[0] != call_id[0] or key == call_id:
            return None
        return self.end(key)

    def silent_before(self, call_id: wire.Key, details: int) -> list[_Started]:
        """Ends and returns the earlier attempts of ``call_id``'s call still open that
        started on the same call details (``details``, their identity) after LiteLLM had
        logged a failure on them: another attempt on those details starting means the
        Router gave up on them, and LiteLLM reports no more failures there. Attempts
        with details of their own (side by side, or without a Router) are not touched."""
        with self._lock:
            keys = [
                key
                for key, started in self._started.items()
                if key[0] == call_id[0] and key != call_id and started.silent_on == details
            ]
        return [started for key in keys if (started := self.end(key)) is not None]

    def get(self, call_id: wire.Key) -> _Started | None:
        with self._lock:
            return self._started.get(call_id)

    def end(self, call_id: wire.Key) -> _Started | None:
        """The attempt's start, the first time it is ended; None after (or if never seen)."""
        with self._lock:
            if call_id in self._ended:
                return None
            self._ended[call_id] = None
            if len(self._ended) > MAX_CALLS:
                self._ended.popitem(last=False)
            started = self._started.pop(call_id, None)
            if started is not None:
                self._keys.pop(started.mark, None)
            set_open_litellm_calls(len(self._started))
            return started

    def forget_all(self) -> None:
        """No callback of ours is left to end the attempts still open: forget them."""
        with self._lock:
            self._started.clear()
            self._ended.clear()
            self._keys.clear()
            set_open_litellm_calls(0)


_calls = _Calls()


class SpecDecodeLiteLLMCallback(CustomLogger):
    """A LiteLLM callback recording ``spec_decode.*`` for chat and text completions,
    Responses API calls and Anthropic Messages calls.

    Keywords: those of ``SpecDecodeInstrumentor().instrument()`` (``tracer_provider``,
    ``meter_provider``, ``mode``, ``metric_attributes``, ``record_per_step``,
    ``genai_metrics``, ...). The request-changing settings (``inject_include_usage``,
    ``inject_traceparent``, ``request_engine_stats``) do not apply to calls LiteLLM sends
    itself: a callback cannot change the request. Never raises into LiteLLM.
    """

    def __init__(self, **kwargs: Any) -> None:
        instrumentation, _ = _build(dict(kwargs))
        self._setup(instrumentation)

    @classmethod
    def for_instrumentation(cls, instrumentation: Instrumentation) -> SpecDecodeLiteLLMCallback:
        """The callback ``SpecDecodeInstrumentor`` registers: its providers and settings."""
        callback = cls.__new__(cls)
        callback._setup(instrumentation)
        return callback

    def _setup(self, instrumentation: Instrumentation) -> None:
        super().__init__()
        self._instrumentation = instrumentation
        self._enabled = True
        _watch_dropped_streams(self)

    def register(self) -> None:
        """Add this callback to ``litellm.callbacks`` (once)."""
        import litellm

        litellm.logging_callback_manager.add_litellm_callback(self)

    def unregister(self) -> None:
        """Stop recording, and take this callback out of every LiteLLM callback list."""
        import litellm

        self._enabled = False
        litellm.logging_callback_manager.remove_callback_from_all_lists(self, require_self=False)
        _unwatch_dropped_streams(self)

    # -- LiteLLM's hooks (each one swallows its own failures) ---------------------------

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
        try:
            self._started(kwargs)
        except Exception:
            report_internal_error("litellm.pre_api_call")

    def log_post_api_call(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        try:
            self._responded(kwargs)
        except Exception:
            report_internal_error("litellm.post_api_call")

    def log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._ended(kwargs, response_obj, start_time, end_time)

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._ended(kwargs, response_obj, start_time, end_time)

    def log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._ended(kwargs, None, start_time, end_time, failed=True)

    async def async_log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._ended(kwargs, None, start_time, end_time, failed=True)

    # -- call start ---------------------------------------------------------------------

    def _started(self, kwargs: Mapping[str, Any]) -> None:
        """Before the request: note the caller's context, and put the call's mark in it.

        For a sync call LiteLLM runs this in the caller's thread, where any openai SDK
        request of the call is made too (even a stream's, made when it is first read).
        """
        call_id = wire.attempt(kwargs)
        if not self._enabled or call_id is None or not is_instrumentation_enabled():
            return  # a call inside suppress_instrumentation() is never started, so never ends
        if not _ours(kwargs) or wire.mocked(kwargs):
            return

        silent_on = id(kwargs) if wire.failure_logged(kwargs) else None

        def make() -> _Started:
            body = wire.request_body(kwargs)
            return _Started(
                SdkMark(),
                otel_context.get_current(),
                current_attributes(),
                None if body is None else wire.request_kept(body),
                _requested_sequences(body or {}),
                self,
                _kept(kwargs),
                silent_on=silent_on,
            )

        # Made here, never where a stream is reclaimed (see the finalizer module).
        finalizer.start()
        before = current_mark.get()
        mark = _calls.start(call_id, make).mark
        if wire.sent_by_responses_handler(kwargs):
            # Decided now: LiteLLM logs no answer before a Responses stream it reads from
            # the server ends, and SDK requests made meanwhile in this context (the
            # reader's) are other calls'.
            mark.decided = True
        current_mark.set(mark)
        if before is not None and before is not mark:
            retried = _calls.retried(call_id, before)
            if retried is not None:
                self._retried(retried, wire.attempt_start(kwargs))
        if silent_on is not None:
            for retried in _calls.silent_before(call_id, silent_on):
                self._retried(retried, wire.attempt_start(kwargs))

    def _responded(self, kwargs: Mapping[str, Any]) -> None:
        """LiteLLM logged the provider's response: any openai SDK request of this call has
        started by now, unless the request is deferred (a coroutine or a generator that
        sends it later), so a later SDK request in this context is another call's.

        A non-streamed attempt is recorded here, from the body LiteLLM logged, and ends
        now; its success event, if it comes, then finds it recorded. LiteLLM 1.110.2 sends
        an async call's success event only through its logging worker's queue, on the
        caller's loop (``_client_async_logging_helper``, utils.py): a loop that ends with
        the call (``asyncio.run``; each attempt of a sync ``completion(...,
        fallbacks=[...])``, run on a loop made for it by ``run_async_function``,
        asyncify.py) leaves it queued until LiteLLM next runs a loop, or exit. And a retry
        of ``acompletion(..., num_retries=N)`` (``acompletion_with_retries``, main.py)
        runs the undecorated function, which sends no success event at all.

        LiteLLM logs the response in the context the SDK request ran in, so an SDK
        request noted here after the call started is this call's. The proxy needs this:
        it starts a text completion in a worker thread (where the call's mark is set),
        sends it from the request's task, and reports its end from a context that saw
        neither."""
        call_id = wire.attempt(kwargs)
        started = None if call_id is None else _calls.get(call_id)
        if started is None:
            return
        original = kwargs.get("original_response")
        if inspect.isgenerator(original) or inspect.isasyncgen(original):
            # A stream sent when first read: what the caller holds iterates this
            # generator (a text completion's), and drops it with it.
            started.sender = weakref.ref(
                original, functools.partial(_sender_reclaimed, _kept(kwargs))
            )
        elif not inspect.isawaitable(original):
            if last_sdk_request.get() > started.mark.started:
                started.mark.via_sdk = True
            started.mark.decided = True
            body = None if kwargs.get("stream") is True else wire.logged_body(original)
            if body is not None:  # decoded once: the record is made from it
                stamp = wire.attempt_start(kwargs)
                self._ended(kwargs, None, stamp, wire.now_beside(stamp), body=body)

    # -- call end -----------------------------------------------------------------------

    def _ended(
        self,
        kwargs: Any,
        response: Any,
        start_time: Any,
        end_time: Any,
        *,
        failed: bool = False,
        body: Any = None,
    ) -> None:
        """``body``: the logged body, already decoded (None: decode it when needed)."""
        try:
            if not self._enabled or not isinstance(kwargs, Mapping):
                return
            call_id = wire.attempt(kwargs)
            if call_id is None or not _ours(kwargs) or kwargs.get("cache_hit") is True:
                return
            started = _calls.end(call_id)
            if started is None:
                return  # already recorded, or never started here
            # The openai wrapper noted reading this stream: LiteLLM's response carries the
            # id of the server's chunks. Or it recorded this failure: LiteLLM's exception
            # is (or was caused by) the error an SDK stream raised through the wrapper,
            # which LiteLLM reports without the response id. Both are read, so a note is
            # taken even when the mark already tells.
            if failed:
                noted = took_openai_stream_error(kwargs.get("exception"), wire.server_name(kwargs))
            else:
                noted = kwargs.get("stream") is True and took_openai_stream(
                    getattr(response, "id", None), wire.server_name(kwargs), started.mark.started
                )
            if started.mark.went_through_sdk() or noted:
                return  # the openai wrapper's
            started.mark.decided = True
            if not failed and wire.client_left(kwargs):  # a stream left, not one finished
                self._record(kwargs, started, None, start_time, end_time, read_to_end=False)
                return
            self._record(kwargs, started, response, start_time, end_time, failed=failed, body=body)
        except Exception:
            report_internal_error("litellm.end")

    def _retried(self, started: _Started, end_time: Any) -> None:
        """An attempt LiteLLM retried without reporting that it failed: a failed one, ended
        when the next began. LiteLLM 1.110.2 reports no end for the attempt a sync call's
        ``num_retries`` retries (the ``client`` wrapper's ``except`` returns
        ``completion_with_retries`` before its failure logging, utils.py), nor for the
        failed attempts of a proxy request after its first failure (they share the
        request's ``Logging`` object, which logs one failure: ``should_run_logging``,
        litellm/litellm_core_utils/litellm_logging.py). The openai wrapper ends one that
        went through the SDK itself."""
        try:
            kept = started.kept
            if not self._enabled or not _ours(kept) or started.mark.went_through_sdk():
                return
            self._record(kept, started, None, wire.attempt_start(kept), end_time, failed=True)
        except Exception:
            report_internal_error("litellm.retried")

    def _dropped(self, kwargs: Mapping[str, Any], started: _Started, end_time: Any) -> None:
        """A stream the caller dropped before its end, which LiteLLM never reports: ended
        ``not_read_to_end`` when LiteLLM's own handler read it (the mark says so). The
        openai wrapper's stream proxy ends one it read; a call whose route stayed unknown
        is only forgotten."""
        mark = started.mark
        if not self._enabled or not _ours(kwargs) or mark.via_sdk or not mark.decided:
            return
        start_time = wire.attempt_start(kwargs)
        self._record(kwargs, started, None, start_time, end_time, read_to_end=False)

    def _record(
        self,
        kwargs: Mapping[str, Any],
        started: _Started,
        response: Any,
        start_time: Any,
        end_time: Any,
        *,
        failed: bool = False,
        read_to_end: bool = True,
        body: Any = None,
    ) -> None:
        streaming = kwargs.get("stream") is True
        responses_api = wire.responses_call(kwargs)
        include_usage = responses_api or wire.include_usage(kwargs)
        # The openai wrapper's plan (same attributes, same coexistence rules), decided now
        # with what was current when the call started.
        plan = self._instrumentation.plan(
            OPERATIONS[kwargs["call_type"]],
            model=kwargs.get("model"),
            server=wire.server(kwargs),
            user=started.user,
            parent=started.context,
            requested_sequences=started.sequences,
            request=started.request,
            streaming=streaming,
            include_usage=include_usage,
            responses_api=responses_api,
            start_time=wire.nanoseconds(start_time),
        )
        if plan.own_span:
            ends_at: Any = _EndsAt(plan.span, wire.nanoseconds(end_time))
            plan = dataclasses.replace(plan, span=ends_at)
        call = Call(plan)
        # The call began when LiteLLM's did, not now: durations count from there.
        elapsed = wire.seconds(start_time, end_time)
        if elapsed is not None:
            call.started = time.perf_counter() - elapsed
        if failed:
            error = kwargs.get("exception")
            call.finish_error(error if isinstance(error, BaseException) else _Unreported())
            return
        if read_to_end and not streaming:
            if body is None:
                body = wire.kept_body(kwargs, response)
            if isinstance(body, Mapping):
                call.finish_dict(body)
            else:
                call.finish_object(body)
            return
        first = wire.seconds(start_time, kwargs.get("completion_start_time"))
        chunks: list[Any] = []  # a stream dropped before its end: nothing of it is kept
        model: Any = None
        reasons: list[Any] = []
        multi_sequence = False
        if read_to_end and responses_api:  # ended with its completed response
            body = wire.kept_body(kwargs, response)
            chunks = [body]
            model = body.get("model") if isinstance(body, Mapping) else getattr(body, "model", None)
            reasons = finish_reasons(body)
        elif read_to_end:
            warn_once(
                "litellm-stream",
                "LiteLLM rebuilds the chunks of streams it reads itself and drops their "
                "spec-decode stats: these calls get no record. Stream through the openai/ "
                "provider (with api_base) under SpecDecodeInstrumentor, or do not stream.",
            )
            view = wire.SdkShaped.of(response, keep_usage=include_usage)
            chunks = [view]
            model = view.model if isinstance(view.model, str) else None
            reasons = [c.finish_reason for c in view.choices if isinstance(c.finish_reason, str)]
            multi_sequence = len(view.choices) > 1 or any(c.index for c in view.choices)
        call.finish_stream(
            chunks,
            response_model=model,
            finish_reasons=reasons,
            multi_sequence=multi_sequence,
            first_chunk_at=None if first is None else call.started + first,
            read_to_end=read_to_end,
        )


class _Unreported(Exception):
    """A failure LiteLLM did not describe (a retried attempt; a failure event without its
    exception): ``error.type`` gets OpenTelemetry's fallback value for an unknown error."""

    __qualname__ = "_OTHER"


class _EndsAt(wrapt.ObjectProxy):  # type: ignore[type-arg]  # generic from wrapt 2
    """Our span, ended at the time LiteLLM says the call ended (not when it told us)."""

    def __init__(self, span: Any, end_time: int | None) -> None:
        super().__init__(span)
        self._self_end_time = end_time

    def end(self, end_time: int | None = None) -> None:
        self.__wrapped__.end(end_time=end_time or self._self_end_time)


#: What a dropped stream's end needs of LiteLLM's call details (none of its content).
_DROPPED_FIELDS = (
    "litellm_call_id",
    "current_attempt_api_call_start_time",
    "api_call_start_time",
    "start_time",
    "completion_start_time",
    "call_type",
    "model",
    "stream",
    "stream_options",
    "cache_hit",
)
_watch_lock = threading.Lock()
#: Callbacks set up and not unregistered: LiteLLM's stream classes stay patched while
#: one of them lives.
_watchers: weakref.WeakSet[SpecDecodeLiteLLMCallback] = weakref.WeakSet()
#: What :func:`_watch_dropped_streams` set.
_patches = Patches("litellm.unwatch_streams")
#: ``CustomStreamWrapper``'s own ``__next__`` and ``__anext__``: only a stream iterated by
#: them has the state :func:`_stream_reclaimed` reads.
_own_iteration: tuple[Any, Any] | None = None
#: The ``__next__``/``__anext__`` of the Responses iterators that read the server's
#: answer themselves (:func:`_responses_stream_reclaimed`).
_responses_iteration: frozenset[Any] = frozenset()


def _watch_dropped_streams(callback: SpecDecodeLiteLLMCallback) -> None:
    """Learn when the caller drops a LiteLLM stream before its end (patched once, while
    any callback of ours is set up and not unregistered).

    LiteLLM 1.110.2 reports a stream's end only when it is read to the end or fails
    (``CustomStreamWrapper``, litellm_core_utils/streaming_handler.py; the Responses
    API's iterators, litellm/responses/streaming_iterator.py): ``close()``, ``aclose()``
    and dropping it send no event, so its call stayed open here, and with it the notes
    of every openai SDK stream (:mod:`spec_decode_otel.integrations`). No hook hands a
    callback an async call's stream (a sync call's is only logged as its response), so
    the streams' own finalizers are wrapped (the Responses iterators get one): when the
    collector reclaims a stream LiteLLM has not reported ended, its call is ended on the
    finalizer thread (:mod:`spec_decode_otel.instrumentation.finalizer`), as the openai
    wrapper's stream proxies end theirs. A stream the caller keeps after ``close()``
    ends when reclaimed, except an async Responses stream, which ends when closed
    (:func:`_responses_stream_closed`).
    """
    global _own_iteration, _responses_iteration
    with _watch_lock:
        _watchers.add(callback)
        if _patches:
            return
        try:
            from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper

            _own_iteration = (CustomStreamWrapper.__next__, CustomStreamWrapper.__anext__)
            finalize = vars(CustomStreamWrapper).get("_finalize_completed_stream", ABSENT)
            _patches.set(
                CustomStreamWrapper,
                "_finalize_completed_stream",
                wrapt.FunctionWrapper(finalize, _finalizing),
            )
            _patch_del(CustomStreamWrapper, _stream_reclaimed)
        except Exception:
            report_internal_error("litellm.watch_streams")
        try:
            from litellm.litellm_core_utils.litellm_logging import Logging

            _patch_del(Logging, _call_reclaimed)
        except Exception:
            report_internal_error("litellm.watch_calls")
        try:
            from litellm.responses import streaming_iterator as responses

            _responses_iteration = frozenset(
                {
                    responses.SyncResponsesAPIStreamingIterator.__next__,
                    responses.ResponsesAPIStreamingIterator.__anext__,
                    responses.MockResponsesAPIStreamingIterator.__next__,
                    responses.MockResponsesAPIStreamingIterator.__anext__,
                }
            )
            _patch_del(responses.BaseResponsesAPIStreamingIterator, _responses_stream_reclaimed)
            own_aclose = vars(responses.ResponsesAPIStreamingIterator).get("aclose", ABSENT)
            if own_aclose is not ABSENT:
                _patches.set(
                    responses.ResponsesAPIStreamingIterator,
                    "aclose",
                    wrapt.FunctionWrapper(own_aclose, _responses_stream_closed),
                )
        except Exception:
            report_internal_error("litellm.watch_responses_streams")


def _patch_del(cls: type, reclaimed: Callable[[Any], None]) -> None:
    """Set as ``cls.__del__``: LiteLLM's own (if any), then ``reclaimed(instance)`` (under
    ``_watch_lock``)."""
    own = vars(cls).get("__del__", ABSENT)
    if own is not ABSENT:
        _patches.set(
            cls, "__del__", wrapt.FunctionWrapper(own, functools.partial(_reclaimed, reclaimed))
        )
        return

    def __del__(self: Any) -> None:
        reclaimed(self)

    _patches.set(cls, "__del__", __del__)


def _reclaimed(reclaimed: Any, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    try:
        wrapped(*args, **kwargs)
    finally:
        reclaimed(instance)


def _unwatch_dropped_streams(callback: SpecDecodeLiteLLMCallback) -> None:
    """``callback`` is unregistered: when it was the last one set up, put LiteLLM's own
    methods back (unless someone has since replaced ours: theirs stays, and ours inside
    it passes every call through), and forget the calls still open, which nothing of
    ours would end any more."""
    with _watch_lock:
        _watchers.discard(callback)
        if _watchers:
            return
        _patches.restore()
    _calls.forget_all()


#: Set on an async stream once LiteLLM has dispatched its success event.
_REPORTED = "_spec_decode_otel_reported"


async def _finalizing(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``CustomStreamWrapper._finalize_completed_stream``, where LiteLLM 1.110.2 ends an
    async stream whose provider stream ended: it returns the finish or usage chunk, or
    dispatches the success event (a task, which may run after the stream is reclaimed),
    closes the stream and raises ``StopAsyncIteration``. That last exit is marked on the
    stream: a stream the caller closed after its last chunk has the same state
    otherwise."""
    try:
        return await wrapped(*args, **kwargs)
    except StopAsyncIteration:
        with contextlib.suppress(Exception):
            vars(instance)[_REPORTED] = True
        raise


def _stream_reclaimed(stream: Any) -> None:
    """In ``__del__``, on whichever thread the collector interrupted: reads the stream's
    own state and queues the rest, taking no lock (see the finalizer module).

    An async stream whose success event (:func:`_finalizing`) or failure event LiteLLM
    dispatched is left to LiteLLM: the event's task may run after the stream is
    reclaimed. Any other stream's end is queued, and the call ended there unless LiteLLM
    ended it first: a sync stream's events hold its logging object, which holds the
    stream (as the response it logged), so it is reclaimed only after they ran.
    A subclass iterating something else keeps none of that state: the Router's
    ``FallbackAwareStreamWrapper`` (litellm/router_rust/invoke/streaming.py) reads the
    attempt's own stream, which shares its call and is judged when reclaimed with it."""
    try:
        kind = type(stream)
        if not open_litellm_calls() or (kind.__next__, kind.__anext__) != _own_iteration:
            return
        state = vars(stream)
        if state.get(_REPORTED) is True or state.get("_failure_logging") is not None:
            return
        sdk_stream = isinstance(state.get("completion_stream"), _StreamProxyBase)
        _queue_end(state.get("logging_obj"), sdk_stream)
    except Exception as error:
        _report_later(error)


def _responses_stream_reclaimed(stream: Any) -> None:
    """In a Responses iterator's ``__del__`` (or after its ``aclose``), as
    :func:`_stream_reclaimed`.

    LiteLLM 1.110.2 has reported, or is reporting, a Responses stream's end when it
    logged the terminal event (``_completed_response_logged``, set before the success
    event is dispatched) or a failure (``_failure_handled``): those are left to it. Only
    the iterators that read the answer themselves are judged: the server's stream
    (``SyncResponsesAPIStreamingIterator`` / ``ResponsesAPIStreamingIterator``) or the
    unstreamed answer replayed (``MockResponsesAPIStreamingIterator``), all sent by
    LiteLLM's own handler. The others iterate another stream, judged when reclaimed:
    a Responses call answered through a chat completion, a Router's fallback, MCP's."""
    try:
        kind = type(stream)
        own = _responses_iteration
        if not open_litellm_calls() or (
            getattr(kind, "__next__", None) not in own
            and getattr(kind, "__anext__", None) not in own
        ):
            return
        state = vars(stream)
        if state.get("_completed_response_logged") is True or state.get("_failure_handled"):
            return
        _queue_end(state.get("logging_obj"), sdk_stream=False)
    except Exception as error:
        _report_later(error)


async def _responses_stream_closed(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """``ResponsesAPIStreamingIterator.aclose``: LiteLLM's own, then the stream is judged
    as when reclaimed (:func:`_responses_stream_reclaimed`).

    LiteLLM 1.110.2's Router closes the server's stream once its own stream ends, as the
    proxy's client hangs up too (``stream_with_fallbacks``' ``finally``,
    litellm/router_rust/invoke/streaming.py), and the proxy reports a hung-up call's end
    only when it relayed output text to bill (``partial_response_on_disconnect``,
    responses/streaming_iterator.py). The Router's wrapper is a class made per call
    (``wrap_responses_stream``, same file) whose methods hold the iterator in their
    closures, and a class is freed only by the cyclic collector, tens of seconds later
    or not at all: the call waited for that, its span's end with it. A closed iterator
    reads nothing more (its HTTP response is closed), so its call ends now. A stream
    read to its end, or failed, is LiteLLM's to report, and a second end (its reclaim,
    or a disconnect's billing event) finds the call ended already."""
    try:
        return await wrapped(*args, **kwargs)
    finally:
        _responses_stream_reclaimed(instance)


def _call_reclaimed(logging_obj: Any) -> None:
    """In the ``__del__`` of a call's ``Logging`` object, as :func:`_stream_reclaimed`:
    the call is over, and one still open with its route unknown (no answer logged) is
    forgotten on the finalizer thread. Such a call was cancelled or interrupted before
    its answer (``task.cancel()``, ``asyncio.wait_for`` running out, Ctrl-C; LiteLLM
    1.110.2's ``client`` wrappers report failures from ``except Exception`` only,
    utils.py), or it is the unreported last attempt of a call whose every attempt failed:
    which one is not known here, so it gets no span (through ``openai/`` the openai
    wrapper's span has it). It stayed open, holding the caller's context and keeping
    every openai SDK stream noted, until ``MAX_CALLS`` pushed it out. A call whose answer
    was logged is left to its stream's reclaim or LiteLLM's events, which may run later."""
    try:
        details = getattr(logging_obj, "model_call_details", None)
        if open_litellm_calls() and isinstance(details, Mapping):
            call_id = wire.attempt(details)
            if call_id is not None:
                finalizer.defer(functools.partial(_forget_undecided, call_id))
    except Exception as error:
        _report_later(error)


def _forget_undecided(call_id: wire.Key) -> None:
    started = _calls.get(call_id)
    if started is not None and not started.mark.decided:
        _calls.end(call_id)


def _sender_reclaimed(kept: Mapping[str, Any], _sender: Any) -> None:
    """The weak reference's callback, run like ``__del__``: the generator a text
    completion's stream iterates is reclaimed. LiteLLM 1.110.2 sends the request, and
    makes the ``CustomStreamWrapper`` reading it, only when the generator is first read
    (``OpenAITextCompletion.streaming`` / ``async_streaming``, litellm/llms/openai/
    completion/handler.py): a stream dropped unread had neither, and nothing else would
    end its call. A stream read (to its end or not) has the openai wrapper's span, so
    its call is only forgotten, here or by its ``CustomStreamWrapper``, whichever comes
    first."""
    try:
        _queue(kept, sdk_stream=False)
    except Exception as error:
        _report_later(error)


def _kept(details: Mapping[str, Any]) -> dict[str, Any]:
    """What a dropped stream's end needs of LiteLLM's call details (none of the
    content)."""
    kept: dict[str, Any] = {name: details.get(name) for name in _DROPPED_FIELDS}
    params = details.get("litellm_params")
    if isinstance(params, Mapping):
        kept["litellm_params"] = {"api_base": params.get("api_base")}
    optional = details.get("optional_params")
    if isinstance(optional, Mapping):
        kept["optional_params"] = {"stream_options": optional.get("stream_options")}
    return kept


def _queue_end(logging_obj: Any, sdk_stream: bool) -> None:
    """Queue the end of a reclaimed stream's call on the finalizer thread, with the few
    call fields it needs."""
    details = getattr(logging_obj, "model_call_details", None)
    if isinstance(details, Mapping):
        _queue(_kept(details), sdk_stream)


def _queue(kept: Mapping[str, Any], sdk_stream: bool) -> None:
    now = wire.now_beside(wire.attempt_start(kept))
    finalizer.defer(functools.partial(_forget_dropped, kept, now, sdk_stream))


def _report_later(error: Exception) -> None:
    """Reported from the finalizer's thread; never from ``__del__``."""
    with contextlib.suppress(Exception):
        finalizer.defer(functools.partial(_report, error.with_traceback(None)))


def _forget_dropped(kwargs: Mapping[str, Any], end_time: Any, sdk_stream: bool) -> None:
    """On the finalizer thread: the dropped stream's call is no longer open, and is
    ended ``not_read_to_end`` when ours to record."""
    call_id = wire.attempt(kwargs)
    started = None if call_id is None else _calls.end(call_id)
    if started is None or sdk_stream or started.pid != os.getpid():
        return  # reported ended already, the openai wrapper's, or a forked parent's
    if kwargs.get("cache_hit") is not True:
        started.callback._dropped(kwargs, started, end_time)


def _report(error: Exception) -> None:
    try:
        raise error
    except Exception:
        report_internal_error("litellm.stream_reclaimed")


__all__ = ["SpecDecodeLiteLLMCallback"]
