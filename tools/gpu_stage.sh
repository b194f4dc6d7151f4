#!/bin/bash
# Stages GPU binaries for a machine that has a driver and nothing of this project:
#   tools/gpu_stage.sh STAGE_DIR BINARY...
# copies each binary (stripped) to STAGE_DIR/bin, every shared library they need but the C
# runtime, the driver and cuBLAS to STAGE_DIR/lib, and writes STAGE_DIR/MANIFEST: one line per
# binary with the number of tests it lists (gtest binaries) or "-". tools/gpu_bundle.sh packs the
# result; //tools:gpu_bundle_test runs it in CI and starts every staged binary under `env -i`.
set -euo pipefail
stage=$1
shift
mkdir -p "$stage/bin" "$stage/lib"
for b in "$@"; do
  cp "$b" "$stage/bin/"
  chmod u+w "$stage/bin/$(basename "$b")"
  strip "$stage/bin/$(basename "$b")"
done
for b in "$stage"/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcuda.so* | libcublas*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
: >"$stage/MANIFEST"
for b in "$stage"/bin/*; do
  name=$(basename "$b")
  if [[ "$name" == *_test ]]; then
    count=$(env -i LD_LIBRARY_PATH="$stage/lib" "$b" --gtest_list_tests | grep -c '^  ' || true)
    echo "$name $count" >>"$stage/MANIFEST"
  else
    echo "$name -" >>"$stage/MANIFEST"
  fi
done
