"""Parses NVIDIA SASS listings into functions, loops, instruction mixes and division sites.

Reads the text of `cuobjdump -sass` (addresses, hex branch targets) and of `nvdisasm -gi`
(labels, `(.L_x_N) branch targets, `//## File "...", line N` line info, innermost first), and
`cuobjdump -res-usage`. Python standard library only; no tool is run here (cuda_resources.py
runs them), so the parser is unit-tested on checked-in listings (testdata/).

Loops (find_loops): a backward BRA to a block that dominates it closes a loop; for ptxas's
layout its body is the address range [target, branch], plus out-of-line blocks that return into
it. Branches to the same head are one loop. A loop that contains no other loop is innermost: a
hot loop. Backward branches of cold code (a diverged warp's copy of a shuffle) close none.

Integer division (division_sites): nvcc expands a runtime 32-bit `/` or `%` into I2F.RP
(I2F.U32.RP unsigned) of the divisor, MUFU.RCP of that, F2I.FTZ.U32.TRUNC.NTZ, then IMAD.HI.U32
corrections; a 64-bit one into a CALL.REL.NOINC to an internal subroutine placed after the
kernel's EXIT (`__cuda_sm20_div_s64` and kin, holding I2F.U64.RP, MUFU.RCP, F2I.U64.TRUNC),
behind a 32-bit fast path. Checked with CUDA 13 on `a / m`, `a % b`, `c / d` over runtime ints
and int64s, sm_90a and sm_80: testdata/snippets.cu and its listings.
"""

import collections
import dataclasses
import re
from typing import Dict, List, Optional, Tuple

# Instruction classes by base opcode (the text before the first '.').
_CLASSES = {
    "fp32": "FFMA FMUL FADD FMNMX FSEL FSET FSETP FCHK FSWZADD FRND FMUL32I FFMA32I FADD32I",
    "fp64": "DFMA DMUL DADD DSETP DMNMX",
    "half2": "HFMA2 HADD2 HMUL2 HMNMX2 HSET2 HSETP2 HFMA2_32I HADD2_32I HMUL2_32I",
    "tensor": "HMMA IMMA HGMMA DMMA BMMA IGMMA WARPGROUP",
    "int": ("IMAD IMAD32I IADD3 IADD IADD32I LOP3 LOP LOP32I SHF SHL SHR LEA IABS IMNMX ISETP "
            "SEL PRMT FLO POPC BREV BMSK SGXT IMUL ISCADD VIADD VIADDMNMX VIMNMX VIMNMX3 VABSDIFF "
            "VABSDIFF4 IDP IDP4A P2R R2P PLOP3 PSETP ICMP"),
    "uniform": ("UIADD3 UIMAD ULOP3 USHF ULEA USEL UISETP UMOV UPRMT UFLO UPOPC UBREV USGXT UBMSK "
                "UPLOP3 UPSETP UP2UR ULOP ULOP32I S2UR R2UR UCLEA UVIADD UIABS UIMNMX"),
    "move": "MOV MOV32I S2R CS2R",
    "shared": "LDS STS LDSM STSM",
    "global": "LDG STG LDGSTS LDGDEPBAR LD ST UBLKCP UTMALDG UTMASTG",
    "local": "LDL STL",
    "const": "LDC ULDC",
    "mufu": "MUFU",
    "conversion": "I2F F2I F2F I2I F2FP I2FP F2IP",
    "barrier": "BAR DEPBAR MEMBAR ERRBAR SYNCS ARRIVES",
    "shuffle": "SHFL VOTE VOTEU MATCH REDUX",
    "atomic": "ATOMS ATOMG ATOM RED REDG REDAS",
    "branch": "BRA BRX JMP JMX CALL RET EXIT BSSY BSYNC WARPSYNC ENDCOLLECTIVE BPT BREAK KILL",
}
_CLASS_OF = {op: cls for cls, ops in _CLASSES.items() for op in ops.split()}
CLASSES = list(_CLASSES) + ["other"]

