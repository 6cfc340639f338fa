"""The real LiteLLM proxy in front of the simulator: what reaches an instrumented client.

One ``litellm --config`` process (LiteLLM 1.110.2, the version pyproject's ``litellm``
extra pins; built by scripts/install-litellm-proxy.sh into a venv of its own) runs for
the module, on loopback, with one model entry per engine shape and route: the two
routes users give self-hosted engines, ``hosted_vllm/<model>`` (LiteLLM's own HTTP
handler) and ``openai/<model>`` (the ``openai`` SDK inside LiteLLM), each with
``api_base`` = the session simulator. The proxy does not forward a client's headers, so
each entry names its shape and seed with ``extra_headers`` in its ``litellm_params``
(``x-spec-decode-engine``, ``x-sim-seed``); request fields such as SGLang's
``return_spec_tokens_details`` are sent by the client, and the proxy forwards them.

The real ``openai`` SDK, instrumented, calls the proxy; plain ``httpx`` fetches the same
request from the proxy (what the proxy sent) and from the simulator directly (what the
engine sent: with ``x-sim-seed`` the simulator answers the same request with the same
sample). Each test names what the real proxy was seen to do.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from instrumentation_helpers import (
    MESSAGES,
    MODEL,
    PROMPT,
    Otel,
    expected_outcome,
    expected_span_attributes,
    only_attributes,
    spec_decode_attributes,
)

from installed import built_by
from ports import free_port
from spec_decode_otel import record_from_json
from spec_decode_otel.payloads import parse_payloads

REPO = Path(__file__).resolve().parents[2]
ENV_PROXY = "SPEC_DECODE_OTEL_LITELLM_PROXY"
INSTALL_HINT = (
    f'export {ENV_PROXY}="$(bash scripts/install-litellm-proxy.sh | tail -n 1)" '
    "(scripts/test.sh does this)"
)
LITELLM_VERSION = "1.110.2"
SEED = 5150
ROUTES = ("hosted_vllm", "openai")
#: shape -> (the simulator's engine, what the client adds to the request body)
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "vllm": ("vllm", {}),
    "vllm-premerge": ("vllm-premerge", {}),
    "sglang": ("sglang", {"return_spec_tokens_details": True}),
    "sglang-meta-info": ("sglang", {"return_meta_info": True}),
    "tokenspeed": ("tokenspeed", {"return_meta_info": True}),
    "trtllm": ("trtllm", {}),
    "trtllm-released": ("trtllm-released", {}),
    "llamacpp": ("llamacpp", {}),
    "mlx-vlm": ("mlx-vlm", {}),
    "smg": ("smg", {}),
}
ENGINES = sorted({engine for engine, _ in SHAPES.values()})
#: SGLang (0.5.23) refuses return_meta_info on a streamed chat request and ignores it on
#: completions: a non-streamed chat call is the only one that carries meta_info.
ONLY_CHAT_JSON = {"sglang-meta-info"}
#: Where each shape puts its stats, as the engine sends them.
ROOT_FIELDS = {"vllm": "metrics", "sglang": "sglext", "llamacpp": "timings", "mlx-vlm": "timings"}
#: vLLM 0.34.0 dumps every field of its choice models (``ChatCompletionResponseChoice``,
#: ``CompletionResponseChoice``), null ones included.
VLLM_CHOICE_FIELDS = {"stop_reason", "token_ids", "routed_experts", "weight_versions"}
CHOICE_FIELDS = {
    "vllm": VLLM_CHOICE_FIELDS,
    "vllm-premerge": {"speculative_decoding_stats"},
    "sglang": {"matched_stop"},
    "sglang-meta-info": {"meta_info", "matched_stop"},
    "tokenspeed": {"meta_info"},
    "trtllm": {"speculative_decoding", "avg_decoded_tokens_per_iter"},
    "trtllm-released": {"avg_decoded_tokens_per_iter"},
}
#: A text completion body's vLLM choice adds the prompt's fields.
COMPLETION_CHOICE_FIELDS = {"vllm": VLLM_CHOICE_FIELDS | {"prompt_logprobs", "prompt_token_ids"}}
#: Choice fields LiteLLM knows beside OpenAI's: a chat body keeps them on the choice too.
KNOWN_CHOICE_FIELDS = {"vllm": {"stop_reason", "token_ids"}}
STATS_ROOT_FIELDS = frozenset({"metrics", "sglext", "timings"})
STATS_CHOICE_FIELDS = frozenset({"speculative_decoding", "speculative_decoding_stats", "meta_info"})


def _speed_only(chunk: dict[str, Any]) -> bool:
    """A chunk whose only engine field is mlx-vlm's per-chunk ``timings`` without draft
    counts (``server/openai.py``, mlx-vlm 0.7.10)."""
    timings = chunk.get("timings")
    return set(chunk) & STATS_ROOT_FIELDS == {"timings"} and (
        isinstance(timings, dict) and "draft_n" not in timings
    )


# --------------------------------------------------------------------------- the proxy


@dataclass(frozen=True)
class Proxy:
    base_url: str
    key: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=self.key, max_retries=0)


@pytest.fixture(scope="module")
def litellm_executable() -> Path:
    """The proxy venv's ``litellm``: scripts/test.sh builds it (cached) and exports its
    path; a bare pytest run builds it here. Never skipped."""
    path = built_by("install-litellm-proxy.sh", ENV_PROXY)
    assert path.is_file() and os.access(path, os.X_OK), f"{path} is not executable: {INSTALL_HINT}"
    return path


def model_name(route: str, engine: str) -> str:
    return f"{route}-{engine}"


def proxy_config(simulator_url: str, key: str) -> dict[str, Any]:
    entries = [
        {
            "model_name": model_name(route, engine),
            "litellm_params": {
                "model": f"{route}/{MODEL}",
                "api_base": simulator_url,
                "api_key": "sk-test",
                "extra_headers": {"x-spec-decode-engine": engine, "x-sim-seed": str(SEED)},
            },
        }
        for route in ROUTES
        for engine in ENGINES
    ]
    return {"model_list": entries, "general_settings": {"master_key": key}}


@pytest.fixture(scope="module")
def litellm_proxy(
    simulator_url: str, litellm_executable: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    """``litellm --config`` on a free loopback port, one worker, no database, a master
    key; ready once ``/health/readiness`` answers 200 (about 10 s here)."""
    workdir = tmp_path_factory.mktemp("litellm-proxy")
    key = "sk-" + secrets.token_hex(32)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(proxy_config(simulator_url, key)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no attempt to fetch the price list
    with running_proxy(litellm_executable, config, env) as base:
        yield Proxy(base + "/v1", key)


@contextlib.contextmanager
def running_proxy(executable: Path, config: Path, env: dict[str, str]) -> Iterator[str]:
    """``litellm --config`` on a free loopback port with one worker, run in the config's
    directory (its log: ``proxy.log`` there); yields its base URL once
    ``/health/readiness`` answers 200, and stops it afterwards."""
    workdir = config.parent
    port = free_port()
    serve = ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    log_path = workdir / "proxy.log"
    log = log_path.open("w+")
    proc = subprocess.Popen(
        [str(executable), "--config", str(config), *serve],
        cwd=workdir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "the proxy exited:\n" + log_path.read_text()
            try:
                if httpx.get(base + "/health/readiness", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the proxy was not ready in 120 s"
            time.sleep(0.25)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
        log.close()


def test_the_proxy_is_litellm_1_110_2(litellm_executable: Path) -> None:
    """The claims below are about LiteLLM 1.110.2 (the proxy venv's own ``litellm``)."""
    python = litellm_executable.parent / "python"
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == LITELLM_VERSION, done.stderr


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Case:
    route: str
    shape: str
    api: str
    stream: bool

    @property
    def engine(self) -> str:
        return SHAPES[self.shape][0]

    def body(self) -> dict[str, Any]:
        """The request body (model aside): the same to the proxy and to the simulator."""
        if self.api == "responses":
            return {"max_output_tokens": 24, "stream": self.stream, "input": PROMPT}
        if self.api == "messages":  # Anthropic's Messages API
            return {"max_tokens": 24, "stream": self.stream, "messages": MESSAGES}
        body: dict[str, Any] = {"max_tokens": 24, "stream": self.stream, **SHAPES[self.shape][1]}
        if self.api == "chat":
            body["messages"] = MESSAGES
        else:
            body["prompt"] = PROMPT
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def sdk_kwargs(self) -> dict[str, Any]:
        body = self.body()
        extra = SHAPES[self.shape][1]
        kwargs = {k: v for k, v in body.items() if k not in extra}
        return {**kwargs, "model": model_name(self.route, self.engine), "extra_body": extra}

    def path(self) -> str:
        paths = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}
        return paths.get(self.api, "/completions")


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """The decoded body, or the list of a stream's chunks."""
    response = httpx.post(url, json=body, headers=headers, timeout=30)
    response.raise_for_status()
    return parse_payloads(response.text) if body.get("stream") else response.json()


