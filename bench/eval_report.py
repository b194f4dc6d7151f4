#!/usr/bin/python3
"""Collects `sluice eval --json` lines into one results file, a Markdown table and a plot.

  bench/eval_report.py OUT_JSON OUT_PNG RUN.jsonl... [--device D] [--command C] [--ratio wire]

Each RUN.jsonl holds the JSON lines of one `sluice eval --json` run (one text, one context).
OUT_JSON gets every line plus the per-(context, preset) means over the texts; the table of
those means goes to stdout; OUT_PNG plots compression ratio against KL and against the
perplexity increase, one panel per context, with each context's Pareto frontier (the presets
no other beats on both ratio and error) joined by a line; `--ratio wire` plots the bytes that
cross from prefill to decode (`wire_ratio`) instead of those held. Needs matplotlib (Debian:
python3-matplotlib).
"""
import argparse
import collections
import json
import sys


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
    return rows


def means(rows):
    """Per (context, preset): the means over texts of dppl %, KL, top-1 and ratio."""
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["context"], r["preset"])].append(r)
    out = []
    for (context, preset), rs in sorted(groups.items()):
        n = len(rs)
        out.append({
            "context": context,
            "preset": preset,
            "texts": n,
            "dppl_pct": sum(100 * (r["ppl"] / r["ppl_fp16"] - 1) for r in rs) / n,
            "kl": sum(r["kl"] for r in rs) / n,
            "top1": sum(r["top1"] for r in rs) / n,
            "ratio": sum(r["ratio"] for r in rs) / n,
            # Lines from before the wire was measured have none.
            "wire_ratio": (sum(r["wire_ratio"] for r in rs) / n
                           if all("wire_ratio" in r for r in rs) else None),
        })
    return out


def pareto(points):
    """Indices of the points no other has both a higher ratio and a lower error."""
    keep = []
    for i, (err, ratio) in enumerate(points):
        dominated = any(e <= err and r >= ratio and (e, r) != (err, ratio) for e, r in points)
        if not dominated:
            keep.append(i)
    return sorted(keep, key=lambda i: points[i][0])


def short_name(preset):
    """A short name for a plot: the preset and its settings' values."""
    name, *settings = preset.split(":")
    return name + ("(" + ",".join(x.split("=")[-1] for x in settings) + ")" if settings else "")


def plot(summary, path, ratio_key="ratio"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({m["context"] for m in summary})
    fig, axes = plt.subplots(len(contexts), 2, figsize=(12, 4.8 * len(contexts)), squeeze=False)
    for row, context in enumerate(contexts):
        ms = [m for m in summary if m["context"] == context and m[ratio_key] is not None]
        for col, (key, label, floor) in enumerate([
            ("kl", "mean KL(fp16 || preset), nats", 1e-4),
            ("dppl_pct", "perplexity increase over fp16, %", 1e-2),
        ]):
            ax = axes[row][col]
            # Log scale for the error: clamp at a floor (a few presets match fp16 to noise).
            pts = [(max(m[key], floor), m[ratio_key]) for m in ms]
            front = pareto(pts)
            for i, m in enumerate(ms):
                on = i in front
                ax.scatter(pts[i][0], pts[i][1], s=50 if on else 30,
                           color="tab:red" if on else "tab:blue", zorder=3)
                ax.annotate(short_name(m["preset"]), pts[i], textcoords="offset points", xytext=(5, 4),
                            fontsize=8)
            ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color="tab:red",
                    linewidth=1, label="Pareto frontier")
            ax.set_xscale("log")
            ax.set_xlabel(label + (" (log; floor %g)" % floor))
            ax.set_ylabel("KV bytes %s, ratio vs fp16" %
                          ("crossing prefill to decode" if ratio_key == "wire_ratio" else "held"))
            ax.set_title("context %d: mean over %d texts" % (context, max(m["texts"] for m in ms)))
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(loc="upper left", fontsize=8)
    fig.suptitle("sluice eval, SmolLM2-135M-Instruct: KV compression against prediction error")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("out_png")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--device", default="")
    ap.add_argument("--command", default="")
    ap.add_argument("--ratio", choices=("resident", "wire"), default="resident")
    a = ap.parse_args()
    rows = load(a.runs)
    if not rows:
        sys.exit("eval_report: no JSON lines in " + " ".join(a.runs))
    summary = means(rows)
    with open(a.out_json, "w") as f:
        json.dump({"device": a.device, "command": a.command, "results": rows,
                   "means": summary}, f, indent=2, sort_keys=True)
        f.write("\n")
    wire = any(m["wire_ratio"] is not None for m in summary)
    print("| context | preset | texts | Δppl | KL (nats) | top-1 | ratio vs fp16 |" +
          (" wire ratio |" if wire else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if wire else ""))
    for m in summary:
        line = "| %d | %s | %d | %+.2f%% | %.4f | %.1f%% | %.2fx |" % (
            m["context"], m["preset"], m["texts"], m["dppl_pct"], m["kl"], 100 * m["top1"],
            m["ratio"])
        if wire:
            line += " %s |" % ("%.2fx" % m["wire_ratio"] if m["wire_ratio"] is not None else "-")
        print(line)
    plot(summary, a.out_png, "wire_ratio" if a.ratio == "wire" else "ratio")


if __name__ == "__main__":
    main()
