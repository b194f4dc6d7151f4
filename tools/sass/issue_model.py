"""Static issue-bound model of the decode attention chunk kernels (sm_90a): the generic
ChunkKernel<4> (ANCHORS, PAGE_ROWS, VIEW_ROWS) and the KIVI kernel KiviChunkKernel<128, B, 32, 32>
(KIVI_ANCHORS, KIVI_ROWS); model_for() picks the one the decode plan runs on a tier's pages.

A page of B bytes that costs I warp-instructions can be read at most at
    B / (I / (SMS * ISSUE_PER_SM * CLOCK_HZ))   bytes/s
(every SM issues at most 4 warp-instructions per cycle), a share of HBM_BYTES_PER_S (capped at 1).

I per page = sum over the kernel's loops of (instructions of the loop that are not inside an
inner loop, from the SASS) x (times those run per page, from the page format). The loops are
found in the SASS of a -lineinfo build of decode_attention_kernels.cu (same flags as the
production archive, whose instruction stream the caller checks is identical) and identified by
their nest of source loops: each SASS loop's latch (its backward branch) carries the line of its
`for`, and the rows below (VIEW_ROWS, PAGE_ROWS) name those `for` statements by their text
(ANCHORS), so the table does not depend on line numbers.

Trip counts are warp-level: a loop `for (i = threadIdx.x; i < m; i += 128)` runs, in warp w,
as many iterations as its lane 0 (strided()). nvcc/ptxas unroll many loops; each row names an
instruction that appears a fixed number of times per source iteration (its signature), the
unroll factor follows from its count in the loop, and a loop run for k source iterations with
unroll u runs
floor(k / u) times, the rest falling to the next smaller version of the loop (a remainder loop)
or to straight-line code in the enclosing loop (counted there).

What the estimate is: static counts charge every instruction of a loop body per iteration, also
those on paths a format does not take (the kernel picks codec, bits and grouping at run time, so
its loops carry the code for all of them); straight-line code of the page (and Huffman unit)
loop is charged once per warp, all of it. Within a modeled loop the estimate is therefore an
upper bound on issue; softmax and reduction code left to straight-line remainders is counted
only through those page-level charges. For a kernel specialised at compile time (the planned
rebuild) static and executed counts coincide.
"""

import dataclasses
import math
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import sass_parse

# H100 SXM: HBM3 bandwidth, SMs, warp-instructions issued per SM per cycle, boost clock.
HBM_BYTES_PER_S = 3.35e12
SMS = 132
ISSUE_PER_SM = 4
CLOCK_HZ = 1.98e9
ISSUE_PER_S = SMS * ISSUE_PER_SM * CLOCK_HZ

THREADS = 128  # kDecodeThreads
WARPS = THREADS // 32
ROWS_PER_BLOCK = 4  # R: query rows per block; Llama-3-8B decode has 32 / 8 = 4 per kv-head
SOURCE = "kernels/cuda/decode_attention_kernels.cu"
# Headers whose inlined loops the kernels run (anchored as "file:Function").
HEADERS = ("kernels/cuda/huffman_unit.cuh",)
KERNEL = re.compile(r"ChunkKernel<%d>" % ROWS_PER_BLOCK)
HUFFMAN_LANES = 16  # kHuffmanStreamLanes: lanes that decode one stream

