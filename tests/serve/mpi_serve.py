"""mpi_serve.py - `qshard serve` under mpirun (README "Several processes (MPI)"), run by
tests/test_mpi.sh: rank 0 listens and schedules, the other ranks follow its steps.

  python3 tests/serve/mpi_serve.py MODEL_DIR NP DEVICE [kill]

1. `mpirun -np NP qshard serve MODEL_DIR --device DEVICE` answers concurrent completions (greedy
   and seeded sampling, one streamed) exactly as the one-process offline runner
   `qshard run MODEL_DIR --prompts` on the same device (a reference the server did not produce).
2. SIGTERM to rank 0 (the listener): every rank ends, mpirun exits 0 within 30 s; SIGTERM to
   mpirun: every rank ends within 30 s (mpirun itself exits 1 after a signal, its convention).
3. With `kill` (NP >= 2): kill -9 of rank 1 while a long request runs: mpirun exits non-zero
   within 30 s, the client's connection ends, no qshard process left.
Summary line "# mpi-serve: N passed, M failed"; exit status non-zero on a failure.
Environment: QSHARD (the binary), QSHARD_SERVE_TMP (scratch), QSHARD_MPIRUN (the launcher).
"""
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import srv  # noqa: E402

MODEL, NP, DEVICE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
KILL = len(sys.argv) > 4 and sys.argv[4] == "kill"
MPIRUN = shlex.split(os.environ.get("QSHARD_MPIRUN", "mpirun --oversubscribe")) + ["-np", str(NP)]
t = srv.Counter("mpi-serve")

REQS = [
    {"prompt": "And God said", "max_tokens": 12, "temperature": 0},
    {"prompt": "In the beginning", "max_tokens": 20, "temperature": 0.8, "top_k": 40, "seed": 7},
    {"prompt": "And Moses went up", "max_tokens": 10, "temperature": 0, "stop": ["LORD"]},
    {"prompt": "And the LORD spake unto Moses, saying", "max_tokens": 16, "temperature": 0.7,
     "top_k": 50, "top_p": 0.9, "seed": 11},
]


def qshard_pids():
    p = subprocess.run(["pgrep", "-f", "^%s " % srv.QSHARD], stdout=subprocess.PIPE)
    return p.stdout.decode().split()


