"""What clients send the simulator, and the error bodies it answers with when it refuses.

Request bodies are validated as OpenAI-compatible servers do: the fields every server
reads are typed, anything else is kept, not refused. Each body knows its prompts and its
token limit, so the app plans every route the same way.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

JSON = dict[str, Any]
Kind = Literal["chat", "completion", "responses"]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class OpenAIRequest(BaseModel):
    """Fields every OpenAI-compatible server reads; unknown ones are kept, not refused."""

    KIND: ClassVar[Kind]
    #: The token-limit fields, in the order the server reads them (it reads the first set).
    LIMIT_FIELDS: ClassVar[tuple[str, ...]] = ("max_tokens",)
    model_config = ConfigDict(extra="allow")
    model: str
    n: int = Field(1, ge=1, le=128)
    # Not ge=1 here: llama.cpp takes 0 and -1 (``app.token_limit`` checks per engine).
    max_tokens: int | None = None
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

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's ``continuous_usage_stats``: usage on every chunk, only with
        ``include_usage`` (``serve/utils/api_utils.py`` ``should_include_usage``)."""
        return self.include_usage and bool(
            self.stream_options and self.stream_options.continuous_usage_stats
        )

    def prompts(self) -> list[object]:
        """One entry per prompt; each prompt gets ``n`` sequences."""
        raise NotImplementedError

    def token_limit_field(self) -> str | None:
        """The limit field the server reads: the first of ``LIMIT_FIELDS`` that is set."""
        return next((f for f in self.LIMIT_FIELDS if getattr(self, f) is not None), None)

    def token_limit(self) -> int | None:
        name = self.token_limit_field()
        return None if name is None else int(getattr(self, name))


class ChatCompletionRequest(OpenAIRequest):
    KIND = "chat"
    LIMIT_FIELDS = ("max_completion_tokens", "max_tokens")
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = None

    def prompts(self) -> list[object]:
        return [self.messages]


class CompletionRequest(OpenAIRequest):
    KIND = "completion"
    prompt: str | list[str] | list[int] | list[list[int]]

    def prompts(self) -> list[object]:
        p = self.prompt
        several = isinstance(p, list) and len(p) > 0 and not isinstance(p[0], int)
        return list(p) if several else [p]


class ResponsesRequest(OpenAIRequest):
    KIND = "responses"
    LIMIT_FIELDS = ("max_output_tokens",)
    input: str | list[dict[str, Any]]
    max_output_tokens: int | None = None

    def prompts(self) -> list[object]:
        return [self.input]


def error_body(message: str, type_: str, code: str | int | None, param: str | None = None) -> JSON:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class SimulatorError(Exception):
    """A refusal: HTTP status and JSON body."""

    def __init__(self, status: int, body: JSON) -> None:
        super().__init__(status, body)
        self.status, self.body = status, body

    @classmethod
    def invalid(cls, message: str) -> SimulatorError:
        """OpenAI's 400, for what the simulator itself refuses."""
        return cls(400, error_body(message, "invalid_request_error", None))

    @classmethod
    def sglang_bad_request(cls, message: str) -> SimulatorError:
        """SGLang 0.5.23's 400 (``OpenAIServingBase.handle_request`` in
        ``srt/entrypoints/openai/serving_base.py``, for a ValueError raised while the request
        is converted): its ``ErrorResponse`` at the body's root, not under ``"error"``.
        (SGLang's unreleased main nests the same object under ``"error"``.)"""
        return cls(
            400,
            {
                "object": "error",
                "message": message,
                "type": "BadRequest",
                "param": None,
                "code": 400,
            },
        )

    @classmethod
    def llamacpp_bad_request(cls, message: str) -> SimulatorError:
        """llama.cpp b11312's 400 (``format_error_response`` in ``server-common.cpp``):
        an integer ``code``, and no ``param``."""
        return cls(
            400, {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}
        )

    @classmethod
    def llamacpp_exceeds_context(cls, prompt_tokens: int, n_ctx: int) -> SimulatorError:
        """llama.cpp b11312's refusal of a prompt that fills the context (``update_slots``
        in ``server-context.cpp``; ``server_task_result_error::to_json`` in
        ``server-task.cpp`` adds the two counts to ``format_error_response``'s body)."""
        message = (
            f"request ({prompt_tokens} tokens) exceeds the available context size "
            f"({n_ctx} tokens), try increasing it"
        )
        error = {"code": 400, "message": message, "type": "exceed_context_size_error"}
        return cls(400, {"error": {**error, "n_prompt_tokens": prompt_tokens, "n_ctx": n_ctx}})


#: SGLang 0.5.23's refusal of a streamed chat request that asks for ``return_meta_info``
#: (``OpenAIServingChat._convert_to_internal_request`` in ``serving_chat.py``).
SGLANG_STREAM_META_INFO = (
    "return_meta_info is not supported with streaming. "
    "Please set stream=false when using return_meta_info=true."
)
