#!/usr/bin/env bash
# Creates (once) the Python venv used by tests/reference/make_goldens.py.
#   venv: ${XDG_CACHE_HOME:-$HOME/.cache}/sluice/reference-venv
# Idempotent and silent when the venv already matches requirements.txt.
# Prints the venv's python path on stdout only when SETUP_VENV_PRINT=1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$here/requirements.txt"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/sluice/reference-venv"
stamp="$venv/.sluice-requirements.sha256"
python="${PYTHON:-python3}"

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  [[ "${SETUP_VENV_PRINT:-0}" == 1 ]] && echo "$venv/bin/python"
  exit 0
fi

echo "setup_venv: installing $req into $venv (torch + CUDA runtime libs, ~4 GB)" >&2
mkdir -p "$(dirname "$venv")"
if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
rm -f "$stamp"
# --no-deps: requirements.txt is a complete lock (see the comment at its top).
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$req"
# Smoke test: torch imports and computes on the CPU; transformers sees gguf.
"$venv/bin/python" - <<'EOF'
import torch, transformers, gguf, accelerate  # noqa: F401
from transformers.utils import is_gguf_available
assert is_gguf_available(), "transformers does not see gguf"
x = torch.ones(2, 2) @ torch.ones(2, 2)
assert float(x.sum()) == 8.0
EOF
echo "$want" > "$stamp"
echo "setup_venv: done" >&2
[[ "${SETUP_VENV_PRINT:-0}" == 1 ]] && echo "$venv/bin/python"
exit 0