def offline():
    path = os.path.join(srv.TMP, "mpi-serve-req.jsonl")
    with open(path, "w") as f:
        for r in REQS:
            f.write(json.dumps(r) + "\n")
    p = subprocess.run([srv.QSHARD, "run", MODEL, "--prompts", path, "--device", DEVICE,
                        "--max-num-seqs", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=300)
    if p.returncode != 0:
        raise srv.ServerError("offline run: exit %d: %s" % (p.returncode, p.stderr.decode()[-1500:]))
    return [json.loads(ln) for ln in p.stdout.decode().splitlines() if ln.strip()]


def model_id(s):
    st, js, _, _ = s.get("/v1/models")
    return js["data"][0]["id"] if st == 200 and js and js.get("data") else "?"


def answers(s):
    """All REQS at once (the last one streamed): [(text, finish_reason, completion_tokens)]."""
    out = [None] * len(REQS)
    mid = model_id(s)

    def one(i):
        body = dict(REQS[i], model=mid)
        try:
            if i == len(REQS) - 1:
                body["stream"] = True
                body["stream_options"] = {"include_usage": True}
                st, _, raw = s.stream("/v1/completions", body, timeout=300)
                ev = srv.sse_events(raw) or []
                text, fin, n = "", None, None
                for e in ev:
                    if e == "[DONE]":
                        continue
                    js = json.loads(e)
                    for c in js.get("choices", []):
                        text += c.get("text", "")
                        fin = c.get("finish_reason") or fin
                    if js.get("usage"):
                        n = js["usage"]["completion_tokens"]
                out[i] = (st, text, fin, n)
            else:
                st, js, raw, _ = s.post("/v1/completions", body, timeout=300)
                c = js["choices"][0]
                out[i] = (st, c["text"], c["finish_reason"], js["usage"]["completion_tokens"])
        except Exception as e:  # noqa: BLE001 - one failed request is one failed check
            out[i] = ("error", str(e), None, None)

    th = [threading.Thread(target=one, args=(i,)) for i in range(len(REQS))]
    for x in th:
        x.start()
    for x in th:
        x.join(400)
    return out


def case_equal():
    ref = offline()
    s = srv.Server("mpi-np%d" % NP, ["--max-num-seqs", "4"], model=MODEL, launcher=MPIRUN,
                   device=DEVICE)
    got = answers(s)
    t.eq(len(ref), len(REQS), "the one-process runner answered every request")
    for i, (g, r) in enumerate(zip(got, ref)):
        want = (200, r["text"], r["finish_reason"], r["usage"]["completion_tokens"])
        t.eq(g, want, "np %d %s request %d%s equal to the one-process runner"
             % (NP, DEVICE, i, " (streamed)" if i == len(REQS) - 1 else ""))
    # a process manager stops the server through rank 0 (the listener): every rank ends, exit 0
    pid0 = rank_pid(0)
    rc, dt, left = signal_and_wait(s, pid0, signal.SIGTERM)
    t.check(pid0 and rc == 0 and not left and "qshard serve: stopped" in s.log_text(),
            "SIGTERM to rank 0: every rank gone after %.1f s, mpirun exit 0" % dt,
            "rank-0 pid %r, exit %r after %.1f s, left %s; log:\n%s"
            % (pid0, rc, dt, left, s.log_tail()))
    s.kill()


def case_term_mpirun():
    # SIGTERM (or Ctrl-C) to mpirun: it passes the signal to every rank and exits 1 itself (its
    # convention whatever the ranks do); the ranks must be gone within the bound
    s = srv.Server("mpi-term", [], model=MODEL, launcher=MPIRUN, device=DEVICE)
    rc, dt = s.stop(30)
    time.sleep(0.5)
    left = qshard_pids()
    t.check(rc is not None and not left,
            "SIGTERM to mpirun: every rank gone after %.1f s (mpirun exit %r)" % (dt, rc),
            "exit %r after %.1f s, left %s; log:\n%s" % (rc, dt, left, s.log_tail()))


def rank_pid(r):
    key = b"OMPI_COMM_WORLD_RANK=%d" % r
    for p in qshard_pids():
        try:
            env = open("/proc/%s/environ" % p, "rb").read().split(b"\0")
        except OSError:
            continue
        if key in env:
            return int(p)
    return None


def signal_and_wait(s, pid, sig):
    """Send sig to process pid (when found), wait up to 30 s for mpirun: (its exit status or
    None, seconds, the qshard processes left half a second later)."""
    t0 = time.monotonic()
    if pid:
        os.kill(pid, sig)
    try:
        rc = s.proc.wait(30)
    except subprocess.TimeoutExpired:
        rc = None
    dt = time.monotonic() - t0
    time.sleep(0.5)
    return rc, dt, qshard_pids()


def case_kill():
    s = srv.Server("mpi-kill", [], model=MODEL, launcher=MPIRUN, device=DEVICE,
                   env={"QSHARD_MPI_TIMEOUT": "3"})
    res = {}
    mid = model_id(s)

    def long_req():
        try:
            res["r"] = s.post("/v1/completions", {"model": mid, "prompt": "And God said",
                                                  "max_tokens": 400, "ignore_eos": True},
                              timeout=120)[0]
        except Exception as e:  # noqa: BLE001 - the connection is expected to end
            res["r"] = "ended: %s" % type(e).__name__
    th = threading.Thread(target=long_req)
    th.start()
    time.sleep(1.0)
    pid = rank_pid(1)
    rc, dt, left = signal_and_wait(s, pid, signal.SIGKILL)
    th.join(30)
    t.check(pid is not None and rc not in (None, 0) and not left and
            str(res.get("r")).startswith("ended"),
            "kill -9 of rank 1 while serving: mpirun gone after %.1f s (exit %r), request %s"
            % (dt, rc, res.get("r")),
            "rank-1 pid %r, exit %r, left %s; log:\n%s" % (pid, rc, left, s.log_tail()))
    s.kill()


t.run(case_equal)
t.run(case_term_mpirun)
if KILL and NP >= 2:
    t.run(case_kill)
sys.exit(t.summary())
