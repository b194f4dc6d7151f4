"""Tests of sass_parse.py on checked-in listings of testdata/snippets.cu (a loop with 32- and
64-bit divisions, a kernel that spills, nested loops with a warp shuffle in divergent code), as
cuobjdump prints them for sm_90a and sm_80 and as nvdisasm -gi prints the -lineinfo build."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_parse as sp  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")


def read(name):
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def functions(name):
    return {f.name: f for f in sp.parse_sass(read(name))}


LOOP_DIV, SPILL, NESTED = "_Z7LoopDivPKiS0_PKlPlii", "_Z5SpillPKfPfi", "_Z6NestedPKfPfii"


def shape(fn):
    return [(hex(l.start), hex(l.end), l.depth, l.innermost) for l in sp.find_loops(fn.instrs)]


class ParseTest(unittest.TestCase):
    def test_functions_archs_and_targets(self):
        fns = functions("snippets_sm90a.sass")
        self.assertEqual(sorted(fns), sorted([LOOP_DIV, SPILL, NESTED]))
        self.assertEqual({f.arch for f in fns.values()}, {"sm_90a"})
        bra = [i for i in fns[LOOP_DIV].instrs if i.addr == 0x680][0]
        self.assertEqual((bra.pred, bra.opcode, bra.target), ("@!P0", "BRA", 0xE0))
        self.assertEqual({f.arch for f in sp.parse_sass(read("snippets_sm80.sass"))}, {"sm_80"})

    def test_res_usage(self):
        res = sp.parse_res_usage(read("snippets.res"))
        self.assertEqual(res[("sm_90a", SPILL)]["REG"], 24)
        self.assertEqual(res[("sm_90a", SPILL)]["STACK"], 72)
        self.assertEqual(res[("sm_90a", NESTED)]["STACK"], 0)
        self.assertEqual(res[("sm_80", SPILL)]["STACK"], 48)

    def test_instruction_classes(self):
        text = ("\tcode for sm_90a\n\t\tFunction : f\n"
                "        /*0000*/                   FFMA R0, R1, R2, R3 ;\n"
                "        /*0010*/                   HFMA2.MMA R4, -RZ, RZ, 0, 0 ;\n"
                "        /*0020*/                   HFMA2 R4, R5, R6, R7 ;\n"
                "        /*0030*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;\n"
                "        /*0040*/                   I2F.U32.RP R0, R5 ;\n"
                "        /*0050*/                   ATOMS.CAST.SPIN P0, [R2], R4, R5 ;\n"
                "        /*0060*/                   EXIT ;\n")
        (fn,) = sp.parse_sass(text)
        self.assertEqual([i.klass for i in fn.instrs],
                         ["fp32", "move", "half2", "global", "conversion", "atomic", "branch"])
        self.assertEqual(sp.mix(fn.instrs)["fp32"], 1)


class DivisionTest(unittest.TestCase):
    def test_loop_with_32_and_64_bit_divisions(self):
        for name, div32, div64 in (("snippets_sm90a.sass", [0x190, 0x220, 0x4C0], [0x4A0]),
                                   ("snippets_sm80.sass", [0x120, 0x1C0, 0x440], [0x420])):
            fn = functions(name)[LOOP_DIV]
            sites = sp.division_sites(fn)
            # a / m and a % b, and the 32-bit fast path nvcc puts before the 64-bit routine.
            self.assertEqual(sites["div32"], div32, name)
            self.assertEqual(sites["div64"], div64, name)
            (loop,) = sp.find_loops(fn.instrs)
            inside = {i.addr for i in loop.instrs}
            self.assertTrue(set(div32 + div64) <= inside, name)
            by_addr = {i.addr: i for i in fn.instrs}
            self.assertTrue(all(by_addr[a].opcode in ("I2F.RP", "I2F.U32.RP") for a in div32))
            # The 64-bit routine lies after the kernel's EXIT: a subroutine, not loop code.
            (sub,) = sp.subroutines(fn.instrs).items()
            self.assertGreater(sub[0], loop.end)
            self.assertTrue(any(i.opcode == "I2F.U64.RP" for i in fn.instrs
                                if sub[0] <= i.addr <= sub[1]))

    def test_i2f_without_reciprocal_is_no_division(self):
        text = ("\tcode for sm_90a\n\t\tFunction : f\n"
                "        /*0000*/                   I2F.RP R0, R5 ;\n"
                "        /*0010*/                   FADD R1, R0, R0 ;\n"
                "        /*0020*/                   F2I.FTZ.U32.TRUNC.NTZ R2, R1 ;\n"
                "        /*0030*/                   I2F.U32 R3, R5 ;\n"
                "        /*0040*/                   MUFU.RCP R3, R3 ;\n"
                "        /*0050*/                   EXIT ;\n")
        (fn,) = sp.parse_sass(text)
        self.assertEqual(sp.division_sites(fn), {"div32": [], "div64": []})

    def test_no_divisions_where_none(self):
        for fn in functions("snippets_sm90a.sass").values():
            if fn.name != LOOP_DIV:
                self.assertEqual(sp.division_sites(fn), {"div32": [], "div64": []})


class SpillTest(unittest.TestCase):
    def test_spill_bytes_match_ptxas(self):
        # ptxas -v for sm_90a: 72 bytes stack frame, 88 bytes spill stores, 88 bytes spill loads.
        fn = functions("snippets_sm90a.sass")[SPILL]
        self.assertEqual(sp.local_traffic(fn.instrs),
                         {"stl": 22, "ldl": 22, "stl_bytes": 88, "ldl_bytes": 88})
        fn80 = functions("snippets_sm80.sass")[SPILL]
        self.assertEqual(sp.local_traffic(fn80.instrs)["stl_bytes"], 56)

    def test_widths(self):
        text = ("\tcode for sm_90a\n\t\tFunction : f\n"
                "        /*0000*/                   STL.64 [R1], R2 ;\n"
                "        /*0010*/                   STL.128 [R1+0x10], R4 ;\n"
                "        /*0020*/                   LDL.U8 R0, [R1+0x20] ;\n"
                "        /*0030*/                   EXIT ;\n")
        (fn,) = sp.parse_sass(text)
        self.assertEqual(sp.local_traffic(fn.instrs),
                         {"stl": 2, "ldl": 1, "stl_bytes": 24, "ldl_bytes": 1})

    def test_no_spills_elsewhere(self):
        fn = functions("snippets_sm90a.sass")[NESTED]
        self.assertEqual(sp.local_traffic(fn.instrs)["stl"], 0)


class LoopTest(unittest.TestCase):
    def test_nested_loops_sm90a(self):
        fn = functions("snippets_sm90a.sass")[NESTED]
        self.assertEqual(shape(fn), [
            # ptxas's copy of the i loop for m <= 0: only the second j loop inside.
            ("0xc0", "0x1b0", 0, False), ("0x140", "0x190", 1, True),
            # i loop > j loop > k loop, and the second j loop beside the first.
            ("0x1f0", "0x470", 0, False), ("0x240", "0x390", 1, False),
            ("0x2e0", "0x350", 2, True), ("0x400", "0x450", 1, True)])

    def test_cold_copy_jumping_back_is_no_loop(self):
        # The diverged-warp path of the shuffle (after BRA.DIV) ends in `BRA 0x580` from 0x800:
        # a backward branch, but 0x580 does not dominate it.
        fn = functions("snippets_sm90a.sass")[NESTED]
        back = [i for i in fn.instrs if i.opcode == "BRA" and i.target == 0x580]
        self.assertEqual([i.addr for i in back], [0x800])
        self.assertNotIn(0x580, [l.start for l in sp.find_loops(fn.instrs)])

    def test_same_shape_on_sm80(self):
        # sm_80 calls a subroutine for the diverged-warp shuffle; the loops are the same.
        fn = functions("snippets_sm80.sass")[NESTED]
        self.assertEqual([(d, i) for _, _, d, i in shape(fn)],
                         [(0, False), (1, True), (0, False), (1, False), (2, True), (1, True)])

    def test_own_excludes_inner_loops(self):
        fn = functions("snippets_sm90a.sass")[NESTED]
        loops = {l.start: l for l in sp.find_loops(fn.instrs)}
        outer = loops[0x1F0]
        inner = sum(len(loops[a].instrs) for a in (0x240, 0x400))
        self.assertEqual(len(outer.own), len(outer.instrs) - inner)

    def test_ldgsts_loop_body_is_the_range(self):
        fn = functions("snippets_sm90a.sass")[SPILL]
        (loop,) = sp.find_loops(fn.instrs)
        self.assertEqual([i.addr for i in loop.instrs], list(range(loop.start, loop.end + 16, 16)))


class LineInfoTest(unittest.TestCase):
    def test_nvdisasm_listing_matches_cuobjdump(self):
        a = functions("snippets_sm90a.sass")
        b = functions("snippets_sm90a_lineinfo.nvdisasm")
        for name in a:
            self.assertEqual([(i.addr, i.pred, i.opcode, i.target) for i in a[name].instrs],
                             [(i.addr, i.pred, i.opcode, i.target) for i in b[name].instrs])

    def test_latches_carry_their_for_lines(self):
        source = read("snippets.cu").splitlines()

        def line_of(text):
            (n,) = [k + 1 for k, line in enumerate(source) if text in line]
            return n

        fn = functions("snippets_sm90a_lineinfo.nvdisasm")[NESTED]
        by_addr = {i.addr: i for i in fn.instrs}
        latch = {hex(l.start): by_addr[l.end].line_in("snippets.cu")
                 for l in sp.find_loops(fn.instrs)}
        i_loop = line_of("for (int i = 0; i < n; ++i)")
        j_loop = line_of("for (int j = 0; j < m; ++j)")
        k_loop = line_of("for (int k = threadIdx.x; k < m; k += 32)")
        j2_loop = line_of("for (int j = threadIdx.x; j < n; j += 32)")
        self.assertEqual(latch, {"0xc0": i_loop, "0x140": j2_loop, "0x1f0": i_loop,
                                 "0x240": j_loop, "0x2e0": k_loop, "0x400": j2_loop})


if __name__ == "__main__":
    unittest.main()
