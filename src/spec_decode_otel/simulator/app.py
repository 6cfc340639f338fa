"""The ASGI app: an OpenAI-compatible server that speaks every engine's stats shape.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
(the Responses API), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (the
server-side counters, see ``server_metrics.py``).
One request is planned in full before a byte is sent (see ``plan.py``);
this module only renders the plan as a JSON body or an SSE stream in the shape of the
engine chosen for the request, and applies the requested faults.

Per-request headers:

- ``x-spec-decode-engine``: one of ``config.ENGINES`` (default: the server's ``engine``)
- ``x-spec-decode-level``: none | summary | detailed (vLLM shapes and TRT-LLM)
- ``x-sim-draft-schedule``: e.g. ``2,4,4,6`` (draft length per verify step, cycled)
- ``x-sim-seed``: makes the request's sample depend on this seed alone
- ``x-sim-fault``: see ``faults.py``; ``x-sim-delay-ms`` for ``slow`` (default 50)
- ``x-sim-gateway``: ``litellm-proxy`` answers as LiteLLM's proxy does in front of the
  engine: each choice's non-standard fields move into ``provider_specific_fields``
  (root fields stay); non-streaming bodies only
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response, StreamingResponse

from spec_decode_otel.simulator import faults as F
from spec_decode_otel.simulator import shapes
from spec_decode_otel.simulator.acceptance import AcceptanceProfile, parse_ints
from spec_decode_otel.simulator.config import ENGINES, LEVELS, SimulatorConfig
from spec_decode_otel.simulator.plan import (
    ChoicePlan,
    choice_rng,
    count_prompt_tokens,
    plan_choice,
)
from spec_decode_otel.simulator.server_metrics import CONTENT_TYPE, ServerMetrics

JSON = dict[str, Any]

HEADER_ENGINE = "x-spec-decode-engine"
HEADER_LEVEL = "x-spec-decode-level"
HEADER_SCHEDULE = "x-sim-draft-schedule"
HEADER_SEED = "x-sim-seed"
HEADER_FAULT = "x-sim-fault"
HEADER_DELAY = "x-sim-delay-ms"
HEADER_GATEWAY = "x-sim-gateway"
GATEWAYS = ("litellm-proxy",)
#: The per-choice fields of OpenAI's chat and completion schemas (LiteLLM keeps these).
_STANDARD_CHOICE_FIELDS = frozenset(
    {"index", "message", "delta", "text", "logprobs", "finish_reason"}
)


def litellm_proxy(body: JSON) -> JSON:
    """The body as LiteLLM's proxy returns it: per-choice fields it does not know go into
    ``choices[i].provider_specific_fields``; root fields (``metrics``, ``sglext``,
    ``timings``) survive."""
    choices = []
    for choice in body.get("choices") or ():
        moved = {k: v for k, v in choice.items() if k not in _STANDARD_CHOICE_FIELDS}
        kept = {k: v for k, v in choice.items() if k in _STANDARD_CHOICE_FIELDS}
        choices.append({**kept, "provider_specific_fields": moved} if moved else kept)
    return {**body, "choices": choices}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False


class _CommonRequest(BaseModel):
    """Fields every OpenAI-compatible server reads; unknown ones are kept, not refused."""

    model_config = ConfigDict(extra="allow")
    model: str
    n: int = Field(1, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    # SGLang request extensions
    return_spec_tokens_details: bool | None = False
    return_meta_info: bool | None = False

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_CommonRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(_CommonRequest):
    prompt: str | list[str] | list[int] | list[list[int]]


class ResponsesRequest(_CommonRequest):
    input: str | list[dict[str, Any]]
    max_output_tokens: int | None = Field(None, ge=1)


#: Engines answering with SGLang's field family (``sglext``, ``meta_info``).
SGLANG_FAMILY = frozenset({"sglang", "sglang-no-histogram", "tokenspeed"})
#: SGLang's own server (checked against SGLang 0.5.23, the newest release, Dec 2026).
#: ``return_meta_info`` exists on its chat request only (``ChatCompletionRequest`` in
#: ``srt/entrypoints/openai/protocol.py``; ``CompletionRequest`` has no such field and
#: ignores it), and a streamed chat request carrying it is refused before anything is
#: generated: ``OpenAIServingChat._convert_to_internal_request`` (``serving_chat.py``)
#: raises ValueError, which ``OpenAIServingBase.handle_request`` (``serving_base.py``)
#: answers with HTTP 400 and an ``ErrorResponse`` body at the root (not under
#: ``"error"``). Its streams carry spec-decode stats only as ``sglext`` on a separate
#: ``choices: []`` chunk after the finish_reason chunks (``return_spec_tokens_details``).
#: (SGLang's unreleased main nests the same body under ``"error"``.)
SGLANG_SERVERS = frozenset({"sglang", "sglang-no-histogram"})
SGLANG_STREAM_META_INFO = (
    "return_meta_info is not supported with streaming. "
    "Please set stream=false when using return_meta_info=true."
)
#: Engines answering with llama.cpp's root ``timings``.
TIMINGS_FAMILY = frozenset({"llamacpp", "mlx-vlm"})


class SimulatorError(Exception):
    """An error answer: HTTP status and JSON body."""

    def __init__(self, status: int, body: JSON) -> None:
        super().__init__(status, body)
        self.status, self.body = status, body

    @classmethod
    def invalid(cls, message: str) -> SimulatorError:
        """OpenAI's 400 shape, for what the simulator itself refuses."""
        return cls(400, error_body(message, "invalid_request_error", None))


