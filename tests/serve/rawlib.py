"""rawlib.py - what raw_http.py and raw_http_opts.py share: the check counter, request bodies,
the error-shape check, raw-socket helpers (python3 stdlib only)."""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import srv  # noqa: E402
from srv import SLOW, Server, is_error_shape, metric, sse_events, stop_checked  # noqa: E402

T = srv.Counter("raw_http")
GOLD = srv.kjv_golden()
G1, G2, G3 = GOLD["prompts"]                # HF reference prompts: text, ids, greedy ids/text
CTX = 512                                   # max_position_embeddings of the KJV model
VOCAB = GOLD["vocab_size"]
P1 = G1["text"]                             # "In the beginning God created"
LONG = 400                                  # tokens of a "long" request (~5 s on CPU)
SENTENCE = ("And God said, Let there be light: and there was light. And God saw the light, "
            "that it was good: and God divided the light from the darkness.")


def cmpl(**kw):
    b = {"prompt": P1, "max_tokens": 4, "temperature": 0}
    b.update(kw)
    return b


def err_check(name, st, js, status, etype="invalid_request_error", code=None, param=None,
              params=None):
    """One check: the status, the error shape, its type, and code/param where the contract
    names them (params: any of these is accepted, for a field of a nested object)."""
    why = []
    if st != status:
        why.append("status %r, want %d" % (st, status))
    bad = is_error_shape(js)
    if bad:
        why.append(bad)
    else:
        e = js["error"]
        if etype is not None and e["type"] != etype:
            why.append("type %r, want %r" % (e["type"], etype))
        if code is not None and e["code"] != code:
            why.append("code %r, want %r" % (e["code"], code))
        if param is not None and e["param"] != param:
            why.append("param %r, want %r" % (e["param"], param))
        if params is not None and e["param"] not in params:
            why.append("param %r, want one of %r" % (e["param"], params))
    return T.check(not why, name, "; ".join(why) + ("; body %r" % (js,) if why else ""))


def usage3(u):
    """The usage fields of the contract (prompt_tokens_details may vary with the prefix cache)."""
    return {k: (u or {}).get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def ok_json(name, st, js, raw=b""):
    return T.check(st == 200 and isinstance(js, dict), name,
                   "status %r body %r" % (st, raw[:300] if raw else js))


def jparse(data):
    try:
        return json.loads(data)
    except ValueError:
        return None


def chat_body(content="Who is the LORD?", **kw):
    b = {"messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0}
    b.update(kw)
    return b


def msum(m, name):
    vals = [v for n, _, v in m["samples"] if n == name]
    return sum(vals) if vals else None


def raw_send(server, data, read=True, timeout=None, close_after=True):
    """Send bytes on a fresh socket; the reply bytes (until EOF or timeout)."""
    s = socket.create_connection((server.host, server.port), timeout=timeout or 10 * SLOW)
    try:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not b:
                break
            out += b
        return out
    finally:
        if close_after:
            s.close()


def still_serving(name, server):
    try:
        st, js, raw, _ = server.post("/v1/completions", cmpl(max_tokens=2), timeout=30 * SLOW)
    except OSError as e:
        st, js, raw = None, None, str(e).encode()
    return T.check(st == 200 and server.alive(), "%s: the server still answers" % name,
                   "%r %r alive=%r" % (st, raw[:200], server.alive()))


def sse_socket(server, body, headers=None):
    """Open a streaming request on a raw socket; returns the socket and a reader of events."""
    s = socket.create_connection((server.host, server.port), timeout=30 * SLOW)
    data = json.dumps(body).encode()
    h = "".join("%s: %s\r\n" % kv for kv in (headers or {}).items())
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
              b"Content-Type: application/json\r\n" +
              h.encode() + b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s


def read_events(s, want, buf=b""):
    """Read from the socket until `want` SSE 'data:' events have arrived (counting from the
    start of buf) or EOF; returns (buf, events seen, eof)."""
    while buf.count(b"\ndata: ") + buf.startswith(b"data: ") < want:
        b = s.recv(65536)
        if not b:
            return buf, buf.count(b"data: "), True
        buf += b
    return buf, buf.count(b"data: "), False


def http_body(buf):
    """The body of a raw HTTP/1.1 reply (de-chunked when chunked)."""
    head, _, body = buf.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = dechunk(body)
    return body


def read_to_eof(sk, buf, timeout):
    sk.settimeout(timeout)
    try:
        while True:
            b = sk.recv(65536)
            if not b:
                break
            buf += b
    except OSError:
        pass
    return buf


def streamed_text(body):
    """The text of the completion chunks of an SSE body (whatever its ending)."""
    out = ""
    for ln in body.decode("utf-8", "replace").split("\n"):
        if ln.startswith("data: {"):
            try:
                js = json.loads(ln[6:])
            except ValueError:
                continue
            for c in js.get("choices") or []:
                out += c.get("text") or ""
    return out


def offline_count(text):
    """How many tokens `qshard tokenize --no-bos` makes of text (the offline tokenizer)."""
    p = subprocess.run([srv.QSHARD, "tokenize", srv.MODEL, "--text", text, "--no-bos", "--ids"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60 * SLOW)
    return len(json.loads(p.stdout.decode())) if p.returncode == 0 else None


def dechunk(b):
    out = b""
    while b:
        size, _, rest = b.partition(b"\r\n")
        try:
            n = int(size.split(b";")[0], 16)
        except ValueError:
            return out
        if n == 0:
            break
        out += rest[:n]
        b = rest[n + 2:]
    return out


def send_and_read(server, head, body_sender, timeout):
    """Send a request head, let body_sender(sock) send in a thread, read the reply meanwhile."""
    s = socket.create_connection((server.host, server.port), timeout=timeout)
    s.sendall(head)
    th = threading.Thread(target=quiet(body_sender), args=(s,), daemon=True)
    th.start()
    out = b""
    t0 = time.monotonic()
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
            if b"\r\n\r\n" in out:
                hdr, _, rest = out.partition(b"\r\n\r\n")
                m = re.search(rb"(?i)content-length:\s*(\d+)", hdr)
                if m and len(rest) >= int(m.group(1)):
                    break
    except (socket.timeout, ConnectionResetError, BrokenPipeError):
        pass
    dt = time.monotonic() - t0
    s.close()
    return out, dt


def quiet(fn):
    def run(s):
        try:
            fn(s)
        except OSError:
            pass
    return run


def parse_reply(out):
    head, _, body = out.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return (int(m.group(1)) if m else None), jparse(body)
