"""Per-kernel machine-code resources of every cuda_library, and the decode kernel's issue bound.

    bazel run //tools/sass:cuda_resources -- --out $PWD/bench/results/cuda-resources.json

Runs `cuobjdump -res-usage` and `cuobjdump -sass` on the nvcc archives (lib<name>_nvcc.a, the
real build outputs: sm_80 and sm_90a cubins), and records for every kernel and arch: registers,
stack frame, static shared memory, local-memory instructions (STL/LDL and their bytes), the
instruction mix of the whole function and of each hot (innermost) loop, and integer-division
sequences (in loops too). Then the issue-bound model (issue_model.py) of the decode kernel the
plan picks for each KV preset (KiviChunkKernel for KIVI pages, ChunkKernel<4> for the rest) on its pages at Llama-3-8B shapes, from a -lineinfo build of the same source
(nvdisasm -gi) whose instruction stream must equal the production archive's.

Prints a table and, with --out, writes JSON. cuda_resources_test.py applies the gates to the
same analysis (analyze()). Tools: $SLUICE_SASS_TOOLS, else /usr/local/cuda/bin, else the venv
that setup_sass_tools.sh makes (this binary runs that script when nothing is found).
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import issue_model  # noqa: E402
import sass_parse  # noqa: E402

# The decode kernel: gates on divisions in its loops apply to every R.
CHUNK_KERNEL = re.compile(r"^(Kivi)?ChunkKernel<[0-9, ]+>$")
TARGET_SHARE = 0.70  # of HBM, 4-bit sluice pages at Llama-3-8B shapes (the decode issue)
SHARE_PRESETS = ("sluice", "fp16")


class ToolError(Exception):
    pass


def find_tools(install: bool = False) -> Dict[str, str]:
    """Paths of cuobjdump, nvdisasm and c++filt. Looks in $SLUICE_SASS_TOOLS (which must then
    hold them), /usr/local/cuda/bin and the sass-venv; with `install`, runs setup_sass_tools.sh
    when none has them."""
    env = os.environ.get("SLUICE_SASS_TOOLS")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates = [env] if env else []
    candidates += ["/usr/local/cuda/bin"]
    candidates += sorted(glob.glob(os.path.join(
        cache, "sluice/sass-venv/lib/python3*/site-packages/nvidia/*/bin")))
    found = None
    for d in candidates:
        if all(os.access(os.path.join(d, t), os.X_OK) for t in ("cuobjdump", "nvdisasm")):
            found = d
            break
        if d == env:
            break  # an explicit directory that lacks them is an error, not a hint
    if found is None and install and not env:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "setup_sass_tools.sh")
        found = subprocess.run([script], check=True, stdout=subprocess.PIPE,
                               text=True).stdout.strip()
    if found is None:
        where = (f"SLUICE_SASS_TOOLS={env}" if env else
                 f"/usr/local/cuda/bin, {cache}/sluice/sass-venv")
        raise ToolError(
            f"cuobjdump and nvdisasm not found ({where}). Run tools/sass/setup_sass_tools.sh and "
            "pass its output: bazel test --test_env=SLUICE_SASS_TOOLS=$(tools/sass/"
            "setup_sass_tools.sh) //tools/sass/... (./sluice test does this).")
    cxxfilt = shutil.which("c++filt") or "/usr/bin/c++filt"
    if not os.access(cxxfilt, os.X_OK):
        raise ToolError("c++filt (binutils) not found")
    return {"cuobjdump": os.path.join(found, "cuobjdump"),
            "nvdisasm": os.path.join(found, "nvdisasm"), "c++filt": cxxfilt}


def _run(cmd: List[str], **kw) -> str:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if p.returncode != 0:
        raise ToolError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[:2000]}")
    return p.stdout


def demangle(names: List[str], cxxfilt: str) -> Dict[str, str]:
    out = _run([cxxfilt], input="\n".join(names) + "\n").splitlines()
    return dict(zip(names, out))


def short_name(demangled: str) -> str:
    """'void ns::(anonymous namespace)::ChunkKernel<4>(ns::P)' -> 'ChunkKernel<4>'."""
    s = demangled.strip()
    if s.endswith(")"):  # drop the parameter list
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    parts, depth, cur = [], 0, ""
    i = 0
    while i < len(s):  # split on top-level "::" and spaces (return type)
        ch = s[i]
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(ch, 0)
        if depth == 0 and s.startswith("::", i):
            parts.append(cur)
            cur, i = "", i + 2
            continue
        if depth == 0 and ch == " ":
            cur = ""
        else:
            cur += ch
        i += 1
    return cur


def library_label(archive: str) -> str:
    """kernels/cuda/librmsnorm_nvcc.a -> //kernels/cuda:rmsnorm."""
    d, base = os.path.split(archive)
    m = re.match(r"lib(.+)_nvcc\.a$", base)
    return f"//{d}:{m.group(1) if m else base}"


