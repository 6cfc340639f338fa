"""Simulator configuration: one immutable object shared by the CLI, the app and tests."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spec_decode_otel.simulator.acceptance import AcceptanceProfile

Engine = Literal[
    "vllm",
    "vllm-premerge",
    "sglang",
    "sglang-no-histogram",
    "tokenspeed",
    "smg",
    "trtllm",
    "trtllm-released",
    "llamacpp",
    "mlx-vlm",
    "none",
]
Level = Literal["none", "summary", "detailed"]

#: Every wire shape the simulator speaks (``--engine`` / ``x-spec-decode-engine``):
#: ``sglang-no-histogram`` is SGLang with its histogram filled in as ``[]``,
#: ``tokenspeed`` TokenSpeed's ``meta_info`` names, ``smg`` the smg gateway's
#: prediction-token pair in ``usage``, ``mlx-vlm`` llama.cpp's ``timings`` with mlx-vlm's
#: ``draft_rounds`` and ``draft_kind`` (streams: on the usage chunk only).
ENGINES: tuple[str, ...] = get_args(Engine)
LEVELS: tuple[str, ...] = get_args(Level)


class SimulatorConfig(BaseModel):
    """How the simulated server behaves; every field has a CLI flag (see ``cli.py``).

    Per-request headers (listed in ``app.py``) override the engine-facing parts for one
    request, so one server can speak every shape.
    """

    # protected_namespaces=(): `model_alphas` is ours (pydantic < 2.10 warns on model_*).
    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    engine: Engine = "vllm"
    level: Level = "detailed"
    k: int = Field(4, ge=1, le=64, description="draft length when no schedule is given")
    alpha: float = Field(0.7, ge=0.0, le=1.0, description="scalar per-position acceptance")
    alpha_vector: tuple[float, ...] | None = Field(
        None, description="conditional acceptance per draft position; overrides alpha"
    )
    model_alphas: dict[str, tuple[float, ...]] = Field(
        default_factory=dict, description="model name -> acceptance (scalar or per position)"
    )
    draft_schedule: tuple[int, ...] | None = Field(
        None, description="draft length per verify step, cycled; overrides k"
    )
    seed: int = 0
    force_include_usage: bool = False
    vllm_timing_metrics: bool = Field(
        True,
        description=(
            "vLLM's --enable-per-request-metrics: the timing fields in root metrics (off in "
            "vLLM 0.34.0 unless asked for; spec-decode stats come either way)"
        ),
    )
    served_model: str = "spec-sim"
    min_length: int = Field(64, ge=1, description="natural completion length, lower bound")
    max_length: int = Field(256, ge=1, description="natural completion length, upper bound")
    llamacpp_n_ctx: int | None = Field(
        None,
        ge=1,
        description=(
            "llama.cpp: the context size (its -c): a prompt that fills it is refused, a "
            "reply stops where it ends; none by default (a real server takes its model's)"
        ),
    )
    step_delay_ms: float = Field(
        0.0, ge=0.0, description="real time spent per streamed chunk (0 = as fast as possible)"
    )

    @field_validator("alpha_vector", "model_alphas")
    @classmethod
    def _probabilities(
        cls, value: tuple[float, ...] | dict[str, tuple[float, ...]] | None
    ) -> tuple[float, ...] | dict[str, tuple[float, ...]] | None:
        vectors = value.values() if isinstance(value, dict) else [value] if value else []
        for vec in vectors:
            if not vec or any(not 0.0 <= a <= 1.0 for a in vec):
                raise ValueError(f"acceptance probabilities must be in [0, 1]: {vec}")
        return value

    @field_validator("draft_schedule")
    @classmethod
    def _schedule(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or any(d < 1 for d in value)):
            raise ValueError(f"draft lengths must be >= 1: {value}")
        return value

    @model_validator(mode="after")
    def _lengths(self) -> SimulatorConfig:
        if self.min_length > self.max_length:
            raise ValueError("min_length must not exceed max_length")
        return self

    def profile_for(self, model: str, schedule: tuple[int, ...] | None = None) -> AcceptanceProfile:
        """The acceptance profile for one request's model (and optional schedule override)."""
        return AcceptanceProfile(
            alphas=self.model_alphas.get(model) or self.alpha_vector or (self.alpha,),
            schedule=schedule or self.draft_schedule or (self.k,),
        )

    @property
    def models(self) -> list[str]:
        """Names listed by ``GET /v1/models``: the served name plus every configured one."""
        return [self.served_model, *[m for m in self.model_alphas if m != self.served_model]]
