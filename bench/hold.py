"""The router under a crowd: --streams streaming clients at once, and --slow sockets that hold
a connection open (half send nothing, half trickle a request body a byte a second and connect
again whenever the router drops them), while a thread times GET /health on the API port every
50 ms. Used by chaos.py; one event loop drives every socket, so that the client is not what
limits the crowd.
"""
import asyncio
import http.client
import json
import random
import resource
import threading
import time

from serve_bench import make_prompt, percentile


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _stream(host, port, body, state):
    """One streamed completion; returns (outcome, detail)."""
    payload = json.dumps(body).encode()
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as e:
        return "failed", "connect: %s" % e
    state["open"] += 1
    state["peak"] = max(state["peak"], state["open"])
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: sluice\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" %
                     len(payload) + payload)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        if status != 200:
            return "failed", "HTTP %d" % status
        data = b""
        while True:
            size = await reader.readline()
            if not size or int(size.strip(), 16) == 0:
                break
            data += (await reader.readexactly(int(size.strip(), 16) + 2))[:-2]
        finish, usage, error = None, None, None
        for event in data.split(b"\n\n"):
            event = event.decode(errors="replace").strip()
            if not event.startswith("data: ") or event == "data: [DONE]":
                continue
            j = json.loads(event[len("data: "):])
            error = (j.get("error") or {}).get("message") or error
            usage = j.get("usage") or usage
            for c in j.get("choices", []):
                finish = c.get("finish_reason") or finish
        if error:
            return "failed", "error event: %s" % error
        if finish is None or not usage or usage["completion_tokens"] != body["max_tokens"]:
            return "failed", "finish %s usage %s" % (finish, usage)
        return "completed", None
    except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
        return "failed", "%s: %s" % (type(e).__name__, e)
    finally:
        state["open"] -= 1
        writer.close()


async def _slow(host, port, trickle, stop, state):
    """Keeps one slow connection open until `stop`, connecting again when dropped."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            state["slow_connect_failed"] += 1
            await asyncio.sleep(0.5)
            continue
        state["slow_open"] += 1
        state["slow_peak"] = max(state["slow_peak"], state["slow_open"])
        try:
            if trickle:
                writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: sluice\r\n"
                             b"Content-Length: 100000\r\n\r\n")
            while not stop.is_set():
                if trickle:
                    writer.write(b"x")
                    await writer.drain()
                try:
                    if not await asyncio.wait_for(reader.read(4096), timeout=1.0):
                        state["slow_dropped"] += 1  # the router closed it
                        break
                except asyncio.TimeoutError:
                    pass
        except OSError:
            state["slow_dropped"] += 1
        finally:
            state["slow_open"] -= 1
            writer.close()


async def _crowd(host, port, bodies, slow, state):
    stop = asyncio.Event()
    slow_tasks = [asyncio.create_task(_slow(host, port, i % 2 == 1, stop, state))
                  for i in range(slow)]
    for _ in range(100):  # the slow sockets first
        if state["slow_open"] >= slow:
            break
        await asyncio.sleep(0.1)
    state["t0"] = time.time()
    outcomes = await asyncio.gather(*[_stream(host, port, b, state) for b in bodies])
    state["seconds"] = time.time() - state["t0"]
    stop.set()
    await asyncio.gather(*slow_tasks)
    return outcomes


def hold(host, port, model, streams, slow, max_tokens=16, seed=1):
    """Runs the crowd; returns its figures."""
    raise_fd_limit()
    rng = random.Random(seed)
    bodies = [{"model": model, "prompt": make_prompt(rng, rng.randint(10, 40)),
               "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0,
               "stream_options": {"include_usage": True}} for _ in range(streams)]
    state = {"open": 0, "peak": 0, "slow_open": 0, "slow_peak": 0, "slow_dropped": 0,
             "slow_connect_failed": 0}
    health, done = [], threading.Event()

    def probe():
        while not done.wait(0.05):
            t0 = time.time()
            try:
                c = http.client.HTTPConnection(host, port, timeout=10)
                c.request("GET", "/health")
                c.getresponse().read()
                c.close()
            except OSError:
                pass
            health.append(time.time() - t0)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        outcomes = asyncio.run(_crowd(host, port, bodies, slow, state))
    finally:
        done.set()
        prober.join()
    failures = [d for o, d in outcomes if o == "failed"]
    return {
        "streams": streams,
        "slow_sockets": slow,
        "max_tokens": max_tokens,
        "completed": sum(1 for o, _ in outcomes if o == "completed"),
        "failed": len(failures),
        "failures": failures[:20],
        "streams_open_peak": state["peak"],
        "slow_sockets_open_peak": state["slow_peak"],
        "slow_sockets_dropped_by_router": state["slow_dropped"],
        "seconds": state.get("seconds"),
        "health_seconds": {"p50": percentile(health, 50), "p99": percentile(health, 99),
                           "max": max(health) if health else None, "probes": len(health)},
    }
