#!/bin/bash
# racecheck.sh SANITIZER BINARY ARGS...: compute-sanitizer's racecheck on one test binary. Fails
# when the test fails or when a hazard (error or warning: racecheck's warnings are hazards within
# a warp, races under independent thread scheduling) is reported in a sluice kernel. Hazards in
# other libraries' kernels (cuBLAS's) are printed and counted but are not ours to fix.
set -uo pipefail
sanitizer=$1
shift
log=$(mktemp)
"$sanitizer" --tool racecheck --print-limit 1000 "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
ours=$(grep -E "Race reported" "$log" | grep -c "sluice::")
theirs=$(grep -E "Race reported" "$log" | grep -vc "sluice::")
rm -f "$log"
echo "racecheck: $ours hazard reports in sluice kernels, $theirs in other libraries' kernels"
((rc == 0 && ours == 0))
