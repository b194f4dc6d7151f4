#!/usr/bin/env bash
# Builds the sluice OCI image from deploy/docker/Dockerfile without a Docker daemon or a registry:
# mmdebstrap makes a Debian 12 base from the machine's Debian mirror (once; kept in buildah's
# storage as localhost/sluice-debian:12), and buildah builds the Dockerfile on it with chroot
# isolation. The router and worker binaries come from `bazel build //router //prefill //decode`.
#
#   tools/image.sh [--tag NAME] [--base NAME] [--bin DIR] [--out FILE]
#
# --tag names the image (default localhost/sluice:dev); --base builds on an existing image instead
# of the mmdebstrap one (e.g. docker.io/library/debian:12-slim where a registry is reachable);
# --bin takes the binaries from DIR/{router/router,prefill/prefill,decode/decode} instead of
# building them (deploy:image_test passes its runfiles); --out also writes an OCI archive.
# Needs root (buildah with chroot isolation) and the packages buildah and mmdebstrap, which
# `tools/setup.sh --image` installs (`./sluice image` and `./sluice test` run it).
# Prints the image's name on the last line of stdout.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sluice"
TAG=localhost/sluice:dev
BASE=
BIN=
OUT=
DEFAULT_BASE=localhost/sluice-debian:12

while (($#)); do
  case "$1" in
    --tag) TAG=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "image: unknown argument '$1' (see the head of tools/image.sh)" >&2; exit 2 ;;
  esac
done

if [[ $(id -u) -ne 0 ]]; then
  echo "image: buildah's chroot isolation needs root; run it as root (or with sudo)" >&2
  exit 1
fi
for tool in buildah mmdebstrap; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "image: '$tool' is missing; install it with: tools/setup.sh --image" >&2
    exit 1
  fi
done

# The Debian mirror this machine's apt uses (deb822 or one-line sources), for the base.
debian_mirror() {
  local uri
  uri=$(grep -h -o -E 'https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list 2>/dev/null | head -1 | tr -d ' ' || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# A Debian 12 base like debian:12-slim: minbase, no documentation, man pages or locales.
make_base() {
  local mirror tar
  mirror=$(debian_mirror)
  mirror=${mirror%/}
  tar=$(mktemp --suffix=.tar)
  echo "image: making the Debian 12 base from $mirror (mmdebstrap, once)" >&2
  if ! mmdebstrap --quiet --variant=minbase \
      --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/info/*' \
      bookworm "$tar" \
      "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
      "deb ${mirror%/debian}/debian-security bookworm-security main" >&2; then
    rm -f "$tar"
    echo "image: mmdebstrap could not make the base from $mirror" >&2
    return 1
  fi
  local ctr
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$tar" / >/dev/null
  buildah config --cmd /bin/bash \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label org.opencontainers.image.description="Debian 12 minbase (mmdebstrap)" "$ctr"
  buildah commit --quiet --rm "$ctr" "$DEFAULT_BASE" >/dev/null
  rm -f "$tar"
}

if [[ -z "$BASE" ]]; then
  BASE=$DEFAULT_BASE
  if ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then make_base; fi
fi

if [[ -z "$BIN" ]]; then
  echo "image: building the router and the workers" >&2
  (cd "$ROOT" && bazel build --disk_cache="$CACHE/bazel-disk" \
    --repository_cache="$CACHE/bazel-repo" --noshow_progress --show_result=0 \
    --ui_event_filters=-info //router //prefill //decode) >&2
  BIN=$ROOT/.bazel/bin
fi

# The build context: the files the Dockerfile copies (binaries where it expects them), links
# followed.
CONTEXT=$(mktemp -d)
trap 'rm -rf "$CONTEXT"' EXIT
mkdir -p "$CONTEXT/deploy/docker" "$CONTEXT/tools"
cp -L "$ROOT/deploy/docker/Dockerfile" "$CONTEXT/deploy/docker/"
cp -L "$ROOT/tools/fetch_model.sh" "$CONTEXT/tools/"
for b in router/router prefill/prefill decode/decode; do
  if [[ ! -x "$BIN/$b" ]]; then
    echo "image: $BIN/$b is missing or not executable" >&2
    exit 1
  fi
  mkdir -p "$CONTEXT/.bazel/bin/$(dirname "$b")"
  cp -L "$BIN/$b" "$CONTEXT/.bazel/bin/$b"
done

# pip in the fetching stages trusts what the host's pip trusts (a proxy's CA, where there is one).
CA_ARGS=()
host_ca=$(python3 -m pip config get global.cert 2>/dev/null || true)
host_ca=${PIP_CERT:-${host_ca:-/etc/ssl/certs/ca-certificates.crt}}
if [[ -f "$host_ca" ]]; then
  CA_ARGS=(--secret "id=pip_ca,src=$host_ca")
fi

echo "image: buildah build -t $TAG (base $BASE)" >&2
start=$(date +%s)
buildah build --quiet --isolation chroot --layers --pull=never --build-arg "BASE=$BASE" \
  "${CA_ARGS[@]}" -f "$CONTEXT/deploy/docker/Dockerfile" -t "$TAG" "$CONTEXT" >&2
size=$(buildah images --format '{{.Size}}' "$TAG" | head -1)
echo "image: built $TAG in $(($(date +%s) - start)) s, $size" >&2

if [[ -n "$OUT" ]]; then
  rm -f "$OUT"
  buildah push --quiet "$TAG" "oci-archive:$OUT:$TAG" >&2
  echo "image: wrote $OUT" >&2
fi
echo "$TAG"
