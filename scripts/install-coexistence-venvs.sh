#!/usr/bin/env bash
# Build (or reuse) one virtual environment per OpenAI instrumentation (or other library)
# that cannot share the test environment, for the coexistence matrix (tests/integration/
# test_coexistence_matrix.py). Prints the directory holding them on the last line of
# stdout; everything else goes to stderr.
#
#   export SPEC_DECODE_OTEL_COEXISTENCE_VENVS="$(bash scripts/install-coexistence-venvs.sh | tail -n 1)"
#
# Why separate environments: every OpenAI instrumentation registers its
# `opentelemetry_instrumentor` entry point under the same name (`openai`), so
# `opentelemetry-instrument` loads every one installed; the test environment keeps only
# opentelemetry-instrumentation-openai-v2 (the test extra pins it, and it needs
# opentelemetry-util-genai 1.1b0 while genai-openai needs 1.3b0). OpenInference's LiteLLM
# instrumentation registers one too (`litellm`), which would load in every zero-code test
# of the test environment (tests/integration/test_litellm_openinference.py uses it). Each
# venv below holds exactly one other instrumentation (those named *-litellm with LiteLLM),
# spec-decode-otel's dependencies and openai, at the versions the test environment has
# (used as constraints). spec-decode-otel itself is not installed: the tests put the work
# tree's src/ (and, for the matrix, a copy of its metadata) on PYTHONPATH.
#
# Environment:
#   SPEC_DECODE_OTEL_CACHE  cache root (default: $HOME/.cache/spec-decode-otel)
#   PYTHON                  interpreter of the test environment (default: python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
CACHE_ROOT="${SPEC_DECODE_OTEL_CACHE:-${HOME}/.cache/spec-decode-otel}"
log() { printf '[install-coexistence-venvs] %s\n' "$*" >&2; }

# name -> the instrumentation (pinned: the matrix's claims are about these releases)
declare -A VENVS=(
  [genai-openai]="opentelemetry-instrumentation-genai-openai==1.3b0 opentelemetry-util-genai==1.3b0"
  [openinference]="openinference-instrumentation-openai==0.1.66"
  [openllmetry]="opentelemetry-instrumentation-openai==0.62.4"
  # OpenInference's LiteLLM instrumentation, with the LiteLLM the test extra pins
  # (tests/integration/test_litellm_openinference.py).
  [openinference-litellm]="openinference-instrumentation-litellm==0.1.51 litellm==1.110.2"
  # genai-openai and OpenLLMetry again, each with the LiteLLM the test extra pins
  # (tests/integration/test_litellm_beside_other_instrumentations.py). Venvs of their own,
  # not LiteLLM added to the two above: the matrix claims what an openai application
  # without LiteLLM sees, and with LiteLLM installed spec-decode-otel's instrumentor
  # takes another path (it waits for LiteLLM's import to register its callback) and
  # LiteLLM's own dependencies join the environment.
  [genai-openai-litellm]="opentelemetry-instrumentation-genai-openai==1.3b0 opentelemetry-util-genai==1.3b0 litellm==1.110.2"
  [openllmetry-litellm]="opentelemetry-instrumentation-openai==0.62.4 litellm==1.110.2"
  # Sentry's OpenAI integration and Langfuse's drop-in OpenAI wrapper
  # (tests/integration/test_beside_sentry_and_langfuse.py): neither is an OTel
  # instrumentor, both patch the openai SDK's resources when set up in code. Venvs of
  # their own all the same: Langfuse's wrapper patches the SDK's classes as
  # langfuse.openai is imported, and Sentry's integrations patch what they find when
  # sentry_sdk.init() runs, in any test of the test environment that did either.
  [sentry]="sentry-sdk==2.76.0"
  [langfuse]="langfuse==5.2.0"
  # logfire, whose providers setup() records into (tests/integration/test_setup_env.py).
  # A venv of its own: logfire-sdk registers a pydantic plugin, which imports logfire
  # (and the OTLP/HTTP exporter) wherever pydantic builds a model, in every process.
  [logfire]="logfire==5.4.0"
)

# The test environment's versions of what the venvs share with it.
constraints="$("$PYTHON" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null |
  grep -iE '^(openai|opentelemetry-(api|sdk|proto|exporter-[a-z-]+|instrumentation|distro|semantic-conventions)|pydantic|pydantic-core|wrapt|httpx2?|protobuf)==' |
  sort)"
# spec-decode-otel's own requirements with the extras the app uses (openai, SDK + OTLP).
requirements="$("$PYTHON" -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; x = p["optional-dependencies"]; print("\n".join(p["dependencies"] + x["instruments"] + x["otlp"]))')"
key="$(printf '%s\n%s\n%s\n' "$("$PYTHON" -VV)" "$constraints" "$requirements" | sha256sum | cut -c1-16)"
ROOT="${CACHE_ROOT}/coexistence-${key}"

mkdir -p "${CACHE_ROOT}"
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_ROOT}/.coexistence.lock"
  flock 9
fi

for name in "${!VENVS[@]}"; do
  venv="${ROOT}/${name}"
  if [[ -f "${venv}/.complete" ]]; then
    log "cached: ${venv}"
    continue
  fi
  log "building ${venv}: ${VENVS[$name]}"
  rm -rf "${venv}"
  "$PYTHON" -m venv "${venv}"
  printf '%s\n' "$constraints" >"${venv}/constraints.txt"
  # shellcheck disable=SC2086  # the package list is split on purpose
  "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check \
    -c "${venv}/constraints.txt" $requirements opentelemetry-distro ${VENVS[$name]}
  touch "${venv}/.complete"
done
# Venvs built for other requirements: removed once unused for a week. Not at once: two
# environments alternate here (the machine's Python and a virtualenv hold different
# versions, so different keys), and a run may be reading the other's venvs right now.
touch "${ROOT}"
find "${CACHE_ROOT}" -maxdepth 1 -name 'coexistence-*' ! -path "${ROOT}" -mtime +7 -exec rm -rf {} +
echo "${ROOT}"
