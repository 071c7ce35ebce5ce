"""srv.py - the harness raw_http.py and load.py share (python3 stdlib only).

Starts `qshard serve` on a kernel-picked port (--port 0, --device cpu), reads the port from the
stderr line "qshard serve: listening on http://HOST:PORT", waits for "qshard serve: ready",
stops it with SIGTERM and reports the exit status and how long it took. Every server started
here is killed when the test process exits, however it exits. Counts checks; the summary line
is "# <suite>: N passed, M failed" (with "# " so that tests/run_tests.sh sees only the driver's
"serve: ..." line), which test_serve.sh sums.

Environment (set by test_serve.sh): QSHARD (the binary), QSHARD_SERVE_MODEL (the converted KJV
model), QSHARD_SERVE_TMP (a scratch directory), QSHARD_SAN=1 for a sanitizer build (timeouts x3).
"""
import atexit
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback

QSHARD = os.environ.get("QSHARD", "build/qshard")
MODEL = os.environ.get("QSHARD_SERVE_MODEL", "")
TMP = os.environ.get("QSHARD_SERVE_TMP", "/tmp")
SAN = os.environ.get("QSHARD_SAN", "0") == "1"
# a sanitizer build is ~3x slower: every bound that waits on the model scales with this
SLOW = 3.0 if SAN else 1.0
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LISTEN_RE = re.compile(r"qshard serve: listening on http://([^:\s]+|\[[^\]]+\]):(\d+)\s*$")

_servers = []


class Counter:
    def __init__(self, suite):
        self.suite = suite
        self.passed = 0
        self.failed = 0
        self.failures = []

    def check(self, cond, name, detail=""):
        if cond:
            self.passed += 1
            print("ok   %s" % name, flush=True)
        else:
            self.failed += 1
            d = str(detail)
            if len(d) > 700:
                d = d[:700] + "..."
            msg = "FAIL %s" % name + (": %s" % d if d != "" else "")
            self.failures.append(msg)
            print(msg, flush=True)
        return bool(cond)

    def eq(self, got, want, name):
        return self.check(got == want, name, "got %r, want %r" % (_short(got), _short(want)))

    def run(self, fn, *args):
        """Run one test case; an exception in it is one failure (the others still run)."""
        t0 = time.monotonic()
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - any exception is a failed case
            self.check(False, fn.__name__, "exception %s: %s" % (type(e).__name__, e))
            traceback.print_exc(file=sys.stdout)
        print("# %s: %.1fs" % (fn.__name__, time.monotonic() - t0), flush=True)

    def summary(self):
        if self.failures:
            print("# %s failures:" % self.suite)
            for f in self.failures:
                print("#   " + f)
        print("# %s: %d passed, %d failed" % (self.suite, self.passed, self.failed), flush=True)
        return 1 if self.failed else 0


def _short(v, n=300):
    s = repr(v)
    return v if len(s) <= n else s[:n] + "..."


class ServerError(Exception):
    pass


