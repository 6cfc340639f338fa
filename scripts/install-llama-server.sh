#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) for the engine tests, into a cache outside
# the repository, or reuse the cached build. Prints the binary's path on the last line
# of stdout; everything else goes to stderr.
#
#   export SPEC_DECODE_OTEL_LLAMA_SERVER="$(bash scripts/install-llama-server.sh | tail -n 1)"
#
# Source: the llama.cpp tree vendored in the sdist of `llama-cpp-python` (MIT), pinned
# below and fetched with pip (`vendor/llama.cpp`); nothing else is downloaded, and the
# build itself needs no network (the web UI is neither downloaded nor built).
#
# Next to the binary the script keeps two things from the same source tree, which the
# tests (tests/engines/) find through the binary's path:
#   <dest>/bin/llama-server                       the server, its shared libraries beside it
#   <dest>/share/gguf-py/                         llama.cpp's `gguf` Python package (put on
#                                                 sys.path by the tests, not pip-installed)
#   <dest>/share/models/ggml-vocab-llama-spm.gguf the tokenizer the tiny test models copy
#   <dest>/share/BUILD_INFO                       llama.cpp build number and commit, flags
#
# The binary's RUNPATH would point at the build directory; it is built with the install
# rpath `$ORIGIN` instead, so bin/ is relocatable and the build directory is deleted.
#
# Environment:
#   SPEC_DECODE_OTEL_CACHE     cache root (default: $HOME/.cache/spec-decode-otel)
#   PYTHON                     python used for `pip download` (default: python3)
#   CXX                        C++ compiler (default: c++); part of the cache key
#   LLAMA_BUILD_JOBS           parallel build jobs (default: 2)
#   LLAMA_FORCE_REBUILD=1      ignore a cached build
#
# Cache layout: <cache>/llama-server-<sha256 of source version + cmake flags + compiler
# and cmake versions>/{bin,share}.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"
# sha256 of llama_cpp_python-0.3.36.tar.gz as first fetched (Dec 2026).
SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The vendored tree is the llama.cpp submodule at this commit (the sdist's own .git
# records it as vendor/llama.cpp's gitlink; its CHANGELOG: "update llama.cpp to
# ggml-org/llama.cpp@0c1e57098"), which llama.cpp released as build b11312. The tree
# has no .git, so cmake would stamp "build 0, commit unknown": pass both explicitly.
LLAMA_CPP_COMMIT="0c1e57098bba43ac29e6e3b677cdceebdd22334f"
LLAMA_CPP_BUILD_NUMBER="11312"
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_OPENSSL=OFF
  "-DLLAMA_BUILD_NUMBER=${LLAMA_CPP_BUILD_NUMBER}"
  "-DLLAMA_BUILD_COMMIT=${LLAMA_CPP_COMMIT:0:9}"
  # Relocatable bin/: the build tree gets the install rpath, which is $ORIGIN.
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
  '-DCMAKE_INSTALL_RPATH=$ORIGIN'
)

CACHE_ROOT="${SPEC_DECODE_OTEL_CACHE:-${HOME}/.cache/spec-decode-otel}"
PYTHON="${PYTHON:-python3}"
JOBS="${LLAMA_BUILD_JOBS:-2}"

log() { printf '[install-llama-server] %s\n' "$*" >&2; }

SUDO=""
if [[ "$(id -u)" != "0" ]]; then SUDO="sudo"; fi
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v "${CXX:-c++}" >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
if ((${#missing[@]})); then
  log "installing ${missing[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  ${SUDO} apt-get update >&2
  ${SUDO} apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi
export CXX="${CXX:-c++}"

KEY="$({
  echo "llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION} ${SDIST_SHA256}"
  printf '%s\n' "${CMAKE_FLAGS[@]}"
  "${CXX}" --version | head -n 1
  cmake --version | head -n 1
} | sha256sum | cut -c1-16)"
DEST_DIR="${CACHE_ROOT}/llama-server-${KEY}"
BIN="${DEST_DIR}/bin/llama-server"

mkdir -p "${CACHE_ROOT}"
# One build at a time per cache (two CI jobs or a test fixture racing this script).
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_ROOT}/.llama-server.lock"
  flock 9
