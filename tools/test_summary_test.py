"""Tests for test_summary.py: counts from bazel's log and JUnit XML, and failures that
leave no XML behind."""
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout, redirect_stderr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_summary  # noqa: E402

XML = """<?xml version="1.0"?>
<testsuites><testsuite name="s">
  <testcase name="a" status="run" result="completed"/>
  <testcase name="b" status="run" result="completed"><failure message="x"/></testcase>
  <testcase name="c" status="run" result="skipped"><skipped message="no gpu"/></testcase>
  <testcase name="d" status="run" result="completed"/>
</testsuite></testsuites>
"""


class TestSummaryTest(unittest.TestCase):
    def run_summary(self, log_lines, xmls, rc, extra=("0", "0")):
        with tempfile.TemporaryDirectory() as d:
            for label, text in xmls.items():
                pkg, name = label[2:].split(":")
                os.makedirs(os.path.join(d, "logs", pkg, name))
                with open(os.path.join(d, "logs", pkg, name, "test.xml"), "w") as f:
                    f.write(text)
            log = os.path.join(d, "log")
            with open(log, "w") as f:
                f.write("\n".join(log_lines) + "\n")
            out = io.StringIO()
            with redirect_stdout(out), redirect_stderr(io.StringIO()):
                code = test_summary.main(["x", log, os.path.join(d, "logs"), str(rc), *extra])
            return out.getvalue().strip(), code

    def test_counts_cases_from_xml(self):
        line, code = self.run_summary(
            ["//k:t   FAILED in 0.2s", "//k:u   (cached) PASSED in 0.1s"],
            {"//k:t": XML, "//k:u": '<testsuites><testcase name="z"/></testsuites>'}, 3)
        self.assertEqual(line, "3 passed, 1 failed, 1 skipped")
        self.assertEqual(code, 1)

    def test_target_without_xml_counts_once(self):
        line, code = self.run_summary(
            ["//a:b  PASSED in 1s", "//a:c  FAILED TO BUILD", "//a:d  NO STATUS"], {}, 1)
        self.assertEqual(line, "1 passed, 2 failed")
        self.assertEqual(code, 1)

    def test_crash_after_passing_cases_is_a_failure(self):
        line, _ = self.run_summary(["//a:b  FAILED in 1s"],
                                   {"//a:b": '<testsuites><testcase name="z"/></testsuites>'}, 3)
        self.assertEqual(line, "0 passed, 1 failed")

    def test_build_error_without_test_lines(self):
        line, code = self.run_summary(["ERROR: something broke"], {}, 1, ("1", "0"))
        self.assertEqual(line, "1 passed, 1 failed")
        self.assertEqual(code, 1)

    def test_all_green(self):
        line, code = self.run_summary(["//a:b  PASSED in 1s"],
                                      {"//a:b": '<testsuites><testcase name="z"/></testsuites>'},
                                      0, ("1", "0"))
        self.assertEqual(line, "2 passed, 0 failed")
        self.assertEqual(code, 0)


if __name__ == "__main__":
    unittest.main()