class Server:
    """One `qshard serve` process, stderr to a log file (read while it runs: a pipe that nobody
    drains would block the server once it filled)."""

    def __init__(self, name, args=(), env=None, wait_ready=True, model=None, launcher=(),
                 device="cpu"):
        """launcher: a command put before qshard (mpirun -np N); device: --device."""
        self.name = name
        self.model = model or MODEL
        self.log_path = os.path.join(TMP, "%s.%d.log" % (name, len(_servers)))
        self.args = (list(launcher) + [QSHARD, "serve", self.model, "--port", "0", "--device",
                                        device] + list(args))
        e = dict(os.environ)
        if env:
            e.update(env)
        self.logf = open(self.log_path, "wb")
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=self.logf, env=e)
        _servers.append(self)
        self.rc = None
        self.host, self.port = None, None
        m = self.wait_log(LISTEN_RE, 30 * SLOW)
        if not m:
            raise ServerError("%s: no 'qshard serve: listening on http://HOST:PORT' line within "
                              "%gs; log:\n%s" % (name, 30 * SLOW, self.log_tail()))
        self.host = m.group(1).strip("[]")
        self.port = int(m.group(2))
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout=None):
        timeout = timeout or 60 * SLOW
        if not self.wait_log(re.compile(r"^qshard serve: ready\s*$"), timeout):
            raise ServerError("%s: no 'qshard serve: ready' line within %gs; log:\n%s"
                              % (self.name, timeout, self.log_tail()))

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def log_tail(self, n=30):
        return "\n".join(self.log_text().splitlines()[-n:])

    def wait_log(self, regex, timeout, start_line=0):
        """The first match of regex on a stderr line (from line start_line), or None."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log_text().splitlines()[start_line:]:
                m = regex.search(line)
                if m:
                    return m
            if self.proc.poll() is not None or time.monotonic() > deadline:
                # one last look: the line may have come with the exit
                for line in self.log_text().splitlines()[start_line:]:
                    m = regex.search(line)
                    if m:
                        return m
                return None
            time.sleep(0.05)

    def alive(self):
        return self.proc.poll() is None

    def conn(self, timeout=None):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or 60 * SLOW)

    def request(self, method, path, body=None, headers=None, timeout=None, raw_body=None):
        """One request on a fresh connection: (status, headers dict (lower-case names), bytes)."""
        c = self.conn(timeout)
        try:
            h = {"Connection": "close"}
            data = raw_body
            if body is not None:
                data = json.dumps(body).encode()
            if data is not None:
                h["Content-Type"] = "application/json"
            if headers:
                h.update(headers)
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            payload = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, payload
        finally:
            c.close()

    def post(self, path, body, headers=None, timeout=None):
        """POST JSON; (status, parsed JSON or None, raw bytes, headers)."""
        st, hd, data = self.request("POST", path, body=body, headers=headers, timeout=timeout)
        try:
            js = json.loads(data)
        except ValueError:
            js = None
        return st, js, data, hd

    def get(self, path, headers=None, timeout=None):
        st, hd, data = self.request("GET", path, headers=headers, timeout=timeout)
        try:
            js = json.loads(data)
        except ValueError:
            js = None
        return st, js, data, hd

    def stream(self, path, body, headers=None, timeout=None):
        """POST with stream: the SSE events as a list of data strings, the raw text, status."""
        c = self.conn(timeout)
        try:
            h = {"Content-Type": "application/json", "Connection": "close"}
            if headers:
                h.update(headers)
            c.request("POST", path, body=json.dumps(body).encode(), headers=h)
            r = c.getresponse()
            raw = r.read().decode("utf-8")
            return r.status, {k.lower(): v for k, v in r.getheaders()}, raw
        finally:
            c.close()

    def metrics(self):
        st, _, data = self.request("GET", "/metrics")
        if st != 200:
            raise ServerError("GET /metrics: status %d" % st)
        return parse_prometheus(data.decode("utf-8"))

    def stop(self, timeout=None, sig=signal.SIGTERM):
        """Signal it and wait: (exit status or None if it did not exit in time, seconds taken)."""
        timeout = timeout or 20 * SLOW
        t0 = time.monotonic()
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            self.rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.rc = None
            self.kill()
        dt = time.monotonic() - t0
        self.logf.close()
        if self in _servers:
            _servers.remove(self)
        return self.rc, dt

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass


def stop_checked(t, srv, timeout=None, name=None, sig=signal.SIGTERM):
    """Stop a server and count its clean exit (status 0 within the bound) as one check."""
    timeout = timeout or 20 * SLOW
    rc, dt = srv.stop(timeout, sig)
    t.check(rc == 0, name or "%s: %s -> exit 0 within %gs" % (srv.name, signal.Signals(sig).name, timeout),
            "exit status %r after %.1fs; log:\n%s" % (rc, dt, srv.log_tail()))
    return rc, dt


def _kill_all():
    for s in list(_servers):
        s.kill()


atexit.register(_kill_all)


def _on_signal(signum, frame):
    _kill_all()
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)
signal.signal(signal.SIGHUP, _on_signal)


def sse_events(raw):
    """Split an SSE body into its data payloads; None if the framing is wrong (every event
    must be exactly 'data: <payload>' followed by a blank line)."""
    if not raw.endswith("\n\n"):
        return None
    out = []
    for block in raw[:-2].split("\n\n"):
        if not block.startswith("data: ") or "\n" in block:
            return None
        out.append(block[len("data: "):])
    return out


_SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+-?\d+)?$')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*')


def parse_prometheus(text):
    """Prometheus text format 0.0.4: {"types": {name: type}, "samples": [(name, labels, value)]}.
    Raises ValueError on a line that is not a comment, a blank or a sample."""
    types, samples = {}, []
    for ln in text.split("\n"):
        if not ln.strip():
            continue
        if ln.startswith("#"):
            parts = ln.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        m = _SAMPLE_RE.match(ln)
        if not m:
            raise ValueError("not a Prometheus sample line: %r" % ln)
        labels = {}
        if m.group(2):
            inner = m.group(2)[1:-1]
            pos = 0
            while pos < len(inner):
                lm = _LABEL_RE.match(inner, pos)
                if not lm:
                    raise ValueError("bad labels in %r" % ln)
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
        v = m.group(3)
        val = {"+Inf": float("inf"), "-Inf": float("-inf"), "NaN": float("nan")}.get(v)
        if val is None:
            val = float(v)  # ValueError if not a number
        samples.append((m.group(1), labels, val))
    return {"types": types, "samples": samples}


def metric(m, name, labels=None):
    """The value of one sample, or None."""
    for n, lb, v in m["samples"]:
        if n == name and (labels is None or lb == labels):
            return v
    return None


def is_error_shape(js, status=None):
    """The contract's error body: {"error": {"message": str, "type": str, "param": str|null,
    "code": str|null}}; returns a reason string when it is not, else ''."""
    if not isinstance(js, dict) or not isinstance(js.get("error"), dict):
        return "body is not {\"error\": {...}}: %r" % (_short(js),)
    e = js["error"]
    for k in ("message", "type", "param", "code"):
        if k not in e:
            return "error has no %r: %r" % (k, e)
    if not isinstance(e["message"], str) or not e["message"]:
        return "error.message not a non-empty string: %r" % (e,)
    if not isinstance(e["type"], str):
        return "error.type not a string: %r" % (e,)
    if e["param"] is not None and not isinstance(e["param"], str):
        return "error.param not str|null: %r" % (e,)
    if e["code"] is not None and not isinstance(e["code"], str):
        return "error.code not str|null: %r" % (e,)
    return ""


def offline_run(requests, extra_args=()):
    """The offline batch runner (`qshard run MODEL --prompts FILE.jsonl --device cpu`), a
    reference the server did not produce: one result dict per request, in order."""
    path = os.path.join(TMP, "offline-%d.jsonl" % int(time.monotonic() * 1e6))
    with open(path, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    p = subprocess.run([QSHARD, "run", MODEL, "--prompts", path, "--device", "cpu"] + list(extra_args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120 * SLOW)
    if p.returncode != 0:
        raise ServerError("qshard run --prompts: exit %d: %s" % (p.returncode, p.stderr.decode()[-2000:]))
    out = [json.loads(ln) for ln in p.stdout.decode().splitlines() if ln.strip()]
    if len(out) != len(requests):
        raise ServerError("qshard run --prompts: %d lines for %d requests" % (len(out), len(requests)))
    return out


def kjv_golden():
    """HF transformers' reference tokenization and greedy continuation of the KJV prompts
    (tests/data/models/INDEX.json, made by transformers, not by qshard)."""
    with open(os.path.join(REPO, "tests/data/models/INDEX.json")) as f:
        idx = json.load(f)
    for m in idx["models"]:
        if m["name"] == "kjv-llama-awq-gemm":
            return m
    raise ServerError("kjv-llama-awq-gemm not in tests/data/models/INDEX.json")


def read_npy_f32(path):
    """A little-endian float32 .npy file (C order): (shape, flat tuple of floats)."""
    import ast
    import struct
    with open(path, "rb") as f:
        b = f.read()
    if b[:6] != b"\x93NUMPY":
        raise ValueError("%s: not a .npy file" % path)
    if b[6] == 1:
        hl, off = struct.unpack("<H", b[8:10])[0], 10
    else:
        hl, off = struct.unpack("<I", b[8:12])[0], 12
    h = ast.literal_eval(b[off:off + hl].decode("latin-1"))
    if h["descr"] != "<f4" or h["fortran_order"]:
        raise ValueError("%s: not C-order little-endian float32" % path)
    n = 1
    for d in h["shape"]:
        n *= d
    return tuple(h["shape"]), struct.unpack("<%df" % n, b[off + hl:off + hl + 4 * n])


def log_softmax(row):
    import math
    m = max(row)
    s = math.log(sum(math.exp(x - m) for x in row))
    return [x - m - s for x in row]
