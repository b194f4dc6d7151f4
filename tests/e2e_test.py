"""End to end: a real cluster (router, prefill and decode processes talking gRPC and UCX) on
loopback ports, serving the bundled model, driven over HTTP as clients do.

Needs SLUICE_MODEL (the GGUF). The OpenAI-client and raw gRPC checks also need
SLUICE_CLIENT_PYTHON, a python with the `openai` and `grpcio` packages (tests/setup_client_venv.sh, which `./sluice test` runs).
"""

import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from deploy import test_report
from deploy.test_net import free_port, http

MODEL = os.environ.get("SLUICE_MODEL", "")
CLIENT_PYTHON = os.environ.get("SLUICE_CLIENT_PYTHON", "")
# The services the workers serve (runfiles).
SLUICE_PROTO = os.path.join(os.getcwd(), "proto", "sluice.proto")
# Long enough (~300 tokens) that every preset puts part of it in pages, not just in the
# full-precision window.
LONG_PROMPT = ("Rivers carry water from the mountains to the sea, shaping valleys and feeding "
               "cities along the way. ") * 12 + "Write a long story about one of them."


class PortTaken(RuntimeError):
    """A process could not bind its port: another process took it after free_port chose it."""


def binary(name):
    # Runfiles: the test runs in the workspace's runfiles directory.
    path = os.path.join(os.getcwd(), name, name)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return path


# Calls every rpc of proto/sluice.proto on the workers with raw (empty) messages, without the
# token and with a wrong one; then Admin/Stats with the token and the standard health check
# without one. Runs under the client python (grpcio).
GRPC_PROBE = r"""
import json, re, sys
import grpc
proto, decode, prefill, token = sys.argv[1:5]
text = open(proto).read()
where = {"Decode": [decode], "Prefill": [prefill], "Admin": [decode, prefill]}
raw = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)

def call(target, path, stream, metadata):
    channel = grpc.insecure_channel(target)
    try:
        if stream:
            list(channel.unary_stream(path, **raw)(b"", metadata=metadata, timeout=20))
        else:
            channel.unary_unary(path, **raw)(b"", metadata=metadata, timeout=20)
        return "OK"
    except grpc.RpcError as e:
        return e.code().name
    finally:
        channel.close()

refused = []
for service, body in re.findall(r"service (\w+) \{(.*?)\n\}", text, re.S):
    for name, stream in re.findall(r"rpc (\w+)\(\w+\) returns \((stream )?\w+\)", body):
        path = "/sluice.rpc.%s/%s" % (service, name)
        for target in where[service]:
            for metadata in ([], [("authorization", "Bearer wrong-token-0123456789abcdef")]):
                refused.append({"method": path, "target": target,
                                "code": call(target, path, bool(stream), metadata)})
print(json.dumps({
    "refused": refused,
    "with_token": call(decode, "/sluice.rpc.Admin/Stats", False,
                       [("authorization", "Bearer " + token)]),
    "health": call(decode, "/grpc.health.v1.Health/Check", False, []),
}))
"""

