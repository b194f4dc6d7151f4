"""The machine-code gates, on the real nvcc archives of every cuda_library (BUILD passes them):

- no kernel uses local memory: a stack frame, STL or LDL (spills, or a local array);
- no integer division sequence inside a loop of the decode chunk kernel (ChunkKernel<R>);
- the issue-bound model predicts the sluice preset's pages read at >= 70% of HBM;

as a ratchet: tools/sass/known_violations.json lists each violation present when the gate came
in, exactly; anything new or worse fails, and so does anything better or gone until the list is
edited down. Also tests the ratchet itself. Needs cuobjdump and nvdisasm (SLUICE_SASS_TOOLS, or
what setup_sass_tools.sh installs): fails, saying how to get them, without them.
"""
import argparse
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_resources  # noqa: E402

ARGS = None


class RatchetTest(unittest.TestCase):
    K = {"library": "//l:x", "kernel": "K<1>", "arch": "sm_90a"}

    def v(self, rule, **amount):
        return {**self.K, "rule": rule, **amount}

    def test_equal_lists_pass(self):
        cur = [self.v("local_stores", count=20), self.v("sluice_share", value=0.0612)]
        known = [self.v("local_stores", count=20), self.v("sluice_share", value=0.061)]
        self.assertEqual(cuda_resources.ratchet(cur, known), [])

    def test_new_worse_better_and_fixed_each_fail(self):
        known = [self.v("a", count=20), self.v("b", count=5), self.v("c", count=7),
                 self.v("s", value=0.061)]
        cur = [self.v("a", count=21), self.v("b", count=4), self.v("d", count=1),
               self.v("s", value=0.5)]
        problems = cuda_resources.ratchet(cur, known)
        self.assertEqual([p.split(":")[0] for p in problems],
                         ["WORSE", "BETTER", "FIXED", "NEW", "BETTER"])
        self.assertIn("lower its count to 4", problems[1])
        self.assertIn("delete its entry", problems[2])


class GateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        tools = cuda_resources.find_tools()  # raises, saying how to get them, when missing
        cls.result = cuda_resources.analyze(ARGS.archives, ARGS.lineinfo, ARGS.source,
                                            ARGS.layouts, tools)
        print(cuda_resources.table(cls.result), file=sys.stderr)
        with open(ARGS.known) as f:
            cls.known = json.load(f)["violations"]

    def test_every_archive_has_kernels_for_both_archs(self):
        for a in ARGS.archives:
            label = cuda_resources.library_label(a)
            archs = {r["arch"] for r in self.result["kernels"] if r["library"] == label}
            self.assertEqual(archs, {"sm_80", "sm_90a"}, label)

    def test_the_model_predicts_every_preset(self):
        issue = self.result["issue_model"]
        names = {r["preset"] for r in issue["presets"]}
        self.assertIn("sluice", names)
        for p in cuda_resources.SHARE_PRESETS:
            share = issue["predicted_share"][p]
            self.assertTrue(0 < share <= 1, (p, share))
            print(f"predicted share of HBM, {p} pages: {share:.3f}", file=sys.stderr)

    def test_violations_match_the_known_list(self):
        problems = cuda_resources.ratchet(self.result["violations"], self.known)
        if problems:
            self.fail("the machine-code gates (tools/sass/README.md):\n" + "\n".join(problems))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--lineinfo", required=True)
    ap.add_argument("--source", required=True, action="append")
    ap.add_argument("--layouts", required=True)
    ap.add_argument("--known", required=True)
    ap.add_argument("archives", nargs="+")
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