# One instruction: `/*0a30*/  @!P0 BRA 0x130 ;` (cuobjdump) or `` BRA `(.L_x_5) ; `` (nvdisasm).
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^([.$\w]+):\s*$")
_LINE = re.compile(r'^\s*//## File "([^"]*)", line (\d+)')
_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_ARCH = re.compile(r"^\s*(?:arch = |code for |\.target\s+)(sm_\w+)")
_HEX_TARGET = re.compile(r"(?:^|[\s,])(0x[0-9a-f]+)\s*$")
_LABEL_TARGET = re.compile(r"`\(([^)]+)\)")


@dataclasses.dataclass
class Instr:
    addr: int
    pred: str  # "@P0", "@!UP1" or ""
    opcode: str  # full opcode with modifiers: "F2I.FTZ.U32.TRUNC.NTZ"
    operands: str
    target: Optional[int] = None  # branch/call target address
    # Source positions (file, line), innermost first then the lines it is inlined at
    # (nvdisasm -gi listings only).
    lines: Tuple[Tuple[str, int], ...] = ()

    @property
    def base(self) -> str:
        return self.opcode.split(".", 1)[0]

    @property
    def klass(self) -> str:
        if self.base == "HFMA2" and re.match(r"\S+, -RZ, RZ, ", self.operands):
            return "move"  # HFMA2.MMA Rd, -RZ, RZ, imm: ptxas's idiom for a constant move
        return _CLASS_OF.get(self.base, "other")

    def line_in(self, file_suffix: str) -> Optional[int]:
        """The innermost line of this instruction's inline chain that lies in `file_suffix`."""
        return next((n for f, n in self.lines if f.endswith(file_suffix)), None)

    def text(self) -> str:
        return f"{self.pred + ' ' if self.pred else ''}{self.opcode} {self.operands}".strip()


@dataclasses.dataclass
class Function:
    name: str  # mangled
    arch: str  # "sm_90a"
    instrs: List[Instr]


@dataclasses.dataclass
class Loop:
    start: int  # address of the branch target (the loop head)
    end: int  # address of the last backward branch to it
    instrs: List[Instr]
    depth: int = 0  # 0 = outermost
    innermost: bool = True
    own: List[Instr] = dataclasses.field(default_factory=list)  # not inside an inner loop


def _split(text: str) -> Tuple[str, str, str]:
    """'@!P0 BRA 0x130' -> ('@!P0', 'BRA', '0x130')."""
    pred = ""
    if text.startswith("@"):
        pred, text = text.split(None, 1)
    parts = text.split(None, 1)
    return pred, parts[0], parts[1] if len(parts) > 1 else ""


def parse_sass(text: str) -> List[Function]:
    """Functions of a cuobjdump -sass or nvdisasm listing, in order, with targets resolved."""
    functions: List[Function] = []
    arch = ""
    cur: Optional[Function] = None
    labels: Dict[str, int] = {}
    pending_labels: List[str] = []
    pending_lines: List[Tuple[str, int]] = []
    label_refs: List[Tuple[Instr, str]] = []

    def finish():
        for ins, label in label_refs:
            ins.target = labels.get(label)
        label_refs.clear()

    for raw in text.splitlines():
        m = _ARCH.match(raw)
        if m:
            arch = m.group(1)
            continue
        m = _FUNCTION.match(raw) or _SECTION.match(raw)
        if m:
            finish()
            cur = Function(m.group(1), arch, [])
            functions.append(cur)
            labels, pending_labels, pending_lines = {}, [], []
            continue
        if cur is None:
            continue
        m = _LINE.match(raw)
        if m:
            pending_lines.append((m.group(1), int(m.group(2))))
            continue
        m = _LABEL.match(raw.strip())
        if m:
            pending_labels.append(m.group(1))  # ".L_x_12:", "$__internal_0_$__cuda_sm20_div_s64:"
            continue
        m = _INSTR.match(raw)
        if not m:
            continue
        pred, opcode, operands = _split(m.group(2))
        ins = Instr(int(m.group(1), 16), pred, opcode, operands)
        if pending_lines:
            ins.lines = tuple(pending_lines)
            pending_lines = []
        elif cur.instrs:
            ins.lines = cur.instrs[-1].lines
        for label in pending_labels:
            labels[label] = ins.addr
        pending_labels = []
        if ins.base in ("BRA", "CALL", "JMP"):
            lm = _LABEL_TARGET.search(operands)
            hm = _HEX_TARGET.search(operands)
            if lm:
                label_refs.append((ins, lm.group(1)))
            elif hm:
                ins.target = int(hm.group(1), 16)
        cur.instrs.append(ins)
    finish()
    for fn in functions:  # the NOPs that pad a function to its alignment are no code
        while fn.instrs and fn.instrs[-1].opcode == "NOP":
            fn.instrs.pop()
    return functions