class Cluster:
    """One decode, one prefill and the router, on free ports; stopped with SIGTERM. A start
    that loses a port to another process (between free_port and the bind) starts over on
    fresh ports, up to three times."""

    def __init__(self, preset="sluice", kv_pages=4096, workers=1, placement="least_loaded",
                 decode_list=False, router_args=(), prefill_args=(), decode_args=()):
        self.prefill_args, self.decode_args = list(prefill_args), list(decode_args)
        for attempt in range(3):
            try:
                self._start(preset, kv_pages, workers, placement, decode_list, list(router_args))
                return
            except PortTaken:
                self.stop()
                if attempt == 2:
                    raise

    def _start(self, preset, kv_pages, workers, placement, decode_list, router_args):
        self.logs = tempfile.mkdtemp(prefix="sluice-e2e-")
        self.http = free_port()
        # The cluster token every gRPC call between the processes carries, as ./sluice up makes.
        self.token_file = os.path.join(self.logs, "token")
        with open(os.open(self.token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(os.urandom(32).hex())
        auth = "--auth_token_file=" + self.token_file
        common = ["--model=" + MODEL, "--threads=1", "--preset=" + preset, auth]
        self.procs = {}
        prefill, decode = [], []
        self.decode_metrics_ports = []
        for i in range(workers):
            port, metrics = free_port(), free_port()
            decode.append("127.0.0.1:%d" % port)
            self.start("decode-%d" % i, [binary("decode"), "--port=%d" % port,
                                         "--metrics_port=%d" % metrics,
                                         "--kv_pages=%d" % kv_pages]
                       + common + self.decode_args)
            self.decode_metrics_ports.append(metrics)
            if i == 0:
                self.decode_metrics = metrics
            port, metrics = free_port(), free_port()
            prefill.append("127.0.0.1:%d" % port)
            self.start("prefill-%d" % i, [binary("prefill"), "--port=%d" % port,
                                          "--metrics_port=%d" % metrics] + common +
                       self.prefill_args)
            if i == 0:
                self.prefill_metrics = metrics
        self.decode_addrs = decode
        decode_flag = ",".join(decode)
        if decode_list:
            # The router follows a file of decode workers (as a headless Service's DNS name):
            # it starts with the first; set_decoders changes the list.
            self.decode_list = os.path.join(self.logs, "decoders")
            self.set_decoders(decode[:1])
            decode_flag = "file:" + self.decode_list
        self.router_metrics = free_port()
        self.start("router", [binary("router"), "--model=" + MODEL, "--port=%d" % self.http,
                              "--prefill=" + ",".join(prefill), "--decode=" + decode_flag,
                              "--placement=" + placement, auth,
                              "--metrics_port=%d" % self.router_metrics] + router_args)
        self.url = "http://127.0.0.1:%d" % self.http
        self.grpc = {"decode": decode[0], "prefill": prefill[0]}
        deadline = time.time() + 60
        while True:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    log = self.log(name)
                    if "port in use" in log or "cannot listen on" in log:
                        raise PortTaken("%s: %s" % (name, log[-300:]))
                    raise RuntimeError("%s exited with %s:\n%s" % (name, p.returncode, log))
            try:
                # Every worker polled and serving, not only one of each role: a worker the
                # router has not reached yet would be tried last, on a channel still backing off.
                status, body = get(self.url + "/v1/workers")
                if status == 200 and all(w["state"] == "serving"
                                          for w in json.loads(body)["workers"]):
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("the cluster did not become healthy:\n" + self.log("router"))
            time.sleep(0.2)
        _, models = get(self.url + "/v1/models")
        self.model = json.loads(models)["data"][0]["id"]

    def set_decoders(self, addresses):
        with open(self.decode_list + ".new", "w") as f:
            f.write("\n".join(addresses) + "\n")
        os.rename(self.decode_list + ".new", self.decode_list)

    def start(self, name, argv):
        out = open(os.path.join(self.logs, name + ".log"), "w")
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def log(self, name):
        with open(os.path.join(self.logs, name + ".log")) as f:
            return f.read()[-4000:]

    def stop(self):
        """SIGTERM to every process; returns their exit codes."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[name] = "killed"
        return codes

    def metric(self, port, name):
        """Sum of a metric's samples on a worker's /metrics."""
        _, text = get("http://127.0.0.1:%d/metrics" % port)
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def get(url):
    return http(url, timeout=10)


def post(url, body, timeout=120):
    return http(url, body, timeout)


def sse_events(text):
    """The data payloads of an SSE body, in order."""
    assert text.endswith("\n\n"), text[-200:]
    events = []
    for block in text.split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            events.append(block[len("data: "):])
    return events


# A client holding the cluster token attacks from the network, as a peer that learned the
# token might: releases reservations by guessing ids, then reserves room for an 8-token prompt
# and asks the prefill worker to put a 1,500-token prompt's pages through it, claiming room for
# 5,000 pages. Messages are encoded by hand (protobuf wire format). Prints the status codes.
GRPC_ATTACK = r"""
import json, sys
import grpc
decode, prefill, token = sys.argv[1:4]
md = [("authorization", "Bearer " + token)]
raw = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)

def varint(v):
    out = b""
    while True:
        b = v & 0x7f
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])

def field(n, v):  # int or bytes
    if isinstance(v, int):
        return varint(n << 3) + varint(v)
    return varint(n << 3 | 2) + varint(len(v)) + v

def fields(b):
    out, i = {}, 0
    while i < len(b):
        key, i = read_varint(b, i)
        n, kind = key >> 3, key & 7
        if kind == 0:
            v, i = read_varint(b, i)
        elif kind == 2:
            size, i = read_varint(b, i)
            v, i = b[i:i + size], i + size
        elif kind == 5:
            v, i = b[i:i + 4], i + 4
        else:
            v, i = b[i:i + 8], i + 8
        out[n] = v
    return out

def read_varint(b, i):
    v = shift = 0
    while True:
        v |= (b[i] & 0x7f) << shift
        shift += 7
        i += 1
        if not b[i - 1] & 0x80:
            return v, i

def call(target, path, body):
    channel = grpc.insecure_channel(target)
    try:
        return "OK", channel.unary_unary(path, **raw)(body, metadata=md, timeout=120)
    except grpc.RpcError as e:
        return e.code().name, e.details()
    finally:
        channel.close()

out = {"release": []}
for rid in list(range(1, 50)) + [2**63 + 5]:
    out["release"].append(call(decode, "/sluice.rpc.Decode/Release", field(1, rid))[0])
code, body = call(decode, "/sluice.rpc.Decode/Reserve", field(3, 8) + field(4, 1))
out["reserve"] = code
own = fields(body)
one = bytes.fromhex("0000803f")  # 1.0f, little-endian
sampling = varint(3 << 3 | 5) + one + varint(5 << 3 | 5) + one + field(7, 1)  # top_p, penalty
prompt = b"".join(varint(t) for t in range(200, 1700))
pre = (field(1, 7) + field(2, prompt) + field(3, sampling) + field(5, b"decode-0") +
       field(6, own[4]) + field(8, own[3]) + field(10, 5000) + field(11, 1 << 30))