def through_proxy(proxy: Proxy, case: Case) -> Any:
    body = {**case.body(), "model": model_name(case.route, case.engine)}
    return post(proxy.base_url + case.path(), body, {"authorization": f"Bearer {proxy.key}"})


def direct(simulator_url: str, case: Case, gateway: str | None = None) -> Any:
    headers = {"x-spec-decode-engine": case.engine, "x-sim-seed": str(SEED)}
    if gateway:
        headers["x-sim-gateway"] = gateway
    return post(simulator_url + case.path(), {**case.body(), "model": MODEL}, headers)


def call(proxy: Proxy, case: Case) -> list[Any]:
    """One instrumented SDK call through the proxy; every chunk of a stream is read."""
    with proxy.client() as client:
        create = client.chat.completions.create if case.api == "chat" else client.completions.create
        result = create(**case.sdk_kwargs())
        return list(result) if case.stream else [result]


def extra_choice_fields(choice: dict[str, Any]) -> set[str]:
    standard = {"index", "message", "delta", "text", "logprobs", "finish_reason"}
    return set(choice) - standard - {"provider_specific_fields"}


def cases(stream: bool) -> list[Case]:
    return [
        Case(route, shape, api, stream)
        for route in ROUTES
        for shape in SHAPES
        for api in ("chat", "completions")
        if shape not in ONLY_CHAT_JSON or (api == "chat" and not stream)
    ]