def dumps(obj: object) -> str:
    """Compact JSON that lets NaN/Infinity through as bare tokens, as Python's json does
    (Starlette's JSONResponse refuses them; the ``nan`` fault needs them on the wire)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=True)


def json_response(
    obj: object, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(dumps(obj), status_code=status, media_type="application/json", headers=headers)


def error_body(message: str, type_: str, code: str | int | None, param: str | None = None) -> JSON:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass
class RequestPlan:
    """Everything needed to render one response, decided before anything is sent."""

    kind: Literal["chat", "completion", "responses"]
    engine: str
    level: str
    profile: AcceptanceProfile
    model: str
    request_id: str
    created: int
    prompt_tokens: int
    n_sequences: int
    choices: list[ChoicePlan]
    include_usage: bool
    sglang_details: bool
    sglang_meta: bool
    faults: frozenset[str] = field(default_factory=frozenset)

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    @property
    def single(self) -> bool:
        return self.n_sequences == 1

    def usage(self) -> JSON:
        completion = sum(c.completion_tokens for c in self.choices)
        usage: JSON = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }
        if self.engine == "smg" and self.single:
            details = shapes.smg_completion_tokens_details(self.choices[0].generation)
            usage["completion_tokens_details"] = details
        return usage

    def header(self) -> JSON:
        return {
            "id": self.request_id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.model,
        }

    # --- engine payloads (fresh objects each call, so faults never leak between uses) --

    def vllm_metrics(self) -> JSON | None:
        """Root ``metrics`` for the merged vLLM shape; no spec key at level none. For
        n > 1 (or several prompts) vLLM 0.33.0 nulls the whole object."""
        if self.engine != "vllm" or not self.single:
            return None
        gen = self.choices[0].generation
        out = shapes.vllm_timing_metrics(gen, self.prompt_tokens)
        if self.level != "none":
            stats = shapes.vllm_merged(gen, self.profile, self.level)
            F.corrupt_stats(stats, "vllm", self.faults)
            out["speculative_decoding"] = stats
        return out

    def premerge_stats(self, choice: ChoicePlan) -> JSON | None:
        if self.level == "none":
            return None
        stats = shapes.vllm_premerge(choice.generation, self.profile, self.level)
        F.corrupt_stats(stats, "vllm-premerge", self.faults)
        return stats

    def trtllm_stats(self, choice: ChoicePlan) -> JSON | None:
        if self.level == "none":
            return None
        stats = shapes.trtllm_stats(choice.generation, self.profile)
        if stats is not None:
            F.corrupt_stats(stats, "trtllm", self.faults)
        return stats

    def avg_decoded(self, steps: int, accepted: int) -> object:
        return F.corrupt_avg_decoded(shapes.trtllm_avg_decoded(steps, accepted), self.faults)

    def sglext(self) -> JSON | None:
        if not self.sglang_details or self.engine not in ("sglang", "sglang-no-histogram"):
            return None
        details = []
        for c in self.choices:
            d = shapes.sglang_details(c.generation, self.profile, histogram=self.engine == "sglang")
            F.corrupt_stats(d, "sglang", self.faults)
            details.append(d)
        return {"spec_tokens_details": details[0] if self.single else details}

    def meta_info(self, choice: ChoicePlan) -> JSON:
        meta = shapes.sglang_meta_info(
            choice.generation,
            self.profile,
            self.request_id,
            choice.finish_reason,
            self.prompt_tokens,
            self.engine,
        )
        F.corrupt_stats(meta, "sglang", self.faults)
        return meta

    def llamacpp_timings(self) -> JSON:
        timings = shapes.llamacpp_timings(
            self.choices[0].generation, self.prompt_tokens, mlx_vlm=self.engine == "mlx-vlm"
        )
        F.corrupt_llamacpp(timings, self.faults)
        return timings

    # --- non-streaming ------------------------------------------------------------------

    def choice_extras(self, choice: ChoicePlan) -> JSON:
        """Per-choice engine fields of a non-streaming response."""
        out: JSON = {}
        if self.engine == "vllm-premerge":
            out["speculative_decoding_stats"] = self.premerge_stats(choice)
        elif self.engine in ("trtllm", "trtllm-released"):
            gen = choice.generation
            out["avg_decoded_tokens_per_iter"] = self.avg_decoded(
                gen.num_spec_steps, gen.num_accepted_draft_tokens
            )
            if self.engine == "trtllm":
                stats = self.trtllm_stats(choice)
                if stats is not None:
                    out["speculative_decoding"] = stats
        elif self.engine in SGLANG_FAMILY and self.sglang_meta:
            out["meta_info"] = self.meta_info(choice)
        return out

    def response(self) -> JSON:
        choices = []
        for c in self.choices:
            if self.kind == "chat":
                body: JSON = {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
            else:
                body = {
                    "index": c.index,
                    "text": c.text,
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
            body.update(self.choice_extras(c))
            choices.append(body)
        out: JSON = {
            "id": self.request_id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
            "system_fingerprint": None,
        }
        self._root_extras(out)
        return out

    def _root_extras(self, out: JSON) -> None:
        if self.engine == "vllm":
            out["metrics"] = self.vllm_metrics()
        elif self.engine in SGLANG_FAMILY:
            ext = self.sglext()
            if ext is not None:
                out["sglext"] = ext
        elif self.engine in TIMINGS_FAMILY:
            out["timings"] = self.llamacpp_timings()

    # --- streaming ----------------------------------------------------------------------

    def _chunk(self, choices: list[JSON]) -> JSON:
        return {**self.header(), "choices": choices}

    def _choice(self, index: int, text: str | None, finish: str | None, role: bool = False) -> JSON:
        if self.kind == "chat":
            delta: JSON = {}
            if role:
                delta = {"role": "assistant", "content": ""}
            elif text is not None:
                delta = {"content": text}
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}

    def chunks(self) -> Iterator[JSON]:
        """The stream, chunk by chunk: role, one content chunk per verify step (choices
        interleaved), one finish_reason chunk per choice, engine tails, usage."""
        trt = self.engine in ("trtllm", "trtllm-released")
        running = {c.index: [0, 0] for c in self.choices}  # steps, accepted so far

        def with_avg(choice: JSON, index: int) -> JSON:
            if trt:
                steps, accepted = running[index]
                choice["avg_decoded_tokens_per_iter"] = self.avg_decoded(steps, accepted)
            return choice

        if self.kind == "chat":
            for c in self.choices:
                yield self._chunk([with_avg(self._choice(c.index, None, None, role=True), c.index)])
        longest = max(len(c.pieces) for c in self.choices)
        for i in range(longest):
            for c in self.choices:
                if i >= len(c.pieces):
                    continue
                if i > 0:
                    running[c.index][0] += 1
                    running[c.index][1] += c.generation.per_step_accepted[i - 1]
                if c.pieces[i]:
                    yield self._chunk([with_avg(self._choice(c.index, c.pieces[i], None), c.index)])

        last_is_finish = not self.include_usage
        for pos, c in enumerate(self.choices):
            choice = with_avg(
                self._choice(c.index, None if self.kind == "chat" else "", c.finish_reason), c.index
            )
            if self.engine == "vllm-premerge":
                choice["speculative_decoding_stats"] = self.premerge_stats(c)
            elif self.engine == "trtllm":
                stats = self.trtllm_stats(c)
                if stats is not None:
                    choice["speculative_decoding"] = stats
            elif self.engine in SGLANG_FAMILY and self.sglang_meta:
                choice["meta_info"] = self.meta_info(c)
            chunk = self._chunk([choice])
            if self.engine == "llamacpp" and last_is_finish and pos == len(self.choices) - 1:
                chunk["timings"] = self.llamacpp_timings()
            yield chunk

        if self.engine in SGLANG_FAMILY:
            ext = self.sglext()
            if ext is not None:
                yield {**self._chunk([]), "sglext": ext}

        if self.include_usage:
            chunk = {**self._chunk([]), "usage": self.usage()}
            if self.engine == "vllm":
                metrics = self.vllm_metrics()
                if metrics is not None:  # the usage chunk is dumped with exclude_none
                    chunk["metrics"] = metrics
            elif self.engine in TIMINGS_FAMILY:
                # (mlx-vlm sends its draft counters on this chunk only)
                chunk["timings"] = self.llamacpp_timings()
            yield chunk

    # --- the Responses API ----------------------------------------------------------------

    def responses_body(self, status: str = "completed") -> JSON:
        """A Responses API ``Response``. vLLM 0.33.0 adds root ``metrics`` with timing
        fields only (``build_per_request_timing_metrics``: no spec-decode object);
        llama.cpp (b11312) adds nothing to a non-streamed one."""
        c = self.choices[0]
        usage = self.usage()
        out: JSON = {
            "id": self.request_id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": [self._output_item(c.text, status)],
            "usage": {
                "input_tokens": usage["prompt_tokens"],
                "output_tokens": usage["completion_tokens"],
                "total_tokens": usage["total_tokens"],
            },
        }
        if self.engine == "vllm":
            out["metrics"] = {
                **shapes.vllm_timing_metrics(c.generation, self.prompt_tokens),
                "speculative_decoding": None,
            }
        return out

    def _output_item(self, text: str, status: str) -> JSON:
        return {
            "id": "msg_" + self.request_id.removeprefix("resp_"),
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }

    def responses_events(self) -> Iterator[JSON]:
        """A Responses API stream: created, in progress, one text delta per verify step,
        the done events, then ``response.completed`` with the whole response. llama.cpp
        (b11312, PR ggml-org/llama.cpp#25348) puts root ``timings`` on that last event,
        beside ``response``, and numbers no event; vLLM numbers them all."""
        numbered = self.engine not in TIMINGS_FAMILY
        item_id = self._output_item("", "in_progress")["id"]
        pending = {**self.responses_body("in_progress"), "output": []}
        pending.pop("usage")
        events: list[JSON] = [
            {"type": "response.created", "response": pending},
            {"type": "response.in_progress", "response": pending},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**self._output_item("", "in_progress"), "content": []},
            },
            {
                "type": "response.content_part.added",
                "item_id": item_id,
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
        ]
        c = self.choices[0]
        for piece in c.pieces:
            if piece:
                events.append(
                    {
                        "type": "response.output_text.delta",
                        "item_id": item_id,
                        "output_index": 0,
                        "content_index": 0,
                        "delta": piece,
                    }
                )
        done = self._output_item(c.text, "completed")
        completed: JSON = {"type": "response.completed", "response": self.responses_body()}
        if self.engine in TIMINGS_FAMILY:
            completed["timings"] = self.llamacpp_timings()
        events += [
            {
                "type": "response.output_text.done",
                "item_id": item_id,
                "output_index": 0,
                "content_index": 0,
                "text": c.text,
            },
            {
                "type": "response.content_part.done",
                "item_id": item_id,
                "output_index": 0,
                "content_index": 0,
                "part": done["content"][0],
            },
            {"type": "response.output_item.done", "output_index": 0, "item": done},
            completed,
        ]
        for number, event in enumerate(events):
            if numbered:
                event["sequence_number"] = number
            yield event


class Simulator:
    """Turns validated requests into plans; holds the request counter behind the seeds."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self._counter = itertools.count()

    def plan(
        self,
        kind: Literal["chat", "completion", "responses"],
        req: _CommonRequest,
        request: Request,
    ) -> RequestPlan:
        cfg = self.config
        headers = request.headers
        engine = (headers.get(HEADER_ENGINE) or cfg.engine).strip().lower()
        if engine not in ENGINES:
            raise SimulatorError.invalid(f"unknown {HEADER_ENGINE}: {engine!r}")
        level = (headers.get(HEADER_LEVEL) or cfg.level).strip().lower()
        if level not in LEVELS:
            raise SimulatorError.invalid(f"unknown {HEADER_LEVEL}: {level!r}")
        try:
            schedule = (
                parse_ints(headers[HEADER_SCHEDULE]) if headers.get(HEADER_SCHEDULE) else None
            )
            profile = cfg.profile_for(req.model, schedule or None)
            seed_header = headers.get(HEADER_SEED)
            seed, request_no = (
                (int(seed_header), 0) if seed_header else (cfg.seed, next(self._counter))
            )
            faults = F.parse_faults(headers.get(HEADER_FAULT))
        except ValueError as exc:
            raise SimulatorError.invalid(str(exc)) from exc

        if kind == "chat":
            assert isinstance(req, ChatCompletionRequest)
            prompts: list[object] = [req.messages]
            max_tokens = req.max_completion_tokens or req.max_tokens
        elif kind == "responses":
            assert isinstance(req, ResponsesRequest)
            prompts = [req.input]
            max_tokens = req.max_output_tokens
        else:
            assert isinstance(req, CompletionRequest)
            p = req.prompt
            multi = isinstance(p, list) and len(p) > 0 and not isinstance(p[0], int)
            prompts = list(p) if multi else [p]
            max_tokens = req.max_tokens
        sglang_meta = bool(req.return_meta_info)
        if engine in SGLANG_SERVERS and sglang_meta:
            if kind != "chat":
                sglang_meta = False  # not a field of SGLang's completion request
            elif req.stream:
                raise SimulatorError(
                    400,
                    {
                        "object": "error",
                        "message": SGLANG_STREAM_META_INFO,
                        "type": "BadRequest",
                        "param": None,
                        "code": 400,
                    },
                )
        if engine in TIMINGS_FAMILY and (req.n != 1 or len(prompts) != 1):
            raise SimulatorError.invalid("Only one completion choice is allowed")
        n_sequences = req.n * len(prompts)
        choices = [
            plan_choice(
                choice_rng(seed, request_no, i),
                profile,
                i,
                max_tokens,
                req.stops,
                (cfg.min_length, cfg.max_length),
            )
            for i in range(n_sequences)
        ]
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if cfg.force_include_usage and engine in ("vllm", "vllm-premerge"):
            include_usage = True
        prefix = {"chat": "chatcmpl-", "completion": "cmpl-", "responses": "resp_"}[kind]
        return RequestPlan(
            kind=kind,
            engine=engine,
            level=level,
            profile=profile,
            model=req.model,
            request_id=prefix + uuid.uuid4().hex,
            created=int(time.time()),
            prompt_tokens=sum(count_prompt_tokens(p) for p in prompts),
            n_sequences=n_sequences,
            choices=choices,
            include_usage=include_usage,
            sglang_details=bool(req.return_spec_tokens_details),
            sglang_meta=sglang_meta,
            faults=faults,
        )


class _DropFilter(logging.Filter):
    """Keep uvicorn's log free of the tracebacks our deliberate disconnects cause."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if isinstance(exc, F.SimulatedDisconnect):
                return False
            group = getattr(exc, "exceptions", None)  # an ExceptionGroup from anyio
            exc = exc.__cause__ or exc.__context__ or (group[0] if group else None)
        return True


def _delay_seconds(request: Request, faults: frozenset[str], config: SimulatorConfig) -> float:
    if "slow" in faults:
        try:
            return float(request.headers.get(HEADER_DELAY) or F.DEFAULT_DELAY_MS) / 1000.0
        except ValueError:
            return F.DEFAULT_DELAY_MS / 1000.0
    return config.step_delay_ms / 1000.0


async def _sse(plan: RequestPlan, delay: float) -> AsyncIterator[bytes]:
    for i, chunk in enumerate(plan.chunks()):
        if "drop-mid-stream" in plan.faults and i >= F.DROP_AFTER_CHUNKS:
            raise F.SimulatedDisconnect("drop-mid-stream")
        if delay and i:
            await asyncio.sleep(delay)
        yield f"data: {dumps(chunk)}\n\n".encode()
    if "drop-mid-stream" in plan.faults:
        raise F.SimulatedDisconnect("drop-mid-stream")
    yield b"data: [DONE]\n\n"


async def _responses_sse(plan: RequestPlan, delay: float) -> AsyncIterator[bytes]:
    """A Responses API stream: ``event:`` and ``data:`` lines per event, no ``[DONE]``."""
    for i, event in enumerate(plan.responses_events()):
        if "drop-mid-stream" in plan.faults and i >= F.DROP_AFTER_CHUNKS:
            raise F.SimulatedDisconnect("drop-mid-stream")
        if delay and i:
            await asyncio.sleep(delay)
        yield f"event: {event['type']}\ndata: {dumps(event)}\n\n".encode()


async def _truncated_body(body: bytes) -> AsyncIterator[bytes]:
    yield body[: max(1, len(body) // 2)]
    raise F.SimulatedDisconnect("drop-mid-stream")


def create_app(config: SimulatorConfig | None = None) -> FastAPI:
    """Build the ASGI app for ``config`` (defaults: vLLM merged shape, detailed, k=4, alpha 0.7)."""
    config = config or SimulatorConfig()
    sim = Simulator(config)
    app = FastAPI(title="spec-decode-otel simulator", docs_url=None, redoc_url=None)
    app.state.simulator = sim
    server_metrics = app.state.server_metrics = ServerMetrics(config)
    error_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DropFilter) for f in error_log.filters):
        error_log.addFilter(_DropFilter())

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        msg = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid request')}"
        return json_response(
            error_body(msg, "invalid_request_error", None, ".".join(loc) or None), 400
        )

    @app.exception_handler(SimulatorError)
    async def _sim_error(request: Request, exc: SimulatorError) -> Response:
        return json_response(exc.body, exc.status)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server_metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> Response:
        created = int(time.time())
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "spec-decode-otel"}
            for m in config.models
        ]
        return json_response({"object": "list", "data": data})

    async def serve(
        kind: Literal["chat", "completion", "responses"], req: _CommonRequest, request: Request
    ) -> Response:
        try:
            faults = F.parse_faults(request.headers.get(HEADER_FAULT))
        except ValueError as exc:
            raise SimulatorError.invalid(str(exc)) from exc
        if "http-429" in faults:
            return json_response(
                error_body(
                    "Rate limit reached (simulated)", "rate_limit_exceeded", "rate_limit_exceeded"
                ),
                429,
                headers={"retry-after": "1"},
            )
        if "http-500" in faults:
            return json_response(
                error_body("Internal server error (simulated)", "server_error", "internal_error"),
                500,
            )
        gateway = (request.headers.get(HEADER_GATEWAY) or "").strip().lower()
        if gateway and gateway not in GATEWAYS:
            raise SimulatorError.invalid(f"unknown {HEADER_GATEWAY}: {gateway!r}")
        plan = sim.plan(kind, req, request)
        server_metrics.count(c.generation for c in plan.choices)
        delay = _delay_seconds(request, faults, config)
        if req.stream:
            return StreamingResponse(
                _responses_sse(plan, delay) if kind == "responses" else _sse(plan, delay),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        if kind == "responses":
            answer = plan.responses_body()
        else:
            answer = plan.response()
            if gateway == "litellm-proxy":
                answer = litellm_proxy(answer)
        body = dumps(answer).encode()
        if delay:
            await asyncio.sleep(delay)
        if "drop-mid-stream" in faults:
            return StreamingResponse(
                _truncated_body(body),
                media_type="application/json",
                headers={"content-length": str(len(body))},
            )
        return Response(body, media_type="application/json")

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        return await serve("chat", req, request)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        return await serve("completion", req, request)

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request) -> Response:
        return await serve("responses", req, request)

    return app
