#!/usr/bin/env python3
"""Reads a gperftools CPU profile (bench/gpu/profile.sh) and prints the functions with the most
samples on the stack (inclusive) and at the top (self), symbolizing the binary's own frames with
addr2line from the unstripped build; frames in shared libraries are named by their library.

  bench/gpu/profile_report.py PROFILE BINARY [FOCUS] [ROWS]

FOCUS keeps only the samples with a frame whose name contains it (for example Forward)."""
import collections
import os
import re
import struct
import subprocess
import sys


def read_profile(data):
    """The samples (count, program counters) and the executable mappings of a legacy profile."""
    header_words = struct.unpack_from("<5Q", data, 0)
    if header_words[0] != 0 or header_words[1] != 3:
        raise SystemExit("not a gperftools CPU profile (bad header)")
    off = 8 * (2 + header_words[1])
    samples = []
    while True:
        count, depth = struct.unpack_from("<2Q", data, off)
        off += 16
        pcs = struct.unpack_from("<%dQ" % depth, data, off)
        off += 8 * depth
        if count == 0 and depth == 1 and pcs[0] == 0:
            break
        samples.append((count, pcs))
    regions = []
    for line in data[off:].decode(errors="replace").splitlines():
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+) ([0-9a-f]+) \S+ \S+\s*(.*)", line)
        if m and "x" in m.group(3):
            regions.append((int(m.group(1), 16), int(m.group(2), 16), int(m.group(4), 16),
                            m.group(5)))
    return samples, regions


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    path, binary = sys.argv[1], sys.argv[2]
    focus = sys.argv[3] if len(sys.argv) > 3 else ""
    rows = int(sys.argv[4]) if len(sys.argv) > 4 else 45
    samples, regions = read_profile(open(path, "rb").read())
    base = os.path.basename(binary)

    def where(pc):
        for lo, hi, file_off, name in regions:
            if lo <= pc < hi:
                return name, pc - lo + file_off
        return "?", pc

    # A return address points past its call: look up the call itself (pc - 1) above the top.
    def frame(pc, depth):
        return where(pc if depth == 0 else pc - 1)

    own = sorted({o for _, pcs in samples for i, pc in enumerate(pcs)
                  for n, o in [frame(pc, i)] if n.endswith(base)})
    out = subprocess.run(["addr2line", "-f", "-C", "-e", binary] + [hex(o) for o in own],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    symbol = {o: re.sub(r"\(.*", "", out[2 * i])[:110] for i, o in enumerate(own)}

    def name(pc, depth):
        n, o = frame(pc, depth)
        return symbol.get(o, "?") if n.endswith(base) else n.split("/")[-1]

    top, inclusive, total = collections.Counter(), collections.Counter(), 0
    for count, pcs in samples:
        names = [name(pc, i) for i, pc in enumerate(pcs)]
        if focus and not any(focus in n for n in names):
            continue
        total += count
        top[names[0]] += count
        for n in set(names):
            inclusive[n] += count
    print(f"{total} samples" + (f" with {focus} on the stack" if focus else ""))
    for n, c in inclusive.most_common(rows):
        print(f"{c:7d} {100.0 * c / max(total, 1):5.1f}%  self {top[n]:6d}  {n}")


if __name__ == "__main__":
    main()