def case_id(case: Case) -> str:
    return f"{case.route}-{case.shape}-{case.api}-{'sse' if case.stream else 'json'}"


# --------------------------------------------------------------------------- non-streamed


@pytest.mark.parametrize("case", cases(stream=False), ids=case_id)
def test_a_body_keeps_the_engines_record(
    case: Case, litellm_proxy: Proxy, simulator_url: str, instrumented: Otel
) -> None:
    """LiteLLM 1.110.2 proxy, real process: a non-streamed body keeps every engine's
    stats, through ``hosted_vllm/`` and ``openai/`` alike. Observed: in a chat body each
    choice's own fields (TRT-LLM's ``speculative_decoding`` and
    ``avg_decoded_tokens_per_iter``, pre-merge vLLM's ``speculative_decoding_stats``,
    SGLang's and TokenSpeed's ``meta_info``, SGLang's ``matched_stop``) move into
    ``choices[i].provider_specific_fields`` (``{}`` when there are none; vLLM's
    ``stop_reason`` and ``token_ids``, which LiteLLM knows, are copied there and stay;
    vLLM's null ``routed_experts`` and ``weight_versions`` move); a text
    completion keeps them on the choice; root ``metrics``, ``sglext``, ``timings`` and
    the ``usage`` pair (smg) stay. The span's ``spec_decode.*`` is the record of the
    engine's direct answer to the same seeded request."""
    (response,) = call(litellm_proxy, case)
    assert response.choices
    sent = direct(simulator_url, case)
    record = record_from_json(sent, case.body())
    assert record is not None

    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == expected_outcome(record)
    assert spec_decode_attributes(attrs) == expected_span_attributes(record)

    proxied = through_proxy(litellm_proxy, case)
    assert record_from_json(proxied, case.body()) == record
    (choice,) = proxied["choices"]
    moved = choice.get("provider_specific_fields")
    if case.api == "chat":
        assert extra_choice_fields(choice) == KNOWN_CHOICE_FIELDS.get(case.shape, set())
        assert set(moved) == CHOICE_FIELDS.get(case.shape, set())
    else:
        assert moved is None
        expected = COMPLETION_CHOICE_FIELDS.get(case.shape) or CHOICE_FIELDS.get(case.shape, set())
        assert extra_choice_fields(choice) == expected
    root = ROOT_FIELDS.get(case.shape)
    if root is not None:
        assert proxied[root] == sent[root]
    if case.shape == "smg":
        pair = ("accepted_prediction_tokens", "rejected_prediction_tokens")
        details = proxied["usage"]["completion_tokens_details"]
        assert {k: details[k] for k in pair} == {
            k: sent["usage"]["completion_tokens_details"][k] for k in pair
        }