code, detail = call(prefill, "/sluice.rpc.Prefill/Prefill", pre)
out["prefill"] = [code, detail if isinstance(detail, str) else ""]
out["release_own"] = call(decode, "/sluice.rpc.Decode/Release", field(1, own[1]))[0]
print(json.dumps(out))
"""

class EndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not MODEL:
            raise unittest.SkipTest("SLUICE_MODEL is not set (./sluice test sets it)")
        cls.c = Cluster()

    @classmethod
    def tearDownClass(cls):
        codes = cls.c.stop()
        for name, code in codes.items():
            assert code == 0, "%s stopped with %s:\n%s" % (name, code, cls.c.log(name))

    def chat(self, content, **kw):
        body = {"model": self.c.model, "messages": [{"role": "user", "content": content}],
                "temperature": 0, "max_tokens": 24}
        body.update(kw)
        return post(self.c.url + "/v1/chat/completions", body)

    def test_chat_answers_and_counts_usage(self):
        status, body = self.chat("What is the capital of France?")
        self.assertEqual(status, 200, body)
        r = json.loads(body)
        self.assertEqual(r["object"], "chat.completion")
        msg = r["choices"][0]["message"]
        self.assertEqual(msg["role"], "assistant")
        self.assertIn("Paris", msg["content"])
        self.assertIn(r["choices"][0]["finish_reason"], ("stop", "length"))
        u = r["usage"]
        self.assertGreater(u["prompt_tokens"], 10)
        self.assertGreater(u["completion_tokens"], 0)
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"])

    @unittest.skipUnless(CLIENT_PYTHON, "needs SLUICE_CLIENT_PYTHON (grpcio)")
    def test_grpc_calls_without_the_cluster_token_are_refused(self):
        # Every method of every service in proto/sluice.proto, called by a client that can
        # reach the workers but has no token (or a wrong one): UNAUTHENTICATED, nothing done.
        with open(self.c.token_file) as f:
            token = f.read().strip()
        out = subprocess.run([CLIENT_PYTHON, "-c", GRPC_PROBE, SLUICE_PROTO, self.c.grpc["decode"],
                              self.c.grpc["prefill"], token],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        calls = json.loads(out.stdout)
        methods = {c["method"] for c in calls["refused"]}
        self.assertGreaterEqual(len(methods), 8, methods)
        self.assertIn("/sluice.rpc.Decode/Reserve", methods)
        self.assertIn("/sluice.rpc.Prefill/Prefill", methods)
        for c in calls["refused"]:
            self.assertEqual(c["code"], "UNAUTHENTICATED", c)
        self.assertEqual(calls["with_token"], "OK")  # Admin/Stats with the token
        self.assertEqual(calls["health"], "OK")  # probes carry no credential
        _, metrics = get("http://127.0.0.1:%d/metrics" % self.c.decode_metrics)
        self.assertIn('sluice_grpc_unauthenticated_total{method="Decode.Reserve"}', metrics)

    @unittest.skipUnless(CLIENT_PYTHON, "needs SLUICE_CLIENT_PYTHON (grpcio)")
    def test_a_token_holder_cannot_write_into_another_requests_pages(self):
        # While a greedy stream runs, a client with the token guesses reservation ids and has the
        # prefill worker put a long prompt's pages through a reservation made for 8 tokens: the
        # releases find nothing, the put fails (ABORTED, it leaves the reservation's window), and
        # the stream's text is that of an undisturbed run.
        with open(self.c.token_file) as f:
            token = f.read().strip()
        body = {"model": self.c.model, "prompt": LONG_PROMPT, "temperature": 0, "max_tokens": 48}
        status, undisturbed = post(self.c.url + "/v1/completions", body)
        self.assertEqual(status, 200, undisturbed)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            victim = pool.submit(post, self.c.url + "/v1/completions", dict(body, stream=True))
            time.sleep(0.3)
            out = subprocess.run([CLIENT_PYTHON, "-c", GRPC_ATTACK, self.c.grpc["decode"],
                                  self.c.grpc["prefill"], token],
                                 capture_output=True, text=True, timeout=300)
            status, streamed = victim.result(timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        attack = json.loads(out.stdout)
        self.assertEqual(set(attack["release"]), {"NOT_FOUND"}, attack)
        self.assertEqual(attack["reserve"], "OK", attack)
        self.assertEqual(attack["prefill"][0], "ABORTED", attack)
        self.assertIn("leaves the peer's region", attack["prefill"][1])
        self.assertEqual(attack["release_own"], "OK", attack)
        self.assertEqual(status, 200, streamed)
        chunks = [json.loads(e) for e in sse_events(streamed) if e != "[DONE]"]
        text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
        self.assertEqual(text, json.loads(undisturbed)["choices"][0]["text"])

    def test_slow_clients_hold_no_thread(self):
        # Many more half-sent requests than the router has threads: they hold a socket each,
        # and the API, its /health and the probe listener answer meanwhile.
        slow = []
        try:
            for _ in range(300):
                s = socket.create_connection(("127.0.0.1", self.c.http), timeout=5)
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
                slow.append(s)
            time.sleep(0.5)
            probes = "http://127.0.0.1:%d" % self.c.router_metrics
            for url in (probes + "/health", probes + "/metrics", self.c.url + "/health"):
                start = time.time()
                status, _ = http(url, timeout=5)
                self.assertEqual(status, 200, url)
                self.assertLess(time.time() - start, 1.0, url)
            status, text = self.chat("Say hi.", max_tokens=4)
            self.assertEqual(status, 200, text)
        finally:
            for s in slow:
                s.close()

    def test_model_is_optional(self):
        body = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
                "temperature": 0, "max_tokens": 8, "skip_special_tokens": False}
        status, text = post(self.c.url + "/v1/chat/completions", body)
        self.assertEqual(status, 200, text)
        self.assertEqual(json.loads(text)["model"], self.c.model)

    def test_streamed_chat_matches_the_whole_answer(self):
        status, whole = self.chat("Name three rivers in Europe.", max_tokens=30)
        self.assertEqual(status, 200, whole)
        status, body = self.chat("Name three rivers in Europe.", max_tokens=30, stream=True,
                                 stream_options={"include_usage": True})
        self.assertEqual(status, 200, body)
        events = sse_events(body)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
        text = "".join(c["choices"][0]["delta"].get("content", "")
                       for c in chunks if c["choices"])
        self.assertEqual(text, json.loads(whole)["choices"][0]["message"]["content"])
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        self.assertTrue(all(f is None for f in finishes[:-1]))
        self.assertIn(finishes[-1], ("stop", "length"))
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"],
                         json.loads(whole)["usage"]["completion_tokens"])

    def test_completions_with_logprobs_stop_and_stream(self):
        body = {"model": self.c.model, "prompt": "The three primary colors are",
                "max_tokens": 16, "temperature": 0, "logprobs": 2}
        status, text = post(self.c.url + "/v1/completions", body)
        self.assertEqual(status, 200, text)
        r = json.loads(text)
        self.assertEqual(r["object"], "text_completion")
        choice = r["choices"][0]
        lp = choice["logprobs"]
        self.assertEqual(len(lp["tokens"]), r["usage"]["completion_tokens"])
        self.assertEqual("".join(lp["tokens"]), choice["text"])
        self.assertTrue(all(x <= 0 for x in lp["token_logprobs"]))
        self.assertTrue(all(len(t) == 2 for t in lp["top_logprobs"]))
        # A stop string cuts the text before it.
        words = choice["text"].split()
        self.assertGreater(len(words), 2, choice["text"])
        stop = words[2]
        status, text = post(self.c.url + "/v1/completions", dict(body, stop=[stop]))
        self.assertEqual(status, 200, text)
        cut = json.loads(text)["choices"][0]
        self.assertEqual(cut["finish_reason"], "stop")
        self.assertEqual(cut["text"], choice["text"][:choice["text"].index(stop)])
        self.assertEqual(cut["stop_reason"], stop)
        status, text = post(self.c.url + "/v1/completions", dict(body, stream=True))
        self.assertEqual(status, 200, text)
        events = sse_events(text)
        self.assertEqual(events[-1], "[DONE]")
        streamed = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
        self.assertEqual(streamed, choice["text"])

    def test_a_repeated_prompt_is_served_from_the_prefix_cache(self):
        # Past one chunk (512 tokens): the second time, the prefill worker forks the prompt's
        # first chunk from its cache, computes the rest, and the greedy text is the same.
        prompt = ("A lighthouse keeper writes in a log every night: the weather, the ships "
                  "that passed, the oil burned, and what the sea threw on the rocks. ") * 24
        body = {"model": self.c.model, "prompt": prompt, "max_tokens": 12, "temperature": 0}
        hits = self.c.metric(self.c.prefill_metrics, "sluice_prefix_cache_hit_tokens_total")
        not_sent = self.c.metric(self.c.prefill_metrics, "sluice_prefix_cache_bytes_not_sent_total")
        answers = []
        for _ in range(2):
            status, text = post(self.c.url + "/v1/completions", body)
            self.assertEqual(status, 200, text)
            answers.append(json.loads(text))
        first, second = answers
        self.assertGreater(first["usage"]["prompt_tokens"], 512)
        self.assertEqual(first["usage"]["prompt_tokens_details"], {"cached_tokens": 0})
        self.assertEqual(second["usage"]["prompt_tokens_details"], {"cached_tokens": 512})
        self.assertEqual(second["choices"][0]["text"], first["choices"][0]["text"])
        self.assertEqual(
            self.c.metric(self.c.prefill_metrics, "sluice_prefix_cache_hit_tokens_total"),
            hits + 512)
        # The decode worker kept the first prompt's pages of that chunk: the second time they
        # were not sent over UCX.
        self.assertGreater(
            self.c.metric(self.c.prefill_metrics, "sluice_prefix_cache_bytes_not_sent_total"),
            not_sent)
        # POST /reset_prefix_cache (as vLLM's): every worker drops what it keeps for reuse, the
        # prefill worker its cached chunk, the decode worker the prompt's held pages; the prompt
        # is then computed from its start, to the same text.
        status, text = post(self.c.url + "/reset_prefix_cache", {})
        self.assertEqual(status, 200, text)
        dropped = {"prefill": 0, "decode": 0}
        for w in json.loads(text)["workers"]:
            dropped[w["role"]] += w["entries_dropped"]
        self.assertGreaterEqual(dropped["prefill"], 1, text)
        self.assertGreaterEqual(dropped["decode"], 1, text)
        status, text = post(self.c.url + "/v1/completions", body)
        self.assertEqual(status, 200, text)
        third = json.loads(text)
        self.assertEqual(third["usage"]["prompt_tokens_details"], {"cached_tokens": 0})
        self.assertEqual(third["choices"][0]["text"], first["choices"][0]["text"])

    def test_several_choices_share_one_prompt(self):
        # n = 3: one prefill, three generations forked on the decode worker; choice i is the
        # text a request of seed + i gives alone.
        body = {"model": self.c.model, "prompt": "Once upon a time", "max_tokens": 12,
                "temperature": 0.9, "seed": 11, "ignore_eos": True, "n": 3}
        status, text = post(self.c.url + "/v1/completions", body)
        self.assertEqual(status, 200, text)
        r = json.loads(text)
        self.assertEqual([c["index"] for c in r["choices"]], [0, 1, 2])
        self.assertTrue(all(c["finish_reason"] == "length" for c in r["choices"]), r)
        self.assertEqual(r["usage"]["completion_tokens"], 36)
        for i, choice in enumerate(r["choices"]):
            status, one = post(self.c.url + "/v1/completions", dict(body, n=1, seed=11 + i))
            self.assertEqual(status, 200, one)
            self.assertEqual(choice["text"], json.loads(one)["choices"][0]["text"], i)
            self.assertEqual(json.loads(one)["usage"]["prompt_tokens"], r["usage"]["prompt_tokens"])
        # Streamed: each choice's chunks carry its index, one finish each, one usage at the end.
        status, streamed = post(self.c.url + "/v1/completions",
                                dict(body, stream=True, stream_options={"include_usage": True}))
        self.assertEqual(status, 200, streamed)
        events = sse_events(streamed)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        texts, finishes = ["", "", ""], [[], [], []]
        for ch in chunks[:-1]:
            self.assertEqual(len(ch["choices"]), 1, ch)
            c = ch["choices"][0]
            texts[c["index"]] += c["text"]
            if c["finish_reason"] is not None:
                finishes[c["index"]].append(c["finish_reason"])
        self.assertEqual(texts, [c["text"] for c in r["choices"]])
        self.assertEqual(finishes, [["length"]] * 3)
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 36)
        # Chat: every choice's first chunk names the assistant.
        status, chat = self.chat("Say hi.", max_tokens=6, n=2, stream=True)
        self.assertEqual(status, 200, chat)
        roles = [json.loads(e)["choices"][0]["index"] for e in sse_events(chat)[:-1]
                 if json.loads(e)["choices"][0]["delta"].get("role") == "assistant"]
        self.assertEqual(sorted(roles), [0, 1])
        self.wait_for_no_pages()

    def test_sixteen_concurrent_requests(self):
        prompts = ["Tell me a fact about the number %d." % i for i in range(16)]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(
                lambda p: self.chat(p, max_tokens=16, stream=p.endswith("1.")), prompts))
        for status, body in results:
            self.assertEqual(status, 200, body)
        # Every sequence's pages went back.
        self.wait_for_no_pages()

    def wait_for_no_pages(self):
        """Neither worker holds a page: decode's gauges, and both as the router last polled
        (a prefill worker's cached prompt prefixes count as free)."""
        deadline = time.time() + 10
        while True:
            used = self.c.metric(self.c.decode_metrics, "sluice_kv_pages_used")
            reserved = self.c.metric(self.c.decode_metrics, "sluice_kv_pages_reserved")
            _, body = get(self.c.url + "/v1/workers")
            held = {w["name"]: w["kv_pages_used"] for w in json.loads(body)["workers"]}
            if used == 0 and reserved == 0 and not any(held.values()):
                return
            if time.time() > deadline:
                self.fail("pages still held: decode %d (%d reserved), workers %s"
                          % (used, reserved, held))
            time.sleep(0.1)

    def test_client_that_disconnects_mid_stream_leaves_no_pages(self):
        body = json.dumps({"model": self.c.model, "stream": True, "max_tokens": 400,
                           "temperature": 0.8, "seed": 5, "ignore_eos": True,
                           "messages": [{"role": "user", "content": LONG_PROMPT}]})
        failures = self.c.metric(self.c.prefill_metrics, "sluice_kv_transfer_failures_total")
        s = socket.create_connection(("127.0.0.1", self.c.http))
        s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                   "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                   % (len(body), body)).encode())
        got = b""
        while got.count(b"data: ") < 4:
            got += s.recv(4096)
        # Pages are held while it streams.
        self.assertGreater(self.c.metric(self.c.decode_metrics, "sluice_kv_pages_used"), 0)
        s.close()
        self.wait_for_no_pages()
        self.assertEqual(self.c.metric(self.c.prefill_metrics, "sluice_kv_transfer_failures_total"),
                         failures)

    def test_bad_requests_get_openai_errors(self):
        url = self.c.url + "/v1/chat/completions"
        cases = [
            (post(url, b"{not json"), 400, None),
            (post(url, {"model": self.c.model, "messages": []}), 400, "messages"),
            (post(url, {"model": "no-such-model",
                        "messages": [{"role": "user", "content": "hi"}]}), 404, "model"),
            (self.chat("hi", temperature="hot"), 400, "temperature"),
            (self.chat("hi", n=17), 400, "n"),
            (self.chat("word " * 9000), 400, "messages"),
            (self.chat("hi", kv_compression="no-such-preset"), 400, "kv_compression"),
            (self.chat("hi", some_new_field=1), 400, "some_new_field"),
            (self.chat("hi", min_tokens=4), 400, "min_tokens"),
            (post(url, b"x" * (9 << 20)), 413, None),
        ]
        for (status, body), want, param in cases:
            self.assertEqual(status, want, body[:300])
            err = json.loads(body)["error"]
            self.assertTrue(err["message"])
            if param:
                self.assertEqual(err["param"], param, body[:300])

    def test_requests_name_a_preset(self):
        status, body = self.chat("What is the capital of France?", kv_compression="int8")
        self.assertEqual(status, 200, body)
        self.assertIn("Paris", json.loads(body)["choices"][0]["message"]["content"])

    def test_workers_name_their_backend(self):
        # Started with the default --backend=auto: the CUDA backend where a GPU is usable, else
        # the CPU; /v1/workers and the worker's banner say which.
        _, body = get(self.c.url + "/v1/workers")
        workers = json.loads(body)["workers"]
        self.assertEqual(len(workers), 2)
        for w in workers:
            self.assertRegex(w["backend"], r"^(cpu|cuda) \(", w)
            # The router's polls: grpc.health.v1 liveness (up) and readiness of each worker.
            self.assertEqual(w["state"], "serving", w)
            self.assertTrue(w["ready"], w)
            banner = [line for line in self.c.log(w["name"]).splitlines() if "serving" in line]
            self.assertTrue(banner and ("with backend %s " % w["backend"]) in banner[0],
                            (w, banner))

    def test_metrics_are_prometheus_text(self):
        self.chat(LONG_PROMPT, max_tokens=4)
        status, text = get(self.c.url + "/metrics")
        self.assertEqual(status, 200)
        for name in ("sluice_requests_total", "sluice_time_to_first_token_seconds_bucket",
                     "sluice_inter_token_latency_seconds_bucket",
                     "sluice_e2e_request_latency_seconds_count", "sluice_prompt_tokens_total",
                     "sluice_generation_tokens_total", "sluice_requests_running"):
            self.assertRegex(text, r"(?m)^%s[{ ]" % re.escape(name))
        self.assertGreater(self.c.metric(self.c.prefill_metrics, "sluice_kv_transfer_bytes_total"),
                           0)
        self.assertGreater(self.c.metric(self.c.decode_metrics, "sluice_kv_pages_free"), 0)
        self.assertGreater(self.c.metric(self.c.decode_metrics, "sluice_kv_compression_ratio"),
                           -1)
        # The pools' pages in memory: some once a prompt has been through, never more than the
        # pools hold (the prefill worker looks once a second).
        for port in (self.c.prefill_metrics, self.c.decode_metrics):
            deadline = time.time() + 10
            while self.c.metric(port, "sluice_kv_pool_resident_bytes") == 0:
                self.assertLess(time.time(), deadline, port)
                time.sleep(0.2)
        page_bytes = self.c.metric(self.c.decode_metrics, "sluice_kv_page_bytes")
        self.assertGreaterEqual(page_bytes, 1024)
        self.assertLessEqual(page_bytes, 16384)
        pool_bytes = page_bytes * self.c.metric(self.c.decode_metrics, "sluice_kv_pages_total")
        self.assertLessEqual(self.c.metric(self.c.decode_metrics, "sluice_kv_pool_resident_bytes"),
                             pool_bytes)

    def test_openai_client(self):
        py = os.environ.get("SLUICE_CLIENT_PYTHON")
        if not py:
            self.skipTest("SLUICE_CLIENT_PYTHON is not set (./sluice test sets it)")
        script = """
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
m = sys.argv[2]
r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "Say hi."}],
                              max_tokens=8, temperature=0)
assert r.choices[0].message.content, r
parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
    model=m, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0,
    stream=True) if ch.choices]
assert "".join(parts) == r.choices[0].message.content, (parts, r)
t = c.completions.create(model=m, prompt="Once upon a time", max_tokens=8, temperature=0)
assert t.choices[0].text and t.usage.completion_tokens > 0, t
s = "".join(x.choices[0].text for x in c.completions.create(
    model=m, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True))
assert s == t.choices[0].text, (s, t)
assert [x.id for x in c.models.list().data] == [m]
print("ok")
"""
        out = subprocess.run([py, "-c", script, self.c.url, self.c.model], capture_output=True,
                             text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("ok", out.stdout)


def answers_together(test, c, body, first, n):
    """Posts the chat `body` n times at once; each must answer 200 with `first`'s content."""
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(
            lambda _: post(c.url + "/v1/chat/completions", body, 120), range(n)))
    for status, text in answers:
        test.assertEqual(status, 200, text + "\nrouter log:\n" + c.log("router"))
        test.assertEqual(json.loads(text)["choices"][0]["message"]["content"],
                         json.loads(first)["choices"][0]["message"]["content"])


class TransformWire(unittest.TestCase):
    """Prompts' KV crossing transform-coded between real processes (./sluice up --wire_bits),
    with the calibration ./sluice test fits beside the model."""

    def test_a_coded_prompt_answers_and_crosses_in_fewer_bytes(self):
        if not MODEL:
            self.skipTest("SLUICE_MODEL is not set (./sluice test sets it)")
        cal = re.sub(r"\.gguf$", "", MODEL) + ".kvtc"
        if not os.path.exists(cal):
            self.skipTest("no calibration at %s (./sluice calibrate)" % cal)
        c = Cluster(preset="fp16", prefill_args=["--kv_calibration=" + cal, "--wire_bits=3/5"],
                    decode_args=["--kv_calibration=" + cal])
        try:
            body = {"model": c.model, "temperature": 0, "max_tokens": 24,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}]}
            status, answer = post(c.url + "/v1/chat/completions", body)
            self.assertEqual(status, 200, answer)
            self.assertIn("Paris", json.loads(answer)["choices"][0]["message"]["content"])
            _, metrics = get("http://127.0.0.1:%d/metrics" % c.prefill_metrics)
            coded = re.search(r'sluice_kv_wire_bytes_total\{codec="kvtc"\} (\S+)', metrics)
            fp16 = re.search(r'sluice_kv_wire_fp16_bytes_total\{codec="kvtc"\} (\S+)', metrics)
            self.assertTrue(coded and fp16, metrics)
            self.assertGreater(float(coded.group(1)), 0)
            # The prompt is short: the first 4 tokens and the last ones cross exact.
            self.assertLess(float(coded.group(1)), float(fp16.group(1)) / 1.5)
            _, metrics = get("http://127.0.0.1:%d/metrics" % c.decode_metrics)
            self.assertRegex(metrics, r"sluice_kv_wire_decode_seconds_count [1-9]")
        finally:
            c.stop()


