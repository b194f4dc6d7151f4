#!/usr/bin/env python3
"""sluice bench serve: a sluice cluster and llama.cpp's server under the same load, same model,
same cores, in one run.

Two loads, each against both servers, one server at a time:
  poisson   open loop: requests arrive as a Poisson process (--rate per second), prompts of
            --prompt-min..--prompt-max tokens, --max-tokens generated each, streamed;
  streams   --streams concurrent streams, each sending --stream-requests requests of
            --stream-prompt tokens back to back.
  chat      (--workload chat) --conversations conversations of --turns turns each, run at
            once, every one over the same system prompt of about --system-tokens tokens; each
            turn resends the conversation so far with a new question (chat completions), as
            a chat client does. Systems: sluice, sluice with its prefix cache off
            (sluice-nocache), llama.cpp with its prompt cache (--cache); sluice's prompts are
            cut (and cached) every 128 tokens unless --chunk-tokens says. Reported besides:
            TTFT of first and later turns, prompt tokens served from a cache, KV bytes sent per
            turn.
For each: generated tokens/s, requests/s, TTFT and inter-token latency p50/p99, end-to-end
latency; for sluice also the KV pages it held at peak (and their FP16 equivalent), the bytes
its prefill workers streamed to decode, and their prefill tokens/s (prompt tokens over the
forward time they took). The system "sluice+kvtc" is sluice with the prompts' KV sent
transform-coded (--wire-bits; the calibration beside the model, ./sluice calibrate): the same
load with the codec on and off in one run, its wire bytes against fp16's. Prints a table and
writes JSON (--out).

A server that dies during a load (a crashed peer) is reported as crashed, with how its process
ended and its last words, in the table and the JSON, and the run exits with status 1; a request
that fails or streams no token counts as an error, never as a silent zero.

usage: serve_bench.py --up PATH_TO_tools/up --llama-python VENV_PYTHON --model GGUF [--out F]
"""
import argparse
import hashlib
import http.client
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import tempfile
import urllib.request

from peer import describe_exit, llama_cpp_build

# Words that are one token each (with their leading space) in SmolLM2's vocabulary, so a prompt
# of n words is about n tokens; the servers' own counts are reported.
WORDS = ("the river water city north south east west old new boat bridge town stone hill "
         "road field tree house light rain wind sun moon star sea lake land fire ice gold "
         "iron wood king queen man woman child friend story song book letter word name day "
         "night year time life world people work home school door window table chair bed "
         "food bread milk fish bird horse dog cat cow sheep wolf bear fox deer forest "
         "mountain valley island coast shore port ship trade market money price market "
         "river bank wall tower church castle garden farm mill wheat corn apple grape wine "
         "salt sugar oil coal steel glass paper cloth wool silk cotton leather").split()


def make_prompt(rng, n_words):
    return "Here is a list of words: " + " ".join(rng.choice(WORDS) for _ in range(n_words)) + \
        ". Now write a short story that uses some of them."


QUESTIONS = ("Which weighs more on the manifest, the %s or the %s?",
             "Can the %s travel in the same hold as the %s?",
             "Name a port that trades both %s and %s.",
             "How should the crew pack the %s next to the %s?",
             "Is the %s worth more than the %s this season?",
             "Write one line of a sea song about the %s and the %s.")


def make_system_prompt(rng, n_words):
    """About n_words + 40 tokens: a system prompt every conversation shares."""
    return ("You are the cargo assistant of a river shipping company. Answer every question in "
            "one or two short sentences. The manifest of this week, item by item: " +
            " ".join(rng.choice(WORDS) for _ in range(n_words)) + ".")


def make_conversations(rng, conversations, turns):
    """Each conversation's user messages, one a turn."""
    return [[QUESTIONS[(c + t) % len(QUESTIONS)] % (rng.choice(WORDS), rng.choice(WORDS))
             for t in range(turns)] for c in range(conversations)]