def test_n_above_one_the_null_vllm_metrics_is_dropped_from_a_chat_body(
    litellm_proxy: Proxy, simulator_url: str, instrumented: Otel
) -> None:
    """LiteLLM 1.110.2 proxy, real process: vLLM nulls ``metrics`` for n > 1; the proxy
    drops a null root field from a chat body (a text completion keeps it). Either way
    the call is ``multi_sequence``, as it is straight from vLLM."""
    chat = Case("hosted_vllm", "vllm", "chat", False)
    with litellm_proxy.client() as client:
        client.chat.completions.create(**chat.sdk_kwargs(), n=2)
    assert only_attributes(instrumented)["spec_decode.outcome"] == "multi_sequence"
    headers = {"authorization": f"Bearer {litellm_proxy.key}"}
    for case, kept in ((chat, False), (Case("hosted_vllm", "vllm", "completions", False), True)):
        body = {**case.body(), "n": 2}
        proxied = post(
            litellm_proxy.base_url + case.path(), {**body, "model": "hosted_vllm-vllm"}, headers
        )
        sent = post(
            simulator_url + case.path(),
            {**body, "model": MODEL},
            {"x-spec-decode-engine": "vllm", "x-sim-seed": str(SEED)},
        )
        assert sent["metrics"] is None
        assert ("metrics" in proxied) is kept


# --------------------------------------------------------------------------- streams

#: What a stream through the proxy still gives (observed); every other stream: nothing.
STREAM_OUTCOMES = {("trtllm", "chat"): "partial", ("trtllm-released", "chat"): "partial"}


def stream_outcome(case: Case) -> str:
    if case.shape == "smg":
        return "partial"  # the usage pair survives
    return STREAM_OUTCOMES.get((case.shape, case.api), "no_stats")


@pytest.mark.parametrize("case", cases(stream=True), ids=case_id)
def test_a_stream_loses_the_engines_stats(
    case: Case, litellm_proxy: Proxy, simulator_url: str, instrumented: Otel
) -> None:
    """LiteLLM 1.110.2 proxy, real process: the proxy rebuilds every chunk, so a stream
    (``include_usage`` on) loses what engines put beside the OpenAI fields. Observed:
    root ``metrics`` (vLLM's usage chunk) and ``timings`` (llama.cpp, mlx-vlm) dropped,
    SGLang's ``sglext`` chunk not sent, the finish chunk's ``speculative_decoding`` /
    ``speculative_decoding_stats`` dropped; kept: TRT-LLM's running
    ``avg_decoded_tokens_per_iter`` on chat chunks before the finish chunk (a mean only,
    as from a released TRT-LLM) and smg's ``usage`` pair. Nothing raises; the outcome
    says so (``no_stats``)."""
    chunks = call(litellm_proxy, case)
    assert chunks
    sent = direct(simulator_url, case)
    engine_record = record_from_json(sent, case.body())
    assert engine_record is not None  # the engine sent stats: the proxy lost them

    proxied = through_proxy(litellm_proxy, case)
    # mlx-vlm 0.7.10 puts ``timings: {predicted_per_second}`` on every chunk, which the
    # proxy keeps on the ``openai/`` route: a speed, no draft counters
    assert not [c for c in proxied if STATS_ROOT_FIELDS & set(c) and not _speed_only(c)]
    assert not [c for chunk in proxied for c in chunk["choices"] if STATS_CHOICE_FIELDS & set(c)]
    record = record_from_json(proxied, case.body())
    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == expected_outcome(record) == stream_outcome(case)
    if record is None:
        assert spec_decode_attributes(attrs) == {}
        return
    assert spec_decode_attributes(attrs) == expected_span_attributes(record)
    if case.shape == "smg":
        assert record == engine_record
    else:  # TRT-LLM: the engine's own final average (prefill included), nothing else
        averages = [
            c["avg_decoded_tokens_per_iter"]
            for chunk in sent
            for c in chunk["choices"]
            if "avg_decoded_tokens_per_iter" in c
        ]
        assert record.mean_acceptance_length == pytest.approx(averages[-1])
        assert record.num_accepted_draft_tokens is None and record.acceptance_histogram is None