def parse_res_usage(text: str) -> Dict[Tuple[str, str], Dict[str, int]]:
    """{(arch, mangled name): {"REG": .., "STACK": .., "SHARED": .., "LOCAL": .., ...}}."""
    out: Dict[Tuple[str, str], Dict[str, int]] = {}
    arch, name = "", None
    for raw in text.splitlines():
        m = _ARCH.match(raw)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"^\s*Function (\S+):\s*$", raw)
        if m:
            name = m.group(1)
            continue
        if name and re.match(r"^\s*REG:", raw):
            pairs = re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", raw)
            out[(arch, name)] = {k: int(v) for k, v in pairs}
            name = None
    return out


def subroutines(instrs: List[Instr]) -> Dict[int, int]:
    """{start: end} of the subroutines CALLed in a function: code placed after the kernel's
    body (internal division routines, the float division slow path, sm_80's diverged-warp
    shuffle) that reaches a RET before any EXIT. sm_80 code also uses `@P0 CALL.REL.NOINC` as a
    conditional jump out of a loop (to the code after the loop's back branch, which never
    returns): not a subroutine."""
    by_addr = {ins.addr: k for k, ins in enumerate(instrs)}
    out: Dict[int, int] = {}
    for ins in instrs:
        if ins.base != "CALL" or ins.target not in by_addr or ins.target in out:
            continue
        for o in instrs[by_addr[ins.target]:]:
            if o.base == "RET":
                out[ins.target] = o.addr
                break
            if (o.base == "EXIT" and not o.pred) or (o.base == "BRA" and o.target == o.addr):
                break
    return out


def _is_jump(ins: Instr, subs: Dict[int, int]) -> bool:
    """A branch whose target the next block may be: BRA/JMP (not BRA.DIV, the diverged-warp
    path before a warp-synchronous shuffle, a cold copy of code), or a CALL that is not a
    subroutine call."""
    if ins.base in ("BRA", "JMP"):
        return ".DIV" not in ins.opcode
    return ins.base == "CALL" and ins.target is not None and ins.target not in subs