def run_chat(host, port, model, system, conversations, max_tokens, extra):
    """Every conversation at once, its turns one after another: each turn sends the system
    prompt, every earlier question and answer, and the next question."""
    results = [[None] * len(c) for c in conversations]

    def go(c):
        messages = [{"role": "system", "content": system}]
        for t, question in enumerate(conversations[c]):
            messages.append({"role": "user", "content": question})
            out = chat_request(host, port, model, messages, max_tokens, extra)
            out["turn"] = t
            results[c][t] = out
            if "error" in out:
                return
            messages.append({"role": "assistant", "content": out["text"]})

    threads = [threading.Thread(target=go, args=(c,)) for c in range(len(conversations))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for conv in results for r in conv if r is not None]


def summarize_chat(results):
    """summarize's figures, and TTFT by turn, prompt tokens served from a cache."""
    s = summarize(results)
    ok = [r for r in results if "error" not in r and "ttft" in r]
    s["ttft_first_turn_p50_s"] = percentile([r["ttft"] for r in ok if r["turn"] == 0], 50)
    s["ttft_later_turns_p50_s"] = percentile([r["ttft"] for r in ok if r["turn"] > 0], 50)
    s["turns"] = len(ok)
    cached = [r.get("cached_tokens") for r in ok]
    s["cached_tokens"] = sum(c for c in cached if c) if any(c is not None for c in cached) \
        else None
    if s["cached_tokens"] is not None:
        s["cached_tokens_first_turn"] = sum(r.get("cached_tokens") or 0 for r in ok
                                            if r["turn"] == 0)
    # Every answer, conversation by conversation and turn by turn: two systems that answered
    # alike have the same digest.
    s["answers_sha256"] = hashlib.sha256(
        "\x1e".join(r.get("text", "") for r in results).encode()).hexdigest()
    return s


