"""Tests of issue_model.py: warp trip counts, unrolled versions, anchors, the bound itself."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import issue_model as im  # noqa: E402

SOURCE = """\
__device__ void Helper(int n) {
  for (int i = threadIdx.x; i < n; i += 128) {
    Work(i);
  }
}
template <int R>
__global__ void Kernel(int n) {
  Helper(n);  // a call, not the definition
  for (int i = threadIdx.x; i < n; i += 128) {
    Work(i);
  }
}
"""


class StridedTest(unittest.TestCase):
    def test_block_strided_loops(self):
        self.assertEqual(im.strided(96), [1, 1, 1, 0])  # 96 tokens: three warps, once each
        self.assertEqual(im.strided(768), [6, 6, 6, 6])
        self.assertEqual(im.strided(961), [8, 8, 8, 7])  # lane 0 of each warp is the busiest
        self.assertEqual(im.strided(0), [0, 0, 0, 0])
        # A loop over threads 8.. of the block, stride 120.
        self.assertEqual(im.strided(640, -8, 120), [6, 6, 5, 5])


class VersionsTest(unittest.TestCase):
    def test_largest_unroll_first_then_remainder_loop(self):
        # 21 iterations: one pass of the x16 loop, one of the x4 loop, 1 left to straight code.
        self.assertEqual(im._run([(16, 206), (4, 58)], 21), 206 + 58)
        self.assertEqual(im._run([(4, 80)], 3), 0)
        self.assertEqual(im._run([(1, 175)], 64), 64 * 175)


class AnchorTest(unittest.TestCase):
    def setUp(self):
        self.saved = im.ANCHORS

    def tearDown(self):
        im.ANCHORS = self.saved

    def test_finds_the_loop_inside_its_function(self):
        im.ANCHORS = {"helper": ("Helper", "for (int i = threadIdx.x; i < n;", 0),
                      "kernel": ("Kernel", "for (int i = threadIdx.x; i < n;", 0)}
        self.assertEqual(im.anchor_lines(SOURCE), {"helper": ("decode_attention_kernels.cu", 2),
                                                   "kernel": ("decode_attention_kernels.cu", 9)})

    def test_anchors_in_a_header_are_looked_up_there(self):
        header = "__device__ int Scan(int n) {\n  int c = 0;\n  for (; c < n; ++c) {}\n}\n"
        im.ANCHORS = {"scan": ("part.cuh:Scan", "for (; c < n;", 0),
                      "kernel": ("Kernel", "for (int i = threadIdx.x; i < n;", 0)}
        self.assertEqual(
            im.anchor_lines({"decode_attention_kernels.cu": SOURCE, "part.cuh": header}),
            {"scan": ("part.cuh", 3), "kernel": ("decode_attention_kernels.cu", 9)})
        with self.assertRaisesRegex(im.ModelError, "part.cuh, which was not read"):
            im.anchor_lines(SOURCE)

    def test_missing_loop_says_what_to_update(self):
        im.ANCHORS = {"gone": ("Kernel", "for (int j = 0;", 0)}
        with self.assertRaisesRegex(im.ModelError, "update ANCHORS and ROWS"):
            im.anchor_lines(SOURCE)
        im.ANCHORS = {"second": ("Helper", "for (int i = threadIdx.x; i < n;", 1)}
        with self.assertRaises(im.ModelError):
            im.anchor_lines(SOURCE)

    def test_the_real_anchors_are_unique_texts(self):
        keys = [(fn, text, nth) for fn, text, nth in im.ANCHORS.values()]
        self.assertEqual(len(keys), len(set(keys)))


class BoundTest(unittest.TestCase):
    def test_issue_bound(self):
        # 46k warp-instructions per 16 KiB page: 132 x 4 x 1.98e9 / 46e3 pages/s.
        bw, share = im.predict(46000, 16384)
        self.assertAlmostEqual(bw, 16384 * 132 * 4 * 1.98e9 / 46000, delta=1)
        self.assertAlmostEqual(share, bw / 3.35e12)
        self.assertEqual(im.predict(10, 16384)[1], 1.0)  # capped

    def test_view_of_a_fixed_width_page(self):
        tier = {"format": {"k": {"codec": "int", "bits": 4, "grouping": "channel", "group": 32,
                                 "block_channels": 0},
                           "v": {"codec": "int", "bits": 4, "grouping": "token", "group": 32,
                                 "block_channels": 0},
                           "page_bytes": 16384},
                "layout": {"tokens": 96, "bytes_used": 15376, "v_row_bytes": 64,
                           "unit_tokens": 0}}
        page = im.Page(tier, 128)
        self.assertFalse(page.huffman)
        self.assertEqual(page.load_bytes, 15376)
        v = page.view()
        self.assertEqual((v.n, v.per("k"), v.group("v")), (96, 2, 32))
        self.assertEqual(v.meta_halves("k"), 3 * 2 * 128)  # (scale, zero) per channel per 32
        self.assertEqual(v.meta_halves("v"), 2 * 4 * 96)  # per token per 32 channels
        self.assertEqual((v.acc_cols(), v.acc_splits()), (64, 2))



class KiviModelTest(unittest.TestCase):
    TIER = {"format": {"k": {"codec": "int", "bits": 4, "grouping": "channel", "group": 32,
                             "block_channels": 0},
                       "v": {"codec": "int", "bits": 4, "grouping": "token", "group": 32,
                             "block_channels": 0},
                       "page_bytes": 16384},
            "layout": {"tokens": 96, "bytes_used": 15376, "v_row_bytes": 64, "unit_tokens": 0}}

    def test_the_plan_picks_the_kivi_kernel_for_kivi_pages_only(self):
        self.assertEqual(im.model_for(self.TIER).kernel, "KiviChunkKernel<128, 4, 32, 32>")
        two = {**self.TIER, "format": {**self.TIER["format"],
                                      "k": {**self.TIER["format"]["k"], "bits": 2},
                                      "v": {**self.TIER["format"]["v"], "bits": 2}}}
        self.assertEqual(im.model_for(two).kernel, "KiviChunkKernel<128, 2, 32, 32>")
        per_token = {**self.TIER, "format": {**self.TIER["format"],
                                            "k": {**self.TIER["format"]["k"],
                                                  "grouping": "token"}}}
        self.assertEqual(im.model_for(per_token).kernel, "ChunkKernel<4>")
        mixed = {**self.TIER, "format": {**self.TIER["format"],
                                        "v": {**self.TIER["format"]["v"], "bits": 2}}}
        self.assertEqual(im.model_for(mixed).kernel, "ChunkKernel<4>")

    def test_work_split_of_a_page(self):
        shape = im._kivi(im.Page(self.TIER, 128))
        self.assertEqual((shape.groups, shape.slices), (3, 6))  # 32-token groups, 16-token slices
        # Warp w takes groups w, w + 4, ...: three warps once each, the fourth idle.
        self.assertEqual(im._warp_strided(3), [(1, 1), (1, 1), (1, 1)])
        self.assertEqual(im._warp_strided(6), [(1, 2), (1, 2), (1, 1), (1, 1)])
        self.assertEqual(im._warp_strided(0), [])


if __name__ == "__main__":
    unittest.main()