class Failover(unittest.TestCase):
    """Two workers of each role; one of each dies; requests still succeed."""

    def test_requests_survive_a_dead_prefill_and_a_dead_decode_worker(self):
        if not MODEL:
            self.skipTest("SLUICE_MODEL is not set (./sluice test sets it)")
        c = Cluster(workers=2, placement="round_robin")
        try:
            body = {"model": c.model, "messages": [{"role": "user", "content": LONG_PROMPT}],
                    "max_tokens": 8, "temperature": 0}
            status, first = post(c.url + "/v1/chat/completions", body)
            self.assertEqual(status, 200, first)
            for name in ("prefill-1", "decode-1"):
                c.procs[name].kill()
                c.procs[name].wait()
            # Right away, before a health check can notice (three failed polls): the router
            # retries elsewhere. The requests go together so that round-robin hands some of them
            # to the dead workers however long each takes on a loaded machine.
            answers_together(self, c, body, first, 6)
            _, metrics = get(c.url + "/metrics")
            self.assertRegex(metrics, r'sluice_request_retries_total\{role="(prefill|decode)"\} [1-9]')
            _, workers = get(c.url + "/v1/workers")
            down = [w["name"] for w in json.loads(workers)["workers"] if w["state"] == "down"]
            self.assertEqual(len(down), 2, workers)
        finally:
            codes = c.stop()
        for name in ("router", "prefill-0", "decode-0"):
            self.assertEqual(codes[name], 0, c.log(name))