def _loop_record(loop: sass_parse.Loop, div: Dict[str, List[int]]) -> dict:
    addrs = {i.addr for i in loop.instrs}
    return {"start": f"{loop.start:#x}", "end": f"{loop.end:#x}", "depth": loop.depth,
            "instructions": len(loop.instrs), "mix": sass_parse.mix(loop.instrs),
            "div32": sum(1 for a in div["div32"] if a in addrs),
            "div64": sum(1 for a in div["div64"] if a in addrs)}


HOT_LOOPS_KEPT = 8  # per kernel in the JSON, largest first; loops with divisions always


def _hot_loops(loops: List[sass_parse.Loop], div: Dict[str, List[int]]) -> List[dict]:
    """The innermost loops, largest first: the first HOT_LOOPS_KEPT and any that divides."""
    recs = sorted((_loop_record(l, div) for l in loops if l.innermost),
                  key=lambda r: -r["instructions"])
    return [r for k, r in enumerate(recs) if k < HOT_LOOPS_KEPT or r["div32"] or r["div64"]]


def kernel_records(archive: str, tools: Dict[str, str]
                   ) -> Tuple[List[dict], List[sass_parse.Function]]:
    """One record per kernel and arch of one archive, and its parsed functions."""
    res = sass_parse.parse_res_usage(_run([tools["cuobjdump"], "-res-usage", archive]))
    fns = sass_parse.parse_sass(_run([tools["cuobjdump"], "-sass", archive]))
    names = demangle(sorted({f.name for f in fns} | {n for _, n in res}), tools["c++filt"])
    records = []
    for fn in fns:
        usage = res.get((fn.arch, fn.name), {})
        div = sass_parse.division_sites(fn)
        loops = sass_parse.find_loops(fn.instrs)
        in_loops = set()
        for l in loops:
            in_loops |= {i.addr for i in l.instrs}
        local = sass_parse.local_traffic(fn.instrs)
        records.append({
            "library": library_label(archive),
            "kernel": short_name(names[fn.name]),
            "signature": names[fn.name],
            "arch": fn.arch,
            "registers": usage.get("REG"),
            "stack_bytes": usage.get("STACK", 0) + usage.get("LOCAL", 0),
            "shared_bytes": usage.get("SHARED"),
            "local": local,
            "instructions": len(fn.instrs),
            "mix": sass_parse.mix(fn.instrs),
            "divisions": {"div32": len(div["div32"]), "div64": len(div["div64"]),
                          "in_loops": sum(1 for a in div["div32"] + div["div64"]
                                          if a in in_loops)},
            "loops": len(loops),
            "hot_loops": _hot_loops(loops, div),
        })
    return records, fns


def _unit_free(mangled: str) -> str:
    """A mangled name without the per-compilation hash nvcc puts in anonymous namespaces
    (_GLOBAL__N__<hash>_<file>...): the -lineinfo build is another compilation of the file."""
    return re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__", mangled)


