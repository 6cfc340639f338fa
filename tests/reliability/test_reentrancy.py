"""Our code runs code that is not ours (plug-in adapters' imports) while it holds a lock
of ours: that code calling back into the instrumentation must not deadlock on it.

Each case runs in a subprocess with a bound on its time: a deadlock would otherwise hold
the lock, and every later test that needs it, for the rest of the session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from spec_decode_otel.adapters import ENTRY_POINT_GROUP

DATA = Path(__file__).resolve().parents[1] / "data"

#: A plug-in whose module, as it is imported, runs detection on a vLLM body: a self-check
#: against a sample payload, or any import-time code that makes an instrumented call.
SELF_CHECKING_PLUGIN = """
import json, sys
import spec_decode_otel

body = json.loads(sys.argv[1])
AT_IMPORT = spec_decode_otel.record_from_json(body)


class SelfCheckAdapter:
    engine = "selfcheck"

    @classmethod
    def can_adapt(cls, responses):
        return any("selfcheck" in r.root for r in responses)

    @classmethod
    def adapt(cls, responses):
        return None
"""

LOAD_AND_REPORT = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from spec_decode_otel.adapters import registered_adapters
names = [a.__name__ for a in registered_adapters()]
import selfcheck_plugin
record = selfcheck_plugin.AT_IMPORT
print(json.dumps({"adapters": names, "engine_at_import": record and record.engine}))
"""


def test_a_plugin_whose_import_runs_detection_is_loaded_without_a_deadlock(
    tmp_path: Path,
) -> None:
    """The registry imports entry-point plug-ins while it holds its lock. A plug-in whose
    import ran detection (``record_from_json`` here; an instrumented call does the same)
    re-entered the registry on the same thread and waited on that lock forever: the
    process hung at ``instrument()`` or its first call (reproduced with
    /tmp/exp9/audit/plugin_reentry.py). Now the import's detection uses the built-in
    adapters, and the plug-in is registered once its import is done."""
    (tmp_path / "selfcheck_plugin.py").write_text(SELF_CHECKING_PLUGIN, encoding="utf-8")
    dist = tmp_path / "selfcheck_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: selfcheck-plugin\nVersion: 1.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nselfcheck = selfcheck_plugin:SelfCheckAdapter\n",
        encoding="utf-8",
    )
    path = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    wire = json.loads((DATA / "wire-examples" / "vllm_merged_summary_chat.json").read_text())
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LOAD_AND_REPORT), json.dumps(wire["response"])],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["adapters"][-1] == "SelfCheckAdapter"
    assert report["engine_at_import"] == "vllm"
    assert "selfcheck" not in done.stderr  # not reported as a plug-in that failed to load
