"""Runs a unittest module and writes each case's outcome as JUnit XML to $XML_OUTPUT_FILE, so
the test summary counts cases, not targets."""

import os
import sys
import unittest
import xml.etree.ElementTree as ET


class RecordingResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ran = []

    def startTest(self, test):
        super().startTest(test)
        self.ran.append(test.id())


def write_junit(result, path, suite_name):
    suite = ET.Element("testsuite", name=suite_name)
    outcomes = {}
    for test, err in result.failures + result.errors:
        outcomes[test.id()] = ("failure", err)
    for test, reason in result.skipped:
        outcomes[test.id()] = ("skipped", reason)
    for test_id in result.ran:
        case = ET.SubElement(suite, "testcase", name=test_id)
        kind, text = outcomes.get(test_id, (None, None))
        if kind:
            ET.SubElement(case, kind, message=text.splitlines()[-1] if text else "").text = text
    # A class whose setUpClass failed or skipped ran no case; report it as one.
    for test, err in result.errors + result.skipped:
        if test.id() not in result.ran:
            case = ET.SubElement(suite, "testcase", name=test.id())
            kind = "skipped" if (test, err) in result.skipped else "failure"
            ET.SubElement(case, kind, message=err.splitlines()[-1] if err else "").text = err
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path)


def main(module_name, suite_name):
    """Runs every test of the module; exits 0 when all passed (skips included)."""
    runner = unittest.TextTestRunner(verbosity=2, resultclass=RecordingResult)
    result = runner.run(unittest.defaultTestLoader.loadTestsFromModule(sys.modules[module_name]))
    if os.environ.get("XML_OUTPUT_FILE"):
        write_junit(result, os.environ["XML_OUTPUT_FILE"], suite_name)
    sys.exit(0 if result.wasSuccessful() else 1)
