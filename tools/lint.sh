#!/usr/bin/env bash
# Lint: clang-format on every tracked C++/CUDA file, and BUILD sanity (every package loads,
# every package has a README, every C++ source is used by some target, BUILD files are tidy).
# `--fix` rewrites C++ files in place instead of failing on them.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

fix=0
[[ "${1:-}" == "--fix" ]] && fix=1
problems=0
say() { echo "lint: $*" >&2; problems=$((problems + 1)); }

CLANG_FORMAT=$(command -v clang-format || true)
if [[ -z "$CLANG_FORMAT" ]]; then
  say "clang-format is not installed (run tools/setup.sh)"
else
  mapfile -t sources < <(git ls-files --cached --others --exclude-standard \
    '*.cc' '*.h' '*.cu' '*.cuh' | while read -r f; do [[ -f "$f" ]] && echo "$f"; done)
  if ((fix)); then
    "$CLANG_FORMAT" -i "${sources[@]}"
  else
    for f in "${sources[@]}"; do
      if ! "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1; then
        say "$f is not clang-formatted (./sluice lint --fix)"
      fi
    done
  fi
fi

# Every top-level package has a README saying what it is for; BUILD files are tidy.
while read -r build; do
  dir=$(dirname "$build")
  if [[ "$dir" != "." && "$dir" != */* && ! -f "$dir/README.md" ]]; then
    say "package $dir has no README.md"
  fi
  if grep -qP '\t' "$build"; then say "$build contains tabs"; fi
  [[ -z "$(tail -c1 "$build")" ]] || say "$build does not end with a newline"
  if grep -qE '[[:space:]]+$' "$build"; then say "$build has trailing whitespace"; fi
done < <(git ls-files --cached --others --exclude-standard 'BUILD' '*/BUILD')

# Every package loads, and every C++ source on disk belongs to some target.
if command -v bazel >/dev/null 2>&1; then
  if ! used=$(bazel query --noshow_progress 'kind("source file", deps(//...))' 2>/tmp/sluice-lint-query.log); then
    cat /tmp/sluice-lint-query.log >&2
    say "bazel query //... failed: a BUILD file does not load"
  else
    used_paths=$(echo "$used" | grep '^//' | sed -E 's#^//##; s#^:##; s#:#/#')
    while read -r f; do
      [[ -f "$f" ]] || continue
      grep -qxF "$f" <<<"$used_paths" || say "$f is not used by any Bazel target"
    done < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h' '*.cu' '*.cuh')
  fi
  # Every compiled .cu is in the machine-code gate (tools/sass NVCC_ARCHIVES): a kernel added
  # without it would ship with no register, spill or occupancy check.
  if ungated=$(bazel query --noshow_progress \
    'attr("srcs", ".+\.cu", kind("_cuda_archive", //...)) except deps(//tools/sass:nvcc_archives, 1)' \
    2>/dev/null); then
    for label in $ungated; do
      say "$label compiles CUDA but is not in tools/sass/BUILD's NVCC_ARCHIVES (the SASS gate)"
    done
  else
    say "bazel query for CUDA archives outside the SASS gate failed"
  fi
else
  say "bazel is not installed (run tools/setup.sh)"
fi

if ((problems > 0)); then
  echo "lint: $problems problem(s)" >&2
  exit 1
fi
echo "lint: clean" >&2
