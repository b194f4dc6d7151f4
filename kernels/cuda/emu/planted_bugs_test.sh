#!/bin/bash
# Planted bugs prove the emulation bites: decode_attention_test built against the decode attention
# kernels with a barrier removed, or with a cp.async wait removed, must fail under the emulation,
# while the same test against the real kernels passes.
#   planted_bugs_test.sh CLEAN_TEST PLANTED_TEST...
set -u
# The runs below are not this test's cases: they must not write its XML report.
unset XML_OUTPUT_FILE GTEST_OUTPUT
clean=$1
shift
log=$(mktemp)
if ! "$clean" >"$log" 2>&1; then
  tail -30 "$log"
  echo "FAIL: the unplanted $(basename "$clean") fails; the planted runs prove nothing until it passes"
  exit 1
fi
status=0
for planted in "$@"; do
  name=$(basename "$planted")
  if "$planted" >"$log" 2>&1; then
    echo "FAIL: $name passed: the emulation did not catch its planted bug"
    status=1
  elif grep -qE "Failure|sluice emu:|AddressSanitizer|ThreadSanitizer" "$log"; then
    echo "ok: $name failed, as it must:"
    grep -m 3 -E "Failure|element|sluice emu:|Sanitizer" "$log" | sed 's/^/    /'
  else
    tail -20 "$log"
    echo "FAIL: $name failed without a test failure or an emulation diagnostic"
    status=1
  fi
done
rm -f "$log"
exit $status
