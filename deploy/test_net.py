"""Helpers the tests that start real clusters share: free loopback ports, the metrics ports
`sluice up` numbers from a base, and JSON over HTTP."""

import json
import socket
import urllib.error
import urllib.request


_handed_out = set()  # ports free_port gave this process: the kernel may offer one again


def free_port():
    """A loopback port nothing listens on, never one this process was given before (several
    taken in a row for one cluster must differ)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port that was not handed out already")


def port_is_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def metrics_base():
    """A base port B with B+1 (prefill 0's metrics) and B+101 (decode 0's) free, as `sluice up`
    numbers them."""
    for _ in range(100):
        base = free_port()
        if base + 101 < 65536 and port_is_free(base + 1) and port_is_free(base + 101):
            return base
    raise RuntimeError("no free metrics ports")


def http(url, body=None, timeout=120):
    """(status, text) of a GET, or of a POST of `body` (JSON, or bytes as they are)."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
