#!/usr/bin/env bash
# Creates (once) the venv with llama-cpp-python, the peer that `./sluice bench model` and
# `./sluice bench serve` measure against: ${XDG_CACHE_HOME:-~/.cache}/sluice/llamacpp-venv.
# llama-cpp-python ships as source on PyPI, so the first run compiles llama.cpp (several minutes
# on two cores); later runs return at once. Prints the venv's python on stdout.
#
# The build targets x86-64-v3 (AVX2, FMA, F16C, BMI2), not the build machine's own CPU: a
# native build (GGML_NATIVE=ON) on this machine kind's AMX Xeon dies with a general protection
# fault in libggml-cpu.so on its first completion, and a venv built on one machine of the kind
# may run on another. AVX-512 and AMX stay off; the build's settings are written next to the
# venv (llama-cpp-build.txt) and into every benchmark's JSON.
set -euo pipefail

VERSION="0.3.36"
BUILD="x86-64-v3"
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/sluice/llamacpp-venv"
STAMP="$VENV/.sluice-llama-cpp-python-server-$VERSION-$BUILD"

if [[ -x "$VENV/bin/python" && -f "$STAMP" ]]; then
  echo "$VENV/bin/python"
  exit 0
fi
echo "bench: building llama-cpp-python==$VERSION ($BUILD) into $VENV (compiles llama.cpp; minutes)" >&2
mkdir -p "$(dirname "$VENV")"
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
# CPU only, x86-64-v3; the [server] extra is the OpenAI-compatible server that
# `./sluice bench serve` drives.
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF \
-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF \
-DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
-DGGML_CUDA=OFF -DLLAMA_CURL=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
# --force-reinstall --no-cache-dir: a wheel built earlier with other settings must not be reused.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
  --no-cache-dir "llama-cpp-python[server]==$VERSION" >&2
printf 'llama-cpp-python %s, %s: %s\n' "$VERSION" "$BUILD" "$CMAKE_ARGS" >"$VENV/llama-cpp-build.txt"
"$VENV/bin/python" -c "import llama_cpp; print('bench: llama-cpp-python', llama_cpp.__version__)" >&2
touch "$STAMP"
echo "$VENV/bin/python"
