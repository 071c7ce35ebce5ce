"""raw_http_opts.py - the raw_http.py cases that need a server of their own: --ctx, --api-key
and --served-model-name, --max-body-mb, --max-num-seqs/--max-queue (429), --timeout with 1,000
idle connections, SIGTERM (--shutdown-timeout), the loading phase and a TP-2 model (python3
stdlib only)."""
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rawlib import *  # noqa: E402,F401,F403
from srv import SLOW, Server, sse_events, stop_checked  # noqa: E402

def t_ctx64():
    s = Server("ctx64", ["--ctx", "64", "--chat-template", "llama2"])
    try:
        st, js, _, _ = s.get("/v1/models")
        T.eq((js or {}).get("data", [{}])[0].get("max_model_len"), 64, "--ctx 64: /v1/models max_model_len 64")
        n_p = len(G1["ids"])
        st, js, _, _ = s.post("/v1/completions", cmpl(max_tokens=64 - n_p + 1))
        err_check("--ctx 64: prompt 6 + max_tokens 59 -> 400 context_length_exceeded", st, js, 400,
                  code="context_length_exceeded")
        st, js, raw, _ = s.post("/v1/completions", cmpl(max_tokens=64 - n_p, ignore_eos=True))
        if ok_json("--ctx 64: prompt 6 + max_tokens 58 -> 200", st, js, raw):
            T.eq(js["usage"]["completion_tokens"], 64 - n_p, "--ctx 64: 58 tokens, the full context")
            T.eq(js["choices"][0]["finish_reason"], "length", "--ctx 64: finish length")
        st, js, _, _ = s.post("/v1/completions", cmpl(prompt=[1] + [261] * 69, max_tokens=1))
        err_check("--ctx 64: 70-token prompt -> 400 context_length_exceeded", st, js, 400,
                  code="context_length_exceeded")
        st, js, _, _ = s.post("/v1/chat/completions", chat_body("and " * 80))
        err_check("--ctx 64: long chat -> 400 context_length_exceeded", st, js, 400,
                  code="context_length_exceeded")
        b = chat_body(ignore_eos=True)
        del b["max_tokens"]
        st, js, raw, _ = s.post("/v1/chat/completions", b)
        if ok_json("--ctx 64: chat without max_tokens -> 200", st, js, raw):
            u = js["usage"]
            T.eq(u["completion_tokens"], 64 - u["prompt_tokens"], "chat default max_tokens: what the context leaves")
            T.eq(js["choices"][0]["finish_reason"], "length", "chat default max_tokens: finish length")
    finally:
        stop_checked(T, s, sig=signal.SIGINT)


def t_api_key():
    s = Server("apikey", ["--api-key", "sekret-123", "--served-model-name", "kjv-demo",
                          "--chat-template", "llama2"])
    good = {"Authorization": "Bearer sekret-123"}
    try:
        for h, what in [({}, "no Authorization"), ({"Authorization": "Bearer wrong"}, "wrong key"),
                        ({"Authorization": "sekret-123"}, "key without Bearer"),
                        ({"Authorization": "Bearer sekret-1234"}, "key with a suffix"),
                        ({"Authorization": "Bearer "}, "empty key")]:
            for m, p, b in [("GET", "/v1/models", None), ("POST", "/v1/completions", cmpl()),
                            ("POST", "/v1/chat/completions", chat_body(max_tokens=2)),
                            ("POST", "/tokenize", {"prompt": "x"}), ("POST", "/detokenize", {"tokens": [300]})]:
                st, _, data = s.request(m, p, body=b, headers=h)
                err_check("--api-key: %s %s, %s -> 401 invalid_api_key" % (m, p, what), st, jparse(data),
                          401, code="invalid_api_key")
        for p in ("/health", "/metrics"):
            st, _, _ = s.request("GET", p)
            T.eq(st, 200, "--api-key: GET %s open without a key" % p)
        st, js, raw, _ = s.get("/v1/models", headers=good)
        if ok_json("--api-key: GET /v1/models with the key -> 200", st, js, raw):
            T.eq(js["data"][0]["id"], "kjv-demo", "--served-model-name: /v1/models id")
        st, js, raw, _ = s.post("/v1/completions", cmpl(model="kjv-demo"), headers=good)
        if ok_json("--api-key: completion with the key -> 200", st, js, raw):
            T.eq(js.get("model"), "kjv-demo", "--served-model-name: response model")
        st, js, raw, _ = s.post("/v1/chat/completions", chat_body(max_tokens=2), headers=good)
        ok_json("--api-key: chat with the key -> 200", st, js, raw)
        st, js, raw, _ = s.post("/tokenize", {"prompt": "x"}, headers=good)
        ok_json("--api-key: /tokenize with the key -> 200", st, js, raw)
        st, js, _, _ = s.post("/v1/completions", cmpl(model=srv.MODEL), headers=good)
        err_check("--served-model-name: the directory as model -> 404", st, js, 404, code="model_not_found")
    finally:
        stop_checked(T, s)


