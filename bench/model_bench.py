#!/usr/bin/env python3
"""`./sluice bench model`: sluice's CPU model runtime side by side with llama.cpp.

Runs bench/model_bench (sluice) and llama.cpp, through llama-cpp-python's low-level API, on
the same GGUF, the same thread count and the same cases: B sequences of P synthetic prompt
tokens prefilled in one batch, then D greedy decode steps with all B sequences in every step.
Each llama.cpp run is a child process of this script, so a peer that crashes is reported as
crashed (table, JSON, exit status 1) instead of taking the benchmark down or going unnoticed.
Prints a table and writes bench/results/model-cpu.json.

Run with the python of bench/setup_llamacpp_venv.sh's venv.
"""
import argparse
import ctypes
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np  # installed with llama-cpp-python

from peer import describe_exit, llama_cpp_build


def prompt_token(seq, i, vocab):
    """The synthetic prompt shared with model_bench.cc: skips the 17 special tokens."""
    return 17 + (i * 7919 + seq * 104729) % (vocab - 17)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class LlamaCpp:
    def __init__(self, path, threads):
        import llama_cpp as L  # noqa: N812
        self.L = L
        self.threads = threads
        # Keep llama.cpp's own logging off the table (the callback must outlive the calls).
        self._quiet = L.llama_log_callback(lambda level, text, user_data: None)
        L.llama_log_set(self._quiet, ctypes.c_void_p(0))
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        vocab = L.llama_model_get_vocab(self.model)
        self.vocab = L.llama_vocab_n_tokens(vocab)
        self.version = getattr(L, "__version__", "?")

    def run_case(self, b, p, d):
        L = self.L
        cparams = L.llama_context_default_params()
        cparams.n_ctx = b * (p + d + 8)
        cparams.n_batch = min(b * p, 4096)
        cparams.n_ubatch = min(b * p, 512)
        cparams.n_seq_max = b
        cparams.n_threads = self.threads
        cparams.n_threads_batch = self.threads
        if hasattr(cparams, "kv_unified"):
            cparams.kv_unified = True
        ctx = L.llama_init_from_model(self.model, cparams)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a context")
        cap = max(cparams.n_batch, b)
        batch = L.llama_batch_init(cap, 0, b)
        try:
            # Warm-up: a first decode builds graphs and buffers; then forget its tokens.
            for j in range(8):
                batch.token[j] = prompt_token(0, j, self.vocab)
                batch.pos[j] = j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = 1 if j == 7 else 0
            batch.n_tokens = 8
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed during warm-up")
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            items = [(s, i, prompt_token(s, i, self.vocab)) for s in range(b) for i in range(p)]
            t0 = time.perf_counter()
            last_index = {}
            for start in range(0, len(items), cap):
                chunk = items[start:start + cap]
                for j, (s, i, tok) in enumerate(chunk):
                    batch.token[j] = tok
                    batch.pos[j] = i
                    batch.n_seq_id[j] = 1
                    batch.seq_id[j][0] = s
                    batch.logits[j] = 1 if i == p - 1 else 0
                    if i == p - 1:
                        last_index[s] = j
                batch.n_tokens = len(chunk)
                if L.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed during prefill")
            t1 = time.perf_counter()
            index = [last_index[s] for s in range(b)]
            for step in range(d):
                for s in range(b):
                    logits = L.llama_get_logits_ith(ctx, index[s])
                    row = (ctypes.c_float * self.vocab).from_address(
                        ctypes.addressof(logits.contents))
                    best = int(np.ctypeslib.as_array(row).argmax())
                    batch.token[s] = best
                    batch.pos[s] = p + step
                    batch.n_seq_id[s] = 1
                    batch.seq_id[s][0] = s
                    batch.logits[s] = 1
                batch.n_tokens = b
                index = list(range(b))
                if L.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed during decode")
            t2 = time.perf_counter()
        finally:
            L.llama_batch_free(batch)
            L.llama_free(ctx)
        return b * p / (t1 - t0), b * d / (t2 - t1)


def peer_case(args):
    """--peer-case B,P,D: one llama.cpp run, printed as JSON (the child side of run_peer)."""
    b, p, d = (int(x) for x in args.peer_case.split(","))
    peer = LlamaCpp(args.model, args.threads)
    pre, dec = peer.run_case(b, p, d)
    print(json.dumps({"version": peer.version, "prefill": pre, "decode": dec}))


