"""The peer for bench/gpu/gpu_bench: PyTorch scaled_dot_product_attention in fp16 on contiguous
KV, one decode query per sequence, at the shapes, batches and contexts gpu_bench measures.
Times with CUDA events (two warm-ups, median of --reps) and writes JSON rows
{shape, batch, context, time_us} that gpu_bench reads with --sdpa_json."""
import argparse
import json

import torch
import torch.nn.functional as F

SHAPES = {"llama3-8b": (32, 8, 128), "smollm2": (9, 3, 64)}


def time_us(fn, reps):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="llama3-8b,smollm2")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--contexts", default="1024,4096,8192,16384,32768")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for shape in args.shapes.split(","):
        heads, kv_heads, d = SHAPES[shape]
        for context in map(int, args.contexts.split(",")):
            for batch in map(int, args.batches.split(",")):
                q = torch.randn(batch, heads, 1, d, device=dev, dtype=torch.float16)
                k = torch.randn(batch, kv_heads, context, d, device=dev, dtype=torch.float16)
                v = torch.randn(batch, kv_heads, context, d, device=dev, dtype=torch.float16)

                def run():
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

                us = time_us(run, args.reps)
                kv_bytes = 2 * k.numel() * k.element_size()
                rows.append({"shape": shape, "batch": batch, "context": context,
                             "time_us": us, "kv_bytes": kv_bytes,
                             "achieved_gbps": kv_bytes / (us * 1e-6) / 1e9})
                print(f"sdpa {shape:10s} batch {batch:4d} ctx {context:6d}: {us:10.1f} us "
                      f"{rows[-1]['achieved_gbps']:7.0f} GB/s", flush=True)
                del q, k, v
                torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
