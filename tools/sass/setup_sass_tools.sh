#!/usr/bin/env bash
# Finds or installs (once) NVIDIA's cuobjdump and nvdisasm, which the machine-code gate
# (tools/sass) reads kernels' SASS with, and prints the directory that holds both.
# /usr/local/cuda/bin is preferred when it has them; otherwise the PyPI packages
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (13.x, for the CUDA 13 nvcc; pinned, so every
# machine disassembles alike) go into a venv at ${XDG_CACHE_HOME:-$HOME/.cache}/sluice/sass-venv.
# Idempotent and silent when present.
set -euo pipefail

cuda_bin=/usr/local/cuda/bin
if [[ -x "$cuda_bin/cuobjdump" && -x "$cuda_bin/nvdisasm" ]]; then
  echo "$cuda_bin"
  exit 0
fi

venv="${XDG_CACHE_HOME:-$HOME/.cache}/sluice/sass-venv"
# The wheels put both binaries in site-packages/nvidia/cu13/bin; find them rather than trust that.
find_bin_dir() {
  local f
  f=$(find "$venv/lib" -type f -name cuobjdump -path '*/nvidia/*' 2>/dev/null | head -n1)
  [[ -n "$f" && -f "$(dirname "$f")/nvdisasm" ]] || return 1
  chmod +x "$f" "$(dirname "$f")/nvdisasm"
  dirname "$f"
}

if ! dir=$(find_bin_dir); then
  echo "setup_sass_tools: installing nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm into $venv" >&2
  mkdir -p "$(dirname "$venv")"
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37 >&2
  dir=$(find_bin_dir) || {
    echo "setup_sass_tools: cuobjdump/nvdisasm not found in $venv after installing" >&2
    exit 1
  }
fi
# Only cuobjdump's and nvdisasm's directory is printed, so the caller can hand it to a sandboxed
# test; the binaries are self-contained.
echo "$dir"