fi

if [[ -x "${BIN}" && -f "${DEST_DIR}/share/BUILD_INFO" && "${LLAMA_FORCE_REBUILD:-0}" != "1" ]] \
  && "${BIN}" --version >/dev/null 2>&1; then
  log "cached: ${BIN}"
  echo "${BIN}"
  exit 0
fi

rm -rf "${DEST_DIR}"
mkdir -p "${DEST_DIR}"
WORK="$(mktemp -d "${DEST_DIR}/build.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT

log "fetching the llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION} sdist (source only)"
"${PYTHON}" -m pip download --quiet --disable-pip-version-check --no-deps \
  --no-binary :all: --dest "${WORK}/dl" "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" >&2
SDIST="$(ls "${WORK}"/dl/llama_cpp_python-*.tar.gz)"
got="$(sha256sum "${SDIST}" | cut -d' ' -f1)"
if [[ "${got}" != "${SDIST_SHA256}" ]]; then
  log "error: ${SDIST##*/} has sha256 ${got}, expected ${SDIST_SHA256}"
  exit 1
fi
tar --no-same-owner -xzf "${SDIST}" -C "${WORK}" --strip-components=1 --wildcards '*/vendor/llama.cpp/*' '*/.git/*'
if command -v git >/dev/null 2>&1; then
  gitlink="$(git -c safe.directory="*" -C "${WORK}" ls-files -s vendor/llama.cpp | cut -d' ' -f2)"
  if [[ "${gitlink}" != "${LLAMA_CPP_COMMIT}" ]]; then
    log "error: the sdist vendors llama.cpp ${gitlink}, expected ${LLAMA_CPP_COMMIT}"
    exit 1
  fi
fi
# The sdist's .git belongs to llama-cpp-python: cmake must not stamp its commit on
# llama.cpp (the build number and commit are passed explicitly above).
rm -rf "${WORK}/.git"
SRC="${WORK}/vendor/llama.cpp"

log "configuring with $("${CXX}" --version | head -n 1); $(cmake --version | head -n 1)"
start=$(date +%s)
cmake -S "${SRC}" -B "${WORK}/build" "${CMAKE_FLAGS[@]}" >&2
log "building llama-server with ${JOBS} jobs (10 to 20 min on 2 shared cores)"
cmake --build "${WORK}/build" --target llama-server -j "${JOBS}" >&2
log "built in $(($(date +%s) - start))s"

mkdir -p "${DEST_DIR}/bin" "${DEST_DIR}/share/models"
cp -a "${WORK}/build/bin/." "${DEST_DIR}/bin/"
cp -a "${SRC}/gguf-py" "${DEST_DIR}/share/gguf-py"
cp -a "${SRC}/models/ggml-vocab-llama-spm.gguf" "${DEST_DIR}/share/models/"
cp -a "${SRC}/LICENSE" "${DEST_DIR}/share/LICENSE.llama.cpp"
{
  echo "llama.cpp build b${LLAMA_CPP_BUILD_NUMBER}, commit ${LLAMA_CPP_COMMIT}"
  echo "llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION} sdist sha256 ${SDIST_SHA256}"
  echo "compiler: $("${CXX}" --version | head -n 1)"
  echo "cmake flags: ${CMAKE_FLAGS[*]}"
} >"${DEST_DIR}/share/BUILD_INFO"

# Nothing may still resolve into the (deleted) build directory.
rm -rf "${WORK}"
if ldd "${BIN}" | grep -E 'not found|/build\.' >&2; then
  log "error: ${BIN} does not find its libraries in its own directory"
  exit 1
fi
"${BIN}" --version >&2 || {
  log "error: ${BIN} does not run"
  exit 1
}
echo "${BIN}"