def run_peer(args, b, p):
    """One llama.cpp run in a child process: (prefill tok/s, decode tok/s, version) or a dict
    {"crashed": how it ended, "stderr": its last words}."""
    res = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--peer-case",
         f"{b},{p},{args.decode_tokens}", f"--model={args.model}", f"--threads={args.threads}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        return {"crashed": describe_exit(res.returncode), "stderr": res.stderr[-400:]}
    out = json.loads(res.stdout)
    return out["prefill"], out["decode"], out["version"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", help="path of the model_bench binary")
    ap.add_argument("--peer-case", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--prompt-lengths", default="128,1024")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per case; the fastest is reported (shared machines are noisy)")
    ap.add_argument("--out", default="bench/results/model-cpu.json")
    args = ap.parse_args()
    if args.peer_case:
        return peer_case(args)
    if not args.sluice:
        ap.error("--sluice is required")
    batches = [int(x) for x in args.batches.split(",")]
    prompts = [int(x) for x in args.prompt_lengths.split(",")]

    print(f"model bench on {cpu_name()}, {args.threads} threads", file=sys.stderr)
    build = llama_cpp_build(sys.executable)
    print(f"llama.cpp peer: {build}", file=sys.stderr)
    backend, version, crashes = None, "?", []

    def run_sluice(b, p):
        res = subprocess.run(
            [args.sluice, f"--model={args.model}", f"--threads={args.threads}",
             f"--batches={b}", f"--prompt_lengths={p}",
             f"--decode_tokens={args.decode_tokens}", "--repeats=1"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True, text=True)
        out = json.loads(res.stdout)
        case = out["cases"][0]
        return out["backend"], case["prefill_tokens_per_s"], case["decode_tokens_per_s"]

    # Shared machines drift: each case alternates sluice and llama.cpp runs, and the best of
    # each is reported.
    print(f"{'batch':>6} {'prompt':>7} | {'sluice prefill':>14} {'decode':>8} | "
          f"{'llama.cpp prefill':>17} {'decode':>8}", file=sys.stderr)
    rows = []
    for p in prompts:
        for b in batches:
            ours, theirs, crashed = [], [], None
            for _ in range(args.repeats):
                backend, pre, dec = run_sluice(b, p)
                ours.append((pre, dec))
                if crashed is None:
                    got = run_peer(args, b, p)
                    if isinstance(got, dict):
                        crashed = got
                        crashes.append(f"batch {b}, prompt {p}: {got['crashed']}")
                    else:
                        theirs.append(got[:2])
                        version = got[2]
            s_pre, s_dec = max(x[0] for x in ours), max(x[1] for x in ours)
            if crashed:
                peer_row = {"crashed": crashed["crashed"], "stderr": crashed["stderr"],
                            "runs": theirs}
                peer_text = f"{'CRASHED: ' + crashed['crashed']:>26}"
            else:
                l_pre, l_dec = max(x[0] for x in theirs), max(x[1] for x in theirs)
                peer_row = {"prefill_tokens_per_s": l_pre, "decode_tokens_per_s": l_dec,
                            "runs": theirs}
                peer_text = f"{l_pre:17.1f} {l_dec:8.1f}"
            print(f"{b:6d} {p:7d} | {s_pre:14.1f} {s_dec:8.1f} | {peer_text}", file=sys.stderr)
            rows.append({
                "batch": b, "prompt": p, "decode_steps": args.decode_tokens,
                "repeats": args.repeats,
                "sluice": {"prefill_tokens_per_s": s_pre, "decode_tokens_per_s": s_dec,
                           "runs": ours},
                "llama_cpp": peer_row,
            })

    print(f"\nbest of {args.repeats} runs per case, {args.threads} threads, {cpu_name()}")
    print("\n| batch | prompt | prefill tok/s sluice | llama.cpp | decode tok/s sluice | llama.cpp |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        s, l = r["sluice"], r["llama_cpp"]
        l_pre = "crashed" if "crashed" in l else f"{l['prefill_tokens_per_s']:.1f}"
        l_dec = "crashed" if "crashed" in l else f"{l['decode_tokens_per_s']:.1f}"
        print(f"| {r['batch']} | {r['prompt']} | {s['prefill_tokens_per_s']:.1f} | "
              f"{l_pre} | {s['decode_tokens_per_s']:.1f} | {l_dec} |")
    out = {
        "benchmark": "model-cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "device": "CPU (no GPU)"},
        "model": os.path.basename(args.model),
        "threads": args.threads,
        "sluice_backend": backend,
        "llama_cpp_python": version,
        "llama_cpp_build": build,
        "llama_cpp_crashes": crashes,
        "cases": rows,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"\nwrote {args.out}", file=sys.stderr)
    if crashes:
        print("\nTHE llama.cpp PEER CRASHED; its figures are missing for:\n  " +
              "\n  ".join(crashes), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
