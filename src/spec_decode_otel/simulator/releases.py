"""Engines' OpenAI layers as their releases send them, field for field.

Each function renders a :class:`~spec_decode_otel.simulator.render.RequestPlan` the way one
release's server does, read from its wheel (the docstrings name the files and functions);
``tests/simulator/`` pins each point. Other engines, and these engines' payload objects,
are rendered by ``render.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from spec_decode_otel.simulator import shapes
from spec_decode_otel.simulator.plan import ChoicePlan
from spec_decode_otel.simulator.protocol import JSON

if TYPE_CHECKING:
    from spec_decode_otel.simulator.render import RequestPlan


# --- vLLM 0.34.0 ----------------------------------------------------------------------


def _stop_reason(c: ChoicePlan) -> str | None:
    """vLLM's ``stop_reason``: the stop string that matched; null for EOS (the
    simulated model has no stop token ids) and the length limit."""
    return c.matched_stop if isinstance(c.matched_stop, str) else None


def vllm_response(plan: RequestPlan) -> JSON:
    """vLLM 0.34.0's body: ``ChatCompletionResponse`` / ``CompletionResponse``
    (``chat_completion/protocol.py``, ``completion/protocol.py``) dumped whole
    (``api_router.py``: ``JSONResponse(content=generator.model_dump())``), so every
    field is sent, null or not, in the models' order. Left out all the same: the
    message's ``annotations`` (``exclude_if`` None) and its empty ``tool_calls``
    (``ChatMessage._serialize`` pops them), the usage's null
    ``prompt_tokens_details`` (``exclude_if``)."""
    chat = plan.kind == "chat"
    choices = []
    for c in plan.choices:
        head: JSON
        if chat:
            message = {
                "role": "assistant",
                "content": c.text,
                "refusal": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            }
            head = {"index": c.index, "message": message}
        else:
            head = {"index": c.index, "text": c.text}
        choice: JSON = {
            **head,
            "logprobs": None,
            "finish_reason": c.finish_reason,
            "stop_reason": _stop_reason(c),
            "token_ids": None,
        }
        if not chat:
            choice.update(prompt_logprobs=None, prompt_token_ids=None)
        choices.append({**choice, "routed_experts": None, "weight_versions": None})
    out: JSON = {
        "id": plan.request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": plan.created,
        "model": plan.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": shapes.VLLM_SYSTEM_FINGERPRINT,
        "usage": {**plan.usage(), "completion_tokens_details": None},
    }
    if chat:
        out.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    out.update(kv_transfer_params=None, ec_transfer_params=None)
    out["metrics"] = plan.vllm_metrics(body=True)
    return out


def _running_usage(plan: RequestPlan, c: ChoicePlan, tokens: int) -> JSON:
    """``continuous_usage_stats``: the choice's own tokens so far against its prompt.
    Chat sets ``completion_tokens_details`` (null without a reasoning parser), so
    ``exclude_unset`` keeps it; completions do not."""
    if not plan.continuous_usage:
        return {}
    prompt = plan.prompt_tokens_of(c)
    usage: JSON = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + tokens,
        "completion_tokens": tokens,
    }
    if plan.kind == "chat":
        usage["completion_tokens_details"] = None
    return {"usage": usage}


def vllm_chunks(plan: RequestPlan) -> Iterator[JSON]:
    """vLLM 0.34.0's stream (``chat_completion/serving.py``
    ``chat_completion_stream_generator``, ``completion/serving.py``
    ``completion_stream_generator``): chunks dumped with ``exclude_unset``, so a
    field is sent, null or not, where the server sets it.

    Chat: one role chunk per choice (``prompt_token_ids`` and ``prompt_text`` null),
    then one chunk per engine step, empty text included, each with ``logprobs``,
    ``token_ids`` and the root ``kv_transfer_params`` null; the step that finishes a
    choice carries its last text with ``finish_reason``, ``stop_reason`` and
    ``weight_versions``. Completions: the same steps, each choice with every field
    (``stop_reason`` and the token fields null until the last). The last chunk of a
    choice has ``system_fingerprint`` unless a usage chunk follows; that chunk
    (``exclude_none``: no null) has ``usage``, ``system_fingerprint`` and the
    ``metrics`` (n = 1, one prompt). ``continuous_usage_stats`` puts each choice's
    running usage on every chunk of it.
    """
    chat = plan.kind == "chat"
    fingerprint = shapes.VLLM_SYSTEM_FINGERPRINT
    if chat:
        for c in plan.choices:
            role: JSON = {
                "index": c.index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            root = {**_running_usage(plan, c, 0), "prompt_token_ids": None, "prompt_text": None}
            yield plan.chunk(role, **root)
    for step, c in plan.steps():
        done = step == len(c.pieces) - 1
        finish, stop = (c.finish_reason, _stop_reason(c)) if done else (None, None)
        choice: JSON
        if chat:
            delta = {"content": c.pieces[step]}
            choice = {"index": c.index, "delta": delta, "logprobs": None, "finish_reason": finish}
            if done:  # the only chat choice vLLM builds with these
                choice.update(stop_reason=stop, token_ids=None, weight_versions=None)
            else:
                choice["token_ids"] = None
        else:
            choice = {
                "index": c.index,
                "text": c.pieces[step],
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop,
                "prompt_token_ids": None,
                "token_ids": None,
                "weight_versions": None,
            }
        tokens = 1 + sum(c.generation.step_tokens()[:step])
        root = _running_usage(plan, c, tokens)
        if done and not plan.include_usage:
            root["system_fingerprint"] = fingerprint
        yield plan.chunk(choice, **root, kv_transfer_params=None)
    if plan.include_usage:
        chunk = plan.chunk(usage=plan.usage(), system_fingerprint=fingerprint)
        metrics = plan.vllm_metrics()
        if metrics is not None:
            chunk["metrics"] = metrics
        yield chunk


# --- SGLang 0.5.23 --------------------------------------------------------------------


def sglang_chunks(plan: RequestPlan) -> Iterator[JSON]:
    """SGLang 0.5.23's stream (``_generate_chat_stream``, ``_generate_completion_stream``).

    Chat: a choice's role chunk comes with its first output, then one chunk per
    non-empty step; the finish_reason chunks (with ``matched_stop``) follow once every
    choice is done. These chunks are msgspec ``StreamChunk``s, which omit a None
    ``usage``. Completions: one chunk per step, empty text included, the last carrying
    finish_reason and ``matched_stop``; each is a pydantic dump, so ``usage: null``.
    Then the ``sglext`` chunk (pydantic: ``usage: null``) and the usage chunk (chat:
    every usage field; completions: dumped with ``exclude_none``).
    """
    chat = plan.kind == "chat"
    for step, c in plan.steps():
        if not chat:
            finish = c.finish_reason if step == len(c.pieces) - 1 else None
            piece = plan.delta(c, step, {"content": c.pieces[step]}, finish)
            yield plan.chunk(piece, usage=None)
            continue
        if step == 0:
            yield plan.chunk(plan.delta(c, 0, {"role": "assistant", "content": ""}))
        if c.pieces[step]:
            yield plan.chunk(plan.delta(c, step, {"content": c.pieces[step]}))
    if chat:
        for c in plan.choices:
            yield plan.chunk(plan.delta(c, len(c.pieces) - 1, {}, c.finish_reason))
    ext = plan.sglext()
    if ext is not None:
        yield plan.chunk(usage=None, sglext=ext)
    if plan.include_usage:
        usage = plan.usage()
        if not chat:
            usage = {k: v for k, v in usage.items() if v is not None}
        yield plan.chunk(usage=usage)


# --- llama.cpp b11312 (the tree vendored in llama-cpp-python 0.3.36) -------------------

#: llama.cpp's ``system_fingerprint``: its ``llama_build_info()``, build number and commit.
LLAMACPP_SYSTEM_FINGERPRINT = "b11312-0c1e57098"


def _llamacpp_usage(plan: RequestPlan, c: ChoicePlan) -> JSON:
    """``usage_json_oaicompat()`` (``server-task.cpp``): one sequence's own counts."""
    prompt = plan.prompt_tokens_of(c)
    return {
        "completion_tokens": c.completion_tokens,
        "prompt_tokens": prompt,
        "total_tokens": prompt + c.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def llamacpp_response(plan: RequestPlan) -> JSON:
    """llama.cpp b11312's body (``server_task_result_cmpl_final::to_json_oaicompat`` and
    ``to_json_oaicompat_chat`` in ``tools/server/server-task.cpp``).

    Every sequence is its own task (``n`` is an alias of ``n_cmpl``, accepted up to the
    server's slot count, ``server-schema.cpp``; several prompts give prompts x n tasks).
    With more than one, ``handle_completions_impl`` (``server-context.cpp``) keeps the
    first task's whole body, results ordered by index, and appends the others' choices to
    it: root ``usage`` and ``timings`` are the FIRST sequence's, not the request's.
    """
    chat = plan.kind == "chat"
    choices: list[JSON] = []
    for c in plan.choices:
        if chat:
            message = {"role": "assistant", "content": c.text}
            choices.append({"finish_reason": c.finish_reason, "index": c.index, "message": message})
        else:
            choices.append(_llamacpp_choice(plan, c, c.text, c.finish_reason))
    first = plan.choices[0]
    return {
        "choices": choices,
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": LLAMACPP_SYSTEM_FINGERPRINT,
        "object": "chat.completion" if chat else "text_completion",
        "usage": _llamacpp_usage(plan, first),
        "id": plan.request_id,
        "timings": plan.llamacpp_timings(first),
    }


def _llamacpp_chunk(plan: RequestPlan, *choices: JSON, **root: object) -> JSON:
    """Every chunk names the build (``system_fingerprint``)."""
    return plan.chunk(*choices, system_fingerprint=LLAMACPP_SYSTEM_FINGERPRINT, **root)


def _llamacpp_choice(
    plan: RequestPlan, c: ChoicePlan, text: str | None, finish: str | None
) -> JSON:
    if plan.kind == "chat":
        delta: JSON = {} if text is None else {"content": text}
        return {"finish_reason": finish, "index": c.index, "delta": delta}
    return {"text": text or "", "index": c.index, "logprobs": None, "finish_reason": finish}


def _llamacpp_final(plan: RequestPlan, c: ChoicePlan) -> Iterator[JSON]:
    """One sequence's last chunks: its own ``usage`` and ``timings``.

    Chat (``to_json_oaicompat_chat_stream``): the finish chunk (empty delta), then with
    ``include_usage`` a ``choices: []`` chunk with the usage; ``timings`` rides whichever
    comes last. Completions (``to_json_oaicompat`` with ``stream``): ONE finish chunk
    (empty text) that carries ``usage`` and ``timings`` whatever ``stream_options`` says,
    and no ``choices: []`` chunk at all."""
    finish = _llamacpp_chunk(plan, _llamacpp_choice(plan, c, None, c.finish_reason))
    if plan.kind != "chat":
        last = {**finish, "usage": _llamacpp_usage(plan, c)}
    elif plan.include_usage:
        yield finish
        last = _llamacpp_chunk(plan, usage=_llamacpp_usage(plan, c))
    else:
        last = finish
    last["timings"] = plan.llamacpp_timings(c)
    yield last


def llamacpp_chunks(plan: RequestPlan) -> Iterator[JSON]:
    """llama.cpp b11312's stream: each sequence's task streams on its own, interleaved
    with the others (``server_task_result_cmpl_partial``, ``..._final``), and ends with
    its own final chunks (``_llamacpp_final``), so with ``n`` > 1 the stream holds
    ``n`` finish chunks with ``timings`` (and, with ``include_usage``, ``n`` usage
    chunks). A chat sequence starts with a role chunk whose ``content`` is null.

    A sequence ended by a stop string sends its ``timings`` twice: the partial result of
    the token that completed the stop carries them too (``send_partial_response`` in
    ``server-context.cpp`` fills ``stats`` once ``slot.stop`` is set, and
    ``find_stopping_strings`` sets it first). A completions partial is always sent, its
    text maybe empty; a chat partial only when it has a delta (``to_json_oaicompat_chat``
    in ``server-task.cpp``: the role delta of a first token, or some text). Here the
    partial is the stop step's chunk: the simulator streams a verify step as one chunk."""
    chat = plan.kind == "chat"
    if chat:
        for c in plan.choices:
            role = {
                "finish_reason": None,
                "index": c.index,
                "delta": {"role": "assistant", "content": None},
            }
            chunk = _llamacpp_chunk(plan, role)
            if len(c.pieces) == 1 and not c.pieces[0] and _stopped_by_string(c):
                chunk["timings"] = plan.llamacpp_timings(c)
            yield chunk
    for step, c in plan.steps():
        last = step == len(c.pieces) - 1
        stop_hit = last and _stopped_by_string(c)
        if c.pieces[step] or (stop_hit and not chat):
            chunk = _llamacpp_chunk(plan, _llamacpp_choice(plan, c, c.pieces[step], None))
            if stop_hit:
                chunk["timings"] = plan.llamacpp_timings(c)
            yield chunk
        if last:
            yield from _llamacpp_final(plan, c)


def _stopped_by_string(c: ChoicePlan) -> bool:
    return isinstance(c.matched_stop, str)


# --- mlx-vlm 0.7.10 (chat) ------------------------------------------------------------


def _mlx_vlm_choice(c: ChoicePlan, key: str, content: str | None, finish: str | None) -> JSON:
    """A choice whose ``message`` or ``delta`` is a ``ChatMessage`` (``server/schemas.py``)
    dumped with its null fields."""
    message = {
        "role": "assistant",
        "content": content,
        "reasoning_content": None,
        "reasoning": None,
        "tool_calls": None,
        "tool_call_id": None,
        "name": None,
    }
    return {"index": c.index, "finish_reason": finish, key: message, "logprobs": None}


def _mlx_vlm_usage(plan: RequestPlan) -> JSON:
    """``UsageStats`` (``server/schemas.py``), with its ``prompt_tokens_details``."""
    return {**plan.usage(), "prompt_tokens_details": {"cached_tokens": 0}}


def mlx_vlm_response(plan: RequestPlan) -> JSON:
    """mlx-vlm 0.7.10's chat body: ``ChatResponse`` (``server/schemas.py``), returned
    whole by ``chat_completions_endpoint`` (``server/openai.py``), so every field is sent,
    null or not, and ``timings`` is ``GenerationTimings.from_metrics``: all its fields,
    ``peak_memory`` and the draft ones included (null when no verify round ran)."""
    c = plan.choices[0]
    choice = _mlx_vlm_choice(c, "message", c.text or None, c.finish_reason)
    return {
        "id": plan.request_id,
        "object": "chat.completion",
        "created": plan.created,
        "model": plan.model,
        "choices": [choice],
        "usage": _mlx_vlm_usage(plan),
        "timings": plan.llamacpp_timings(c),
    }


def mlx_vlm_chunks(plan: RequestPlan) -> Iterator[JSON]:
    """mlx-vlm 0.7.10's chat stream (``server/openai.py`` ``stream_generator``; every
    chunk a ``ChatStreamChunk`` dumped whole, so ``usage: null`` until the last): no
    role chunk; each chunk with text, then the finish chunk (``_final_chat_chunk``),
    carries ``timings`` with nothing but ``predicted_per_second``
    (``StreamingTimings``); the draft counters come only on the ``include_usage``
    chunk (``_chat_usage_chunk``: ``choices: []``, the whole ``GenerationTimings``)."""
    c = plan.choices[0]
    running = {"predicted_per_second": plan.llamacpp_timings(c)["predicted_per_second"]}
    for piece in c.pieces:
        if piece:
            yield plan.chunk(_mlx_vlm_choice(c, "delta", piece, None), usage=None, timings=running)
    finish = _mlx_vlm_choice(c, "delta", None, c.finish_reason)
    yield plan.chunk(finish, usage=None, timings=running)
    if plan.include_usage:
        yield plan.chunk(usage=_mlx_vlm_usage(plan), timings=plan.llamacpp_timings(c))
