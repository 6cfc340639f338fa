"""A fake engine behind smg's gRPC router, for tests/integration/test_gateway_smg_grpc.py.

It speaks an engine's real gRPC service through the stubs smg-project publishes
(``smg-grpc-proto``, installed in the gateways venv by scripts/install-gateways.sh):
``SglangScheduler``, ``VllmEngine``, ``TokenSpeedScheduler`` or ``TrtllmService``; smg
tells which by calling each one's ``HealthCheck``. Each ``Generate`` answers
the same words; its ``GenerateComplete`` carries the chosen ``spec_accepted_tokens`` and
``spec_draft_tokens``, the two counts the real servicers fill in (``smg-grpc-servicer``
0.14.1: SGLang's ``spec_num_correct_drafts`` / ``spec_num_proposed_drafts``, vLLM's
histogram sum / ``num_draft_tokens``, TokenSpeed's own meta fields). Streamed requests
get one chunk per token first, as those servicers send them.

Before serving it writes, with ``tokenizers``, the word-level tokenizer smg tokenizes
and detokenizes with, and prints ``ready`` once listening. ``GetModelInfo`` names that
directory as the model path: smg loads a worker's tokenizer from it (a bare model name
sends it to the HuggingFace hub).

    python grpc_engine.py RUNTIME PORT TOKENIZER_DIR ACCEPTED DRAFTED

Runs in the gateways venv, never imported by the tests.
"""

from __future__ import annotations

import json
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import smg_grpc_proto
from tokenizers import Tokenizer, models, pre_tokenizers

MODEL = "spec-sim"
SPECIAL = ["<unk>", "<s>", "</s>"]
WORDS = ["a", "striped", "horned", "zebra-unicorn", "gallops", "by", "moonlight"]
ANSWER = WORDS[1:]  # the words every Generate answers
#: runtime -> (generated module, service name)
SERVICES = {
    "sglang": ("sglang_scheduler", "SglangScheduler"),
    "vllm": ("vllm_engine", "VllmEngine"),
    "tokenspeed": ("tokenspeed_scheduler", "TokenSpeedScheduler"),
    "trtllm": ("trtllm_service", "TrtllmService"),
}


def write_tokenizer(directory: Path) -> dict[str, int]:
    """A word-level tokenizer.json and a tokenizer_config.json with a chat template."""
    vocab = {word: i for i, word in enumerate(SPECIAL + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return vocab


def build(kind: type, /, **fields: Any) -> Any:
    """A ``kind`` message with those of ``fields`` its runtime's proto has (they differ)."""
    names = kind.DESCRIPTOR.fields_by_name
    return kind(**{k: v for k, v in fields.items() if k in names})


def make_servicer(
    runtime: str, tokenizer_dir: str, vocab: dict[str, int], accepted: int, drafted: int
) -> Any:
    module_name, service = SERVICES[runtime]
    pb2 = getattr(smg_grpc_proto, f"{module_name}_pb2")
    base = getattr(getattr(smg_grpc_proto, f"{module_name}_pb2_grpc"), f"{service}Servicer")
    answer = [vocab[word] for word in ANSWER]
    eos = vocab["</s>"]

    class Engine(base):  # type: ignore[misc,valid-type]
        def HealthCheck(self, request: Any, context: Any) -> Any:
            return build(pb2.HealthCheckResponse, healthy=True, message="ok", status="OK")

        def Abort(self, request: Any, context: Any) -> Any:
            return build(pb2.AbortResponse, success=True)

        def GetModelInfo(self, request: Any, context: Any) -> Any:
            return build(
                pb2.GetModelInfoResponse,
                model_path=tokenizer_dir, tokenizer_path=tokenizer_dir, model_id=tokenizer_dir,
                served_model_name=MODEL, max_input_len=4096, max_seq_len=4096,
                is_generation=True, max_context_length=4096, max_req_input_len=4096,
                vocab_size=len(vocab), eos_token_ids=[eos], pad_token_id=0,
                bos_token_id=vocab["<s>"], model_type="llama",
                architectures=["LlamaForCausalLM"],
            )  # fmt: skip

        def GetServerInfo(self, request: Any, context: Any) -> Any:
            return build(pb2.GetServerInfoResponse, server_type="grpc", data_parallel_size=1)

        def GetLoads(self, request: Any, context: Any) -> Any:
            return build(pb2.GetLoadsResponse)

        def Generate(self, request: Any, context: Any) -> Any:
            tokenized = request.tokenized
            prompt = len(getattr(tokenized, "input_ids", None) or tokenized.input_token_ids)
            rid = {"request_id": request.request_id}
            if getattr(request, "stream", False) or getattr(request, "streaming", False):
                for n, token in enumerate(answer, 1):
                    chunk = build(
                        pb2.GenerateStreamChunk,
                        token_ids=[token], prompt_tokens=prompt, completion_tokens=n,
                    )  # fmt: skip
                    yield build(pb2.GenerateResponse, chunk=chunk, **rid)
            complete = build(
                pb2.GenerateComplete,
                output_ids=answer, output_token_ids=answer, finish_reason="stop",
                prompt_tokens=prompt, completion_tokens=len(answer),
                spec_accepted_tokens=accepted, spec_draft_tokens=drafted,
            )  # fmt: skip
            yield build(pb2.GenerateResponse, complete=complete, **rid)

    return Engine(), getattr(smg_grpc_proto, f"{module_name}_pb2_grpc"), service


def main() -> None:
    runtime, port, tokenizer_dir, accepted, drafted = sys.argv[1:6]
    vocab = write_tokenizer(Path(tokenizer_dir))
    engine, stubs, service = make_servicer(
        runtime, tokenizer_dir, vocab, int(accepted), int(drafted)
    )
    server = grpc.server(futures.ThreadPoolExecutor(8))
    getattr(stubs, f"add_{service}Servicer_to_server")(engine, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