def _blocks(instrs: List[Instr]):
    """Basic blocks [(first index, last index)] and successor lists (block indices). A BRA.DIV's
    taken edge is left out, and subroutine CALLs fall through (the callee returns); BRX/JMX
    (indirect) and RET end a path."""
    n = len(instrs)
    by_addr = {ins.addr: k for k, ins in enumerate(instrs)}
    subs = subroutines(instrs)
    leaders = {0}
    for k, ins in enumerate(instrs):
        jump = _is_jump(ins, subs)
        if ins.base in ("BRA", "BRX", "JMX", "JMP", "EXIT", "RET") or jump:
            if k + 1 < n:
                leaders.add(k + 1)
            if jump and ins.target in by_addr:
                leaders.add(by_addr[ins.target])
    starts = sorted(leaders)
    ends = [s - 1 for s in starts[1:]] + [n - 1]
    blocks = list(zip(starts, ends))
    block_of = {s: b for b, (s, _) in enumerate(blocks)}
    succ: List[List[int]] = []
    for b, (s, e) in enumerate(blocks):
        last = instrs[e]
        out = []
        conditional = bool(last.pred) and last.pred not in ("@PT",)
        # BRA.U !UP0, target / BRA.DIV URx, target: a predicate or condition operand.
        if last.base == "BRA" and re.match(r"!?U?P\d|UR\d", last.operands):
            conditional = True
        falls = b + 1 < len(blocks)
        if _is_jump(last, subs):
            if last.target in by_addr:
                out.append(block_of[by_addr[last.target]])
            if conditional and falls:
                out.append(b + 1)
        elif last.base in ("EXIT", "RET", "BRX", "JMX"):
            if conditional and falls:
                out.append(b + 1)
        elif falls:
            out.append(b + 1)
        succ.append(sorted(set(out)))
    return blocks, succ


