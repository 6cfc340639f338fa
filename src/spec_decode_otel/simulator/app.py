"""The ASGI app: an OpenAI-compatible server that speaks every engine's stats shape.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
(the Responses API), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (the
server-side counters, see ``server_metrics.py``).
One request is planned in full before a byte is sent (``plan.py``, ``render.py``); this
module reads the request, refuses what the chosen engine refuses, and sends the plan as a
JSON body or an SSE stream with the requested transport faults.

Per-request headers:

- ``x-spec-decode-engine``: one of ``config.ENGINES`` (default: the server's ``engine``)
- ``x-spec-decode-level``: none | summary | detailed (vLLM shapes and TRT-LLM)
- ``x-sim-draft-schedule``: e.g. ``2,4,4,6`` (draft length per verify step, cycled)
- ``x-sim-seed``: makes the request's sample depend on this seed alone
- ``x-sim-fault``: see ``faults.py``; ``x-sim-delay-ms`` for ``slow`` (default 50)
- ``x-sim-gateway``: ``litellm-proxy`` answers as LiteLLM's proxy does in front of the
  engine (``gateways.py``); chat and text completions only
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response, StreamingResponse

from spec_decode_otel.simulator import faults as F
from spec_decode_otel.simulator.acceptance import parse_ints
from spec_decode_otel.simulator.config import ENGINES, LEVELS, SimulatorConfig
from spec_decode_otel.simulator.gateways import GATEWAYS, Gateway
from spec_decode_otel.simulator.plan import choice_rng, count_prompt_tokens, plan_choice
from spec_decode_otel.simulator.protocol import (
    SGLANG_STREAM_META_INFO,
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIRequest,
    ResponsesRequest,
    SimulatorError,
    error_body,
)
from spec_decode_otel.simulator.render import SGLANG_RELEASE, TIMINGS_FAMILY, RequestPlan
from spec_decode_otel.simulator.server_metrics import CONTENT_TYPE, ServerMetrics

HEADER_ENGINE = "x-spec-decode-engine"
HEADER_LEVEL = "x-spec-decode-level"
HEADER_SCHEDULE = "x-sim-draft-schedule"
HEADER_SEED = "x-sim-seed"
HEADER_FAULT = "x-sim-fault"
HEADER_DELAY = "x-sim-delay-ms"
HEADER_GATEWAY = "x-sim-gateway"
_ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-", "responses": "resp_"}


def dumps(obj: object) -> str:
    """Compact JSON that lets NaN/Infinity through as bare tokens, as Python's json does
    (Starlette's JSONResponse refuses them; the ``nan`` fault needs them on the wire)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=True)


def json_response(
    obj: object, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(dumps(obj), status_code=status, media_type="application/json", headers=headers)


def _header(request: Request, name: str, default: str = "") -> str:
    return (request.headers.get(name) or default).strip().lower()


def request_id(engine: str, kind: str) -> str:
    """SGLang 0.5.23 answers with the bare request id its ``GenerateReqInput`` made
    (``uuid.uuid4().hex``, ``managers/io_struct.py``): no ``chatcmpl-``/``cmpl-`` prefix."""
    if engine in SGLANG_RELEASE and kind != "responses":
        return uuid.uuid4().hex
    return _ID_PREFIX[kind] + uuid.uuid4().hex


def wants_meta_info(engine: str, req: OpenAIRequest) -> bool:
    """Whether the choices carry ``meta_info``. SGLang 0.5.23 has it in non-streamed chat
    answers only: it refuses a streamed chat request that asks for it, and its
    ``CompletionRequest`` (``protocol.py``) has no such field, so completions drop it,
    streamed or not. TokenSpeed is left as it was: its answer to a stream with
    ``return_meta_info`` is not verified."""
    if not req.return_meta_info:
        return False
    if engine not in SGLANG_RELEASE:
        return True
    if req.KIND == "chat" and req.stream:
        raise SimulatorError.sglang_bad_request(SGLANG_STREAM_META_INFO)
    return req.KIND == "chat"


#: llama.cpp's ``n`` limit: its slot count (``--parallel``, 4 by default in b11312).
LLAMACPP_SLOTS = 4


def refuse_several(engine: str, req: OpenAIRequest, prompts: list[object]) -> None:
    """What the ``timings`` engines refuse of ``n`` > 1 and several prompts.

    llama.cpp b11312 runs each sequence as its own task (``n`` is an alias of
    ``n_cmpl``, at most the slot count: ``server-schema.cpp``), for chat and completions,
    several prompts included; above the slot count it answers its own 400. Its
    Responses API answers ``n`` > 1 with a JSON array of responses, which no OpenAI
    client reads, so that stays refused here. mlx-vlm is left refusing both."""
    if engine == "llamacpp" and req.KIND != "responses":
        if req.n > LLAMACPP_SLOTS:
            raise SimulatorError.llamacpp_bad_request(
                f"Field 'n': Value must be between 1 <= value <= {LLAMACPP_SLOTS}, but got {req.n}"
            )
    elif engine in TIMINGS_FAMILY and (req.n != 1 or len(prompts) != 1):
        raise SimulatorError.invalid("Only one completion choice is allowed")


#: llama.cpp's ``n_predict`` bounds (``server-schema.cpp``: hard limits -1 .. INT32_MAX).
LLAMACPP_PREDICT_RANGE = (-1, 2**31 - 1)


def token_limit(engine: str, req: OpenAIRequest) -> int | None:
    """The request's token limit as the engine reads it (None: no limit).

    llama.cpp b11312 reads ``max_tokens`` and its aliases as ``n_predict``, from -1 to
    INT32_MAX (``server-schema.cpp``; outside it, its own 400 naming the field, which a
    Responses request's ``max_output_tokens`` is renamed to ``max_tokens`` before,
    ``server-chat.cpp``). -1 is no limit. 0 still gives one token, finish ``length``:
    ``process_token`` (``server-context.cpp``) checks the budget only once a token is
    out (``n_gen > 0 && !has_budget()``). Every other engine is refused a limit below 1,
    as OpenAI's API refuses it."""
    for field in type(req).model_fields:  # in the order the request model checked them
        value = getattr(req, field) if field in req.LIMIT_FIELDS else None
        if engine != "llamacpp" and value is not None and value < 1:
            message = f"{field}: Input should be greater than or equal to 1"
            raise SimulatorError(400, error_body(message, "invalid_request_error", None, field))
    limit = req.token_limit()
    if engine != "llamacpp" or limit is None:
        return limit
    low, high = LLAMACPP_PREDICT_RANGE
    if not low <= limit <= high:
        name = "max_tokens" if req.KIND == "responses" else req.token_limit_field()
        raise SimulatorError.llamacpp_bad_request(
            f"Field '{name}': Value must be between {low} <= value <= {high}, but got {limit}"
        )
    return None if limit == -1 else max(limit, 1)


def context_room(n_ctx: int | None, prompt_tokens: int) -> int | None:
    """The tokens llama.cpp's context (``n_ctx``; None: no limit) leaves after a prompt.

    llama.cpp b11312 refuses a prompt that fills the context, with its own 400 before a
    byte is streamed (``update_slots`` in ``server-context.cpp``), and ends a reply
    where the context ends (``process_token``; ``--context-shift`` is off by default),
    drafting only within it (``get_n_draft_max``): see ``acceptance.generate``."""
    if n_ctx is None:
        return None
    if prompt_tokens >= n_ctx:
        raise SimulatorError.llamacpp_exceeds_context(prompt_tokens, n_ctx)
    return n_ctx - prompt_tokens


class Simulator:
    """Turns validated requests into plans; holds the request counter behind the seeds."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self._counter = itertools.count()

    def plan(self, req: OpenAIRequest, request: Request, faults: frozenset[str]) -> RequestPlan:
        cfg = self.config
        engine = _header(request, HEADER_ENGINE, cfg.engine)
        if engine not in ENGINES:
            raise SimulatorError.invalid(f"unknown {HEADER_ENGINE}: {engine!r}")
        level = _header(request, HEADER_LEVEL, cfg.level)
        if level not in LEVELS:
            raise SimulatorError.invalid(f"unknown {HEADER_LEVEL}: {level!r}")
        try:
            schedule = request.headers.get(HEADER_SCHEDULE)
            profile = cfg.profile_for(req.model, parse_ints(schedule) if schedule else None)
            fixed = request.headers.get(HEADER_SEED)
            seed, request_no = (int(fixed), 0) if fixed else (cfg.seed, next(self._counter))
        except ValueError as exc:
            raise SimulatorError.invalid(str(exc)) from exc

        sglang_meta = wants_meta_info(engine, req)
        prompts = req.prompts()
        refuse_several(engine, req, prompts)
        counts = tuple(count_prompt_tokens(p) for p in prompts)
        n_ctx = cfg.llamacpp_n_ctx if engine == "llamacpp" else None
        lengths = (cfg.min_length, cfg.max_length)
        limit = token_limit(engine, req)
        choices = [
            plan_choice(
                choice_rng(seed, request_no, i),
                profile,
                i,
                limit,
                req.stops,
                lengths,
                cap_drafts=engine == "llamacpp",
                context_room=context_room(n_ctx, counts[i // req.n]),
                count_cut_drafts=engine == "llamacpp",
            )
            for i in range(req.n * len(prompts))
        ]
        force_usage = cfg.force_include_usage and engine in ("vllm", "vllm-premerge")
        return RequestPlan(
            kind=req.KIND,
            engine=engine,
            level=level,
            profile=profile,
            model=req.model,
            request_id=request_id(engine, req.KIND),
            created=int(time.time()),
            prompt_tokens=sum(counts),
            prompt_counts=counts,
            choices=choices,
            include_usage=req.include_usage or force_usage,
            # vLLM 0.34.0 forces continuous usage with forced usage (``should_include_usage``)
            continuous_usage=engine == "vllm" and (req.continuous_usage or force_usage),
            sglang_details=bool(req.return_spec_tokens_details),
            sglang_meta=sglang_meta,
            faults=faults,
            vllm_timing=cfg.vllm_timing_metrics,
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


async def _sse(
    frames: Iterable[str], faults: frozenset[str], delay: float, last: str = ""
) -> AsyncIterator[bytes]:
    """Server-sent events, ``delay`` apart; ``drop-mid-stream`` cuts the connection after
    ``DROP_AFTER_CHUNKS`` events, and always before ``last``."""
    drop = "drop-mid-stream" in faults
    for i, frame in enumerate(frames):
        if drop and i >= F.DROP_AFTER_CHUNKS:
            raise F.SimulatedDisconnect("drop-mid-stream")
        if delay and i:
            await asyncio.sleep(delay)
        yield frame.encode()
    if drop:
        raise F.SimulatedDisconnect("drop-mid-stream")
    if last:
        yield last.encode()


def sse_response(plan: RequestPlan, delay: float, gateway: Gateway | None) -> StreamingResponse:
    """Chat and completions: ``data:`` lines, then ``[DONE]``; the Responses API: an
    ``event:`` line before each ``data:`` line, and no ``[DONE]``."""
    if plan.kind == "responses":
        events = (f"event: {e['type']}\ndata: {dumps(e)}\n\n" for e in plan.responses_events())
        body = _sse(events, plan.faults, delay)
    else:
        chunks = plan.chunks()
        if gateway is not None:
            chunks = gateway.chunks(chunks, plan.kind, plan.include_usage)
        frames = (f"data: {dumps(c)}\n\n" for c in chunks)
        body = _sse(frames, plan.faults, delay, last="data: [DONE]\n\n")
    return StreamingResponse(
        body, media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


async def _truncated_body(body: bytes) -> AsyncIterator[bytes]:
    yield body[: max(1, len(body) // 2)]
    raise F.SimulatedDisconnect("drop-mid-stream")


def create_app(config: SimulatorConfig | None = None) -> FastAPI:
    """Build the ASGI app for ``config`` (defaults: vLLM merged shape, detailed, k=4, alpha 0.7)."""
    config = config or SimulatorConfig()
    sim = Simulator(config)
    app = FastAPI(title="spec-decode-otel simulator", docs_url=None, redoc_url=None)
    server_metrics = ServerMetrics(config)
    error_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DropFilter) for f in error_log.filters):
        error_log.addFilter(_DropFilter())

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or None
        msg = f"{param or 'body'}: {first.get('msg', 'invalid request')}"
        return json_response(error_body(msg, "invalid_request_error", None, param), 400)

    @app.exception_handler(SimulatorError)
    async def _refused(request: Request, exc: SimulatorError) -> Response:
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

    async def serve(req: OpenAIRequest, request: Request) -> Response:
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
        gateway_name = _header(request, HEADER_GATEWAY)
        gateway = GATEWAYS.get(gateway_name)
        if gateway_name and gateway is None:
            raise SimulatorError.invalid(f"unknown {HEADER_GATEWAY}: {gateway_name!r}")
        plan = sim.plan(req, request, faults)
        server_metrics.count(c.generation for c in plan.choices)
        delay = _delay_seconds(request, faults, config)
        if req.stream:
            return sse_response(plan, delay, gateway)
        if plan.kind == "responses":
            answer = plan.responses_body()
        else:
            answer = plan.response()
            if gateway is not None:
                answer = gateway.body(answer, plan.kind)
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
        return await serve(req, request)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        return await serve(req, request)

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request) -> Response:
        return await serve(req, request)

    return app
