#!/usr/bin/env bash
# The versions the package claims, tested: the unit tests and the core instrumentation
# integration tests, in one virtual environment per claim (scripts/test.sh runs this after
# the main pytest run, which covers Python 3.11 with the latest packages).
#
#   oldest-py3.10  the oldest Python requires-python allows, with every runtime requirement
#                  (the core and the otlp, simulator and instruments extras) pinned to the
#                  lower bound pyproject.toml declares: a bound is tested as soon as it is
#                  written, and a requirement without a lower bound is an error here.
#   latest-py3.12  the newest Pythons, with the versions of the main test environment
#   latest-py3.13  ($PYTHON's packages, used as constraints): the latest, as the main run.
#   openai2-py3.11 openai's major 2 (its last release), between the floor (1.x) and the
#                  latest (3.x) the instruments extra allows; the other packages as latest.
#                  Also the tests of frameworks that require openai < 3 (Instructor,
#                  LlamaIndex), installed in this venv only, and of openai 2's aiohttp
#                  transport (another package than openai 3's).
#
# Venvs are cached under $SPEC_DECODE_OTEL_CACHE/venvs (default ~/.cache/spec-decode-otel),
# keyed by interpreter, pins and requirements; one of another key goes after a week
# unused. The project itself is installed from this checkout (editable, no index) on every
# run, so each venv tests this tree. The runs go in parallel, each with its own log and
# temporary directory; pytest's exit code 5 (nothing collected) counts as a failure.
#
# Environment:
#   PYTHON                  interpreter of the main test environment (default: python3)
#   SPEC_DECODE_OTEL_CACHE  cache root (default: $HOME/.cache/spec-decode-otel)
#   PYENV_ROOT              where pyenv keeps interpreters (default: $HOME/.pyenv)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"

PYTHON="${PYTHON:-python3}"
CACHE_ROOT="${SPEC_DECODE_OTEL_CACHE:-${HOME}/.cache/spec-decode-otel}"
VENVS="${CACHE_ROOT}/venvs"
log() { printf '[test-matrix] %s\n' "$*" >&2; }

OLDEST_PYTHON=3.10
LATEST_PYTHONS=(3.12 3.13)
OPENAI_2_PYTHON=3.11
OPENAI_2="openai==2.54.0"
# Frameworks whose releases require openai < 3, tested with openai 2 (in the openai2 venv
# only; tests/integration/conftest.py keeps the runs on openai 3 from collecting them):
# Instructor 1.17.0 requires jiter<0.15 (every openai 3 from 3.3.1 on requires >=0.16),
# llama-index-llms-openai 0.8 (under OpenAILike 0.8.1) requires openai<3. And httpx2, which
# their span_counter fixture's module (tests/reliability/reliability_helpers.py) imports.
OPENAI_2_FRAMEWORKS=(instructor==1.17.0 llama-index-llms-openai-like==0.8.1 httpx2)
# openai 2's aiohttp transport is another package's (httpx-aiohttp, on httpx; openai 3
# vendors its own, on httpx2): its `aiohttp` extra, and the test of that transport.
OPENAI_2_FRAMEWORKS+=(aiohttp "httpx-aiohttp>=0.1.9")
OPENAI_2_TESTS=(tests/integration/test_instructor.py tests/integration/test_llamaindex.py
  tests/integration/test_aiohttp_transport.py)
