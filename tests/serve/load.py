#!/usr/bin/env python3
"""load.py - qshard serve under load (python3 stdlib only): 64 concurrent streaming clients on
loopback for QSHARD_SERVE_LOAD_SECONDS (default 60), each looping over greedy requests (a few
prompts, max_tokens 16..48). Every response must be complete (SSE framing, [DONE] last, one
finish_reason per choice, the usage chunk) and its text identical to the same request run
alone; those references come first from the same server one request at a time, and must equal
the offline batch runner (`qshard run --prompts`), which the server did not produce. The
server's memory must stay flat (VmRSS after a 10 s warm-up vs at the end: at most +25 % + 16 MiB),
except under AddressSanitizer, where RSS means little and the check is the clean exit at
SIGTERM (LeakSanitizer makes a leaking process exit non-zero). Run by test_serve.sh.
"""
import http.client
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import srv  # noqa: E402
from srv import SLOW, Server, sse_events, stop_checked  # noqa: E402

T = srv.Counter("load")
CLIENTS = 64
SECONDS = float(os.environ.get("QSHARD_SERVE_LOAD_SECONDS", "60"))
WARMUP = min(10.0, SECONDS / 3)
GOLD = srv.kjv_golden()
PROMPTS = [g["text"] for g in GOLD["prompts"]] + [
    "And the LORD said unto Moses,",
    "Blessed are the poor in spirit: for",
]
KINDS = [(PROMPTS[i % len(PROMPTS)], mt) for i, mt in
         enumerate([16, 24, 32, 48, 40, 20, 36, 28, 44, 16])]


def body(kind):
    p, mt = KINDS[kind]
    return {"model": srv.MODEL, "prompt": p, "max_tokens": mt, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


def asan_build():
    if os.environ.get("QSHARD_SAN") == "1":
        return True
    for cmd in (["nm", "-D", srv.QSHARD], ["ldd", srv.QSHARD]):
        try:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 timeout=60).stdout.decode("utf-8", "replace")
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "libasan" in out or "__asan_init" in out:
            return True
    return False


def vmrss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    raise RuntimeError("no VmRSS for pid %d" % pid)


def check_stream(status, raw):
    """(problem or '', text, completion_tokens, number of text chunks)."""
    if status != 200:
        return "status %r: %r" % (status, raw[:200]), None, None, 0
    ev = sse_events(raw)
    if ev is None:
        return "bad SSE framing: %r" % raw[-200:], None, None, 0
    if not ev or ev[-1] != "[DONE]":
        return "no [DONE] at the end: %r" % raw[-200:], None, None, 0
    try:
        chunks = [json.loads(e) for e in ev[:-1]]
    except ValueError:
        return "a chunk is not JSON: %r" % raw[:200], None, None, 0
    if not chunks or chunks[-1].get("choices") != [] or not isinstance(chunks[-1].get("usage"), dict):
        return "no usage chunk (choices [] + usage) before [DONE]: %r" % (chunks[-1:],), None, None, 0
    text, n_text, fins = "", 0, []
    for c in chunks[:-1]:
        if c.get("object") != "text_completion" or len(c.get("choices") or []) != 1:
            return "bad chunk %r" % (c,), None, None, 0
        ch = c["choices"][0]
        if ch.get("index") != 0 or "finish_reason" not in ch:
            return "bad choice %r" % (ch,), None, None, 0
        if fins:
            return "a chunk after the finish_reason: %r" % (c,), None, None, 0
        t = ch.get("text")
        if not isinstance(t, str):
            return "text not a string: %r" % (ch,), None, None, 0
        text += t
        n_text += t != ""
        if ch["finish_reason"] is not None:
            fins.append(ch["finish_reason"])
    if fins not in (["length"], ["stop"]):
        return "finish_reason %r, want one 'length' or 'stop' on the last chunk" % fins, None, None, 0
    u = chunks[-1]["usage"]
    ct = u.get("completion_tokens")
    if not isinstance(ct, int) or u.get("total_tokens") != u.get("prompt_tokens", -1) + ct:
        return "usage inconsistent: %r" % (u,), None, None, 0
    if n_text != ct:  # streamed token by token: one chunk with text per generated token
        return "%d text chunks for %d completion tokens" % (n_text, ct), None, None, 0
    return "", text, ct, n_text


