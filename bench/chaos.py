#!/usr/bin/env python3
"""sluice bench chaos: a 2 prefill + 2 decode cluster (./sluice up, which restarts a worker that
dies) under a bounded load of streamed requests while a chaos loop kills (-9) and stops (-STOP,
then -CONT) random workers.

The load: --requests requests from --concurrency clients; prompts of 20-1,500 tokens (about:
words that are one token each), max_tokens 8-128, greedy or seeded; 20% of the clients leave
mid-stream, 5% send a malformed request (which must get a 400). Meanwhile a thread asks the
router's /health every 100 ms.

Then the greedy requests that completed run again, undisturbed, and their texts must be the
same: a migration replays its tokens, and a sequence's numbers do not depend on the batches it
ran in. Then the crowd
(hold.py): --hold-streams streaming clients at once and --slow-sockets slow
connections, with /health timed on the API port meanwhile.

It reports requests completed / failed / migrated (the router's sluice_request_migrations_total)
/ left by their clients / malformed and refused, /health latency p50/p99, and, once the load
is over and every worker serves again, each worker's KV pages used and reserved, RSS (by kind
of mapping too; --smaps-dir keeps every mapping) and open file descriptors next to what they
were before the load. A well-formed request fails when it
gets no 200, when its stream carries an error event, or when it ends without a finish reason
or with fewer tokens than it asked for (every request ignores end-of-sequence tokens).
It also reports the router's longest migration phases (sluice_migration_seconds: detect, recover)
and the streams silent for longer than the stall bound plus one migration.
Exit status 1 when a well-formed request failed, a page stayed held, a process the chaos loop
did not touch died, a greedy text differed, a process's RSS or fds after the load and a warm-up
exceed the start by more than --growth-tolerance, or (with --check-silence) a stream stayed
silent beyond the bound.

usage: chaos.py --up PATH_TO_tools/up --model GGUF [--requests 2000] [--out F]
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from hold import hold
from serve_bench import cpu_name, make_prompt, percentile, stop, wait_http


def free_port_block(n):
    """A first port p such that p..p+n-1 look free."""
    rng = random.Random()
    for _ in range(100):
        first = rng.randrange(20000, 60000 - n)
        ok = True
        for p in range(first, first + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return first
    raise RuntimeError("no block of %d free ports" % n)


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def reset_prefix_caches(url):
    """POST /reset_prefix_cache: every worker drops what it keeps for reuse (prefill workers'
    prefix caches, decode workers' held prefixes); returns {worker: entries dropped}."""
    req = urllib.request.Request(url + "/reset_prefix_cache", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return {w["name"]: w["entries_dropped"] for w in json.loads(r.read())["workers"]}


def metric(port, name):
    """Sum of a metric's samples on a process's /metrics (None when it does not answer)."""
    try:
        _, text = get("http://127.0.0.1:%d/metrics" % port)
    except OSError:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def histogram_max(port, name, labels):
    """The upper bound of a Prometheus histogram's highest occupied bucket (the smallest `le`
    holding every observation), 0 with no observation, None when the process does not answer."""
    try:
        _, text = get("http://127.0.0.1:%d/metrics" % port)
    except OSError:
        return None
    buckets, count = [], 0
    for line in text.splitlines():
        if line.startswith(name + "_count{" + labels + "}"):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_bucket{" + labels + ","):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    if count == 0:
        return 0.0
    return min(le for le, n in buckets if n >= count)


def pid_of(binary, port):
    """The pid of the process running `binary` with --port=PORT, or None."""
    want = ("--port=%d" % port).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(binary.encode()) and want in args:
            return int(pid)
    return None


def wait_all_serving(url, seconds=120):
    """Until the router sees every worker serving; RuntimeError after `seconds`."""
    deadline = time.time() + seconds
    while True:
        _, body = get(url + "/v1/workers")
        if all(w["state"] == "serving" for w in json.loads(body)["workers"]):
            return
        if time.time() > deadline:
            raise RuntimeError("the workers did not all serve: " + body)
        time.sleep(0.5)


def process_usage(pid):
    """A process's RSS in MiB (in all and by kind of mapping) and open file descriptors."""
    rss = None
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return {"rss_mib": rss, "rss_by_mapping_mib": rss_by_mapping(pid),
            "fds": len(os.listdir("/proc/%d/fd" % pid))}


def rss_by_mapping(pid):
    """A process's RSS in MiB by kind of mapping: files (code, libraries, the model), heap (the
    main malloc arena), stack, and anonymous (other malloc arenas, thread stacks, large
    allocations and the KV pools)."""
    kinds = {"files": 0.0, "heap": 0.0, "stack": 0.0, "anonymous": 0.0}
    kind = None
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            head = line.split()
            if not head:
                continue
            if head[0].endswith(":"):
                if head[0] == "Rss:" and kind:
                    kinds[kind] += int(head[1]) / 1024
                continue
            path = head[5] if len(head) > 5 else ""
            kind = ("heap" if path == "[heap]" else "stack" if path == "[stack]" else
                    "files" if path.startswith("/") else "anonymous" if not path else None)
    return {k: round(v, 1) for k, v in kinds.items()}


def one_request(host, port, model, spec):
    """Runs one request of the load; returns (outcome, detail): for a completed one, its text and
    the longest silence of its stream after its first event, in seconds."""
    body = {"model": model, "prompt": spec["prompt"], "max_tokens": spec["max_tokens"],
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    if spec["seed"] is None:
        body["temperature"] = 0
    else:
        body.update(temperature=0.8, seed=spec["seed"])
    if spec["kind"] == "malformed":
        payload = spec["malformed"]
    else:
        payload = json.dumps(body)
    conn = http.client.HTTPConnection(host, port, timeout=600)
    try:
        conn.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if spec["kind"] == "malformed":
            resp.read()
            return ("refused", None) if resp.status == 400 else ("failed", "malformed got %d" %
                                                                  resp.status)
        if resp.status != 200:
            return "failed", "%d %s" % (resp.status, resp.read()[:200])
        buf, events, finish, usage, error, text = b"", 0, None, None, None, ""
        last, silence = None, 0.0
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            now = time.time()
            if last is not None:
                silence = max(silence, now - last)
            last = now
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                data = event.decode(errors="replace").strip()
                if not data.startswith("data: ") or data == "data: [DONE]":
                    continue
                j = json.loads(data[len("data: "):])
                events += 1
                if "error" in j:
                    error = j["error"].get("message")
                if j.get("usage"):
                    usage = j["usage"]
                for c in j.get("choices", []):
                    finish = c.get("finish_reason") or finish
                    text += c.get("text") or ""
            if spec["kind"] == "leave" and events >= spec["leave_after"]:
                return "left", None
        if error:
            return "failed", "error event: %s" % error
        if finish is None:
            return "failed", "no finish reason"
        if usage is None or usage.get("completion_tokens") != spec["max_tokens"]:
            return "failed", "usage %s for max_tokens %d" % (usage, spec["max_tokens"])
        return "completed", {"text": text, "silence": silence}
    except (OSError, http.client.HTTPException, ValueError) as e:
        return "failed", "%s: %s" % (type(e).__name__, e)
    finally:
        conn.close()


MALFORMED = [
    "{not json",
    json.dumps({"prompt": "x", "max_tokens": -3}),
    json.dumps({"prompt": "x", "temperature": "hot"}),
    json.dumps({"prompt": "x", "no_such_field": 1}),
    json.dumps({"prompt": ["x", 5]}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--up", required=True, help="the tools/up binary")
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--chaos-every", type=float, default=30, help="seconds between disruptions")
    ap.add_argument("--stop-seconds", type=float, default=20, help="how long -STOP lasts")
    ap.add_argument("--stall-timeout", type=float, default=10, help="the router's")
    ap.add_argument("--prompt-max", type=int, default=1500)
    ap.add_argument("--kv-pages", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hold-streams", type=int, default=2000,
                    help="streaming clients at once after the chaos load (0: none)")
    ap.add_argument("--slow-sockets", type=int, default=1000, help="slow connections meanwhile")
    ap.add_argument("--greedy-check", type=int, default=-1,
                    help="greedy requests run again undisturbed to compare texts (-1: all)")
    ap.add_argument("--growth-tolerance", type=float, default=0.05,
                    help="RSS and fds after the load (and a warm-up) may exceed the start by "
                         "this share (negative: reported, not checked)")
    ap.add_argument("--check-silence", action=argparse.BooleanOptionalAction, default=True,
                    help="fail when a stream stayed silent beyond the stall bound plus one "
                         "migration (a stream that never migrated may reach its own bound, "
                         "50 inter-token times, which the router sees only when it stalls)")
    ap.add_argument("--smaps-dir", default="",
                    help="copy every process's /proc/PID/smaps here before and after the load")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    first = free_port_block(5)
    port, prefill_port, decode_port = first, first + 1, first + 3
    metrics_port = free_port_block(110)
    cmd = [args.up, "--model=" + args.model, "--prefill=2", "--decode=2", "--threads=1",
           "--port=%d" % port, "--prefill_port=%d" % prefill_port,
           "--decode_port=%d" % decode_port, "--metrics_port=%d" % metrics_port,
           "--kv_pages=%d" % args.kv_pages, "--backend=cpu", "--placement=round_robin",
           "--stall_timeout=%g" % args.stall_timeout]
    workers = {}  # name -> (binary, gRPC port, metrics port)
    for i in range(2):
        workers["prefill-%d" % i] = ("prefill/prefill", prefill_port + i, metrics_port + 1 + i)
        workers["decode-%d" % i] = ("decode/decode", decode_port + i, metrics_port + 101 + i)
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "sluice-chaos-%d.log" % port), "w")
    up = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % port
    result = {}
    done = threading.Event()  # ends the chaos and probe threads
    try:
        wait_http(url + "/v1/models", up)
        wait_all_serving(url)
        model = json.loads(get(url + "/v1/models")[1])["data"][0]["id"]

        def usage_now(when):
            out = {}
            for name, (binary, grpc_port, metrics_port) in workers.items():
                pid = pid_of(binary, grpc_port)
                out[name] = {"pid": pid}
                if pid:
                    out[name].update(process_usage(pid))
                    # The KV pools' pages as they are first used: bounded by --kv_pages.
                    pool = metric(metrics_port, "sluice_kv_pool_resident_bytes")
                    out[name]["pool_mib"] = pool / 2**20 if pool is not None else None
            pid = pid_of("router/router", port)
            out["router"] = {"pid": pid}
            out["router"].update(process_usage(pid))
            if args.smaps_dir:  # every mapping of every process, to see what grew
                os.makedirs(args.smaps_dir, exist_ok=True)
                for name, o in out.items():
                    if o.get("pid"):
                        shutil.copyfile("/proc/%d/smaps" % o["pid"],
                                        os.path.join(args.smaps_dir, "%s-%s" % (name, when)))
            return out

        # Requests of the longest prompt first, on every worker (round robin), so that each
        # process has grown to what the load needs before it is measured; again after the load,
        # so that a worker the chaos loop restarted is measured at the same point.
        # Then a burst of short ones, more at once than the router has start threads (64): the
        # most it starts under load (they end once idle, handing back what they cached).
        warm = {"kind": "normal", "prompt": make_prompt(rng, args.prompt_max), "max_tokens": 128,
                "seed": None}
        burst = {"kind": "normal", "prompt": make_prompt(rng, 20), "max_tokens": 2, "seed": None}

        def warm_up():
            for _ in range(2):
                with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                    list(pool.map(lambda _: one_request("127.0.0.1", port, model, warm),
                                  range(args.concurrency)))
            with concurrent.futures.ThreadPoolExecutor(128) as pool:
                list(pool.map(lambda _: one_request("127.0.0.1", port, model, burst), range(128)))
            # Each process gives its heap's free memory back once it turns idle (its
            # IdleTrimmer looks every 2 s); the router turns idle once its start threads,
            # idle for 5 s, have ended.
            time.sleep(10)

        def measure(when):
            """Each process as it is (its prefix caches held: bounded, not a leak), then with
            the caches dropped, once the idle processes have given back what they freed."""
            held = usage_now(when + "-caches-held")
            dropped = reset_prefix_caches(url)
            # The reset ran on one of the router's start threads: it ends after 5 s idle, and
            # the router's trimmer looks every 2 s after that.
            time.sleep(10)
            return held, dropped, usage_now(when)

        warm_up()
        before_held, dropped_before, before = measure("before")

        specs = []
        for i in range(args.requests):
            r = rng.random()
            kind = "malformed" if r < 0.05 else "leave" if r < 0.25 else "normal"
            specs.append({"kind": kind,
                          "prompt": make_prompt(rng, rng.randint(20, args.prompt_max)),
                          "max_tokens": rng.randint(8, 128),
                          "seed": None if rng.random() < 0.5 else rng.randrange(1 << 30),
                          "leave_after": rng.randint(1, 4),
                          "malformed": rng.choice(MALFORMED)})

        disruptions = []
        health = []

        def chaos():
            crng = random.Random(args.seed + 1)
            while not done.wait(args.chaos_every):
                name = crng.choice(sorted(workers))
                binary, grpc_port, _ = workers[name]
                pid = pid_of(binary, grpc_port)
                if pid is None:  # restarting
                    continue
                action = crng.choice(["kill", "stop"])
                disruptions.append({"at": time.time(), "worker": name, "action": action})
                if action == "kill":
                    os.kill(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGSTOP)
                    done.wait(args.stop_seconds)
                    os.kill(pid, signal.SIGCONT)

        def probe():
            while not done.wait(0.1):
                t0 = time.time()
                try:
                    get(url + "/health", timeout=10)
                except OSError:
                    pass  # 503 while a role has no worker: still an answer
                health.append(time.time() - t0)

        threads = [threading.Thread(target=chaos), threading.Thread(target=probe)]
        for t in threads:
            t.start()
        t0 = time.time()
        counts = {"completed": 0, "failed": 0, "left": 0, "refused": 0}
        greedy_texts = {}  # request -> its text, for the greedy requests that completed
        silences = []  # the longest silence of each completed stream
        failures = []
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            futures = [pool.submit(one_request, "127.0.0.1", port, model, s) for s in specs]
            for i, f in enumerate(futures):
                outcome, detail = f.result()
                counts[outcome] += 1
                if outcome == "completed":
                    silences.append(detail["silence"])
                    if specs[i]["seed"] is None:
                        greedy_texts[i] = detail["text"]
                if outcome == "failed":
                    failures.append({"request": i, "kind": specs[i]["kind"], "why": detail})
                if (i + 1) % 50 == 0:
                    print("chaos: %d/%d requests, %s" % (i + 1, len(specs), counts),
                          file=sys.stderr, flush=True)
        seconds = time.time() - t0
        done.set()
        for t in threads:
            t.join()

        # Every worker back and serving; then the crowd, undisturbed.
        wait_all_serving(url)
        crowd = None
        if args.hold_streams > 0:
            print("chaos: %d streams at once and %d slow sockets" %
                  (args.hold_streams, args.slow_sockets), file=sys.stderr, flush=True)
            crowd = hold("127.0.0.1", port, model, args.hold_streams, args.slow_sockets,
                         seed=args.seed)
        # The greedy requests again, undisturbed: a migrated one must give the same text.
        greedy = {"compared": 0, "equal": 0, "differ": []}
        rerun = sorted(greedy_texts)
        if args.greedy_check >= 0:
            rerun = rerun[:args.greedy_check]
        if rerun:
            print("chaos: %d greedy requests again, undisturbed" % len(rerun), file=sys.stderr,
                  flush=True)
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                again = list(pool.map(
                    lambda i: one_request("127.0.0.1", port, model, specs[i]), rerun))
            for i, (outcome, detail) in zip(rerun, again):
                if outcome != "completed":
                    continue
                greedy["compared"] += 1
                if detail["text"] == greedy_texts[i]:
                    greedy["equal"] += 1
                else:
                    greedy["differ"].append(i)
        # Then nothing held.
        # Reservations a router could not release (its worker was stopped) expire after the
        # decode workers' --reservation_ttl (60 s).
        held = {}
        t_drain = time.time()
        deadline = t_drain + 75
        while True:
            held = {name: {"pages_used": metric(m, "sluice_kv_pages_used"),
                           "pages_reserved": metric(m, "sluice_kv_pages_reserved")}
                    for name, (_, _, m) in workers.items() if name.startswith("decode")}
            if all(h["pages_used"] == 0 and h["pages_reserved"] == 0 for h in held.values()):
                break
            if time.time() > deadline:
                break
            time.sleep(0.5)
        drained_seconds = time.time() - t_drain
        warm_up()
        after_held, dropped_after, after = measure("after")
        migrations = metric(port, "sluice_request_migrations_total") or 0
        # A stream may stay silent for its stall bound (the longest detection the router saw, at
        # least --stall-timeout) plus one migration (the longest recovery it saw).
        detect = histogram_max(port, "sluice_migration_seconds", 'phase="detect"') or 0.0
        recover = histogram_max(port, "sluice_migration_seconds", 'phase="recover"') or 0.0
        silence_bound = max(args.stall_timeout, detect) + recover
        beyond = sorted((round(x, 2) for x in silences if x > silence_bound), reverse=True)
        # Growth of the RSS outside the KV pools (which fill up to --kv_pages as pages are
        # first used) and of the open fds.
        growth = {}
        for name in after:
            b, a = before[name], after[name]
            rb = b["rss_mib"] - (b.get("pool_mib") or 0) if b.get("rss_mib") else None
            ra = a["rss_mib"] - (a.get("pool_mib") or 0) if a.get("rss_mib") else None
            growth[name] = {"rss_outside_pools": ra / rb - 1 if rb and ra else None,
                            "fds": a["fds"] / b["fds"] - 1 if b.get("fds") and a.get("fds")
                            else None}
        well_formed = args.requests - sum(1 for s in specs if s["kind"] == "malformed")
        result = {
            "system": "sluice",
            "benchmark": "chaos",
            "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
            "cluster": "2 prefill + 2 decode (./sluice up, --threads=1, --backend=cpu), "
                       "round_robin placement",
            "requests": args.requests,
            "concurrency": args.concurrency,
            "chaos_every_seconds": args.chaos_every,
            "stop_seconds": args.stop_seconds,
            "stall_timeout_seconds": args.stall_timeout,
            "seconds": seconds,
            "outcomes": counts,
            "well_formed": well_formed,
            "completed_share_of_staying_clients":
                counts["completed"] / max(1, counts["completed"] + counts["failed"]),
            "migrations": migrations,
            "disruptions": disruptions,
            "failures": failures[:50],
            "health_seconds": {"p50": percentile(health, 50), "p99": percentile(health, 99),
                               "max": max(health) if health else None, "probes": len(health)},
            "greedy_again": greedy,
            "longest_silence_seconds": {"p50": percentile(silences, 50),
                                        "p99": percentile(silences, 99),
                                        "max": max(silences) if silences else None},
            "migration_seconds_max": {"detect": detect, "recover": recover},
            "silence_bound_seconds": silence_bound,
            "silences_beyond_bound": beyond,
            "growth_after_load": growth,
            "growth_tolerance": args.growth_tolerance,
            "crowd": crowd,
            "pages_after": held,
            "seconds_until_no_page_held": drained_seconds,
            "processes_before": before,
            "processes_after": after,
            # The same, before POST /reset_prefix_cache dropped what the workers keep for reuse.
            "processes_before_caches_held": before_held,
            "processes_after_caches_held": after_held,
            "prefix_cache_entries_dropped": {"before": dropped_before, "after": dropped_after},
        }
    finally:
        done.set()
        # A worker the chaos loop stopped would not see up's SIGTERM: wake every one first.
        for binary, grpc_port, _ in workers.values():
            pid = pid_of(binary, grpc_port)
            try:
                if pid is not None:
                    os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # gone meanwhile
        stop(up)
        log.close()

    print("\nchaos: %d requests in %.0f s (%d clients), a worker disrupted every %g s "
          "(%d disruptions)" % (args.requests, result["seconds"], args.concurrency,
                                args.chaos_every, len(result["disruptions"])), file=sys.stderr)
    print("  completed %d  failed %d  left by their clients %d  malformed and refused %d  "
          "migrations %d" % (counts["completed"], counts["failed"], counts["left"],
                             counts["refused"], migrations), file=sys.stderr)
    h = result["health_seconds"]
    print("  /health p50 %.1f ms  p99 %.1f ms  max %.1f ms over %d probes" %
          (1e3 * (h["p50"] or 0), 1e3 * (h["p99"] or 0), 1e3 * (h["max"] or 0), h["probes"]),
          file=sys.stderr)
    ls = result["longest_silence_seconds"]
    print("  longest silence of a completed stream: p50 %.2f s  p99 %.2f s  max %.2f s "
          "(--stall-timeout %g s)" % (ls["p50"] or 0, ls["p99"] or 0, ls["max"] or 0,
                                      args.stall_timeout), file=sys.stderr)
    mig = result["migration_seconds_max"]
    print("  the router's longest migration phases (histogram bucket bounds): detect <= %g s  "
          "recover <= %g s; streams silent beyond the stall bound plus one migration (%g s): "
          "%d%s" % (mig["detect"], mig["recover"], result["silence_bound_seconds"],
                    len(result["silences_beyond_bound"]),
                    " %s" % result["silences_beyond_bound"][:10]
                    if result["silences_beyond_bound"] else ""), file=sys.stderr)
    g = result["greedy_again"]
    print("  greedy requests run again undisturbed: %d of %d gave the same text%s" % (
        g["equal"], g["compared"],
        " (differ: %s)" % g["differ"][:10] if g["differ"] else ""), file=sys.stderr)
    c = result["crowd"]
    if c:
        ch = c["health_seconds"]
        print("  crowd: %d streams (%d open at once) and %d slow sockets (%d open at once, %d "
              "dropped by the router): completed %d  failed %d in %.0f s; /health p50 %.1f ms  "
              "p99 %.1f ms  max %.1f ms over %d probes" % (
                  c["streams"], c["streams_open_peak"], c["slow_sockets"],
                  c["slow_sockets_open_peak"], c["slow_sockets_dropped_by_router"], c["completed"],
                  c["failed"], c["seconds"] or 0, 1e3 * (ch["p50"] or 0), 1e3 * (ch["p99"] or 0),
                  1e3 * (ch["max"] or 0), ch["probes"]), file=sys.stderr)
        for f in c["failures"][:5]:
            print("  crowd failure: %s" % f, file=sys.stderr)
    print("  each process warmed up before the load and again after it, its prefix caches then "
          "dropped (MiB; outside: the RSS\n  less the KV pools' resident pages):", file=sys.stderr)
    print("  %-10s %6s %8s %14s %14s %22s %12s" % ("process", "pages", "reserved", "RSS",
                                                   "KV pools", "outside", "fds"),
          file=sys.stderr)
    grown = []
    for name in sorted(result["processes_after"]):
        b, a = result["processes_before"][name], result["processes_after"][name]
        g = result["growth_after_load"][name]
        p = result["pages_after"].get(name, {})
        print("  %-10s %6s %8s %6.0f -> %5.0f %6.0f -> %5.0f %6.0f -> %5.0f %+5.1f%% "
              "%4s -> %4s%s" % (
                  name, p.get("pages_used", "-"), p.get("pages_reserved", "-"),
                  b.get("rss_mib") or 0, a.get("rss_mib") or 0, b.get("pool_mib") or 0,
                  a.get("pool_mib") or 0, (b.get("rss_mib") or 0) - (b.get("pool_mib") or 0),
                  (a.get("rss_mib") or 0) - (a.get("pool_mib") or 0),
                  100 * (g["rss_outside_pools"] or 0), b.get("fds"), a.get("fds"),
                  "  (restarted)" if b["pid"] != a["pid"] else ""), file=sys.stderr)
        if any(v is None or v > args.growth_tolerance for v in g.values()):
            grown.append(name)
    dropped = result["prefix_cache_entries_dropped"]["after"]
    print("  before the caches were dropped, after the load (RSS outside the KV pools, MiB; "
          "prefix cache entries dropped): %s" % "  ".join(
              "%s %.0f (%d)" % (name, (h.get("rss_mib") or 0) - (h.get("pool_mib") or 0),
                                dropped.get(name, 0))
              for name, h in sorted(result["processes_after_caches_held"].items())),
          file=sys.stderr)
    for name in grown:  # where it grew
        b, a = result["processes_before"][name], result["processes_after"][name]
        print("  %s by kind of mapping (MiB): %s" % (name, "  ".join(
            "%s %.1f -> %.1f" % (k, b.get("rss_by_mapping_mib", {}).get(k, 0), v)
            for k, v in a.get("rss_by_mapping_mib", {}).items())), file=sys.stderr)
    if grown and args.growth_tolerance >= 0:
        print("  RSS outside the KV pools or fds more than %g%% above the start: %s" % (
            100 * args.growth_tolerance, ", ".join(grown)), file=sys.stderr)
    for f in result["failures"][:10]:
        print("  failed: request %d (%s): %s" % (f["request"], f["kind"], f["why"]),
              file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    leaked = any(h["pages_used"] != 0 or h["pages_reserved"] != 0
                 for h in result["pages_after"].values())
    touched = {d["worker"] for d in result["disruptions"] if d["action"] == "kill"}
    died = [n for n in result["processes_after"]
            if n not in touched and
            result["processes_before"][n]["pid"] != result["processes_after"][n]["pid"]]
    if died:
        print("  died without being killed: %s" % ", ".join(died), file=sys.stderr)
    crowd_failed = bool(result["crowd"] and result["crowd"]["failed"])
    # A greedy text must not depend on migrations or on the batches it ran in (the host
    # backends are batch-invariant).
    greedy_differ = bool(result["greedy_again"]["differ"])
    grew = bool(grown) and args.growth_tolerance >= 0
    silent = bool(result["silences_beyond_bound"]) and args.check_silence
    return 1 if counts["failed"] or crowd_failed or leaked or died or greedy_differ or grew or \
        silent else 0


if __name__ == "__main__":
    sys.exit(main())
