#!/usr/bin/env bash
# Installs the Debian packages sluice builds and runs with, when they are missing.
# Idempotent: prints nothing and returns quickly when everything is present.
#   tools/setup.sh [--image]
# --image adds what `./sluice image` builds the OCI image with (buildah, mmdebstrap).
set -euo pipefail

PACKAGES=(
  bazel-bootstrap
  g++
  pkg-config
  python3
  python3-pip
  python3-venv
  clang-format
  protobuf-compiler
  protobuf-compiler-grpc
  libprotobuf-dev
  libgrpc++-dev
  libabsl-dev
  libucx-dev
  ucx-utils
  prometheus-cpp-dev
  libcpp-httplib-dev
  libboost-dev
  nlohmann-json3-dev
  libopenblas-dev
  libgoogle-glog-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libicu-dev
  clang
  libclang-rt-14-dev
  prometheus
  kubernetes-client
)
case "${1:-}" in
  "") ;;
  --image) PACKAGES+=(buildah mmdebstrap) ;;
  *) echo "setup: unknown argument '$1' (setup.sh [--image])" >&2; exit 2 ;;
esac

missing=()
for pkg in "${PACKAGES[@]}"; do
  # Any kubectl will do; one from another package (Kubernetes' or Google Cloud's apt
  # repository) conflicts with Debian's kubernetes-client.
  if [[ "$pkg" == kubernetes-client ]] && command -v kubectl >/dev/null 2>&1; then continue; fi
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "installed" ]]; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "setup: installing ${#missing[@]} Debian package(s): ${missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "setup: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! "${SUDO[@]}" apt-get update -qq; then
    echo "setup: 'apt-get update' failed; is the Debian mirror reachable?" >&2
    exit 1
  fi
  if ! "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/sluice-apt.log 2>&1; then
    tail -20 /tmp/sluice-apt.log >&2
    echo "setup: 'apt-get install' failed (full log: /tmp/sluice-apt.log)" >&2
    exit 1
  fi
  echo "setup: installed ${missing[*]}"
fi

if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: note: /usr/local/cuda/bin/nvcc not found; CUDA targets will not build" >&2
fi