# --------------------------------------------------------------------------- the imitation


def comparable(payload: Any) -> Any:
    """A body or chunk list minus what differs between two answers (ids, ``created``,
    the ``model`` the proxy names after its own entry, SGLang's ``meta_info.id``) and
    minus chunks that carry nothing (the real proxy turns SGLang's ``sglext`` chunk into
    an empty ``{"choices": []}`` on a chat stream with ``include_usage`` and drops it
    otherwise; the imitation always drops it)."""
    if isinstance(payload, list):
        return [comparable(c) for c in payload if c.get("choices") or c.get("usage")]
    out = {k: v for k, v in payload.items() if k not in ("id", "created", "model")}
    choices = []
    for choice in out.get("choices") or ():
        choice = dict(choice)
        for holder in (choice, choice.get("provider_specific_fields") or {}):
            if isinstance(holder.get("meta_info"), dict):
                holder["meta_info"] = {k: v for k, v in holder["meta_info"].items() if k != "id"}
        choices.append(choice)
    return {**out, "choices": choices}


@pytest.mark.parametrize(
    "case", [c for c in cases(False) + cases(True) if c.route == "hosted_vllm"], ids=case_id
)
def test_the_simulators_imitation_is_what_the_proxy_sends(
    case: Case, litellm_proxy: Proxy, simulator_url: str
) -> None:
    """LiteLLM 1.110.2 proxy, real process, against the simulator's ``x-sim-gateway:
    litellm-proxy``: the same seeded request gives the same body or chunks (ids,
    ``created`` and ``model`` aside), so the tests that use the imitation test what the
    real proxy sends. (The ``openai/`` route sends the same: the tests above.)"""
    proxied = through_proxy(litellm_proxy, case)
    imitated = direct(simulator_url, case, gateway="litellm-proxy")
    assert comparable(imitated) == comparable(proxied)