def t_body_limit():
    s = Server("body", ["--max-body-mb", "1"])
    try:
        big = json.dumps({"prompt": "and " * (2 * 1024 * 1024 // 4), "max_tokens": 1}).encode()
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(big))
        out, _ = send_and_read(s, head, lambda sk: sk.sendall(big), 30 * SLOW)
        st, js = parse_reply(out)
        err_check("--max-body-mb 1: 2 MiB body -> 413 request_too_large", st, js, 413,
                  etype=None, code="request_too_large")
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 2147483648\r\n\r\n")
        out, dt = send_and_read(s, head, lambda sk: sk.sendall(b'{"prompt": "' + b"a" * 100), 15 * SLOW)
        st, js = parse_reply(out)
        err_check("--max-body-mb 1: Content-Length 2 GiB, 100 bytes sent -> 413", st, js, 413,
                  etype=None, code="request_too_large")
        T.check(st == 413 and dt < 5 * SLOW, "the 2 GiB announcement answered without waiting for the "
                "body (< %gs)" % (5 * SLOW), "%.2fs" % dt)
        pad = json.dumps(cmpl(max_tokens=2)).encode()
        pad = pad[:-1] + b" " * (900 * 1024) + b"}"
        st, hd, data = s.request("POST", "/v1/completions", raw_body=pad)
        T.check(st == 200, "--max-body-mb 1: a 900 KiB body (whitespace) -> 200", (st, data[:200]))
        still_serving("after the 413s", s)
    finally:
        stop_checked(T, s)


def t_queue_full():
    s = Server("queue", ["--max-num-seqs", "1", "--max-queue", "1"])
    res = []
    lock = threading.Lock()

    def one(i):
        try:
            st, js, raw, _ = s.post("/v1/completions", cmpl(prompt=G1["text"], max_tokens=100,
                                                            ignore_eos=True), timeout=120 * SLOW)
        except OSError as e:
            st, js = None, {"exc": str(e)}
        with lock:
            res.append((st, js))
    try:
        ths = [threading.Thread(target=one, args=(i,)) for i in range(5)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(150 * SLOW)
        T.check(not any(th.is_alive() for th in ths), "queue: all 5 requests answered")
        sts = sorted(r[0] for r in res if r[0] is not None)
        T.check(sts.count(429) >= 1 and sts.count(200) >= 1 and set(sts) <= {200, 429} and len(sts) == 5,
                "--max-num-seqs 1 --max-queue 1, 5 at once: some 200, at least one 429, nothing else", sts)
        for st, js in res:
            if st == 429:
                err_check("queue full -> 429 rate_limit_error rate_limit_exceeded", st, js, 429,
                          etype="rate_limit_error", code="rate_limit_exceeded")
                break
        T.check(all(js["usage"]["completion_tokens"] == 100 and js["choices"][0]["finish_reason"] == "length"
                    for st, js in res if st == 200), "queue: the accepted requests complete (100 tokens)")
        still_serving("after the 429s", s)
    finally:
        stop_checked(T, s)


def t_idle_connections():
    s = Server("idle", ["--timeout", "3"])
    socks = []
    try:
        t0 = time.monotonic()
        fails = 0
        for _ in range(1000):
            try:
                socks.append(socket.create_connection((s.host, s.port), timeout=20))
            except OSError:
                fails += 1
        T.check(fails == 0, "1000 idle TCP connections open at once", "%d failed" % fails)
        t_open = time.monotonic()
        st, js, raw, _ = s.post("/v1/completions", cmpl(max_tokens=4), timeout=60 * SLOW)
        T.check(st == 200 and js and js["usage"]["completion_tokens"] >= 1,
                "a completion while 1000 connections idle -> 200", (st, raw[:200]))
        # four kinds of idle connection, each closed --timeout (3 s) after its last byte
        probes = {}
        for kind, data in [("silent", b""),
                           ("partial headers", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"),
                           ("partial body", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Length: 1000\r\n\r\n{\"prompt\":"),
                           ("keep-alive after a response", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")]:
            sk = socket.create_connection((s.host, s.port), timeout=20)
            if data:
                sk.sendall(data)
            if kind.startswith("keep-alive"):
                rep = b""
                while b"\r\n\r\n" not in rep or not rep.endswith(b"}"):
                    b = sk.recv(4096)
                    if not b:
                        break
                    rep += b
                T.check(rep.startswith(b"HTTP/1.1 200") and b"connection: close" not in rep.lower(),
                        "keep-alive: GET /health answered, connection kept", rep[:200])
            probes[kind] = (sk, time.monotonic())
        bound = 3 + 3 * SLOW
        for kind, (sk, t1) in probes.items():
            sk.settimeout(max(0.1, t1 + bound - time.monotonic()))
            try:
                got = sk.recv(4096)
                while got and not got.startswith(b"HTTP/"):
                    got = sk.recv(4096)
                if got.startswith(b"HTTP/"):  # a 408 or similar first is fine: then the close
                    while sk.recv(4096):
                        pass
                    got = b""
            except socket.timeout:
                got = None
            except ConnectionResetError:
                got = b""
            dt = time.monotonic() - t1
            T.check(got == b"" and dt >= 2.0, "idle connection (%s) closed after --timeout 3 "
                    "(between 2 and %gs)" % (kind, bound), "got %r after %.1fs" % (got, dt))
            sk.close()
        # the 1000: all closed by the server too
        deadline = t_open + 3 + 10 * SLOW
        by_fd = {sk.fileno(): sk for sk in socks}
        open_ = set(by_fd)
        poll = select.poll()
        for fd in open_:
            poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while open_ and time.monotonic() < deadline:
            for fd, _ in poll.poll(500):
                try:
                    d = by_fd[fd].recv(100)
                except OSError:
                    d = b""
                if d == b"" and fd in open_:
                    open_.discard(fd)
                    poll.unregister(fd)
        T.check(not open_, "all 1000 idle connections closed by the server within %gs" % (3 + 10 * SLOW),
                "%d still open after %.1fs" % (len(open_), time.monotonic() - t_open))
        still_serving("after 1000 idle connections", s)
    finally:
        for sk in socks:
            sk.close()
        stop_checked(T, s)


def t_sigterm_cancel():
    """SIGTERM while a long (500-token) stream runs, --shutdown-timeout 2: new requests are
    refused, the stream is cancelled after ~2 s, exit 0 within shutdown-timeout + a few s."""
    s = Server("sigterm", ["--shutdown-timeout", "2"])
    sk = None
    try:
        sk = sse_socket(s, cmpl(max_tokens=500, ignore_eos=True, stream=True))
        buf, n, eof = read_events(sk, 2)
        T.check(n >= 2, "shutdown: a long stream runs", buf[:200])
        t0 = time.monotonic()
        s.proc.send_signal(15)
        time.sleep(0.5)
        t_h = time.monotonic()
        try:
            st, _, data = s.request("GET", "/health", timeout=5)
            T.check(st == 503, "shutting down: /health 503 (or refused)", (st, data))
        except ConnectionRefusedError:
            T.check(time.monotonic() - t_h < 2, "shutting down: a new connection is refused at "
                    "once (not left waiting)", time.monotonic() - t_h)
        except OSError as e:
            T.check(False, "shutting down: a new connection is answered 503 or refused", repr(e))
        buf = read_to_eof(sk, buf, 2 + 15 * SLOW)
        t_end = time.monotonic() - t0
        n_tok = offline_count(streamed_text(http_body(buf)))
        # cancelled at the 2 s (a machine fast enough to generate all 500 tokens in that time
        # would finish them: also fine); a server that waits for the request runs far past it
        T.check(t_end < 2 + 3 * SLOW, "shutdown: the running 500-token stream ends within "
                "--shutdown-timeout 2 + %gs" % (3 * SLOW), "%.1fs, %r tokens received" % (t_end, n_tok))
        print("# shutdown: the stream ended %.1fs after SIGTERM with %r tokens" % (t_end, n_tok))
        try:
            rc = s.proc.wait(max(0.1, 2 + 5 * SLOW - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            rc = None
        T.check(rc == 0, "SIGTERM during a long stream: exit 0 within shutdown-timeout 2 + %gs" % (5 * SLOW),
                "rc %r after %.1fs; log:\n%s" % (rc, time.monotonic() - t0, s.log_tail()))
    finally:
        if sk:
            sk.close()
        s.stop(5)
    s = Server("sigterm-drain", ["--shutdown-timeout", "60"])
    sk = None
    try:
        ref = s.post("/v1/completions", cmpl(max_tokens=30, ignore_eos=True))[1]["choices"][0]["text"]
        sk = sse_socket(s, cmpl(max_tokens=30, ignore_eos=True, stream=True))
        buf, n, eof = read_events(sk, 2)
        t0 = time.monotonic()
        s.proc.send_signal(15)
        buf = read_to_eof(sk, buf, 30 * SLOW)
        body = http_body(buf)
        ev = sse_events(body.decode("utf-8", "replace")) or ["x"]
        last = json.loads(ev[-2]) if len(ev) >= 2 and ev[-2].startswith("{") else {}
        T.check(ev[-1] == "[DONE]" and streamed_text(body) == ref and
                (last.get("choices") or [{}])[0].get("finish_reason") == "length",
                "SIGTERM with --shutdown-timeout 60: the running 30-token stream finishes in full",
                body[-300:])
        try:
            rc = s.proc.wait(30 * SLOW)
        except subprocess.TimeoutExpired:
            rc = None
        T.check(rc == 0 and time.monotonic() - t0 < 30 * SLOW,
                "drained: exit 0 as soon as the request finished (not after the 60 s)",
                "rc %r after %.1fs" % (rc, time.monotonic() - t0))
    finally:
        if sk:
            sk.close()
        s.stop(5)


def t_loading():
    s = Server("loading", [], env={"QSHARD_DEBUG_LOAD_DELAY_MS": "2000"}, wait_ready=False)
    try:
        t0 = time.monotonic()
        st, js, raw, _ = s.get("/health")
        T.check(st == 503 and js == {"status": "loading"}, "loading: /health 503 {\"status\":\"loading\"}",
                (st, raw[:200]))
        st, js, _, _ = s.post("/v1/completions", cmpl())
        err_check("loading: POST /v1/completions -> 503 service_unavailable", st, js, 503,
                  etype="service_unavailable")
        st = None
        while time.monotonic() - t0 < 60 * SLOW:
            st, js, raw, _ = s.get("/health")
            if st == 200:
                break
            time.sleep(0.1)
        T.check(st == 200 and js == {"status": "ok"}, "loading: /health turns 200 {\"status\":\"ok\"}",
                (st, raw[:200]))
        T.check(time.monotonic() - t0 >= 1.5, "loading: 503 for about the 2000 ms delay",
                time.monotonic() - t0)
        log = s.log_text()
        T.check(log.find("qshard serve: listening on") < log.find("qshard serve: ready") and
                "qshard serve: ready" in log, "stderr: 'listening' before 'ready'", log[-500:])
        st, js, raw, _ = s.post("/v1/completions", cmpl())
        ok_json("loaded: completion -> 200", st, js, raw)
    finally:
        stop_checked(T, s)


def t_tp2():
    """The demo model converted at --tp 2 (two ranks in one process on the CPU backend):
    greedy completions, chat and a stream equal those of the TP-1 server."""
    from srv import MODEL, QSHARD, TMP
    tp2 = os.path.join(TMP, "kjv-tp2")
    r = subprocess.run([QSHARD, "convert", os.path.join("tests", "data", "models", "kjv-llama-awq-gemm"),
                        tp2, "--tp", "2", "-q"], capture_output=True, text=True, timeout=120 * SLOW)
    T.check(r.returncode == 0, "convert the demo model --tp 2", r.stderr[-300:])
    if r.returncode:
        return
    one = Server("tp1", ["--chat-template", "llama2"])
    two = Server("tp2", ["--chat-template", "llama2"], model=tp2)
    try:
        bodies = [("/v1/completions", cmpl(prompt=["And God said", "In the beginning"], max_tokens=24,
                                           ignore_eos=True)),
                  ("/v1/chat/completions", chat_body(max_tokens=16)),
                  ("/v1/completions", cmpl(prompt="Blessed are", max_tokens=12, stream=True))]
        for path, b in bodies:
            outs = []
            for srv_ in (one, two):
                if b.get("stream"):
                    st, _, raw, _ = srv_.post(path, b)
                    evs = [json.loads(e) for e in (sse_events(raw.decode()) or []) if e != "[DONE]"]
                    outs.append((st, "".join(c.get("text") or "" for e in evs
                                             for c in e.get("choices", []))))
                else:
                    st, js, raw, _ = srv_.post(path, b)
                    outs.append((st, [c.get("text", c.get("message", {}).get("content"))
                                      for c in (js or {}).get("choices", [])]))
            T.check(outs[0][0] == 200 and outs[0] == outs[1] and outs[0][1],
                    "TP 2 == TP 1: %s%s" % (path, " (stream)" if b.get("stream") else ""), outs)
        st, js, _, _ = two.get("/v1/models")
        T.eq(st, 200, "TP 2: /v1/models")
    finally:
        stop_checked(T, one)
        stop_checked(T, two)
    T.check(MODEL != tp2, "the TP-2 model is a conversion of its own")


def t_slow_stream_timeout():
    """--timeout counts idleness, not the wait for the engine: with one sequence slot, a stream
    queued behind a request that runs longer than --timeout, and a non-streamed one behind it
    too, both complete (libmicrohttpd's idle clock is restarted whenever data goes out)."""
    s = Server("slowtimeout", ["--timeout", "1", "--max-num-seqs", "1"])
    try:
        first = {}

        def long_one():
            first["r"] = s.post("/v1/completions", cmpl(max_tokens=400, ignore_eos=True),
                                timeout=120 * SLOW)

        th = threading.Thread(target=long_one)
        th.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        st, _, raw, _ = s.post("/v1/completions", cmpl(max_tokens=24, ignore_eos=True, stream=True),
                               timeout=120 * SLOW)
        waited = time.monotonic() - t0
        evs = sse_events(raw.decode(errors="replace")) or []
        T.check(st == 200 and evs[-1:] == ["[DONE]"],
                "a stream queued %.1fs behind a longer request, --timeout 1: complete" % waited,
                (st, raw[-200:]))
        T.check(waited > 1.0, "the stream really waited longer than --timeout", waited)
        th.join()
        st, js, raw, _ = first["r"]
        T.check(st == 200 and js and js["usage"]["completion_tokens"] == 400,
                "the long non-streamed request under --timeout 1: complete", (st, raw[:200]))
    finally:
        stop_checked(T, s)


def t_body_edges():
    """Bodies that cJSON alone would misread, requests that can never fit the queue, and usage
    counts with n > 1."""
    s = Server("edges", ["--max-queue", "8"])
    try:
        for name, body in [("a raw NUL byte inside a string",
                            b'{"prompt": "In the\x00 beginning", "max_tokens": 2, "echo": true}'),
                           ("the \\u0000 escape", b'{"prompt": "In the\\u0000 beginning", "max_tokens": 2}'),
                           ("two JSON texts", b'{"prompt": "In the", "max_tokens": 2} {"prompt": "x"}')]:
            st, hd, data = s.request("POST", "/v1/completions", raw_body=body)
            try:
                js = json.loads(data)
            except ValueError:
                js = None
            err_check("%s -> 400" % name, st, js, 400)
        st, js, _, _ = s.post("/v1/completions", cmpl(prompt=["In the beginning"] * 3, n=3))
        err_check("3 prompts x n=3 = 9 sequences > --max-queue 8 -> 400 (not 429: never fits)",
                  st, js, 400, param="n")
        st, js, raw, _ = s.post("/v1/completions", cmpl(prompt="And God said " * 6, n=4, max_tokens=3))
        if ok_json("n=4 on a 6-block prompt -> 200", st, js, raw):
            u = js["usage"]
            cached = u.get("prompt_tokens_details", {}).get("cached_tokens", -1)
            T.check(0 <= cached <= u["prompt_tokens"], "cached_tokens <= prompt_tokens with n=4",
                    u)
        st, js, raw, _ = s.post("/v1/completions", cmpl(max_tokens=6, logprobs=1))
        if ok_json("logprobs=1 -> 200", st, js, raw):
            lp = js["choices"][0]["logprobs"]
            want, off = [], 0
            for t in lp["tokens"]:
                want.append(off)
                off += len(t)  # characters, as Python (and vLLM) count them
            T.eq(lp["text_offset"], want, "text_offset: cumulative characters of the tokens")
    finally:
        stop_checked(T, s)
