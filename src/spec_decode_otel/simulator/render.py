"""One request's plan, rendered as the chosen engine sends it: a JSON body or stream chunks.

A :class:`RequestPlan` holds everything decided before a byte is sent (the sampled
sequences in ``plan.py``, the engine shape, the faults). Its methods cut every engine's
payload from those sequences (``shapes.py``), corrupt it as the faults say (``faults.py``)
and place it where that engine puts it: chat and legacy completions as a body or chunks,
the Responses API as a ``Response`` or its events. What is matched to a release field for
field (vLLM 0.34.0, SGLang 0.5.23's streams, llama.cpp b11312, mlx-vlm 0.7.10's chat) is
rendered by ``releases.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from spec_decode_otel.simulator import faults as F
from spec_decode_otel.simulator import releases, shapes
from spec_decode_otel.simulator.acceptance import AcceptanceProfile
from spec_decode_otel.simulator.plan import ChoicePlan
from spec_decode_otel.simulator.protocol import JSON, Kind

#: Engines answering with SGLang's field family (``sglext``, ``meta_info``).
SGLANG_FAMILY = frozenset({"sglang", "sglang-no-histogram", "tokenspeed"})
#: Engines whose OpenAI layer is SGLang 0.5.23's own, field for field (``protocol.py``,
#: ``serving_chat.py``, ``serving_completions.py``, ``sse_utils.py``); TokenSpeed's
#: bodies are not verified against a release and keep the generic OpenAI fields.
SGLANG_RELEASE = frozenset({"sglang", "sglang-no-histogram"})
#: Engines answering with llama.cpp's root ``timings``.
TIMINGS_FAMILY = frozenset({"llamacpp", "mlx-vlm"})
#: Engines sending ``avg_decoded_tokens_per_iter`` on every choice.
TRTLLM_FAMILY = frozenset({"trtllm", "trtllm-released"})


@dataclass
class RequestPlan:
    """Everything needed to render one response, decided before anything is sent."""

    kind: Kind
    engine: str
    level: str
    profile: AcceptanceProfile
    model: str
    request_id: str
    created: int
    prompt_tokens: int
    #: Prompt tokens of each prompt (a legacy completion can send several, each
    #: answered by ``n`` choices).
    prompt_counts: tuple[int, ...]
    choices: list[ChoicePlan]
    include_usage: bool
    sglang_details: bool
    sglang_meta: bool
    faults: frozenset[str] = field(default_factory=frozenset)
    #: vLLM's ``continuous_usage_stats``: running usage on every chunk.
    continuous_usage: bool = False
    #: vLLM's ``--enable-per-request-metrics``: timing fields in root ``metrics``.
    vllm_timing: bool = True

    @property
    def single(self) -> bool:
        return len(self.choices) == 1

    @property
    def sglang(self) -> bool:
        """Whether to answer exactly as the SGLang release does."""
        return self.engine in SGLANG_RELEASE

    @property
    def vllm(self) -> bool:
        """Whether to answer exactly as the vLLM release does."""
        return self.engine == "vllm"

    def usage(self) -> JSON:
        completion = sum(c.completion_tokens for c in self.choices)
        if self.sglang:  # SGLang's UsageInfo, every field dumped
            return {
                "prompt_tokens": self.prompt_tokens,
                "total_tokens": self.prompt_tokens + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": None,
                "reasoning_tokens": 0,
                "completion_tokens_details": None,
            }
        if self.vllm:  # vLLM's UsageInfo field order; null details only in a body
            return {
                "prompt_tokens": self.prompt_tokens,
                "total_tokens": self.prompt_tokens + completion,
                "completion_tokens": completion,
            }
        usage: JSON = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }
        if self.engine == "smg" and self.single:
            details = shapes.smg_completion_tokens_details(self.choices[0].generation)
            usage["completion_tokens_details"] = details
        return usage

    # --- engine payloads (fresh objects each call, so faults never leak between uses) --

    def vllm_metrics(self, body: bool = False) -> JSON | None:
        """Root ``metrics`` for the merged vLLM shape; no spec key at level none. For
        n > 1 (or several prompts) vLLM 0.33.0 nulls the whole object.

        The timing fields are there only with ``--enable-per-request-metrics`` (vLLM
        0.34.0 ``chat_completion/serving.py`` and ``completion/serving.py``: without it
        the object is a bare ``PerRequestMetrics()`` holding just
        ``speculative_decoding``, so a body says null for every timing field and the
        usage chunk leaves them out; with neither timing nor stats it is None: a body's
        ``"metrics": null``, no ``metrics`` on the usage chunk).

        A body is dumped whole (vLLM 0.34.0 ``chat_completion/api_router.py``:
        ``model_dump()``), so below the detailed level its ``SpeculativeDecodingMetrics``
        says ``per_step_accepted: null``, and without spec-decode stats its
        ``PerRequestMetrics`` says ``speculative_decoding: null``; the usage chunk
        (``exclude_unset``, ``exclude_none``) leaves the unset per-step keys out
        (``v1/metrics/stats.py`` ``RequestSpecDecodeMetrics.to_dict`` sets them only when
        populated)."""
        if not self.vllm or not self.single:
            return None
        gen = self.choices[0].generation
        if self.vllm_timing:
            out = shapes.vllm_timing_metrics(gen, self.prompt_tokens)
        elif self.level == "none":
            return None
        else:
            out = dict.fromkeys(shapes.VLLM_TIMING_FIELDS) if body else {}
        if self.level == "none" and body:
            out["speculative_decoding"] = None
        elif self.level != "none":
            stats = shapes.vllm_merged(gen, self.profile, self.level)
            if body:
                stats.setdefault("per_step_accepted", None)
                stats.setdefault("per_step_drafted", None)
            F.corrupt_stats(stats, "vllm", self.faults)
            out["speculative_decoding"] = stats
        return out

    def sglext(self) -> JSON | None:
        """SGLang 0.5.23 builds one details object per sequence that ran a verify step
        (``spec_tokens_details_from_meta_info`` gives None without the spec keys) and
        sends no ``sglext`` at all when none did."""
        if not self.sglang_details:
            return None
        details = [
            shapes.sglang_details(c.generation, histogram=self.engine == "sglang")
            for c in self.choices
            if c.generation.num_spec_steps
        ]
        for d in details:
            F.corrupt_stats(d, "sglang", self.faults)
        if not details:
            return None
        return {"spec_tokens_details": details if len(self.choices) > 1 else details[0]}

    def steps(self) -> Iterator[tuple[int, ChoicePlan]]:
        """(step, choice) in stream order: step by step, the choices interleaved."""
        for step in range(max(len(c.pieces) for c in self.choices)):
            for c in self.choices:
                if step < len(c.pieces):
                    yield step, c

    def prompt_tokens_of(self, choice: ChoicePlan) -> int:
        """The prompt tokens of the prompt ``choice`` answers (each prompt gets ``n``)."""
        per_prompt = len(self.choices) // len(self.prompt_counts)
        return self.prompt_counts[choice.index // per_prompt]

    def llamacpp_timings(self, choice: ChoicePlan | None = None) -> JSON:
        """Root ``timings`` of one sequence (default: the first): llama.cpp counts each
        sequence in its own slot and task (``server_slot_stats``)."""
        c = self.choices[0] if choice is None else choice
        timings = shapes.llamacpp_timings(
            c.generation, self.prompt_tokens_of(c), mlx_vlm=self.engine == "mlx-vlm"
        )
        F.corrupt_llamacpp(timings, self.faults)
        return timings

    def trtllm_average(self, choice: ChoicePlan, steps: int) -> JSON:
        """TRT-LLM's ``avg_decoded_tokens_per_iter`` after ``steps`` verify steps: on every
        choice it sends, streamed or not (empty for the other engines)."""
        if self.engine not in TRTLLM_FAMILY:
            return {}
        accepted = sum(choice.generation.per_step_accepted[:steps])
        avg = shapes.trtllm_avg_decoded(steps, accepted)
        return {"avg_decoded_tokens_per_iter": F.corrupt_avg_decoded(avg, self.faults)}

    def choice_stats(self, choice: ChoicePlan) -> JSON:
        """The per-choice stats fields, on the choice of a body or of its finish chunk."""
        gen = choice.generation
        if self.engine == "vllm-premerge":
            stats = None
            if self.level != "none":
                stats = shapes.vllm_premerge(gen, self.profile, self.level)
                F.corrupt_stats(stats, "vllm-premerge", self.faults)
            return {"speculative_decoding_stats": stats}
        if self.engine == "trtllm" and self.level != "none":
            stats = shapes.trtllm_stats(gen, self.profile)  # None: nothing was drafted
            if stats is not None:
                F.corrupt_stats(stats, "trtllm", self.faults)
                return {"speculative_decoding": stats}
        if self.engine in SGLANG_FAMILY and self.sglang_meta:
            meta = shapes.sglang_meta_info(
                gen,
                self.request_id,
                choice.finish_reason,
                self.prompt_tokens,
                self.engine,
                choice.matched_stop,
            )
            F.corrupt_stats(meta, "sglang", self.faults)
            return {"meta_info": meta}
        return {}

    # --- chat and legacy completions --------------------------------------------------

    def _choice(
        self, c: ChoicePlan, steps: int, key: str, content: object, finish: str | None
    ) -> JSON:
        choice = {"index": c.index, key: content, "logprobs": None, "finish_reason": finish}
        if self.sglang:
            choice["matched_stop"] = c.matched_stop if finish else None
        return {**choice, **self.trtllm_average(c, steps)}

    def response(self) -> JSON:
        """The non-streamed body."""
        if self.vllm:
            return releases.vllm_response(self)
        if self.engine == "llamacpp":
            return releases.llamacpp_response(self)
        if self.engine == "mlx-vlm" and self.kind == "chat":
            return releases.mlx_vlm_response(self)
        choices = []
        for c in self.choices:
            steps = c.generation.num_spec_steps
            if self.kind == "chat":
                message: JSON = {"role": "assistant", "content": c.text}
                if self.sglang:
                    message["reasoning_content"] = None
                choice = self._choice(c, steps, "message", message, c.finish_reason)
            else:
                choice = self._choice(c, steps, "text", c.text, c.finish_reason)
            choices.append({**choice, **self.choice_stats(c)})
        out: JSON = {
            "id": self.request_id,
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }
        if self.sglang:  # no system_fingerprint field; the weight version instead
            out["metadata"] = {"weight_version": shapes.SGLANG_WEIGHT_VERSION}
            ext = self.sglext()
            if ext is not None:
                out["sglext"] = ext
        else:
            out["system_fingerprint"] = None
        if self.engine in TIMINGS_FAMILY:
            out["timings"] = self.llamacpp_timings()
        return out

    def chunk(self, *choices: JSON, **root: object) -> JSON:
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": list(choices),
            **root,
        }

    def delta(self, c: ChoicePlan, step: int, delta: JSON, finish: str | None = None) -> JSON:
        """A stream choice once ``step`` verify steps are done (completions: the text).
        SGLang's chat deltas always carry ``reasoning_content`` (``sse_utils.StreamDelta``
        has no default for it, so msgspec never omits it)."""
        if self.kind == "chat":
            if self.sglang:
                delta = {"reasoning_content": None, **delta}
            return self._choice(c, step, "delta", delta, finish)
        return self._choice(c, step, "text", delta.get("content", ""), finish)

    def chunks(self) -> Iterator[JSON]:
        """The stream, chunk by chunk."""
        if self.sglang:
            return releases.sglang_chunks(self)
        if self.vllm:
            return releases.vllm_chunks(self)
        if self.engine == "llamacpp":
            return releases.llamacpp_chunks(self)
        if self.engine == "mlx-vlm" and self.kind == "chat":
            return releases.mlx_vlm_chunks(self)
        return self._chunks()

    def _chunks(self) -> Iterator[JSON]:
        """Role, one content chunk per verify step (choices interleaved), one
        finish_reason chunk per choice, engine tails, usage."""
        if self.kind == "chat":
            for c in self.choices:
                yield self.chunk(self.delta(c, 0, {"role": "assistant", "content": ""}))
        for step, c in self.steps():
            if c.pieces[step]:
                yield self.chunk(self.delta(c, step, {"content": c.pieces[step]}))
        for c in self.choices:
            last = self.delta(c, c.generation.num_spec_steps, {}, c.finish_reason)
            yield self.chunk({**last, **self.choice_stats(c)})
        if self.include_usage:
            chunk = self.chunk(usage=self.usage())
            if self.engine == "mlx-vlm":  # its draft counters ride this chunk only
                chunk["timings"] = self.llamacpp_timings()
            yield chunk

    # --- the Responses API ------------------------------------------------------------

    def _output_item(self, text: str, status: str) -> JSON:
        return {
            "id": "msg_" + self.request_id.removeprefix("resp_"),
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }

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
        if self.engine == "vllm" and self.vllm_timing:  # else left out (``exclude_if``)
            out["metrics"] = {
                **shapes.vllm_timing_metrics(c.generation, self.prompt_tokens),
                "speculative_decoding": None,
            }
        return out

    def _mlx_rate(self) -> JSON:
        """mlx-vlm's ``StreamingTimings`` (``predicted_per_second`` alone); {} elsewhere."""
        if self.engine != "mlx-vlm":
            return {}
        rate = self.llamacpp_timings()["predicted_per_second"]
        return {"timings": {"predicted_per_second": rate}}

    def responses_events(self) -> Iterator[JSON]:
        """A Responses API stream: created, in progress, one text delta per verify step,
        the done events, then ``response.completed`` with the whole response. llama.cpp
        (b11312, PR ggml-org/llama.cpp#25348) puts root ``timings`` on that last event,
        beside ``response``, and numbers no event; vLLM numbers them all. mlx-vlm 0.7.10
        (``server/openai.py`` ``responses_endpoint``) sends no draft counts on a
        Responses stream: its only ``timings`` (``response.output_text.done``'s) holds
        ``predicted_per_second`` alone.

        llama.cpp also puts them on the text delta of a stop string's step when that
        delta has text (the stop began inside a token): ``send_partial_response``
        (``server-context.cpp``) fills ``stats`` once ``slot.stop`` is set, and
        ``server_task_result_cmpl_partial::to_json_oaicompat_resp`` (``server-task.cpp``)
        adds them to a partial's last event, and a partial with no text has none."""
        c = self.choices[0]
        pending = self._output_item("", "in_progress")
        done = self._output_item(c.text, "completed")
        at = {"item_id": pending["id"], "output_index": 0, "content_index": 0}
        started = {**self.responses_body("in_progress"), "output": []}
        started.pop("usage")
        completed: JSON = {"type": "response.completed", "response": self.responses_body()}
        deltas: list[JSON] = [
            {"type": "response.output_text.delta", **at, "delta": p} for p in c.pieces if p
        ]
        if self.engine == "llamacpp":  # mlx-vlm 0.7.10 puts no draft counts on any event
            completed["timings"] = self.llamacpp_timings()
            if isinstance(c.matched_stop, str) and c.pieces[-1]:
                deltas[-1]["timings"] = self.llamacpp_timings()
        events: list[JSON] = [
            {"type": "response.created", "response": started},
            {"type": "response.in_progress", "response": started},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**pending, "content": []},
            },
            {"type": "response.content_part.added", **at, "part": pending["content"][0]},
            *deltas,
            {"type": "response.output_text.done", **at, "text": c.text, **self._mlx_rate()},
            {"type": "response.content_part.done", **at, "part": done["content"][0]},
            {"type": "response.output_item.done", "output_index": 0, "item": done},
            completed,
        ]
        for number, event in enumerate(events):
            if self.engine not in TIMINGS_FAMILY:
                event["sequence_number"] = number
            yield event
