#!/bin/bash
# The GPU bundle, checked in CI: stages the GPU binaries as tools/gpu_bundle.sh does, then starts
# each under `env -i` (no environment, only the staged libraries), as on the GPU machine. Every
# test binary must list its tests; every other binary must start and say why it cannot run here
# (the serving processes are pointed at a model that does not exist).
#   gpu_bundle_test.sh BINARY...
set -euo pipefail
stage="${TEST_TMPDIR:-$(mktemp -d)}/stage"
rm -rf "$stage"
tools/gpu_stage.sh "$stage" "$@"
cat "$stage/MANIFEST"
while read -r name count; do
  if [[ "$count" == "-" ]]; then
    if command -v nvidia-smi >/dev/null 2>&1; then continue; fi  # it would benchmark a real GPU
    args=()
    case "$name" in
      router | prefill | decode) args=(--model=/nonexistent.gguf) ;;
      up) args=(--model=/nonexistent.gguf --bin_dir=/nonexistent) ;;
    esac
    out=$(env -i LD_LIBRARY_PATH="$stage/lib" timeout 60 "$stage/bin/$name" "${args[@]}" 2>&1 || true)
    if ! grep -Eq "^(sluice[- ])?$name: " <<<"$out"; then
      echo "FAIL: $name did not start under env -i: $out"
      exit 1
    fi
  elif ((count == 0)); then
    echo "FAIL: $name lists no tests under env -i"
    exit 1
  fi
done <"$stage/MANIFEST"
echo "ok: every binary of the bundle starts with an empty environment"
