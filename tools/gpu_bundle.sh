#!/bin/bash
# Builds the GPU test and benchmark binaries here and packs them, with the shared libraries they
# need that the GPU machine may lack, into .gpu/bundle.tar.xz (git-ignored; about 15 MB, well
# inside the 64 MiB the device tool carries). bench/gpu/accept.sh unpacks and runs them there:
#
#   tools/gpu_bundle.sh            # then, with the device tool:
#   run(command="bench/gpu/accept.sh correctness", carry=[".gpu"]), then ... speed, ... serve
#
# cuBLAS is not bundled (its libraries are hundreds of MiB): accept.sh finds the GPU machine's own.
set -euo pipefail
cd "$(dirname "$0")/.."
# The binaries: GPU_BUNDLE_BINARIES in tools/BUILD (what //tools:gpu_bundle_test stages).
mapfile -t targets < <(bazel query --noshow_progress \
  'kind("cc_binary|cc_test", labels(data, //tools:gpu_bundle_test))' | sort)
(( ${#targets[@]} > 0 )) || { echo "no binaries in //tools:gpu_bundle_test" >&2; exit 1; }
bazel build --jobs="${SLUICE_JOBS:-2}" "${targets[@]}"
rm -rf .gpu
stage=.gpu/stage
paths=()
for t in "${targets[@]}"; do paths+=(".bazel/bin/$(echo "${t#//}" | tr ':' '/')"); done
tools/gpu_stage.sh "$stage" "${paths[@]}"
cat "$stage/MANIFEST"
tar -C $stage -cf - bin lib MANIFEST | xz -T"${SLUICE_JOBS:-2}" -6 >.gpu/bundle.tar.xz
rm -rf $stage
# The bundled model's metadata, tokenizer and tensor list (no weights): accept.sh serve makes a
# model of its shapes with random weights from it there.
model="${SLUICE_MODEL:-$HOME/.cache/sluice/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [[ -f "$model" ]]; then
  .bazel/bin/tools/random_gguf --like="$model" --describe --out=.gpu/model-desc.gguf
else
  echo "no model at $model: accept.sh serve will not run" >&2
fi
ls -l .gpu/bundle.tar.xz
echo "bundle ready: carry .gpu and run bench/gpu/accept.sh correctness, speed, then serve, on the GPU machine"