# The kernel's loops, by the text of their `for` inside a function (the nth such text, from 0).
# A function spelled "file:Name" is looked up in that header instead of SOURCE.
ANCHORS = {
    "page": ("ChunkKernel", "for (int pi = chunk.page_begin;", 0),
    "unit": ("ChunkKernel", "for (int index = 0; index * u < ref.slots;", 0),
    "load": ("LoadPage", "for (int i = threadIdx.x * 16;", 0),
    "scan": ("huffman_unit.cuh:HuffmanScan", "for (; pos < end; ++c)", 0),
    "rounds": ("huffman_unit.cuh:DecodeHuffmanUnit", "for (int round = 0; round < kLanes;", 0),
    "decode": ("huffman_unit.cuh:DecodeHuffmanUnit", "for (int i = first; pos < hi; ++i)", 0),
    "unit_meta": ("DecodeUnit", "for (int i = threadIdx.x; i < l.unit_meta_bytes;", 0),
    "meta_k": ("ConvertMeta", "for (int i = threadIdx.x; i < kh;", 0),
    "meta_v": ("ConvertMeta", "for (int i = threadIdx.x; i < vh;", 0),
    "score_token": ("ScoreView", "for (int t = threadIdx.x; t < v.n;", 0),
    "score_group": ("ScoreView", "for (int gi = 0; gi < groups; ++gi)", 0),
    "score_group_channel": ("ScoreView", "for (int c = gi * gs; c < (gi + 1) * gs; c += per)", 0),
    "score_group_code": ("ScoreView", "for (int e = 0; e < per; ++e)", 0),
    "score_qsum": ("ScoreView", "for (int j = 0; j < gs / 8; ++j)", 0),
    "score_qsum_slow": ("ScoreView", "for (int c = gi * gs; c < (gi + 1) * gs; ++c)", 0),
    "score_channel": ("ScoreView", "for (int c = 0; c < d; c += per)", 0),
    "score_code": ("ScoreView", "for (int e = 0; e < per; ++e)", 1),
    "score_warp_token": ("ScoreView", "for (int t = warp; t < v.n; t += kWarps)", 0),
    "score_lane_channel": ("ScoreView", "for (int c = lane; c < d; c += 32)", 0),
    "softmax_logits": ("SoftmaxView", "for (int t = lane; t < n; t += 32)", 0),
    "softmax_max": ("SoftmaxView", "for (int t = lane; t < n; t += 32)", 1),
    "softmax_exp": ("SoftmaxView", "for (int t = lane; t < n; t += 32)", 2),
    "rescale": ("RescaleAcc", "for (int i = threadIdx.x; i < rows * d;", 0),
    "acc_item": ("AccumulateView", "for (int item = threadIdx.x;", 0),
    "acc_token": ("AccumulateView", "for (int t = split; t < v.n; t += splits)", 0),
    "acc_atomic": ("AccumulateView", "atomicAdd(&s.acc[r * d + ch]", 0),
}


class ModelError(Exception):
    """The table no longer describes the kernel (a loop moved, appeared or changed shape)."""