def streamed_text(body):
    """The text of a streamed completion, whether an error event came, and its usage."""
    text, error, usage = "", False, None
    for e in sse_events(body):
        if e == "[DONE]":
            continue
        chunk = json.loads(e)
        error = error or "error" in chunk
        usage = chunk.get("usage") or usage
        text += "".join(c["text"] for c in chunk.get("choices", []))
    return text, error, usage


class Migration(unittest.TestCase):
    """Two workers of each role. A decode worker dies (-9) or stalls (-STOP) while it streams:
    its generations go on elsewhere, each client seeing one stream that ends well, with every
    token it asked for counted once (a request of several choices: each choice moves alone). (That the moved text equals an undisturbed run's is
    tested in tests/disaggregated_test, one sequence at a time: across processes the batches
    differ, and a chaos run saw greedy texts part without a migration.)"""

    def check(self, disturb, reason):
        if not MODEL:
            self.skipTest("SLUICE_MODEL is not set (./sluice test sets it)")
        c = Cluster(workers=2, placement="round_robin", router_args=["--stall_timeout=3"])
        try:
            # Long enough that decode-1 is mid-stream when it dies.
            base = {"model": c.model, "prompt": LONG_PROMPT, "max_tokens": 400,
                    "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            # The seeded ones ask for two choices (each migrates alone).
            bodies = [dict(base, temperature=0), dict(base, temperature=0.8, seed=7, n=2)] * 2
            status, out = post(c.url + "/v1/completions", dict(bodies[0], max_tokens=1))
            self.assertEqual(status, 200, out)
            prompt_tokens = streamed_text(out)[2]["prompt_tokens"]
            with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
                futures = [pool.submit(post, c.url + "/v1/completions", b, 300) for b in bodies]
                # Until decode-1 streams (round robin gave it half of them).
                deadline = time.time() + 60
                while c.metric(c.decode_metrics_ports[1], "sluice_requests_running") == 0:
                    self.assertLess(time.time(), deadline, c.log("router"))
                    time.sleep(0.05)
                time.sleep(0.5)
                disturb(c.procs["decode-1"])
                results = [f.result(timeout=300) for f in futures]
            for i, (status, out) in enumerate(results):
                self.assertEqual(status, 200, out)
                text, error, usage = streamed_text(out)
                self.assertFalse(error, out[-500:] + "\nrouter log:\n" + c.log("router"))
                tokens = 400 * bodies[i].get("n", 1)
                self.assertIn("cached_tokens", usage.pop("prompt_tokens_details"))
                self.assertEqual(usage, {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                                         "total_tokens": prompt_tokens + tokens}, "stream %d" % i)
                self.assertGreater(len(text), tokens, text)
            self.assertGreaterEqual(c.metric(c.router_metrics, "sluice_request_migrations_total"
                                             '{reason="%s"}' % reason), 1, c.log("router"))
            # Each migration's phases are timed: its detection, and its recovery up to the
            # next worker's first token. A stall is noticed no sooner than its bound (3 s).
            phase = lambda p, what: c.metric(
                c.router_metrics, 'sluice_migration_seconds_%s{phase="%s"}' % (what, p))
            migrations = c.metric(c.router_metrics, "sluice_request_migrations_total")
            self.assertEqual(phase("detect", "count"), migrations)
            self.assertEqual(phase("recover", "count"), migrations)
            self.assertGreater(phase("recover", "sum"), 0)
            if reason == "stalled":
                self.assertGreaterEqual(phase("detect", "sum"), 3 * migrations)
            return c
        except BaseException:
            c.procs["decode-1"].send_signal(signal.SIGCONT)
            c.stop()
            raise

    def test_a_killed_decode_worker_loses_no_stream(self):
        c = self.check(lambda p: (p.kill(), p.wait()), "failed")
        codes = c.stop()
        for name in ("router", "prefill-0", "prefill-1", "decode-0"):
            self.assertEqual(codes[name], 0, c.log(name))


    def test_a_stalled_decode_worker_loses_no_stream(self):
        c = self.check(lambda p: p.send_signal(signal.SIGSTOP), "stalled")
        try:
            # Woken, the stalled worker finds its generations cancelled and frees their pages.
            c.procs["decode-1"].send_signal(signal.SIGCONT)
            deadline = time.time() + 30
            while (c.metric(c.decode_metrics_ports[1], "sluice_kv_pages_used") != 0 or
                   c.metric(c.decode_metrics_ports[1], "sluice_requests_running") != 0):
                self.assertLess(time.time(), deadline, c.log("decode-1"))
                time.sleep(0.1)
        finally:
            codes = c.stop()
        for name in ("router", "prefill-0", "prefill-1", "decode-0", "decode-1"):
            self.assertEqual(codes[name], 0, c.log(name))


class StoppedPrefill(unittest.TestCase):
    """A prefill worker stopped (-STOP) with prompts in flight: once the router's health checks
    find it gone, its calls are given up and the prompts prefilled elsewhere."""

    def test_a_stopped_prefill_worker_holds_no_request(self):
        if not MODEL:
            self.skipTest("SLUICE_MODEL is not set (./sluice test sets it)")
        c = Cluster(workers=2, placement="round_robin")
        try:
            body = {"model": c.model, "messages": [{"role": "user", "content": LONG_PROMPT}],
                    "max_tokens": 8, "temperature": 0}
            status, first = post(c.url + "/v1/chat/completions", body)
            self.assertEqual(status, 200, first)
            c.procs["prefill-1"].send_signal(signal.SIGSTOP)
            t0 = time.time()
            # Together, so that round-robin hands some to the stopped worker at once.
            answers_together(self, c, body, first, 4)
            seconds = time.time() - t0
            # Three failed polls of 2 s each, then the retry: far from the call's 5 minutes.
            self.assertLess(seconds, 60, c.log("router"))
            self.assertGreaterEqual(c.metric(c.router_metrics,
                                             'sluice_request_retries_total{role="prefill"}'), 1,
                                    c.log("router"))
            self.assertIn("stopped answering its health checks", c.log("router"))
        finally:
            c.procs["prefill-1"].send_signal(signal.SIGCONT)
            codes = c.stop()
        for name in ("router", "prefill-0", "decode-0", "decode-1"):
            self.assertEqual(codes[name], 0, c.log(name))


class Scaling(unittest.TestCase):
    """Decode workers join and leave the router's list under a steady load of streams."""

    def test_decode_workers_join_and_leave_under_load(self):
        if not MODEL:
            self.skipTest("SLUICE_MODEL is not set (./sluice test sets it)")
        c = Cluster(workers=3, decode_list=True)
        failures, done = [], []
        stop = False

        def client(i):
            body = {"model": c.model, "prompt": "Count slowly: one, two, three,",
                    "max_tokens": 6, "temperature": 0, "stream": True}
            while not stop:
                status, text = post(c.url + "/v1/completions", body)
                if status != 200 or "[DONE]" not in text or '"error"' in text:
                    failures.append((status, text[-300:]))
                done.append(i)

        def decoders():
            _, body = get(c.url + "/v1/workers")
            return sorted(w["address"] for w in json.loads(body)["workers"]
                          if w["role"] == "decode" and w["state"] == "serving")

        def tokens(port):
            _, text = get("http://127.0.0.1:%d/metrics" % port)
            m = re.search(r"^sluice_decode_tokens_total (\S+)", text, re.M)
            return float(m.group(1)) if m else 0

        def wait(what, deadline_s=30):
            deadline = time.time() + deadline_s
            while not what() and time.time() < deadline:
                time.sleep(0.2)
            return what()

        pool = concurrent.futures.ThreadPoolExecutor(4)
        clients = []
        try:
            self.assertEqual(decoders(), c.decode_addrs[:1])
            clients = [pool.submit(client, i) for i in range(4)]
            self.assertTrue(wait(lambda: len(done) >= 4), failures)
            listed = time.time()
            c.set_decoders(c.decode_addrs)  # scale 1 -> 3 (the new workers are ready already)
            self.assertTrue(wait(lambda: decoders() == sorted(c.decode_addrs)), decoders())
            # Both new workers generate within 10 s of being listed (issue's bound: a new worker
            # used within 10 s of becoming ready).
            self.assertTrue(wait(lambda: all(tokens(p) > 0 for p in c.decode_metrics_ports),
                                 deadline_s=max(0.0, listed + 10 - time.time())),
                            [tokens(p) for p in c.decode_metrics_ports])
            print("scaling: both new decode workers generating %.1f s after being listed" %
                  (time.time() - listed))
            c.set_decoders(c.decode_addrs[2:])  # 3 -> 1, the first one leaving too
            self.assertTrue(wait(lambda: decoders() == c.decode_addrs[2:]), decoders())
            before = len(done)
            self.assertTrue(wait(lambda: len(done) >= before + 8), failures)
            # The removed workers finish what they had and get nothing new.
            left = [tokens(p) for p in c.decode_metrics_ports[:2]]
            time.sleep(1)
            self.assertEqual([tokens(p) for p in c.decode_metrics_ports[:2]], left)
        finally:
            stop = True
            for f in clients:
                f.result(timeout=120)
            pool.shutdown()
            codes = c.stop()
        self.assertEqual(failures, [], c.log("router"))
        self.assertGreater(len(done), 12)
        for name, code in codes.items():
            self.assertEqual(code, 0, c.log(name))


if __name__ == "__main__":
    test_report.main(__name__, "e2e")
