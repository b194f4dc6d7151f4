#!/usr/bin/env bash
# Creates (once) the venv with llama-cpp-python, the peer that `./sluice bench model` and
# `./sluice bench serve` measure against: ${XDG_CACHE_HOME:-~/.cache}/sluice/llamacpp-venv. llama-cpp-python ships as source on
# PyPI, so the first run compiles llama.cpp for this CPU (several minutes on two cores); later
# runs return at once. Prints the venv's python on stdout.
set -euo pipefail

VERSION="0.3.36"
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/sluice/llamacpp-venv"
STAMP="$VENV/.sluice-llama-cpp-python-server-$VERSION"

if [[ -x "$VENV/bin/python" && -f "$STAMP" ]]; then
  echo "$VENV/bin/python"
  exit 0
fi
echo "bench: building llama-cpp-python==$VERSION into $VENV (compiles llama.cpp; minutes)" >&2
mkdir -p "$(dirname "$VENV")"
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
# Native CPU build, no GPU backends; the [server] extra is the OpenAI-compatible server that
# `./sluice bench serve` drives.
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  "llama-cpp-python[server]==$VERSION" >&2
"$VENV/bin/python" -c "import llama_cpp; print('bench: llama-cpp-python', llama_cpp.__version__)" >&2
touch "$STAMP"
echo "$VENV/bin/python"