def strided(m: int, first: int = 0, stride: int = THREADS) -> List[int]:
    """Iterations each warp runs of `for (i = threadIdx.x + first; i < m; i += stride)` (lanes
    with i < 0 sit out): as many as its lane with the smallest i."""
    out = []
    for w in range(WARPS):
        i0 = max(0, 32 * w + first)
        out.append(-(-(m - i0) // stride) if m > i0 else 0)
    return out


@dataclasses.dataclass
class View:
    """One RunView: n tokens of a fixed-width page (or decoded Huffman unit) of format f."""
    f: dict  # page_layouts' "format"
    l: dict  # page_layouts' "layout" (the unit layout for Huffman units)
    n: int
    d: int
    R: int = ROWS_PER_BLOCK

    def spec(self, which: str) -> dict:
        return self.f[which]

    def int_codes(self, which: str) -> bool:
        return self.spec(which)["codec"] == "int"

    def per(self, which: str) -> int:
        return 8 // self.spec(which)["bits"] if self.int_codes(which) else 1

    def group(self, which: str) -> int:
        return self.spec(which)["group"] or self.d

    def meta_halves(self, which: str) -> int:
        """KvMetaHalves of decode_attention_kernels.h, over the layout's slots."""
        s, d, tokens = self.spec(which), self.d, self.l["tokens"]
        if s["codec"] == "f16":
            return 0
        gs = self.group(which)
        if s["codec"] == "fp8":
            return (d // gs) * tokens
        if s["grouping"] == "token":
            return 2 * (d // gs) * tokens
        blocks = d // s["block_channels"] if s["grouping"] == "block" else d
        return (tokens // gs) * 2 * blocks

    # AccumulateView's thread items: (column, split).
    def acc_cols(self) -> int:
        return self.l["v_row_bytes"] if self.int_codes("v") else self.d

    def acc_splits(self) -> int:
        return max(1, THREADS // self.acc_cols())


Trips = List[Tuple[float, int]]  # (warp-level entries per view, source iterations per entry)


@dataclasses.dataclass
class Row:
    key: str
    path: Tuple[str, ...]  # anchors from the RunView (or page) level down to this loop
    phase: str
    trips: Callable[[View], Trips]
    sig: Optional[Tuple[str, int]] = None  # (opcode, count per source iteration); None: unroll 1
    active: Callable[[View], float] = lambda v: 1.0  # share of the loop's code copies that run


def _score_int(v: View) -> bool:
    return v.int_codes("k")


def _k_per_token(v: View) -> bool:
    return _score_int(v) and v.spec("k")["grouping"] == "token"


def _t_entries(v: View) -> int:
    return sum(strided(v.n)) if _score_int(v) else 0


# Loops of one RunView (ConvertMeta, ScoreView, SoftmaxView, RescaleAcc, AccumulateView), in
# order; `trips` per view. The decode benchmark computes no per-key scores: logits stay null.
VIEW_ROWS = [
    Row("meta_k", ("meta_k",), "meta", lambda v: [(1, k) for k in strided(v.meta_halves("k"))],
        ("STS", 1)),
    Row("meta_v", ("meta_v",), "meta", lambda v: [(1, k) for k in strided(v.meta_halves("v"))],
        ("STS", 1)),
    # Int keys: one thread per token.
    Row("score_token", ("score_token",), "score",
        lambda v: [(1, k) for k in strided(v.n)] if _score_int(v) else [], ("STS", ROWS_PER_BLOCK)),
    Row("score_channel", ("score_token", "score_channel"), "score",
        lambda v: [(_t_entries(v), v.d // v.per("k"))] if not _k_per_token(v) else [],
        ("LDS.U8", 1)),
    Row("score_code", ("score_token", "score_channel", "score_code"), "score",
        lambda v: [(_t_entries(v) * (v.d // v.per("k")), v.per("k"))] if not _k_per_token(v)
        else [], ("FADD", 1)),
    Row("score_group", ("score_token", "score_group"), "score",
        lambda v: [(_t_entries(v), v.d // v.group("k"))] if _k_per_token(v) else [],
        ("FMUL", ROWS_PER_BLOCK)),
    Row("score_group_channel", ("score_token", "score_group", "score_group_channel"), "score",
        lambda v: [(_t_entries(v) * (v.d // v.group("k")), v.group("k") // v.per("k"))]
        if _k_per_token(v) else [], ("LDS.U8", 1)),
    Row("score_group_code", ("score_token", "score_group", "score_group_channel",
                             "score_group_code"), "score",
        lambda v: [(_t_entries(v) * (v.d // v.per("k")), v.per("k"))] if _k_per_token(v) else [],
        ("FADD", 1)),
    # One copy per row r (unrolled); gs / 8 slices of q sums per group.
    Row("score_qsum", ("score_token", "score_group", "score_qsum"), "score",
        lambda v: [(_t_entries(v) * (v.d // v.group("k")), v.group("k") // 8)]
        if _k_per_token(v) and v.group("k") % 8 == 0 else [], ("FADD", 1)),
    Row("score_qsum_slow", ("score_token", "score_group", "score_qsum_slow"), "score",
        lambda v: [(_t_entries(v) * (v.d // v.group("k")), v.group("k"))]
        if _k_per_token(v) and v.group("k") % 8 else [], ("FADD", 1)),
    # f16 / fp8 keys: one warp per token, lanes over channels.
    Row("score_warp_token", ("score_warp_token",), "score",
        lambda v: [(1, -(-(v.n - w) // WARPS)) for w in range(WARPS) if v.n > w]
        if not _score_int(v) else [], ("SHFL", 5 * ROWS_PER_BLOCK)),
    Row("score_lane_channel", ("score_warp_token", "score_lane_channel"), "score",
        lambda v: [(v.n, -(-v.d // 32))] if not _score_int(v) else [], ("FFMA", ROWS_PER_BLOCK)),
    # One warp per row (R = 4 = warps: no loop over rows).
    Row("softmax_logits", ("softmax_logits",), "softmax", lambda v: [], ("LDS", 1)),
    Row("softmax_max", ("softmax_max",), "softmax", lambda v: [(v.R, -(-v.n // 32))],
        ("FMNMX", 1)),
    Row("softmax_exp", ("softmax_exp",), "softmax", lambda v: [(v.R, -(-v.n // 32))],
        ("MUFU.EX2", 1)),
    Row("rescale", ("rescale",), "rescale", lambda v: [(1, k) for k in strided(v.R * v.d)],
        ("FMUL", 1)),
    Row("acc_item", ("acc_item",), "accumulate",
        lambda v: [(1, k) for k in strided(v.acc_cols() * v.acc_splits())]),
    Row("acc_token", ("acc_item", "acc_token"), "accumulate",
        lambda v: [(sum(strided(v.acc_cols() * v.acc_splits())), -(-v.n // v.acc_splits()))],
        ("LDS.U16", 1)),
    # atomicAdd on shared fp32 is a compare-and-swap loop, one copy per (row, code e < 4) of an
    # item; copies with e >= codes per byte are skipped. One pass each (no contention).
    Row("acc_atomic", ("acc_item", "acc_atomic"), "accumulate",
        lambda v: [(sum(strided(v.acc_cols() * v.acc_splits())), 1)], ("ATOMS", 1),
        active=lambda v: min(v.per("v"), 4) / 4),
]


@dataclasses.dataclass
class Page:
    """One page of a tier: the views it runs and what it loads."""
    tier: dict  # page_layouts' tier
    d: int

    @property
    def huffman(self) -> bool:
        return "unit_layout" in self.tier

    @property
    def load_bytes(self) -> int:  # DecodeTier::load_bytes (decode_attention.cc)
        if self.huffman:
            return -(-self.tier["format"]["page_bytes"] // 16) * 16
        return -(-self.tier["layout"]["bytes_used"] // 16) * 16

    @property
    def units(self) -> int:
        l = self.tier["layout"]
        return l["tokens"] // l["unit_tokens"] if self.huffman else 0

    @property
    def lane_codes(self) -> int:
        """Codes each lane of a Huffman stream decodes: a sixteenth of d * U / 4."""
        return -(-(self.d * self.tier["layout"]["unit_tokens"] // 4) // HUFFMAN_LANES)

    def view(self) -> View:
        if self.huffman:
            ul = self.tier["unit_layout"]
            return View(self.tier["unit_format"], ul, ul["tokens"], self.d)
        return View(self.tier["format"], self.tier["layout"], self.tier["layout"]["tokens"],
                    self.d)


# Page-level loops; `trips` per page. Views per page: 1, or one per Huffman unit.
PAGE_ROWS = [
    # Straight-line code of the page loop, all of it, once per warp.
    Row("page", (), "overhead", lambda p: [(WARPS, 1)]),
    # cp.async of the next page, 16 bytes per thread per iteration.
    Row("load", ("load",), "load", lambda p: [(1, k) for k in strided(p.load_bytes // 16)],
        ("LDGSTS", 1)),
    Row("unit", ("unit",), "overhead", lambda p: [(WARPS * p.units, 1)] if p.huffman else []),
    # Every warp decodes two of the unit's 8 streams, 16 lanes each (huffman_unit.cuh): a scan
    # from each lane's guessed start, one round that rescans from the previous lane's end (and
    # the vote of a second that finds nothing to change: the lanes of a KV stream synchronize
    # within their sixteenth; huffman_unit_test also covers codes that take more rounds), then
    # the pass that writes the codes. Each pass runs a sixteenth of the stream's codes.
    Row("scan", ("unit", "scan"), "decode",
        lambda p: [(WARPS * p.units, p.lane_codes)] if p.huffman else [], ("LDG", 1)),
    Row("rounds", ("unit", "rounds"), "decode",
        lambda p: [(WARPS * p.units, 2)] if p.huffman else []),
    Row("rescan", ("unit", "rounds", "scan"), "decode",
        lambda p: [(WARPS * p.units, p.lane_codes)] if p.huffman else [], ("LDG", 1)),
    Row("decode", ("unit", "decode"), "decode",
        lambda p: [(WARPS * p.units, p.lane_codes)] if p.huffman else [], ("STS.U8", 1)),
    Row("unit_meta", ("unit", "unit_meta"), "decode",
        lambda p: [(p.units, k) for k in strided(p.tier["layout"]["unit_meta_bytes"])]
        if p.huffman else [], ("STS.U8", 1)),
]


Position = Tuple[str, int]  # (file name without its directory, 1-based line)


def _base(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _function_span(lines: List[str], name: str, file: str) -> Tuple[int, int]:
    """[first, last] line index of the definition of `name` (its body by brace matching)."""
    for i, line in enumerate(lines):
        if not re.search(r"\b%s\s*\(" % re.escape(name), line):
            continue
        text = "".join(lines[i:i + 6])
        rest = text[text.index(name):]
        brace, semi = rest.find("{"), rest.find(";")
        if brace < 0 or (0 <= semi < brace):
            continue  # a call or a declaration
        depth, started = 0, False
        for j in range(i, len(lines)):
            for ch in lines[j]:
                if ch == "{":
                    depth, started = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if started and depth == 0:
                return i, j
    raise ModelError(f"{file}: no definition of {name}() (update ANCHORS in issue_model.py)")


def anchor_lines(sources, anchors: Optional[Dict[str, Tuple[str, str, int]]] = None
                 ) -> Dict[str, Position]:
    """Position of each anchor (default: ANCHORS). `sources`: the kernel source's text, or
    {file name: text} for it and the headers anchors name ("file:Function")."""
    if isinstance(sources, str):
        sources = {_base(SOURCE): sources}
    out = {}
    for key, (fn, text, nth) in (ANCHORS if anchors is None else anchors).items():
        file, _, name = fn.rpartition(":")
        file = file or _base(SOURCE)
        if file not in sources:
            raise ModelError(f"issue model: anchor '{key}' is in {file}, which was not read")
        lines = sources[file].splitlines(keepends=True)
        first, last = _function_span(lines, name, file)
        hits = [i for i in range(first, last + 1) if text in lines[i]]
        if len(hits) <= nth:
            raise ModelError(f"{file}: loop '{key}' ({text!r}, occurrence {nth} in {name}) not "
                             "found: the kernel changed; update ANCHORS and ROWS in "
                             "tools/sass/issue_model.py")
        out[key] = (file, hits[nth] + 1)
    return out


@dataclasses.dataclass
class SassLoop:
    loop: sass_parse.Loop
    path: Tuple[Position, ...]  # latch positions of the enclosing loops, outermost first, own last


def loop_paths(fn: sass_parse.Function) -> List[SassLoop]:
    loops = sass_parse.find_loops(fn.instrs)
    by_addr = {i.addr: i for i in fn.instrs}

    files = {_base(f) for f in (SOURCE,) + HEADERS}

    def latch_line(l):
        """The innermost position of the latch's inline chain in the modeled files."""
        return next(((_base(f), n) for f, n in by_addr[l.end].lines if _base(f) in files), None)

    out = []
    for l in loops:
        addrs = {i.addr for i in l.instrs}
        outer = sorted((o for o in loops if o is not l and l.start in {i.addr for i in o.instrs}
                        and addrs <= {i.addr for i in o.instrs}), key=lambda o: o.depth)
        out.append(SassLoop(l, tuple(latch_line(o) for o in outer) + (latch_line(l),)))
    return out


def _signature_count(loop: sass_parse.Loop, opcode: str) -> int:
    return sum(1 for i in loop.own if i.opcode == opcode or i.opcode.startswith(opcode + "."))


@dataclasses.dataclass
class Matched:
    row: Row
    level: str  # "page" or "view"
    versions: List[Tuple[int, int]]  # (unroll, own instructions) per version, largest unroll first
    copies: int
    addrs: List[int]


def match(fn: sass_parse.Function, sources, km: Optional["KernelModel"] = None
          ) -> Tuple[List[Matched], List[SassLoop]]:
    """Every table row of the kernel model `km` (default: the generic kernel's) with its SASS
    loops, and the SASS loops inside the page loop that no row describes. Raises ModelError when
    a row finds no loop or its signature does not fit."""
    km = GENERIC if km is None else km
    lines = anchor_lines(sources, km.anchors)
    sass_loops = loop_paths(fn)
    page = (lines["page"],)
    prefixes = {"page": [page]}
    if km.view_rows:
        prefixes["view"] = [page, page + (lines["unit"],)]
    used, out = set(), []
    for level, rows in (("page", km.page_rows), ("view", km.view_rows)):
        for row in rows:
            for prefix in prefixes[level]:
                want = prefix + tuple(lines[a] for a in row.path)
                found = [s for s in sass_loops if s.path == want]
                if not found:
                    raise ModelError(f"issue model: no SASS loop for '{row.key}' at source lines "
                                     f"{want} in {fn.name}: update ROWS in issue_model.py")
                by_unroll: Dict[int, List[sass_parse.Loop]] = {}
                for s in found:
                    used.add(id(s.loop))
                    u = 1
                    if row.sig:
                        c = _signature_count(s.loop, row.sig[0])
                        if c == 0 or c % row.sig[1]:
                            raise ModelError(
                                f"issue model: '{row.key}' loop at {s.loop.start:#x} has {c} "
                                f"{row.sig[0]}, not a multiple of {row.sig[1]} per iteration: "
                                "update ROWS in issue_model.py")
                        u = c // row.sig[1]
                    by_unroll.setdefault(u, []).append(s.loop)
                copies = {len(v) for v in by_unroll.values()}
                if len(copies) != 1:
                    raise ModelError(f"issue model: '{row.key}' has versions with different "
                                     f"numbers of copies {sorted(copies)}")
                versions = [(u, max(len(l.own) for l in ls))
                            for u, ls in sorted(by_unroll.items(), reverse=True)]
                m = Matched(row, level + ("" if len(prefix) == 1 else ":unit"), versions,
                            copies.pop(), sorted(s.loop.start for s in found))
                out.append(m)
    unmatched = [s for s in sass_loops if s.path[:1] == page and id(s.loop) not in used]
    return out, unmatched


def _run(versions: Sequence[Tuple[int, int]], iters: int) -> int:
    """Instructions one copy issues for `iters` source iterations: largest unroll first."""
    total = 0
    for u, own in versions:
        total += (iters // u) * own
        iters %= u
    return total


def page_cost(matched: List[Matched], page: Page) -> Dict[str, float]:
    """Warp-instructions per page, by phase."""
    phases: Dict[str, float] = {}
    view = page.view()
    views = page.units if page.huffman else 1
    for m in matched:
        if m.level == "view:unit" and not page.huffman:
            continue
        if m.level == "view" and page.huffman:
            continue
        ctx, times = (page, 1) if m.level == "page" else (view, views)
        cost = 0.0
        active = m.row.active(ctx)
        for entries, iters in m.row.trips(ctx):
            cost += entries * _run(m.versions, iters) * m.copies * active
        phases[m.row.phase] = phases.get(m.row.phase, 0.0) + cost * times
    return phases


def predict(instructions: float, page_bytes: int) -> Tuple[float, float]:
    """(bytes/s, share of HBM) when issue is the only limit."""
    seconds = instructions / ISSUE_PER_S
    bw = page_bytes / seconds if seconds > 0 else math.inf
    return bw, min(1.0, bw / HBM_BYTES_PER_S)


# The KIVI kernel (KiviChunkKernel<D, B, 32, 32>, decode_attention_kernels.cu): one page format,
# every size a compile-time constant, so the static counts are the executed ones. All its loops
# run per page; trips from the page's slots (a full page), D and B.
KIVI_ANCHORS = {
    "page": ("KiviChunkKernel", "for (int pi = chunk.page_begin;", 0),
    "load": ("LoadPage", "for (int i = threadIdx.x * 16;", 0),
    "keys": ("KiviPage", "for (int gi = warp; gi < groups; gi += kWarps)", 0),
    "softmax_max": ("KiviSoftmax", "for (int t = lane; t < n; t += 32)", 0),
    "softmax_exp": ("KiviSoftmax", "for (int t = lane; t < n; t += 32)", 1),
    "weights": ("KiviPage", "for (int i = threadIdx.x; i < pairs; i += kDecodeThreads)", 0),
    "values": ("KiviPage", "for (int sl = warp; sl < slices; sl += kWarps)", 0),
}


@dataclasses.dataclass
class KiviShape:
    """The KIVI kernel's work split for one page (KiviPage): n slots, head_dim d, B-bit codes."""
    n: int
    d: int
    bits: int

    @property
    def groups(self) -> int:  # 32-token key groups
        return -(-self.n // 32)

    @property
    def slices(self) -> int:  # 16-token value slices
        return -(-self.n // 16)


def _kivi(page: "Page") -> KiviShape:
    f = page.tier["format"]
    return KiviShape(page.tier["layout"]["tokens"], page.d, f["k"]["bits"])


def _warp_strided(m: int) -> Trips:
    """`for (i = warp; i < m; i += WARPS)`: warp w runs ceil((m - w) / WARPS) iterations."""
    return [(1, -(-(m - w) // WARPS)) for w in range(WARPS) if m > w]


KIVI_ROWS = [
    # Straight-line code of the page loop (barriers, the accumulators' rescale, softmax's
    # reductions, remainders of unrolled loops), per warp.
    Row("page", (), "overhead", lambda p: [(WARPS, 1)]),
    Row("load", ("load",), "load", lambda p: [(1, k) for k in strided(p.load_bytes // 16)],
        ("LDGSTS", 1)),
    # Warp w: key groups w, w + 4, ...: kq in fp16 parts, kb, and D / 8 mma for 32 tokens.
    Row("keys", ("keys",), "score", lambda p: _warp_strided(_kivi(p).groups), ("HMMA", 0)),
    # Warp r: row r.
    Row("softmax_max", ("softmax_max",), "softmax",
        lambda p: [(ROWS_PER_BLOCK, -(-_kivi(p).n // 32))], ("FMNMX", 1)),
    Row("softmax_exp", ("softmax_exp",), "softmax",
        lambda p: [(ROWS_PER_BLOCK, -(-_kivi(p).n // 32))], ("MUFU.EX2", 1)),
    # Thread per 2 tokens: ps in fp16 parts for every row and value group (32-bit stores).
    Row("weights", ("weights",), "meta", lambda p: [(1, k) for k in strided(_kivi(p).slices * 8)],
        ("STS", 0)),
    # Warp w: 16-token slices w, w + 4, ...: D / 16 mma each.
    Row("values", ("values",), "accumulate", lambda p: _warp_strided(_kivi(p).slices),
        ("HMMA", 0)),
]


@dataclasses.dataclass
class KernelModel:
    """One kernel's loop table: its demangled name, anchors, and page- and view-level rows."""
    kernel: str
    anchors: Dict[str, Tuple[str, str, int]]
    page_rows: List[Row]
    view_rows: List[Row]
    applies: Callable[[dict], bool]  # to a page_layouts tier


def _is_kivi(tier: dict, d: int, bits: int) -> bool:
    f = tier["format"]
    k, v = f["k"], f["v"]
    return ("unit_layout" not in tier and f.get("head_dim", d) == d and k["codec"] == "int" and
            k["grouping"] == "channel" and k["group"] == 32 and v["codec"] == "int" and
            v["grouping"] == "token" and v["group"] == 32 and k["bits"] == bits and
            v["bits"] == bits)


def _kivi_rows(d: int) -> List[Row]:
    """KIVI_ROWS with the signatures of an instantiation for head_dim d (4 value groups)."""
    sigs = {"keys": ("HMMA", d // 8), "values": ("HMMA", d // 16),
            "weights": ("STS", (d // 32) * 2 * ROWS_PER_BLOCK)}
    return [dataclasses.replace(r, sig=sigs[r.key]) if r.key in sigs else r for r in KIVI_ROWS]


GENERIC = KernelModel("ChunkKernel<%d>" % ROWS_PER_BLOCK, ANCHORS, PAGE_ROWS, VIEW_ROWS,
                      lambda tier: True)
KIVI_HEAD_DIM = 128
MODELS = [KernelModel("KiviChunkKernel<%d, %d, 32, 32>" % (KIVI_HEAD_DIM, b), KIVI_ANCHORS,
                      _kivi_rows(KIVI_HEAD_DIM), [],
                      lambda tier, b=b: _is_kivi(tier, KIVI_HEAD_DIM, b)) for b in (4, 2)]
MODELS.append(GENERIC)


def model_for(tier: dict) -> KernelModel:
    """The kernel the decode plan runs on pages of this tier (ChooseDecodeKernel)."""
    return next(m for m in MODELS if m.applies(tier))
