"""A cached virtual environment for config F, opentelemetry-instrumentation-genai-openai.

F cannot share this environment: it needs ``opentelemetry-util-genai`` 1.3b0, with
which openai-v2 2.4b0 (config D, pinned in the ``bench`` extra) no longer imports. The
venv sees this environment's packages (``--system-site-packages``: the same openai, OTel
SDK and spec_decode_otel) and adds only those two on top, so F's worker differs from
the others by exactly the instrumentation it times.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PACKAGES = (
    "opentelemetry-instrumentation-genai-openai==1.3b0",
    "opentelemetry-util-genai==1.3b0",
)
_CHECK = "import opentelemetry.instrumentation.genai.openai"


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spec-decode-otel" / "genai-openai-venv"


def ensure(venv: Path | None = None) -> tuple[str | None, str]:
    """The venv's interpreter (built on first use), or None and why it could not be."""
    venv = venv or default_dir()
    python = venv / "bin" / "python"
    if python.exists() and _imports(python):
        return str(python), "cached"
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", "--clear", str(venv)],
            check=True,
            capture_output=True,
            text=True,
        )
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *PACKAGES],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        return None, detail.strip().splitlines()[-1] if detail.strip() else repr(exc)
    if not _imports(python):
        return None, "installed, but the instrumentation does not import"
    return str(python), "built"


def _imports(python: Path) -> bool:
    done = subprocess.run([str(python), "-c", _CHECK], capture_output=True, check=False)
    return done.returncode == 0
