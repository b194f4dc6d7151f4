#!/usr/bin/env python3
"""Counts test results of one `bazel test` run and prints `N passed, M failed[, K skipped]`.

Reads the run's console log for each test target's status line, then that target's JUnit XML
(bazel-testlogs/<pkg>/<name>/test.xml) to count individual test cases. A target that did not
build, timed out or crashed without reporting cases counts as one failure, so nothing that
went wrong is lost from the count.

usage: test_summary.py LOG TESTLOGS_DIR BAZEL_EXIT_CODE [EXTRA_PASSED EXTRA_FAILED]
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS_RE = re.compile(
    r"^(//[^\s]+)\s+(?:\(cached\)\s+)?"
    r"(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE|SKIPPED)\b"
)


def count_cases(xml_path):
    """Returns (passed, failed, skipped) test cases in a JUnit XML file, or None."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    passed = failed = skipped = 0
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif (case.find("skipped") is not None or case.get("result") == "skipped"
              or case.get("status") == "notrun"):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main(argv):
    log_path, testlogs, bazel_rc = argv[1], argv[2], int(argv[3])
    passed = int(argv[4]) if len(argv) > 4 else 0
    failed = int(argv[5]) if len(argv) > 5 else 0
    skipped = 0
    seen = 0
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = STATUS_RE.match(line)
            if not m:
                continue
            seen += 1
            label, status = m.group(1), m.group(2)
            pkg, _, name = label[2:].partition(":")
            counts = None
            if status in ("PASSED", "FAILED", "FLAKY", "TIMEOUT"):
                counts = count_cases(os.path.join(testlogs, pkg, name, "test.xml"))
            if counts is None or sum(counts) == 0:
                ok = status in ("PASSED", "FLAKY")
                counts = (1, 0, 0) if ok else (0, 1, 0)
            p, fl, s = counts
            if status not in ("PASSED", "FLAKY") and fl == 0:
                # The target failed (crash, timeout, leak check) after its cases passed.
                p, fl = max(p - 1, 0), 1
            passed, failed, skipped = passed + p, failed + fl, skipped + s
    if bazel_rc not in (0, 3) and failed == 0:
        # A build error outside any test target, or no test ran at all.
        print(f"bazel exited with status {bazel_rc} before reporting a failing test",
              file=sys.stderr)
        failed += 1
    if seen == 0:
        print("no test results were reported", file=sys.stderr)
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 0 if failed == 0 and bazel_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
