#!/usr/bin/env bash
# The English texts `sluice eval` results are measured on, assembled from Debian packages'
# documentation into DIR (default bench/texts):
#   vim-manual.txt   Vim user manual chapters 1-8 (vim-runtime)
#   node-streams.md  Node.js API docs: stream, events (nodejs-doc)
#   licenses.txt     Apache-2.0, GPL-1, GPL-2, LGPL-2, LGPL-2.1, MPL-1.1, MPL-2.0, GFDL-1.3
#                    (base-files)
# and the calibration text, which none of them contains:
#   calibration.txt  GPL-3 (base-files)
set -euo pipefail
dir="${1:-bench/texts}"
mkdir -p "$dir"
need() {
  for f in "$@"; do
    [[ -r "$f" ]] || { echo "eval_texts: missing $f (install the package named above)" >&2; exit 1; }
  done
}
vim=(/usr/share/vim/vim90/doc/usr_0{1..8}.txt)
node=(/usr/share/doc/nodejs/api/{stream,events}.md)
lic=(/usr/share/common-licenses/{Apache-2.0,GPL-1,GPL-2,LGPL-2,LGPL-2.1,MPL-1.1,MPL-2.0,GFDL-1.3})
need "${vim[@]}" "${node[@]}" "${lic[@]}" /usr/share/common-licenses/GPL-3
cat "${vim[@]}" >"$dir/vim-manual.txt"
cat "${node[@]}" >"$dir/node-streams.md"
cat "${lic[@]}" >"$dir/licenses.txt"
cp /usr/share/common-licenses/GPL-3 "$dir/calibration.txt"
wc -c "$dir"/*