TEST_TOOLS=(pytest pytest-asyncio pytest-timeout hypothesis httpx hatchling editables)
EXTRAS="otlp,simulator,instruments"
TESTS=(
  tests/unit
  tests/integration/test_instrumentation_streams.py
  tests/integration/test_instrumentation_responses.py
  tests/integration/test_instrumentation_options.py
  tests/integration/test_instrumentation_defaults.py
  tests/integration/test_instrumentation_engines.py
  tests/integration/test_outcomes.py
  tests/integration/test_raw_stream_reads.py
  tests/integration/test_check_cli.py
)
# Tests of SDK surface newer than the oldest declared openai (they run in the other venvs).
# A test that needs a newer API than the floor goes here, with the reason.
OLDEST_SKIP=(
  # openai.types.responses (the Responses API SDK types) appeared in openai 1.66
  "--deselect=tests/unit/test_vectors.py::test_vector_from_openai_sdk_objects_gives_expected_record[llamacpp_responses_stream]"
  "--deselect=tests/unit/test_vectors.py::test_vector_from_openai_sdk_objects_gives_expected_record[vllm_responses_timing_metrics]"
  --deselect=tests/unit/test_adapters_wire_fidelity.py::test_a_responses_body_shows_output_tokens_as_completion_tokens
  --deselect=tests/unit/test_adapters_wire_fidelity.py::test_a_completed_event_merges_the_event_root_and_the_response_root
  --deselect=tests/unit/test_adapters_wire_fidelity.py::test_a_responses_body_with_vllms_spec_decode_object_is_read
  --deselect=tests/integration/test_raw_stream_reads.py::test_a_responses_api_stream_read_as_lines_gives_what_parse_gives
  --deselect=tests/integration/test_outcomes.py::test_no_include_usage_hint_for_responses_api_streams
  "--deselect=tests/unit/test_capture.py::test_a_responses_usage_with_both_namings_counts_by_its_own_names[sdk]"
  "--deselect=tests/unit/test_capture.py::test_a_responses_usage_with_both_namings_counts_by_its_own_names[event-sdk]"
  # chat.completions.parse()/stream() sit under client.beta in openai 1.40
  --deselect=tests/integration/test_instrumentation_responses.py::test_chat_completions_parse_is_recorded
  --deselect=tests/integration/test_instrumentation_responses.py::test_stream_helper_
  # ...and there has no with_streaming_response
  --deselect=tests/integration/test_instrumentation_responses.py::test_a_parse_that_fails_on_a_streaming_response_ends_as_the_plain_parse_does
)
# Not declared by us: openai 1.40 passes `proxies` to httpx.Client, which httpx 0.28
# removed, so the oldest openai needs the httpx of its day.
OLDEST_EXTRA_PINS="httpx==0.27.0"
# The packages whose versions key a cached venv (a regular expression of names).
KEY_PACKAGES='openai|opentelemetry-[a-z-]+|pydantic(-core)?|wrapt|fastapi|starlette|uvicorn|httpx2?|httpcore|pytest[a-z-]*|hypothesis'
# The main run fuzzes at full depth; here the property tests only check compatibility.
export SPEC_DECODE_OTEL_FUZZ_EXAMPLES="${SPEC_DECODE_OTEL_FUZZ_EXAMPLES:-50}"

find_python() { # X.Y -> path of an interpreter of that version
  local version="$1" candidate found=""
  for candidate in "${PYENV_ROOT:-${HOME}/.pyenv}"/versions/"${version}".*/bin/python"${version}"; do
    [[ -x "$candidate" ]] && found="$candidate"
  done
  [[ -n "$found" ]] || found="$(command -v "python${version}" || true)"
  if [[ -z "$found" ]]; then
    log "no Python ${version} found (pyenv install ${version}, or put python${version} on PATH)"
    return 1
  fi
  echo "$found"
}

# The runtime requirements a matrix venv installs (the core and $EXTRAS), one a line.
requirements() {
  "$PYTHON" -c '
import sys
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
wanted = [*project["dependencies"], *(r for x in sys.argv[1].split(",") for r in extras[x])]
print("\n".join(wanted))
' "$EXTRAS"
}

# Every runtime requirement at its declared lower bound, one `name==version` a line.
oldest_pins() {
  requirements | "$PYTHON" -c '
import sys

from packaging.requirements import Requirement

pins = {}
for text in sys.stdin.read().splitlines():
    requirement = Requirement(text)
    floors = [s.version for s in requirement.specifier if s.operator == ">="]
    if not floors:
        sys.exit(f"test-matrix: {text!r} declares no lower bound to test")
    pins[requirement.name] = f"{requirement.name}=={floors[0]}"
print("\n".join(sorted(pins.values())))
'
}

# The main environment's versions, as constraints for everything a matrix venv installs.
latest_pins() {
  "$PYTHON" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null |
    grep -v '^-e ' | grep -iv '^spec-decode-otel==' | sort
}