def percentile(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# Both servers generate exactly max_tokens: sluice ignores the end-of-sequence tokens
# (ignore_eos, as in vLLM); llama-cpp-python has no such field, so a logit bias bans them
# (<|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 in SmolLM2's vocabulary).
NO_EOS = {
    "sluice": {"ignore_eos": True},
    "sluice-nocache": {"ignore_eos": True},
    "sluice+kvtc": {"ignore_eos": True},
    "llama.cpp": {"logit_bias": {"0": -100, "1": -100, "2": -100}},
}


def is_token_event(chunk):
    """A chunk that carries a generated token: text, or (llama.cpp sends one chunk per token,
    special tokens with empty text included) any chunk before the finishing one."""
    choices = chunk.get("choices")
    if not choices:
        return False
    return bool(choices[0].get("text")) or choices[0].get("finish_reason") is None


def stream_request(host, port, model, prompt, max_tokens, extra):
    """One streamed /v1/completions request; returns its timings and token counts, or
    {"error": why} when it failed or streamed no token."""
    body = dict({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                 "stream": True, "stream_options": {"include_usage": True}}, **extra)
    return checked_stream(host, port, "/v1/completions", body)


def chat_request(host, port, model, messages, max_tokens, extra):
    """One streamed /v1/chat/completions request; as stream_request, with the answer's text."""
    body = dict({"model": model, "messages": messages, "max_tokens": max_tokens,
                 "temperature": 0, "stream": True, "stream_options": {"include_usage": True}},
                **extra)
    return checked_stream(host, port, "/v1/chat/completions", body)


def checked_stream(host, port, path, body):
    try:
        out = _stream_request(host, port, path, body)
    except (OSError, http.client.HTTPException, ValueError) as e:
        return {"error": "%s: %s" % (type(e).__name__, e)}
    if "error" not in out and not out.get("tokens_seen"):
        out["error"] = "the stream ended without a token"
    return out


def chunk_text(chunk):
    """The text a completions or chat chunk carries ("" for none)."""
    choices = chunk.get("choices") or [{}]
    return choices[0].get("text") or (choices[0].get("delta") or {}).get("content") or ""


def _stream_request(host, port, path, body):
    chat = path.endswith("chat/completions")
    body = json.dumps(body)
    t0 = time.time()
    conn = http.client.HTTPConnection(host, port, timeout=1800)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        return {"error": "%d %s" % (resp.status, resp.read()[:300])}
    times, buf, usage, text = [], b"", None, []

    def take(j):
        nonlocal usage
        if j.get("usage"):
            usage = j["usage"]
        t = chunk_text(j)
        text.append(t)
        # A chat stream's first chunk names the role only: a token is text there.
        if (bool(t) if chat else is_token_event(j)):
            times.append(time.time())

    while True:
        try:
            chunk = resp.read1(65536)
        except http.client.IncompleteRead as e:
            # Some servers close a chunked stream without its last empty chunk.
            buf = (buf + e.partial).replace(b"\r\n", b"\n")
            break
        if not chunk:
            break
        # SSE lines may end in CRLF (sse-starlette) or LF.
        buf = (buf + chunk).replace(b"\r\n", b"\n")
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.decode().strip()
            if not data.startswith("data: "):
                continue
            data = data[len("data: "):]
            if data == "[DONE]":
                continue
            take(json.loads(data))
    for event in buf.split(b"\n\n"):
        data = event.decode(errors="replace").strip()
        if data.startswith("data: ") and data != "data: [DONE]":
            try:
                j = json.loads(data[len("data: "):])
            except ValueError:
                continue
            take(j)
    conn.close()
    end = time.time()
    out = {"start": t0, "end": end, "tokens_seen": len(times), "text": "".join(text)}
    if times:
        out["ttft"] = times[0] - t0
        out["itl"] = [b - a for a, b in zip(times, times[1:])]
    if usage:
        out["prompt_tokens"] = usage.get("prompt_tokens")
        out["completion_tokens"] = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        out["cached_tokens"] = details.get("cached_tokens")
    return out


# What the sluice systems' workers are sampled for (summed over workers and labels).
SLUICE_METRICS = ["sluice_kv_pages_used", "sluice_kv_transfer_bytes_total",
                  "sluice_kv_compression_ratio", "sluice_prefill_tokens_total",
                  "sluice_prefill_step_seconds_sum", "sluice_kv_wire_bytes_total",
                  "sluice_kv_wire_fp16_bytes_total", "sluice_prefix_cache_hit_tokens_total",
                  "sluice_prefix_cache_bytes_not_sent_total"]


def metric_samples(urls, names):
    """Every sample of the metrics `names` on the workers' /metrics at `urls`, by name (a worker
    that does not answer gives none)."""
    samples = {n: [] for n in names}
    for url in urls:
        try:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            for n in names:
                if line.startswith(n + " ") or line.startswith(n + "{"):
                    samples[n].append(float(line.rsplit(" ", 1)[1]))
    return samples


class Sampler:
    """Polls a few Prometheus metrics while a load runs and keeps their peaks and last values."""

    def __init__(self, urls, names):
        self.urls, self.names = urls, names
        self.peak = {n: 0.0 for n in names}
        self.last = {n: 0.0 for n in names}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def read(self):
        return {n: sum(v) for n, v in metric_samples(self.urls, self.names).items()}

    def run(self):
        while not self.stop.is_set():
            v = self.read()
            for n in self.names:
                self.peak[n] = max(self.peak[n], v[n])
                self.last[n] = v[n]
            self.stop.wait(0.5)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        v = self.read()
        for n in self.names:
            self.last[n] = v[n]


def run_load(host, port, model, schedule, max_tokens, extra):
    """schedule: [(delay_from_start_s, prompt)]; every request in its own thread."""
    results = [None] * len(schedule)
    t0 = time.time()

    def go(i, delay, prompt):
        time.sleep(max(0.0, t0 + delay - time.time()))
        results[i] = stream_request(host, port, model, prompt, max_tokens, extra)

    threads = [threading.Thread(target=go, args=(i, d, p)) for i, (d, p) in enumerate(schedule)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def run_streams(host, port, model, streams, per_stream, prompts, max_tokens, extra):
    results = []
    lock = threading.Lock()

    def go(s):
        for r in range(per_stream):
            out = stream_request(host, port, model, prompts[s * per_stream + r], max_tokens,
                                 extra)
            with lock:
                results.append(out)

    threads = [threading.Thread(target=go, args=(s,)) for s in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def summarize(results):
    ok = [r for r in results if r and "error" not in r and "ttft" in r]
    errors = [r["error"] for r in results if r and "error" in r]
    if not ok:
        return {"requests": len(results), "errors": len(errors), "first_error": errors[:1]}
    start = min(r["start"] for r in ok)
    end = max(r["end"] for r in ok)
    gen = sum(r.get("completion_tokens") or r["tokens_seen"] for r in ok)
    itl = [x for r in ok for x in r.get("itl", [])]
    ttft = [r["ttft"] for r in ok]
    e2e = [r["end"] - r["start"] for r in ok]
    return {
        "requests": len(results), "errors": len(errors), "first_error": errors[:1],
        "duration_s": end - start,
        "generated_tokens": gen,
        "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in ok),
        "tokens_per_s": gen / (end - start),
        "requests_per_s": len(ok) / (end - start),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(itl, 50), "itl_p99_s": percentile(itl, 99),
        "itl_max_s": max(itl) if itl else None,
        "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
    }


def wait_http(url, proc, seconds=180):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("%s ended before it answered: %s" %
                               (proc.args[0], describe_exit(proc.returncode)))
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("%s did not answer %s" % (proc.args[0], url))


def stop(proc):
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--up", required=True, help="the tools/up binary")
    ap.add_argument("--llama-python", default="",
                    help="python with llama-cpp-python[server] (for the llama.cpp system)")
    ap.add_argument("--bin_dir", default="",
                    help="where up finds prefill/, decode/ and router/ (default: beside it)")
    ap.add_argument("--backend", default="cpu",
                    help="what sluice's workers compute on: cpu (the llama.cpp peer's), cuda or "
                         "auto")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--preset", default="sluice")
    ap.add_argument("--wire-bits", default="1.5/3",
                    help="sluice+kvtc: entropy-coded bits per key/value value of the "
                         "transform-coded wire")
    ap.add_argument("--rate", type=float, default=0.08, help="Poisson arrivals per second")
    ap.add_argument("--requests", type=int, default=16, help="Poisson requests")
    ap.add_argument("--prompt-min", type=int, default=512)
    ap.add_argument("--prompt-max", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--stream-requests", type=int, default=1)
    ap.add_argument("--stream-prompt", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workload", choices=("standard", "chat"), default="standard",
                    help="standard: the streams and poisson loads; chat: the chat load")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1000,
                    help="chat: about how many tokens the shared system prompt takes")
    ap.add_argument("--answer-tokens", type=int, default=32, help="chat: tokens of each answer")
    ap.add_argument("--chunk-tokens", type=int, default=0,
                    help="sluice's prefill chunk (and prefix-cache block); 0: up's default "
                         "(512), or 128 for the chat workload")
    ap.add_argument("--systems", default="",
                    help="default: sluice,llama.cpp; chat: sluice,sluice-nocache,llama.cpp")
    ap.add_argument("--loads", default="streams,poisson")
    ap.add_argument("--out-dir", default="",
                    help="where the JSON goes when --out is not given: serve-cpu.json, or "
                         "serve-chat-cpu.json for the chat workload")
    ap.add_argument("--out", default="")
    ap.add_argument("--fail-on-errors", action="store_true",
                    help="exit with status 1 when any request failed (acceptance runs)")
    args = ap.parse_args()
    chat = args.workload == "chat"
    if not args.systems:
        args.systems = "sluice,sluice-nocache,llama.cpp" if chat else "sluice,llama.cpp"
    if chat:
        args.loads = "chat"
        # Prompts are cut, and their prefixes cached, every chunk: a chat turn reuses the
        # conversation up to the last chunk its previous turn ended, so finer chunks reuse
        # more (a step still runs up to 512 tokens, a chunk from each of several prompts).
        args.chunk_tokens = args.chunk_tokens or 128
    if not args.out and args.out_dir:
        args.out = os.path.join(args.out_dir, "serve-chat-cpu.json" if chat else "serve-cpu.json")
    if "llama.cpp" in args.systems.split(",") and not args.llama_python:
        ap.error("--llama-python is required for the llama.cpp system")

    rng = random.Random(args.seed)
    t, poisson = 0.0, []
    for _ in range(args.requests):
        poisson.append((t, make_prompt(rng, rng.randint(args.prompt_min, args.prompt_max))))
        t += rng.expovariate(args.rate)
    stream_prompts = [make_prompt(rng, args.stream_prompt)
                      for _ in range(args.streams * args.stream_requests)]
    system_prompt = make_system_prompt(rng, max(0, args.system_tokens - 40))
    conversations = make_conversations(rng, args.conversations, args.turns)

    report = {
        "benchmark": "serve-chat-cpu" if chat else "serve-cpu",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "device": "CPU (no GPU)"},
        "model": os.path.basename(args.model),
        "threads": args.threads,
        "settings": {k: getattr(args, k) for k in ("preset", "rate", "requests", "prompt_min",
                                                   "prompt_max", "max_tokens", "streams",
                                                   "stream_requests", "stream_prompt", "seed",
                                                   "workload", "conversations", "turns",
                                                   "system_tokens", "answer_tokens",
                                                   "chunk_tokens")},
        "llama_cpp_build": llama_cpp_build(args.llama_python) if args.llama_python else None,
        "sluice_backend": args.backend,
        "results": {},
        "crashes": [],
    }
    loads = args.loads.split(",")
    for system in args.systems.split(","):
        sluice = system.startswith("sluice")
        port = 18000 if sluice else 18100
        if sluice:
            cmd = [args.up, "--model=" + args.model, "--port=%d" % port,
                   "--threads=%d" % args.threads, "--preset=" + args.preset,
                   "--prefill_port=18200", "--decode_port=18300", "--metrics_port=18400",
                   "--backend=" + args.backend]
            if system == "sluice+kvtc":
                cmd.append("--wire_bits=" + args.wire_bits)
            if system == "sluice-nocache":
                cmd.append("--prefix_cache_entries=0")
            if args.chunk_tokens:
                cmd.append("--chunk_tokens=%d" % args.chunk_tokens)
            if args.bin_dir:
                cmd.append("--bin_dir=" + args.bin_dir)
            metrics = {"decode": ["http://127.0.0.1:18501/metrics"],
                       "prefill": ["http://127.0.0.1:18401/metrics"]}
        else:
            cmd = [args.llama_python, "-m", "llama_cpp.server", "--model", args.model,
                   "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192",
                   "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
                   "--n_batch", "512",
                   # Queue concurrent requests instead of cutting the running one short (the
                   # server's default interrupts it when another arrives).
                   "--interrupt_requests", "False"]
            if chat:
                # Its prompt cache: the states of earlier prompts kept in memory, the longest
                # prefix of a new prompt loaded instead of computed.
                cmd += ["--cache", "True"]
            metrics = None
        print("bench serve: starting %s" % system, file=sys.stderr)
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_http("http://127.0.0.1:%d/%s" % (port, "health" if sluice else "v1/models"), proc)
            model = json.loads(urllib.request.urlopen(
                "http://127.0.0.1:%d/v1/models" % port).read())["data"][0]["id"]
            if sluice:
                # What the workers compute on, as they say (the machine's device if any).
                workers = json.loads(urllib.request.urlopen(
                    "http://127.0.0.1:%d/v1/workers" % port).read())["workers"]
                report["sluice_workers"] = {w["name"]: w.get("backend", "") for w in workers}
                gpus = sorted({b for b in report["sluice_workers"].values()
                               if b.startswith("cuda")})
                if gpus:
                    report["machine"]["device"] = ", ".join(gpus)
                    report["benchmark"] = "serve-gpu"
            out = {}
            for load in loads:
                print("bench serve: %s, %s load" % (system, load), file=sys.stderr)
                sampler = None
                if metrics:
                    sampler = Sampler(metrics["decode"] + metrics["prefill"], SLUICE_METRICS)
                    before = sampler.read()
                    sampler.__enter__()
                if load == "poisson":
                    res = run_load("127.0.0.1", port, model, poisson, args.max_tokens,
                                   NO_EOS[system])
                elif load == "chat":
                    res = run_chat("127.0.0.1", port, model, system_prompt, conversations,
                                   args.answer_tokens, NO_EOS[system])
                else:
                    res = run_streams("127.0.0.1", port, model, args.streams,
                                      args.stream_requests, stream_prompts, args.max_tokens,
                                      NO_EOS[system])
                s = summarize_chat(res) if load == "chat" else summarize(res)
                if sampler:
                    sampler.__exit__()
                    s["kv_pages_peak"] = sampler.peak["sluice_kv_pages_used"]
                    page_bytes = metric_samples(metrics["decode"], ["sluice_kv_page_bytes"])
                    s["kv_bytes_peak"] = (sampler.peak["sluice_kv_pages_used"] *
                                          max(page_bytes["sluice_kv_page_bytes"], default=0))
                    s["kv_compression_ratio_peak"] = sampler.peak["sluice_kv_compression_ratio"]
                    grew = {n: sampler.last[n] - before[n] for n in SLUICE_METRICS}
                    s["transfer_bytes"] = grew["sluice_kv_transfer_bytes_total"]
                    s["prefill_tokens"] = grew["sluice_prefill_tokens_total"]
                    # Steps' forward time: a step of several prompts counts once.
                    s["prefill_seconds"] = grew["sluice_prefill_step_seconds_sum"]
                    s["prefill_tokens_per_s"] = (s["prefill_tokens"] / s["prefill_seconds"]
                                                 if s["prefill_seconds"] > 0 else None)
                    s["wire_bytes"] = grew["sluice_kv_wire_bytes_total"]
                    s["wire_fp16_bytes"] = grew["sluice_kv_wire_fp16_bytes_total"]
                    s["wire_ratio"] = (s["wire_fp16_bytes"] / s["wire_bytes"]
                                       if s["wire_bytes"] > 0 else None)
                    s["prefix_hit_tokens"] = grew["sluice_prefix_cache_hit_tokens_total"]
                    if load == "chat" and s.get("turns"):
                        s["kv_bytes_sent_per_turn"] = s["transfer_bytes"] / s["turns"]
                        # Pages the decode worker held already: left out of what was sent.
                        s["kv_bytes_not_sent_per_turn"] = (
                            grew["sluice_prefix_cache_bytes_not_sent_total"] / s["turns"])
                        s["prefill_tokens_per_turn"] = s["prefill_tokens"] / s["turns"]
                else:
                    # llama.cpp keeps an FP16 K and V for all n_ctx positions of its one slot.
                    s["kv_bytes_allocated"] = 8192 * 30 * 3 * 64 * 2 * 2
                out[load] = s
                if proc.poll() is not None:
                    log.seek(0)
                    s["crashed"] = describe_exit(proc.returncode)
                    s["stderr"] = log.read()[-600:].decode(errors="replace")
                    report["crashes"].append("%s, %s load: %s" % (system, load, s["crashed"]))
                    print("bench serve: %s CRASHED during the %s load: %s" %
                          (system, load, s["crashed"]), file=sys.stderr)
                    break
            report["results"][system] = out
        except RuntimeError as e:  # the server never came up
            report["results"][system] = {"failed": str(e)}
            report["crashes"].append("%s: %s" % (system, e))
        finally:
            stop(proc)
            log.close()

    print("\n%-10s %-8s %8s %9s %9s %9s %9s %9s %12s %12s" % (
        "system", "load", "tok/s", "req/s", "ttft p50", "ttft p99", "itl p50", "itl p99",
        "kv peak MiB", "xfer MiB"))
    for system, loads_out in report["results"].items():
        if "failed" in loads_out:
            print("%-10s %-8s FAILED: %s" % (system, "-", loads_out["failed"]))
            continue
        for load, s in loads_out.items():
            if "crashed" in s:
                print("%-10s %-8s CRASHED: %s (%d of %d requests failed)" % (
                    system, load, s["crashed"], s["errors"], s["requests"]))
                continue
            if "tokens_per_s" not in s:
                print("%-10s %-8s failed: %s" % (system, load, s))
                continue
            print("%-10s %-8s %8.1f %9.3f %9.2f %9.2f %9.3f %9.3f %12s %12s" % (
                system, load, s["tokens_per_s"], s["requests_per_s"], s["ttft_p50_s"],
                s["ttft_p99_s"], s["itl_p50_s"] or 0, s["itl_p99_s"] or 0,
                "%.1f" % (s["kv_bytes_peak"] / 2**20) if "kv_bytes_peak" in s else
                "%.1f*" % (s["kv_bytes_allocated"] / 2**20),
                "%.1f" % (s["transfer_bytes"] / 2**20) if "transfer_bytes" in s else "-"))
    print("* llama.cpp: its FP16 KV for the full 8192-token context, allocated at start")
    wired = [(system, load, s) for system, loads_out in report["results"].items()
             if "failed" not in loads_out for load, s in loads_out.items()
             if s.get("prefill_tokens_per_s")]
    if wired:
        print("\n%-12s %-8s %14s %14s %12s" % ("system", "load", "prefill tok/s", "wire MiB",
                                              "wire vs fp16"))
        for system, load, s in wired:
            print("%-12s %-8s %14.1f %14.1f %11.2fx" % (
                system, load, s["prefill_tokens_per_s"], s["wire_bytes"] / 2**20,
                s["wire_ratio"] or 0))
    chats = [(system, loads_out["chat"]) for system, loads_out in report["results"].items()
             if "chat" in loads_out and "tokens_per_s" in loads_out["chat"]]
    if chats:
        print("\n%-15s %9s %9s %11s %11s %9s %11s %12s %12s %13s" % (
            "system", "ttft p50", "ttft p99", "turn 1 p50", "later p50", "tok/s",
            "cached tok", "computed/turn", "KV KiB/turn", "held KiB/turn"))
        for system, s in chats:
            print("%-15s %9.2f %9.2f %11.2f %11.2f %9.1f %11s %12s %12s %13s" % (
                system, s["ttft_p50_s"], s["ttft_p99_s"], s["ttft_first_turn_p50_s"] or 0,
                s["ttft_later_turns_p50_s"] or 0, s["tokens_per_s"],
                "-" if s.get("cached_tokens") is None else "%d" % s["cached_tokens"],
                "%.0f" % s["prefill_tokens_per_turn"] if "prefill_tokens_per_turn" in s else "-",
                "%.0f" % (s["kv_bytes_sent_per_turn"] / 1024) if "kv_bytes_sent_per_turn" in s
                else "-",
                "%.0f" % (s["kv_bytes_not_sent_per_turn"] / 1024)
                if "kv_bytes_not_sent_per_turn" in s else "-"))
        by = dict(chats)
        if "sluice" in by and "sluice-nocache" in by:
            same = by["sluice"]["answers_sha256"] == by["sluice-nocache"]["answers_sha256"]
            report["sluice_answers_equal_with_and_without_cache"] = same
            print("sluice's answers with and without the prefix cache: %s" %
                  ("the same" if same else "DIFFERENT"))
        if "sluice" in by:
            for other in ("sluice-nocache", "llama.cpp"):
                if other in by:
                    ratio = by[other]["ttft_p50_s"] / by["sluice"]["ttft_p50_s"]
                    report.setdefault("ttft_p50_ratio", {})[other + "/sluice"] = ratio
                    print("TTFT p50 %s / sluice: %.2fx" % (other, ratio))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print("wrote " + args.out, file=sys.stderr)
    if report["crashes"]:
        print("\nA SERVER CRASHED; its figures are missing for:\n  " +
              "\n  ".join(report["crashes"]), file=sys.stderr)
        sys.exit(1)
    failed = ["%s, %s load: %d of %d" % (system, load, s.get("errors", 0), s.get("requests", 0))
              for system, loads_out in report["results"].items() for load, s in loads_out.items()
              if isinstance(s, dict) and s.get("errors")]
    if args.fail_on_errors and failed:
        print("\nREQUESTS FAILED:\n  " + "\n  ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
