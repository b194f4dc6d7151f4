"""`sluice up` supervises its cluster: a worker killed with SIGKILL is started again with the
same flags, rejoins, and the cluster serves again; the router kept answering meanwhile; SIGTERM
still stops every process cleanly.

Needs SLUICE_MODEL (the GGUF); skips without it.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.getcwd())
from deploy import test_report  # noqa: E402
from deploy.test_net import free_port, http, metrics_base  # noqa: E402

MODEL = os.environ.get("SLUICE_MODEL", "")
ROOT = os.getcwd()


def pids_of(binary, port):
    """Processes running `binary` with --port=`port` (from /proc)."""
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(binary.encode()) and ("--port=%d" % port).encode() in argv:
            out.append(int(pid))
    return out


class Supervision(unittest.TestCase):
    def test_a_killed_worker_is_started_again_and_serves(self):
        if not MODEL:
            self.skipTest("SLUICE_MODEL is not set (./sluice test sets it)")
        logs = tempfile.mkdtemp(prefix="sluice-up-")
        http_port, decode_port = free_port(), free_port()
        base = metrics_base()
        log_path = os.path.join(logs, "up.log")
        out = open(log_path, "w")
        up = subprocess.Popen(
            [os.path.join(ROOT, "tools", "up"), "--bin_dir=" + ROOT, "--model=" + MODEL,
             "--host=127.0.0.1", "--port=%d" % http_port, "--prefill_port=%d" % free_port(),
             "--decode_port=%d" % decode_port, "--metrics_port=%d" % base, "--kv_pages=2048",
             "--threads=1"], stdout=out, stderr=subprocess.STDOUT)
        url = "http://127.0.0.1:%d" % http_port

        def log():
            with open(log_path) as f:
                return f.read()[-4000:]

        def wait(what, seconds):
            deadline = time.time() + seconds
            while time.time() < deadline:
                self.assertIsNone(up.poll(), log())
                try:
                    if what():
                        return True
                except OSError:
                    pass
                time.sleep(0.2)
            return False

        def decode_serving():
            status, body = http(url + "/v1/workers", timeout=2)
            return status == 200 and any(w["role"] == "decode" and w["state"] == "serving"
                                         for w in json.loads(body)["workers"])

        def chat():
            status, body = http(url + "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 8, "temperature": 0})
            return status, body

        try:
            self.assertTrue(wait(lambda: "sluice is up" in log(), 120), log())
            self.assertEqual(chat()[0], 200)
            [decode] = pids_of("decode/decode", decode_port)
            os.kill(decode, signal.SIGKILL)
            self.assertTrue(wait(lambda: "decode-0 was killed by signal 9" in log(), 10), log())
            # The router answers meanwhile (503 without a decode worker, not a dead socket).
            self.assertIn(http(url + "/health", timeout=5)[0], (200, 503))
            self.assertTrue(wait(lambda: "decode-0 started again" in log(), 10), log())
            restarted = pids_of("decode/decode", decode_port)
            self.assertEqual(len(restarted), 1)
            self.assertNotEqual(restarted[0], decode)
            self.assertTrue(wait(decode_serving, 60), log())
            self.assertTrue(wait(lambda: chat()[0] == 200, 30), log())
        finally:
            if up.poll() is None:
                up.send_signal(signal.SIGTERM)
            code = up.wait(timeout=60)
        self.assertEqual(code, 0, log())
        self.assertEqual(pids_of("decode/decode", decode_port), [], "a worker outlived sluice up")


if __name__ == "__main__":
    test_report.main(__name__, "up")
