#!/usr/bin/env python3
"""serve_check.py - `qshard serve` checks for the GPU machine (python3 stdlib only; used by
tools/bench_serve_gpu.sh).

  serve_check.py QSHARD MODEL [--device cuda]
      greedy answers of the server (completions and chat, whole and streamed, 16 requests at
      once) against `qshard run MODEL --prompts` on the same device (the engine without HTTP);
      prints "serve_check: N passed, M failed", exit 1 on a failure.
  serve_check.py --start-time QSHARD MODEL [--device cuda]
      three times: process start -> the first GET /health 200, in seconds.
  serve_check.py --wait URL
      poll URL/health until 200 (at most 600 s).
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

PROMPTS = ["And God said", "In the beginning", "The LORD is my shepherd", "Blessed are",
           "And it came to pass", "Thus saith the LORD", "Now the serpent", "Let there be"]


def health(url, timeout=0.5):
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait(url, limit=600.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if health(url) == 200:
            return time.monotonic() - t0
        time.sleep(0.002)
    raise SystemExit("serve_check: %s/health never answered 200" % url)


def post(url, body, stream):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        if not stream:
            return json.loads(r.read())
        out, usage = {}, None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return {"stream": out, "usage": usage}
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev["choices"]:
                d = c.get("delta", {}).get("content") if "delta" in c else c.get("text")
                out[c["index"]] = out.get(c["index"], "") + (d or "")
        raise RuntimeError("stream ended without [DONE]")


def start(qshard, model, device, extra=()):
    p = subprocess.Popen([qshard, "serve", model, "--port", "0", "--device", device,
                          "--chat-template", "llama2", *extra],
                         stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if "listening on " in line:
            url = line.split("listening on ")[1].strip()
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            wait(url)
            return p, url
    raise SystemExit("serve_check: the server did not start")


def check(qshard, model, device):
    reqs = []
    for i, t in enumerate(PROMPTS):
        reqs.append({"prompt": t, "max_tokens": 24 + i, "temperature": 0})
        reqs.append({"messages": [{"role": "user", "content": t + "?"}], "max_tokens": 20,
                     "temperature": 0})
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")
    out = subprocess.run([qshard, "run", model, "--prompts", f.name, "--device", device,
                          "--chat-template", "llama2"], capture_output=True, text=True, check=True)
    os.unlink(f.name)
    ref = [json.loads(l)["text"] for l in out.stdout.splitlines()]
    p, url = start(qshard, model, device, ["--max-num-seqs", "16"])
    got, errs = [None] * (2 * len(reqs)), []

    def one(k):
        r = dict(reqs[k % len(reqs)])
        chat = "messages" in r
        stream = k >= len(reqs)
        if stream:
            r["stream"] = True
        try:
            res = post(url + ("/v1/chat/completions" if chat else "/v1/completions"), r, stream)
            got[k] = res["stream"][0] if stream else (
                res["choices"][0]["message"]["content"] if chat else res["choices"][0]["text"])
        except Exception as e:  # noqa: BLE001 - reported as a failure
            errs.append("request %d: %s" % (k, e))

    th = [threading.Thread(target=one, args=(k,)) for k in range(len(got))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    p.terminate()
    rc = p.wait(timeout=60)
    passed = failed = 0
    for k, g in enumerate(got):
        want = ref[k % len(reqs)]
        if g == want:
            passed += 1
        else:
            failed += 1
            print("serve_check: request %d: server %r, run --prompts %r" % (k, g, want))
    for e in errs:
        print("serve_check:", e)
    if rc == 0:
        passed += 1
    else:
        failed += 1
        print("serve_check: the server exited %d after SIGTERM" % rc)
    print("serve_check: %d passed, %d failed" % (passed, failed + len(errs)))
    return 1 if failed or errs else 0


def start_time(qshard, model, device):
    for i in range(3):
        t0 = time.monotonic()
        p = subprocess.Popen([qshard, "serve", model, "--port", "18124", "--device", device],
                             stderr=subprocess.DEVNULL)
        wait("http://127.0.0.1:18124")
        dt = time.monotonic() - t0
        p.terminate()
        p.wait(timeout=120)
        print("start %d: process start -> /health 200: %.3f s" % (i + 1, dt))
    return 0


def main(argv):
    device = "cuda"
    if "--device" in argv:
        i = argv.index("--device")
        device = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if argv[:1] == ["--wait"]:
        print("server ready after %.1f s" % wait(argv[1]))
        return 0
    if argv[:1] == ["--start-time"]:
        return start_time(argv[1], argv[2], device)
    return check(argv[0], argv[1], device)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