# build NAME X.Y PINS [PACKAGE...] -> prints the venv's directory (cached; rebuilt when the
# key changes). PACKAGEs: installed beside the test tools in this venv only.
build() {
  local name="$1" version="$2" pins="$3" python key venv
  local extra=("${@:4}")
  python="$(find_python "$version")"
  # Keyed by what decides the tests' outcome: other packages of the main environment may
  # move without a rebuild.
  key="$(printf '%s\n%s\n%s\n%s\n%s\n' "$("$python" -VV)" "$(requirements)" "${TEST_TOOLS[*]}" \
    "$(grep -iE "^(${KEY_PACKAGES})==" <<<"$pins" || true)" "${extra[*]}" |
    sha256sum | cut -c1-16)"
  venv="${VENVS}/${name}-${key}"
  if [[ ! -f "${venv}/.complete" ]]; then
    log "building ${venv}"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    printf '%s\n' "$pins" >"${venv}/constraints.txt"
    "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check \
      -c "${venv}/constraints.txt" -e "${REPO}[${EXTRAS}]" "${TEST_TOOLS[@]}" "${extra[@]}" >&2
    touch "${venv}/.complete"
  fi
  # This checkout, whatever the venv was built from; then the whole set must agree.
  "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation -e "$REPO" >&2
  "${venv}/bin/python" -m pip check >&2
  # Venvs of this name built for other pins: removed once unused for a week, not at once.
  # The latest pins are the main environment's, so the machine's Python and a virtualenv
  # key them differently, and runs of the two would otherwise rebuild them in turn.
  touch "$venv"
  find "$VENVS" -maxdepth 1 -name "${name}-*" ! -path "$venv" -mtime +7 -exec rm -rf {} +
  echo "$venv"
}

mkdir -p "$VENVS"
if command -v flock >/dev/null 2>&1; then
  exec 9>"${VENVS}/.lock"
  flock 9
fi

declare -A VENV_OF
oldest="$(oldest_pins)"
log "oldest: Python ${OLDEST_PYTHON}, $(echo "$oldest" | tr '\n' ' ')${OLDEST_EXTRA_PINS}"
VENV_OF[oldest-py${OLDEST_PYTHON}]="$(build "oldest-py${OLDEST_PYTHON}" "$OLDEST_PYTHON" \
  "$(printf '%s\n%s\n' "$oldest" "$OLDEST_EXTRA_PINS")")"
latest="$(latest_pins)"
for version in "${LATEST_PYTHONS[@]}"; do
  VENV_OF[latest-py${version}]="$(build "latest-py${version}" "$version" "$latest")"
done
# Nor the main environment's jiter (openai 3 needs a newer one than Instructor allows) or
# setuptools (LlamaIndex's core needs a newer one than a plain Python 3.11 venv has).
VENV_OF[openai2-py${OPENAI_2_PYTHON}]="$(build "openai2-py${OPENAI_2_PYTHON}" \
  "$OPENAI_2_PYTHON" "$(grep -ivE '^(openai|jiter|setuptools)==' <<<"$latest"; echo "$OPENAI_2")" \
  "${OPENAI_2_FRAMEWORKS[@]}")"

LOGS="$(mktemp -d)"
declare -A PID_OF
for name in "${!VENV_OF[@]}"; do
  venv="${VENV_OF[$name]}"
  args=() # this venv's own: tests deselected, or tests added
  [[ "$name" == oldest-* ]] && args=("${OLDEST_SKIP[@]}")
  [[ "$name" == openai2-* ]] && args=("${OPENAI_2_TESTS[@]}")
  versions="$("${venv}/bin/python" -m pip list --format=freeze --disable-pip-version-check |
    grep -iE '^(openai|opentelemetry-(api|sdk|instrumentation)|pydantic|wrapt)==' | tr '\n' ' ')"
  log "${name}: $("${venv}/bin/python" -V) ${versions}"
  (
    cd "$REPO"
    exec "${venv}/bin/python" -m pytest -p no:cacheprovider -q --basetemp="${LOGS}/${name}-tmp" \
      "${TESTS[@]}" "${args[@]}"
  ) >"${LOGS}/${name}.log" 2>&1 &
  PID_OF[$name]=$!
done

failed=()
for name in "${!PID_OF[@]}"; do
  status=0
  wait "${PID_OF[$name]}" || status=$?
  if [[ $status -ne 0 ]]; then
    [[ $status -eq 5 ]] && log "${name}: pytest collected no tests"
    failed+=("$name")
    log "${name}: FAILED (exit ${status}); its log:"
    cat "${LOGS}/${name}.log" >&2
  else
    log "${name}: $(tail -n 1 "${LOGS}/${name}.log")"
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  log "failed: ${failed[*]} (logs in ${LOGS})"
  exit 1
fi
rm -rf "$LOGS"