def _stream(fn: sass_parse.Function) -> List[Tuple[int, str, Optional[int]]]:
    return [(i.addr, i.pred + i.opcode, i.target) for i in fn.instrs]


def model(lineinfo_cubin: str, production: List[sass_parse.Function], sources: Dict[str, str],
          layouts: dict, tools: Dict[str, str]) -> dict:
    """The issue-bound model on every preset's tiers (issue_model.py), each with the kernel the
    decode plan runs on it (issue_model.model_for)."""
    listing = _run([tools["nvdisasm"], "-gi", "-c", lineinfo_cubin])
    names = demangle([f.name for f in production], tools["c++filt"])
    lineinfo = sass_parse.parse_sass(listing)
    matched = {}
    kernels = []
    for km in issue_model.MODELS:
        want = [f for f in production if f.arch == "sm_90a"
                and short_name(names[f.name]) == km.kernel]
        if len(want) != 1:
            raise ToolError(f"{km.kernel} sm_90a: found {len(want)} in the archive")
        prod = want[0]
        li = [f for f in lineinfo if _unit_free(f.name) == _unit_free(prod.name)]
        if len(li) != 1 or _stream(li[0]) != _stream(prod):
            raise ToolError(
                "the -lineinfo build of decode_attention_kernels.cu differs from the production "
                f"archive (or lacks {km.kernel}): its line info cannot describe the real SASS. "
                "Keep tools/sass/nvcc_lineinfo.bzl's flags equal to third_party/cuda.bzl's.")
        rows, unmatched = issue_model.match(li[0], sources, km)
        if unmatched:
            raise issue_model.ModelError(
                f"issue model: loops inside {km.kernel}'s page loop that no row of "
                "issue_model.py describes: " +
                ", ".join(f"{s.loop.start:#x} (source lines {s.path})" for s in unmatched))
        matched[km.kernel] = rows
        kernels.append({"kernel": f"{km.kernel} sm_90a",
                        "loops": [{"row": m.row.key, "level": m.level, "phase": m.row.phase,
                                   "versions": [{"unroll": u, "instructions": n}
                                                for u, n in m.versions],
                                   "copies": m.copies} for m in rows]})
    out = {"kernels": kernels, "head_dim": layouts["head_dim"],
           "page_bytes": layouts["page_bytes"],
           "machine": {"hbm_bytes_per_s": issue_model.HBM_BYTES_PER_S, "sms": issue_model.SMS,
                       "issue_per_sm_per_cycle": issue_model.ISSUE_PER_SM,
                       "clock_hz": issue_model.CLOCK_HZ},
           "presets": [], "target_share": TARGET_SHARE}
    for p in layouts["presets"]:
        for t in p["tiers"]:
            if "error" in t:
                continue
            km = issue_model.model_for(t)
            page = issue_model.Page(t, layouts["head_dim"])
            phases = issue_model.page_cost(matched[km.kernel], page)
            total = sum(phases.values())
            bw, share = issue_model.predict(total, page.load_bytes)
            out["presets"].append({
                "preset": p["name"], "tier": t["tier"], "format": t["format"]["name"],
                "kernel": km.kernel,
                "tokens": t["layout"]["tokens"], "bytes_per_page": page.load_bytes,
                "instructions_per_page": round(total),
                "by_phase": {k: round(v) for k, v in phases.items() if v},
                "predicted_bytes_per_s": bw, "predicted_share": round(share, 4)})
    out["predicted_share"] = {r["preset"]: r["predicted_share"] for r in out["presets"]
                              if r["preset"] in SHARE_PRESETS and r["tier"] == "high"}
    out["predicted_kernel"] = {r["preset"]: r["kernel"] for r in out["presets"]
                               if r["preset"] in SHARE_PRESETS and r["tier"] == "high"}
    return out