#: vLLM 0.34.0 answers the proxy rebuilds differently: a matched stop string
#: (``stop_reason``, the last text empty), a stream without the usage chunk (vLLM puts
#: ``system_fingerprint`` on the finish chunk) and one with usage on every chunk.
VLLM_VARIANTS: dict[str, dict[str, Any]] = {
    "stop-string": {"stop": [" cache"]},
    "no-usage": {"stream_options": None},
    "continuous-usage": {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
}
VLLM_VARIANT_CASES = [
    (Case("hosted_vllm", "vllm", api, stream), variant)
    for api in ("chat", "completions")
    for stream in (False, True)
    for variant in VLLM_VARIANTS
    if stream or variant == "stop-string"
]


def vllm_variant(proxy: Proxy, simulator_url: str, case: Case, variant: str) -> tuple[Any, ...]:
    """What the engine sent, what the proxy sent, what the imitation sends."""
    body = {k: v for k, v in {**case.body(), **VLLM_VARIANTS[variant]}.items() if v is not None}
    engine = {"x-spec-decode-engine": "vllm", "x-sim-seed": str(SEED)}
    direct_url = simulator_url + case.path()
    return (
        post(direct_url, {**body, "model": MODEL}, engine),
        post(
            proxy.base_url + case.path(),
            {**body, "model": model_name(case.route, case.engine)},
            {"authorization": f"Bearer {proxy.key}"},
        ),
        post(direct_url, {**body, "model": MODEL}, {**engine, "x-sim-gateway": "litellm-proxy"}),
    )


@pytest.mark.parametrize(
    "case,variant", VLLM_VARIANT_CASES, ids=[f"{case_id(c)}-{v}" for c, v in VLLM_VARIANT_CASES]
)
def test_the_imitation_is_what_the_proxy_sends_for_vllm_stop_strings_and_usage_options(
    case: Case, variant: str, litellm_proxy: Proxy, simulator_url: str
) -> None:
    """LiteLLM 1.110.2 proxy, real process, against the imitation, on vLLM 0.34.0
    answers the default request does not give: the stop string matched (the seeded text
    holds it), no usage chunk, usage on every chunk (which the proxy drops from every
    chunk but the last)."""
    sent, proxied, imitated = vllm_variant(litellm_proxy, simulator_url, case, variant)
    if variant == "stop-string":
        reasons = [
            c.get("stop_reason") for p in (sent if case.stream else [sent]) for c in p["choices"]
        ]
        assert " cache" in reasons
    assert comparable(imitated) == comparable(proxied)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_the_proxy_sends_a_vllm_finish_chunk_text_first_then_the_finish_reason(
    api: str, litellm_proxy: Proxy, simulator_url: str
) -> None:
    """LiteLLM 1.110.2 proxy, real process: vLLM 0.34.0 puts a sequence's last text on
    its finish chunk (``chat_completion/serving.py`` ``chat_completion_stream_generator``,
    ``completion/serving.py`` ``completion_stream_generator``); the proxy sends that
    text on a chunk of its own, with ``stop_reason`` (and, chat, ``token_ids``), then the
    ``finish_reason`` with no text. A chat finish chunk sent so gets the stream's
    ``system_fingerprint`` (wherever vLLM sent it: here, no usage chunk asked for, on its
    finish chunk); a text completion chunk never has one."""
    case = Case("hosted_vllm", "vllm", api, True)
    sent, proxied, _ = vllm_variant(litellm_proxy, simulator_url, case, "no-usage")
    (last,) = sent[-1]["choices"]
    text = "content" if api == "chat" else "text"
    assert last["finish_reason"] and (last.get("delta") or last)[text]
    (text_part,) = proxied[-2]["choices"]
    (finish_part,) = proxied[-1]["choices"]
    assert (text_part.get("delta") or text_part)[text] == (last.get("delta") or last)[text]
    assert "finish_reason" not in text_part and "stop_reason" in text_part
    assert finish_part["finish_reason"] == last["finish_reason"]
    assert not (finish_part.get("delta") or {}).get("content") and not finish_part.get("text")
    if api == "chat":
        assert proxied[-1]["system_fingerprint"] == sent[-1]["system_fingerprint"]
    else:
        assert not any("system_fingerprint" in c for c in proxied)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("shape", ["vllm", "llamacpp"])
@pytest.mark.parametrize("route", ROUTES)
def test_a_responses_api_call_keeps_the_engines_fields(
    route: str,
    shape: str,
    stream: bool,
    litellm_proxy: Proxy,
    simulator_url: str,
    instrumented: Otel,
) -> None:
    """LiteLLM 1.110.2 proxy, real process, ``/v1/responses`` on both routes (posted to the
    engine's ``/v1/responses``): the response keeps vLLM's root ``metrics`` (0.34.0: timing
    fields only, so no record), and a stream's ``response.completed`` event keeps
    llama.cpp's ``timings`` beside the response. The instrumented client's span has the
    record of the engine's direct answer to the same seeded request (llama.cpp streams:
    ``partial``; the rest: ``no_stats``)."""
    case = Case(route, shape, "responses", stream)
    sent = direct(simulator_url, case)
    record = record_from_json(sent)
    assert (record is not None) == (shape == "llamacpp" and stream)
    with litellm_proxy.client() as client:
        result = client.responses.create(**{**case.body(), "model": model_name(route, case.engine)})
        events = list(result) if stream else [result]
    assert events

    attrs = only_attributes(instrumented)
    assert attrs["spec_decode.outcome"] == expected_outcome(record)
    assert spec_decode_attributes(attrs) == (
        {} if record is None else expected_span_attributes(record)
    )
    proxied = through_proxy(litellm_proxy, case)
    assert record_from_json(proxied) == record
    if not stream:
        assert proxied.get("metrics") == sent.get("metrics")
    else:
        assert proxied[-1]["type"] == sent[-1]["type"] == "response.completed"
        assert proxied[-1].get("timings") == sent[-1].get("timings")
        assert proxied[-1]["response"].get("metrics") == sent[-1]["response"].get("metrics")