def stream_once(conn, kind):
    conn.request("POST", "/v1/completions", body=json.dumps(body(kind)).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    raw = r.read().decode("utf-8", "replace")
    return r.status, raw


def main():
    san = asan_build()
    print("# load: %d clients, %gs, %d request kinds, ASan build: %s" % (CLIENTS, SECONDS, len(KINDS), san))
    try:
        off = srv.offline_run([{"prompt": p, "max_tokens": mt, "temperature": 0} for p, mt in KINDS])
    except Exception as e:  # noqa: BLE001
        T.check(False, "offline runner references", str(e))
        return T.summary()
    s = Server("load", ["--max-num-seqs", str(CLIENTS)])
    try:
        refs = []
        for k in range(len(KINDS)):
            c = http.client.HTTPConnection(s.host, s.port, timeout=60 * SLOW)
            st, raw = stream_once(c, k)
            c.close()
            why, text, ct, _ = check_stream(st, raw)
            T.check(not why, "alone: request %d (%d tokens) complete" % (k, KINDS[k][1]), why)
            T.eq(text, off[k]["text"], "alone: request %d text = offline runner" % k)
            T.eq(ct, off[k]["usage"]["completion_tokens"], "alone: request %d completion_tokens = offline runner" % k)
            refs.append((text, ct))
        stats = {"done": 0, "bad": 0, "mismatch": 0, "errors": 0}
        examples = []
        per_client = [0] * CLIENTS
        lock = threading.Lock()
        t_start = time.monotonic()
        deadline = t_start + SECONDS

        def client(i):
            conn = None
            it = 0
            while time.monotonic() < deadline:
                k = (i * 3 + it) % len(KINDS)
                it += 1
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection(s.host, s.port, timeout=60 * SLOW)
                    st, raw = stream_once(conn, k)
                except (OSError, http.client.HTTPException) as e:
                    with lock:
                        stats["errors"] += 1
                        if len(examples) < 5:
                            examples.append("client %d: %s: %s" % (i, type(e).__name__, e))
                    if conn:
                        conn.close()
                    conn = None
                    time.sleep(0.2)
                    continue
                why, text, ct, _ = check_stream(st, raw)
                with lock:
                    stats["done"] += 1
                    per_client[i] += 1
                    if why:
                        stats["bad"] += 1
                        if len(examples) < 5:
                            examples.append("client %d kind %d: %s" % (i, k, why))
                    elif (text, ct) != refs[k]:
                        stats["mismatch"] += 1
                        if len(examples) < 5:
                            examples.append("client %d kind %d: text %r, alone %r" % (i, k, text, refs[k][0]))
            if conn:
                conn.close()

        ths = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for th in ths:
            th.start()
        time.sleep(WARMUP)
        rss0 = vmrss_kib(s.proc.pid)
        for th in ths:
            th.join(max(1.0, deadline + 90 * SLOW - time.monotonic()))
        hung = sum(th.is_alive() for th in ths)
        rss1 = vmrss_kib(s.proc.pid)
        dt = time.monotonic() - t_start
        print("# load: %d responses in %.1fs (%.1f/s), per client %d..%d; VmRSS %d -> %d KiB"
              % (stats["done"], dt, stats["done"] / dt, min(per_client), max(per_client), rss0, rss1))
        for e in examples:
            print("#   " + e[:500])
        T.check(hung == 0, "load: every client finished its last request", "%d clients hung" % hung)
        T.check(min(per_client) >= 1, "load: every one of the %d clients got responses" % CLIENTS, per_client)
        T.eq(stats["errors"], 0, "load: no connection errors")
        T.eq(stats["bad"], 0, "load: every response complete (framing, [DONE], finish_reason, usage)")
        T.eq(stats["mismatch"], 0, "load: every greedy text = the same request alone")
        if san:
            print("# load: ASan build: no RSS bound (the clean exit at SIGTERM is the leak check)")
        else:
            limit = rss0 * 1.25 + 16 * 1024
            T.check(rss1 <= limit, "load: VmRSS flat (%d KiB after warm-up, %d at the end, limit %d)"
                    % (rss0, rss1, limit), "grew %d KiB" % (rss1 - rss0))
        m = s.metrics()
        T.eq(srv.metric(m, "qshard:num_requests_running"), 0, "after the load: num_requests_running 0")
        T.eq(srv.metric(m, "qshard:num_requests_waiting"), 0, "after the load: num_requests_waiting 0")
        # the same answers after the load as before it
        c = http.client.HTTPConnection(s.host, s.port, timeout=60 * SLOW)
        st, raw = stream_once(c, 0)
        c.close()
        T.eq(check_stream(st, raw)[1], refs[0][0], "after the load: request 0 unchanged")
    finally:
        stop_checked(T, s, 30 * SLOW, name="load server: SIGTERM -> exit 0 (LeakSanitizer: no leaks)")
    return T.summary()


if __name__ == "__main__":
    try:
        rc = main()
    except Exception as e:  # noqa: BLE001
        T.check(False, "load.py", "%s: %s" % (type(e).__name__, e))
        rc = T.summary()
    sys.exit(rc)