def violations(records: List[dict], issue: dict) -> List[dict]:
    """Current violations of the gates: local memory in any kernel, integer divisions in the
    chunk kernel's loops, the sluice preset's predicted share below TARGET_SHARE."""
    out = []
    for r in records:
        key = {"library": r["library"], "kernel": r["kernel"], "arch": r["arch"]}
        for rule, n in (("stack_frame", r["stack_bytes"]),
                        ("local_stores", r["local"]["stl_bytes"]),
                        ("local_loads", r["local"]["ldl_bytes"])):
            if n:
                out.append({**key, "rule": rule, "count": n})
        if CHUNK_KERNEL.match(r["kernel"]) and r["divisions"]["in_loops"]:
            out.append({**key, "rule": "loop_divisions", "count": r["divisions"]["in_loops"]})
    share = issue["predicted_share"].get("sluice")
    if share is not None and share < TARGET_SHARE:
        out.append({"library": "//kernels/cuda:decode_attention_kernels",
                    "kernel": issue["predicted_kernel"]["sluice"], "arch": "sm_90a",
                    "rule": "sluice_share_below_%.2f" % TARGET_SHARE, "value": round(share, 3)})
    return out


def _key(v: dict) -> Tuple[str, str, str, str]:
    return (v["library"], v["kernel"], v["arch"], v["rule"])


def ratchet(current: List[dict], known: List[dict]) -> List[str]:
    """What differs between the violations found and those listed in known_violations.json:
    new ones and worse ones (fix the kernel), better and fixed ones (edit the list down, so
    they cannot come back). Counts are bytes or sites, lower is better; `value` (a predicted
    share of HBM) is compared to 3 decimals, higher is better."""
    problems = []
    old = {_key(v): v for v in known}
    cur = {_key(v): v for v in current}
    edit = "edit tools/sass/known_violations.json"
    for k in sorted(set(old) | set(cur)):
        o, c = old.get(k), cur.get(k)
        what = f"{k[1]} ({k[0]}, {k[2]}) {k[3]}"
        if o is None:
            amount = c.get("count", c.get("value"))
            problems.append(f"NEW: {what} = {amount}. Fix the kernel; the list only "
                            "holds debts older than this gate (README.md).")
        elif c is None:
            problems.append(f"FIXED: {what} (listed as {o.get('count', o.get('value'))}) is gone: "
                            f"{edit} and delete its entry, so it cannot come back.")
        elif "value" in o or "value" in c:
            ov, cv = round(o.get("value", -1), 3), round(c.get("value", -1), 3)
            if cv > ov:
                problems.append(f"BETTER: {what} is now {cv} (listed {ov}): {edit} and set its "
                                f"value to {cv}.")
            elif cv < ov:
                problems.append(f"WORSE: {what} fell to {cv} (listed {ov}).")
        elif c["count"] > o["count"]:
            problems.append(f"WORSE: {what} = {c['count']} (listed {o['count']}).")
        elif c["count"] < o["count"]:
            problems.append(f"BETTER: {what} = {c['count']} (listed {o['count']}): {edit} and "
                            f"lower its count to {c['count']}, so it cannot grow back.")
    return problems


def analyze(archives: List[str], lineinfo_cubin: str, sources: List[str], layouts_binary: str,
            tools: Dict[str, str]) -> dict:
    records, decode_fns = [], None
    for a in archives:
        recs, fns = kernel_records(a, tools)
        records += recs
        if a.endswith("libdecode_attention_kernels_nvcc.a"):
            decode_fns = fns
    if decode_fns is None:
        raise ToolError("the decode_attention_kernels archive is not among the inputs")
    layouts = json.loads(_run([layouts_binary]))
    texts = {}
    for path in sources:
        with open(path) as f:
            texts[os.path.basename(path)] = f.read()
    issue = model(lineinfo_cubin, decode_fns, texts, layouts, tools)
    version = _run([tools["cuobjdump"], "--version"]).strip().splitlines()[-1]
    result = {"command": "bazel run //tools/sass:cuda_resources -- --out "
                         "$PWD/bench/results/cuda-resources.json",
              "device": "none: static analysis of the sm_80 and sm_90a SASS in the nvcc archives",
              "cuobjdump": version, "kernels": records, "issue_model": issue}
    result["violations"] = violations(records, issue)
    return result


