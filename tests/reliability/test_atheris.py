"""A bounded coverage-guided run of ``atheris_parse.py`` (libFuzzer via atheris).

The corpus is seeded with every wire example (as a JSON body, JSON lines and SSE) and a
real SSE stream of every engine shape from the simulator. ``SPEC_DECODE_OTEL_ATHERIS_RUNS``
sets the number of iterations (a soak: 1000000).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from reliability_helpers import sse

from record_json import WIRE_EXAMPLES

RUNS = int(os.environ.get("SPEC_DECODE_OTEL_ATHERIS_RUNS", "200000"))
SCRIPT = Path(__file__).with_name("atheris_parse.py")


def _seed(corpus: Path, engine_payloads) -> int:
    corpus.mkdir()
    count = 0

    def put(name: str, text: str) -> None:
        nonlocal count
        (corpus / name).write_text(text, encoding="utf-8")
        count += 1

    for path in sorted(WIRE_EXAMPLES.glob("*.json")):
        vector = json.loads(path.read_text(encoding="utf-8"))
        if "chunks" in vector:
            chunks = vector["chunks"]
            put(f"{path.stem}.sse", sse(chunks).decode())
            put(f"{path.stem}.jsonl", "\n".join(json.dumps(c) for c in chunks))
            put(f"{path.stem}.array.json", json.dumps(chunks))
        else:
            put(f"{path.stem}.json", json.dumps(vector["response"]))
    for label, payload in sorted(engine_payloads.items()):
        put(f"sim-{label}.json", json.dumps(payload.body))
        put(f"sim-{label}.sse", payload.sse)
    return count


def test_coverage_guided_parse_fuzzing(engine_payloads, tmp_path: Path) -> None:
    seeds = _seed(tmp_path / "corpus", engine_payloads)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            f"-runs={RUNS}",
            "-max_len=16384",
            "-timeout=20",
            "-rss_limit_mb=2048",
            f"-artifact_prefix={artifacts}/",
            str(tmp_path / "corpus"),
        ],
        capture_output=True,
        text=True,
        timeout=max(600, RUNS // 50),
        check=False,
    )
    log = proc.stderr[-4000:]
    assert proc.returncode == 0, log
    assert not list(artifacts.iterdir()), log
    assert f"Done {RUNS} runs" in proc.stderr, log
    # The guidance worked: libFuzzer found coverage beyond the seeds.
    cov = [int(m) for m in re.findall(r"cov: (\d+)", proc.stderr)]
    assert cov and max(cov) > 100, log
    assert seeds >= 20