def _dominators(succ: List[List[int]]) -> Dict[int, int]:
    """Immediate dominators of the blocks reachable from block 0 (Cooper, Harvey, Kennedy)."""
    order: List[int] = []
    seen = {0}
    stack = [(0, iter(succ[0]))]
    while stack:
        b, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            order.append(b)
            stack.pop()
        elif nxt not in seen:
            seen.add(nxt)
            stack.append((nxt, iter(succ[nxt])))
    rpo = order[::-1]
    index = {b: i for i, b in enumerate(rpo)}
    preds: Dict[int, List[int]] = collections.defaultdict(list)
    for b in rpo:
        for s in succ[b]:
            preds[s].append(b)
    idom = {0: 0}

    def intersect(a: int, b: int) -> int:
        while a != b:
            while index[a] > index[b]:
                a = idom[a]
            while index[b] > index[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            ps = [p for p in preds[b] if p in idom]
            new = ps[0]
            for p in ps[1:]:
                new = intersect(p, new)
            if idom.get(b) != new:
                idom[b] = new
                changed = True
    return idom


def _dominates(idom: Dict[int, int], a: int, b: int) -> bool:
    while True:
        if a == b:
            return True
        if b == 0:
            return False
        b = idom[b]


def find_loops(instrs: List[Instr]) -> List[Loop]:
    """Natural loops of the function's control flow, outer before inner, with depth, innermost
    and `own` (instructions not inside an inner loop) set.

    A back edge is a branch to a block that dominates it (for loops laid out as ptxas does, a
    backward BRA to the loop head: the body is then the range [target, branch] plus any
    out-of-line block that returns into it). Backward branches that are not back edges (cold
    copies of code placed after EXIT that jump back, e.g. the diverged-warp path of a
    shuffle) close no loop."""
    if not instrs:
        return []
    blocks, succ = _blocks(instrs)
    idom = _dominators(succ)
    preds: Dict[int, List[int]] = collections.defaultdict(list)
    for b, ss in enumerate(succ):
        for s in ss:
            preds[s].append(b)
    bodies: Dict[int, set] = {}
    latches: Dict[int, int] = {}
    for b in idom:
        for h in succ[b]:
            if h in idom and _dominates(idom, h, b):
                body = bodies.setdefault(h, {h})
                stack = [b]
                while stack:
                    x = stack.pop()
                    if x not in body:
                        body.add(x)
                        stack.extend(p for p in preds[x] if p in idom)
                latches[h] = max(latches.get(h, -1), blocks[b][1])
    loops = []
    for h, body in bodies.items():
        ks = sorted(k for b in body for k in range(blocks[b][0], blocks[b][1] + 1))
        loops.append((h, body, Loop(instrs[blocks[h][0]].addr, instrs[latches[h]].addr,
                                    [instrs[k] for k in ks])))
    loops.sort(key=lambda x: (x[2].start, -x[2].end))
    for h, body, loop in loops:
        inner = [o for g, o, _ in loops if g != h and g in body]
        loop.innermost = not inner
        loop.depth = sum(1 for g, o, _ in loops if g != h and h in o)
        inside = set().union(*inner) if inner else set()
        loop.own = [instrs[k] for b in sorted(body - inside)
                    for k in range(blocks[b][0], blocks[b][1] + 1)]
    return [l for _, _, l in loops]


def mix(instrs: List[Instr]) -> Dict[str, int]:
    """Instruction counts per class (only classes present)."""
    c = collections.Counter(i.klass for i in instrs)
    return {k: c[k] for k in CLASSES if c[k]}


def _reads(ins: Instr, reg: str) -> bool:
    sources = ins.operands.split(",", 1)[-1]
    return re.search(r"(?<![\w.])" + re.escape(reg) + r"(?![\w])", sources) is not None


def _div32_at(instrs: List[Instr], k: int, window: int = 40) -> bool:
    """Whether instrs[k] (an I2F.*.RP, not 64-bit) starts a 32-bit division sequence: a MUFU.RCP
    of its result and then an F2I...TRUNC within `window` instructions."""
    ins = instrs[k]
    dst = ins.operands.split(",", 1)[0].strip()
    rcp = None
    for j in range(k + 1, min(len(instrs), k + window)):
        o = instrs[j]
        if rcp is None and o.opcode == "MUFU.RCP" and _reads(o, dst):
            rcp = o.operands.split(",", 1)[0].strip()
        elif rcp is not None and o.base == "F2I" and "TRUNC" in o.opcode:
            return True
    return False


def _is_rp_i2f(ins: Instr) -> bool:
    mods = ins.opcode.split(".")[1:]
    return ins.base == "I2F" and "RP" in mods


def _is_64(ins: Instr) -> bool:
    return any(m in ("U64", "S64") for m in ins.opcode.split(".")[1:])


def division_sites(fn: Function) -> Dict[str, List[int]]:
    """Addresses of 32-bit division sequences (their I2F.RP) and of CALLs to a 64-bit division
    subroutine (one holding I2F.U64.RP or I2F.S64.RP before its RET). Sequences inside such a
    subroutine are not counted as 32-bit ones; 64-bit sequences inlined outside one count as
    64-bit at their I2F."""
    instrs = fn.instrs
    subs = subroutines(instrs)
    divides64 = {s for s, e in subs.items()
                 if any(_is_rp_i2f(o) and _is_64(o) for o in instrs if s <= o.addr <= e)}

    def in_subroutine(a: int) -> bool:
        return any(s <= a <= e for s, e in subs.items())

    div32, div64 = [], []
    for k, ins in enumerate(instrs):
        if ins.base == "CALL" and ins.target in divides64:
            div64.append(ins.addr)
        elif _is_rp_i2f(ins) and not in_subroutine(ins.addr):
            if _is_64(ins):
                div64.append(ins.addr)
            elif _div32_at(instrs, k):
                div32.append(ins.addr)
    return {"div32": div32, "div64": div64}


def local_traffic(instrs: List[Instr]) -> Dict[str, int]:
    """STL/LDL instructions and their bytes (width from .64/.128 modifiers, else 4 bytes; .U8 and
    friends 1-2). Summed statically these equal ptxas -v's spill store/load bytes when all
    local memory is spills (checked on ChunkKernel<4>: 5 STL = 20 bytes, 11 LDL = 44 bytes)."""
    out = {"stl": 0, "ldl": 0, "stl_bytes": 0, "ldl_bytes": 0}
    widths = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}
    for ins in instrs:
        if ins.base not in ("STL", "LDL"):
            continue
        w = 4
        for m in ins.opcode.split(".")[1:]:
            w = widths.get(m, w)
        key = ins.base.lower()
        out[key] += 1
        out[key + "_bytes"] += w
    return out
