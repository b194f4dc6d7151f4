"""profile_report.py reads a gperftools profile: samples counted inclusive and self per frame,
library frames named by their library, the focus filter, and a bad header refused."""
import io
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import profile_report  # noqa: E402

LIBA, LIBB = 0x7f0000001000, 0x7f0000101000


def profile(samples):
    """A legacy CPU profile: header, (count, depth, pcs...) records, trailer, then the maps."""
    words = [0, 3, 0, 1000, 0]
    for count, pcs in samples:
        words += [count, len(pcs)] + list(pcs)
    words += [0, 1, 0]
    maps = (f"{LIBA:x}-{LIBA + 0x1000:x} r-xp 00000000 00:00 0 /usr/lib/liba.so\n"
            f"{LIBB:x}-{LIBB + 0x1000:x} r-xp 00000000 00:00 0 /usr/lib/libb.so\n")
    return struct.pack("<%dQ" % len(words), *words) + maps.encode()


class ProfileReportTest(unittest.TestCase):
    def run_report(self, data, *args):
        with tempfile.NamedTemporaryFile(suffix=".prof", delete=False) as f:
            f.write(data)
        try:
            out = io.StringIO()
            sys.argv = ["profile_report.py", f.name, "/bin/true", *args]
            stdout, sys.stdout = sys.stdout, out
            try:
                profile_report.main()
            finally:
                sys.stdout = stdout
            return out.getvalue()
        finally:
            os.unlink(f.name)

    def test_counts_inclusive_and_self(self):
        # 3 samples at the top of liba called from libb, 2 at the top of libb.
        data = profile([(3, [LIBA + 0x10, LIBB + 0x20]), (2, [LIBB + 0x30])])
        out = self.run_report(data)
        self.assertIn("5 samples", out)
        lines = {line.split()[-1]: line.split() for line in out.splitlines()[1:]}
        self.assertEqual(lines["libb.so"][0], "5")
        self.assertEqual(lines["libb.so"][3], "2")
        self.assertEqual(lines["liba.so"][0], "3")
        self.assertEqual(lines["liba.so"][3], "3")

    def test_focus_keeps_samples_with_the_frame(self):
        data = profile([(3, [LIBA + 0x10, LIBB + 0x20]), (2, [LIBB + 0x30])])
        out = self.run_report(data, "liba")
        self.assertIn("3 samples with liba on the stack", out)
        self.assertNotIn("   5 ", out)

    def test_refuses_other_files(self):
        with self.assertRaises(SystemExit) as e:
            self.run_report(b"\x01" * 64)
        self.assertIn("not a gperftools CPU profile", str(e.exception))


if __name__ == "__main__":
    unittest.main()