def table(result: dict) -> str:
    lines = ["%-44s %-6s %4s %6s %6s %5s %5s %6s %5s %5s" % (
        "kernel", "arch", "reg", "stack", "shared", "stl", "ldl", "instr", "loops", "div")]
    for r in sorted(result["kernels"], key=lambda r: (r["library"], r["kernel"], r["arch"])):
        name = f"{r['library'].split(':')[-1]}:{r['kernel']}"
        lines.append("%-44s %-6s %4s %6d %6s %5d %5d %6d %5d %5s" % (
            name[:44], r["arch"], r["registers"], r["stack_bytes"], r["shared_bytes"],
            r["local"]["stl_bytes"], r["local"]["ldl_bytes"], r["instructions"], r["loops"],
            "%d/%d" % (r["divisions"]["in_loops"], r["divisions"]["div32"] +
                       r["divisions"]["div64"])))
    lines.append("(stack/stl/ldl in bytes; div: integer divisions in loops / in all)")
    issue = result["issue_model"]
    lines.append("")
    lines.append("Issue bound of the decode kernels (sm_90a), head_dim %d, %d-byte pages (H100 "
                 "SXM: %d SMs x %d issue x %.2f GHz; HBM %.2f TB/s):" % (
                     issue["head_dim"], issue["page_bytes"],
                     issue_model.SMS, issue_model.ISSUE_PER_SM, issue_model.CLOCK_HZ / 1e9,
                     issue_model.HBM_BYTES_PER_S / 1e12))
    phases = ["load", "meta", "score", "softmax", "rescale", "accumulate", "decode", "overhead"]
    lines.append("%-12s %-4s %-44s %-8s %6s %6s %8s %s %7s %6s" % (
        "preset", "tier", "format", "kernel", "tokens", "bytes", "instr",
        " ".join("%7s" % p[:7] for p in phases), "TB/s", "share"))
    for r in issue["presets"]:
        kernel = r["kernel"].split(",")[1].strip() if "Kivi" in r["kernel"] else "generic"
        lines.append("%-12s %-4s %-44s %-8s %6d %6d %8d %s %7.3f %6.3f" % (
            r["preset"], r["tier"], r["format"][:44],
            "kivi" + kernel if kernel != "generic" else kernel, r["tokens"], r["bytes_per_page"],
            r["instructions_per_page"],
            " ".join("%7d" % r["by_phase"].get(p, 0) for p in phases),
            r["predicted_bytes_per_s"] / 1e12, r["predicted_share"]))
    lines.append("(warp-instructions per page by phase; target: sluice >= %.2f of HBM)"
                 % issue["target_share"])
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the JSON here (relative: to the workspace)")
    ap.add_argument("--lineinfo", required=True, help="the -lineinfo decode kernels cubin")
    ap.add_argument("--source", required=True, action="append",
                    help="decode_attention_kernels.cu and the headers the issue model anchors in")
    ap.add_argument("--layouts", required=True, help="the page_layouts binary")
    ap.add_argument("archives", nargs="+", help="lib*_nvcc.a")
    args = ap.parse_args()
    tools = find_tools(install=True)
    result = analyze(args.archives, args.lineinfo, args.source, args.layouts, tools)
    print(table(result))
    print("\nviolations:\n" + "\n".join(json.dumps(v) for v in result["violations"]))
    if args.out:
        # `bazel run` starts in the runfiles; a relative --out means the workspace.
        out = os.path.join(os.environ.get("BUILD_WORKSPACE_DIRECTORY", ""), args.out)
        with open(out, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
