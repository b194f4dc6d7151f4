#!/usr/bin/env bash
# Creates (once) the Python venv with the OpenAI client and grpcio (tests/client_requirements.txt) that the
# end-to-end tests and `./sluice bench serve` use: ${XDG_CACHE_HOME:-$HOME/.cache}/sluice/client-venv.
# Idempotent and silent when the venv matches the requirements; prints its python path.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$here/client_requirements.txt"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/sluice/client-venv"
stamp="$venv/.sluice-requirements.sha256"

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "setup_client_venv: installing $req into $venv" >&2
  mkdir -p "$(dirname "$venv")"
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  rm -f "$stamp"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
  "$venv/bin/python" -c "import openai, grpc" >&2
  echo "$want" >"$stamp"
fi
echo "$venv/bin/python"
